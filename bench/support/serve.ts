import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { closeSync, openSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** Starting `mam serve` and the processes that load it, for the benchmarks that drive it over HTTP (bench/http.ts, bench/observe.ts). */

const ROOT = path.dirname(path.dirname(path.dirname(fileURLToPath(import.meta.url))));
/** The environment without the caller's MAM_* settings, so only ours apply. */
export function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("MAM_") && k !== "NODE_OPTIONS") env[k] = v;
  return { ...env, ...extra };
}

export const CAN_PIN = os.availableParallelism() >= 2 && spawnSync("taskset", ["-c", "0", "true"]).status === 0;
export const SERVER_CPU = "0";
export const LOAD_CPU = "1";

/** `node <args>`, on one CPU when pinning is possible (taskset execs node: the pid is node's). */
export function spawnNode(cpu: string, args: readonly string[], options: Parameters<typeof spawn>[2]): ChildProcess {
  return CAN_PIN ? spawn("taskset", ["-c", cpu, process.execPath, ...args], options) : spawn(process.execPath, args, options);
}

/** Resolve with the first capture of `pattern` on the child's stream; reject if it exits first. */
export function waitForLine(child: ChildProcess, stream: "stdout" | "stderr", pattern: RegExp, what: string): Promise<string> {
  const source = child[stream];
  if (source === null) throw new Error(`${what}: no ${stream} pipe`);
  let seen = "";
  return new Promise((resolve, reject) => {
    const onData = (s: string) => {
      seen += s;
      const m = pattern.exec(seen);
      if (m) {
        source.off("data", onData);
        child.off("exit", onExit);
        resolve(m[1] ?? m[0]);
      }
    };
    const onExit = (code: number | null) => reject(new Error(`${what} exited ${code} before it was ready: ${seen.trim()}`));
    source.setEncoding("utf8").on("data", onData);
    child.once("exit", onExit);
  });
}

export function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once("exit", () => resolve());
    child.kill("SIGTERM");
  });
}

export interface Mam {
  readonly child: ChildProcess;
  readonly url: string;
  readonly startMs: number;
}

/** `mam serve` as `npm start` runs it; its stdout (one JSON line per request) goes to a file. */
export async function startMam(dataDir: string, logFile: string, nodeArgs: readonly string[] = []): Promise<Mam> {
  const env = cleanEnv({ MAM_DATA_DIR: dataDir, MAM_HOST: "127.0.0.1", MAM_PORT: "0", MAM_MQTT_PORT: "0", NO_COLOR: "1" });
  const log = openSync(logFile, "a");
  const started = performance.now();
  const child = spawnNode(SERVER_CPU, [...nodeArgs, "--import", "tsx", "packages/cli/src/main.ts", "serve"], {
    cwd: ROOT,
    env,
    stdio: ["ignore", log, "pipe"],
  });
  closeSync(log); // the child has its own copy
  const url = await waitForLine(child, "stderr", /mam serving on (http:\/\/\S+)/, "mam serve");
  return { child, url, startMs: performance.now() - started };
}
