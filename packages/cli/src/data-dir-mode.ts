import { existsSync } from "node:fs";
import { resolve } from "node:path";
import type { Config } from "@mam/core";
import { dataDirPaths } from "@mam/local/data-dir-paths";
import type { Backend } from "./backend.ts";
import type { EmbeddedOptions } from "./embedded-backend.ts";

/**
 * The `--data-dir` mode, loaded on its first call: embedded-backend.ts and @mam/local
 * (SQLite through the native better-sqlite3, the MQTT publisher) are imported only
 * when a command works on a store, so a command in API mode loads core, the client
 * and Node's built-ins, and nothing of the service's. The agent install (`npm run
 * package:agent`) has no data-dir mode at all: its build puts a module that refuses
 * in place of those (scripts/package-agent.mjs), and the refusal arrives here as the
 * rejected import, a MamError like any other.
 */
export function embeddedBackend(opts: EmbeddedOptions): Backend {
  let loaded: Promise<Backend> | undefined;
  const backend = () => {
    loaded ??= import("./embedded-backend.ts").then((m) => m.embeddedBackend(opts));
    return loaded;
  };
  return {
    mode: "embedded",
    publishEvent: async (jobId, input) => (await backend()).publishEvent(jobId, input),
    finalize: async (jobId, input) => (await backend()).finalize(jobId, input),
    verify: async (jobId, input) => (await backend()).verify(jobId, input),
    dispatch: async (jobId, request) => (await backend()).dispatch(jobId, request),
    listChanges: async (query) => (await backend()).listChanges(query),
    async close() {
      // Nothing was opened unless the module loaded; a load that failed has already said why.
      const opened = await loaded?.catch(() => undefined);
      await opened?.close();
    },
  };
}

/** `resolve`d data dir the caller named, or ./.mam (MAM_DATA_DIR's default) when mam serve already made it there. */
export function namedDataDir(
  flag: string | undefined,
  env: Readonly<Record<string, string | undefined>>,
  config: Config,
): string | undefined {
  if (flag !== undefined) return resolve(flag);
  if (env.MAM_DATA_DIR !== undefined && env.MAM_DATA_DIR !== "") return resolve(config.dataDir);
  const dflt = dataDirPaths(config.dataDir);
  return existsSync(dflt.database) || existsSync(dflt.credentials) ? dflt.root : undefined;
}
