/**
 * A serverless plugin of ours for `npm run offline` (scripts/offline.ts), inert
 * everywhere else: it acts only on `offline start`, and there only when
 * MAM_OFFLINE_FUNCTION_ENV is set.
 *
 * serverless-offline gives each function serverless.yml's environment, in which the
 * table and bucket names are CloudFormation references (`!Ref JobTable`) that only a
 * deployment resolves. Before serverless-offline reads the functions, this plugin
 * puts in their place the names `npm run offline` created on its local peers, and
 * adds the settings a local run needs (the peers' endpoints, the signing key named
 * directly instead of its SSM parameter). Any other reference left is an error
 * naming its variable, never passed on as "[object Object]".
 *
 * It also takes the `schedule` events off the functions: `npm run offline` runs the
 * sweep on a timer of its own, at the schedule's rate, so serverless-offline's
 * scheduler must not run it a second time. (Stream events serverless-offline ignores:
 * our stream poller drives the stream function.)
 */
class MamOfflinePlugin {
  constructor(serverless) {
    this.serverless = serverless;
    this.hooks = {
      "before:offline:start:init": () => this.localize(),
      "before:offline:start": () => this.localize(),
    };
  }

  localize() {
    if (this.done) return;
    this.done = true;
    const raw = process.env.MAM_OFFLINE_FUNCTION_ENV;
    if (raw === undefined) {
      throw new Error("run the offline stack with `npm run offline`: it starts the peers and names them in MAM_OFFLINE_FUNCTION_ENV");
    }
    const local = JSON.parse(raw);
    const service = this.serverless.service;
    const settle = (environment, where) => {
      const out = { ...(environment ?? {}) };
      for (const [name, value] of Object.entries(out)) {
        if (typeof value === "string" || name in local) continue;
        throw new Error(`${where} environment ${name} is ${JSON.stringify(value)}: npm run offline names no local value for it`);
      }
      return out;
    };
    service.provider.environment = { ...settle(service.provider.environment, "provider"), ...local };
    for (const name of service.getAllFunctions()) {
      const fn = service.getFunction(name);
      if (fn.environment !== undefined) {
        const own = settle(fn.environment, `function ${name}`);
        for (const key of Object.keys(local)) delete own[key];
        fn.environment = own;
      }
      fn.events = (fn.events ?? []).filter((event) => event.schedule === undefined);
    }
  }
}

module.exports = MamOfflinePlugin;
