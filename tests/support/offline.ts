/**
 * `npm run offline` as a child process on the ports a test chooses, up once it says
 * "is up in N s" (bundling three functions and starting a JVM and serverless-offline:
 * on a busy 2-core machine, up to a minute or two). Used by tests/engine/offline and
 * the browser tier's AWS-shaped page.
 */
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { holdPackagingLock } from "../packaging/package.ts";

export const ROOT = path.resolve(import.meta.dirname, "..", "..");
/** The stack bundles three functions and starts a JVM and serverless-offline: on a busy 2-core machine, up to a minute or two. */
export const START_TIMEOUT_MS = 240_000;

export interface Offline {
  readonly child: ChildProcess;
  readonly api: string;
  readonly mqtt: string;
  readonly output: () => string;
  readonly exited: Promise<number | null>;
}

/**
 * `npm run offline` bundles into the checkout's one `.build/` and serves the http
 * function from it for its whole life, so it holds the packaging lock until it exits:
 * a test file packaging meanwhile (tests/engine/cfn-lint, tests/functions/metrics:
 * `npm run package` starts by deleting `.build/`) waits instead of deleting the bundle
 * under it (seen in CI: "Cannot find module .build/http/http").
 */
export async function startOffline(dir: string, ports: { api: number; lambda: number; mqtt: number }): Promise<Offline> {
  const release = await holdPackagingLock();
  const child = spawn("npm", ["run", "offline"], {
    cwd: ROOT,
    env: {
      ...process.env,
      MAM_DATA_DIR: path.join(dir, ".mam"),
      MAM_OFFLINE_PORT: String(ports.api),
      MAM_OFFLINE_LAMBDA_PORT: String(ports.lambda),
      MAM_OFFLINE_MQTT_PORT: String(ports.mqtt),
      MAM_AUTO_COMPLETE: "1",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  void exited.then(release);
  const up = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`npm run offline did not come up:\n${out}`)), START_TIMEOUT_MS);
    const onData = (d: Buffer): void => {
      out += String(d);
      if (/is up in [\d.]+ s/.test(out)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`npm run offline exited (${code}) before it was up:\n${out}`));
    });
  });
  await up;
  return { child, api: `http://127.0.0.1:${ports.api}`, mqtt: `mqtt://127.0.0.1:${ports.mqtt}`, output: () => out, exited };
}
