import { createMamClient } from "@mam/client";
import { type Config, MamError, systemClock } from "@mam/core";
import { EXIT_OK, EXIT_UNREACHABLE } from "../exit-codes.ts";
import type { CliIo } from "../io.ts";
import { HerdrCollector } from "./collector.ts";
import { HerdrSocket } from "./herdr-socket.ts";
import { mamPort } from "./mam-port.ts";

export const WATCH_HERDR_SUMMARY = "post herdr's pane states of dispatched jobs to mam, as a watcher (API mode)";

export const WATCH_HERDR_USAGE = `mam watch herdr [--socket PATH] --api URL --token TOKEN [--interval SECONDS] [--once]

A collector: it connects to herdr's socket (--socket, default $HERDR_SOCKET_PATH),
lists herdr's panes, subscribes to pane lifecycle events and to each mapped pane's
status, and posts each status change to mam as an observation (source_kind
pane_status, source watcher:<the token's name>). It re-posts a quiescent pane
(idle, done) at least every half settle window of the job's backend: mam coalesces
the repeat, and that is how the pane's quiescent span grows.

A pane maps to the latest dispatch of a pending or running job when its pane_id and
terminal_id are the ones recorded at dispatch (mam dispatch --pane ID --terminal ID) and,
when herdr reports the agent's session, that session is the dispatch's. Nothing is
posted for a pane that maps to no dispatch. A dispatch naming a pane another running
dispatch holds is refused; a pane that closes or exits ends its mapping for good.

The token is a watcher's: mam token create --scope read,observe --name herdr.
--interval SECONDS: how often mam's dispatches are read again (default 5).
--once: list, post what changed, and exit (2 when herdr could not be reached).

Logs go to stderr, one line each; it runs until SIGINT or SIGTERM, reconnecting to
herdr with a capped exponential backoff and retrying mam when it cannot be reached.`;

export const WATCH_HERDR_OPTIONS = {
  api: { type: "string" },
  token: { type: "string" },
  socket: { type: "string" },
  interval: { type: "string" },
  once: { type: "boolean" },
} as const;

/** `mam watch herdr`: its composition root (the client, the socket, the collector) and its run. */
export async function watchHerdr(
  values: Record<string, unknown>,
  ctx: { readonly io: CliIo; readonly config: Config; say(line: string): void },
): Promise<number> {
  const str = (v: unknown) => (typeof v === "string" && v !== "" ? v : undefined);
  if (values["data-dir"] !== undefined) {
    throw new MamError(
      "input.invalid",
      "--data-dir is not for mam watch herdr: the collector posts to the service (--api URL), as a watcher",
    );
  }
  const socket = str(values.socket) ?? str(ctx.io.env.HERDR_SOCKET_PATH);
  if (socket === undefined)
    throw new MamError("input.invalid", "--socket PATH (or HERDR_SOCKET_PATH) names herdr's socket: it is required");
  const api = str(values.api) ?? ctx.config.apiUrl;
  if (api === undefined) throw new MamError("input.invalid", "--api URL (or MAM_API_URL) is required: the collector posts to the service");
  if (!URL.canParse(api))
    throw new MamError("input.invalid", `--api must be a URL such as http://127.0.0.1:8787, not ${JSON.stringify(api)}`);
  const token = str(values.token) ?? ctx.config.token;
  if (token === undefined)
    throw new MamError("input.invalid", "--token TOKEN (or MAM_TOKEN) is required: a watcher token (scopes read,observe)");
  let intervalSeconds = 5;
  if (values.interval !== undefined) {
    intervalSeconds = Number(values.interval);
    if (!Number.isFinite(intervalSeconds) || intervalSeconds <= 0 || intervalSeconds > 3600) {
      throw new MamError(
        "input.invalid",
        `--interval must be a number of seconds, above 0 and at most 3600, not ${JSON.stringify(values.interval)}`,
      );
    }
  }
  const client = createMamClient({ baseUrl: api, token, ...(ctx.io.fetch === undefined ? {} : { fetch: ctx.io.fetch }) });
  const controller = new AbortController();
  const signal = ctx.io.signal ?? controller.signal;
  const onSignal = () => controller.abort();
  if (ctx.io.signal === undefined) {
    process.once("SIGINT", onSignal);
    process.once("SIGTERM", onSignal);
  }
  try {
    ctx.say(`watching herdr at ${socket} for ${api}`);
    const reached = await new HerdrCollector({
      herdr: new HerdrSocket(socket),
      mam: mamPort(client),
      clock: systemClock,
      log: (line) => ctx.say(line),
      signal,
      discoveryMs: intervalSeconds * 1000,
      once: values.once === true,
    }).run();
    // --once that never reached herdr did not do what was asked; a long run ended by a signal did.
    return values.once === true && !reached ? EXIT_UNREACHABLE : EXIT_OK;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}
