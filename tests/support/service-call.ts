import path from "node:path";
import { type RunningService, startService } from "@mam/cli";
import { type Clock, parseConfig } from "@mam/core";
import { type TempDir, tempDir } from "./temp-dir.ts";

/** A JSON answer of a running service, read field by field. */
export interface ServiceAnswer {
  readonly status: number;
  readonly text: string;
  // biome-ignore lint/suspicious/noExplicitAny: JSON answers read field by field
  readonly body: Record<string, any>;
  readonly headers: Headers;
}

/**
 * The one way the in-process e2e tests call a running `mam serve` (`startService`):
 * `call(method, path, token, body?, type?)` — a string body is sent as it is, anything
 * else as JSON; the answer's text, its JSON (undefined when empty) and its headers.
 */
export function serviceCaller(baseUrl: () => string) {
  return async (method: string, url: string, token: string, body?: unknown, type = "application/json"): Promise<ServiceAnswer> => {
    const res = await fetch(new URL(url, baseUrl()), {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": type }) },
      ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
    });
    const text = await res.text();
    return { status: res.status, text, body: (text === "" ? undefined : JSON.parse(text)) as ServiceAnswer["body"], headers: res.headers };
  };
}

/**
 * `mam serve` in-process for an e2e file, on the test clock: a fresh data dir, ports
 * chosen by the OS, auto-completion on and the sweep timer every second, plus `env`.
 * `stop()` stops it and removes the data dir.
 */
export async function startTestService(
  name: string,
  clock: Clock,
  env: Record<string, string> = {},
): Promise<{ readonly service: RunningService; readonly dataDir: string; readonly tmp: TempDir; stop(): Promise<void> }> {
  const tmp = await tempDir(name);
  const dataDir = path.join(tmp.dir, "data");
  const config = parseConfig({
    MAM_DATA_DIR: dataDir,
    MAM_PORT: "0",
    MAM_MQTT_PORT: "0",
    MAM_AUTO_COMPLETE: "1",
    MAM_SWEEP_INTERVAL_SECONDS: "1",
    ...env,
  });
  const service = await startService(config, () => undefined, { clock });
  return {
    service,
    dataDir,
    tmp,
    async stop() {
      await service.stop();
      await tmp.remove();
    },
  };
}
