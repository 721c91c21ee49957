import { type ChildProcess, spawn } from "node:child_process";
import { MAM } from "./mam-process.ts";

/** `mam serve` as a child process, as `npm start` runs it, with what it wrote so far. */
export interface ServeProcess {
  readonly child: ChildProcess;
  readonly url: string;
  /** The embedded broker's address, when started with `{ broker: true }`. */
  readonly mqttUrl: string;
  readonly stderr: () => string;
  readonly stdout: () => string;
  /** Resolves with the first stdout line `match` accepts, as soon as it is written; rejects if the process exits first. */
  line(match: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  /** SIGTERM (or `signal`), and the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

const ROOT = new URL("../..", import.meta.url).pathname;

export interface ServeOptions {
  /** The working directory (default: the repository root, as `npm start` runs it). */
  readonly cwd?: string;
  /** Also wait until it says where its embedded MQTT broker listens (`mqttUrl`). */
  readonly broker?: boolean;
  /** Start it under this soft open-file limit (`ulimit -n` in a shell that then execs it). */
  readonly openFiles?: number;
}

function spawnServe(dataDir: string, env: Record<string, string>, cwd = ROOT, openFiles?: number): ChildProcess {
  const [command, args] =
    openFiles === undefined
      ? [process.execPath, [MAM, "serve"]]
      : ["/bin/sh", ["-c", `ulimit -n ${openFiles} && exec "$0" "$1" serve`, process.execPath, MAM]];
  return spawn(command, args, {
    cwd,
    env: { PATH: process.env.PATH ?? "", MAM_DATA_DIR: dataDir, MAM_PORT: "0", MAM_MQTT_PORT: "0", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

/** Start `mam serve` on `dataDir` (free ports) and resolve once it says where it serves. */
export async function startServeProcess(dataDir: string, env: Record<string, string> = {}, opts: ServeOptions = {}): Promise<ServeProcess> {
  const child = spawnServe(dataDir, env, opts.cwd, opts.openFiles);
  let err = "";
  let out = "";
  const waiters = new Set<() => void>();
  child.stdout?.on("data", (d) => {
    out += String(d);
    for (const w of waiters) w();
  });
  child.stderr?.on("data", (d) => {
    err += String(d);
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const { url, mqttUrl } = await new Promise<{ url: string; mqttUrl: string }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`mam serve did not start: ${err}`)), 20_000);
    child.stderr?.on("data", () => {
      const found = /serving on (http:\/\/\S+)/.exec(err)?.[1];
      const broker = /MQTT broker: (mqtt:\/\/\S+)/.exec(err)?.[1];
      // The banner's last line (each line is its own write, so they may come apart).
      const banner = /operator token: in .*\n/.test(err);
      if (found && banner && (broker || !opts.broker)) {
        clearTimeout(timer);
        resolve({ url: found, mqttUrl: broker ?? "" });
      }
    });
    void exited.then((code) => reject(new Error(`mam serve exited with ${code}: ${err}`)));
  });
  return {
    child,
    url,
    mqttUrl,
    stderr: () => err,
    stdout: () => out,
    line(match, timeoutMs = 10_000) {
      return new Promise<string>((resolve, reject) => {
        const check = () => {
          const found = out.split("\n").find((l) => l.length > 0 && match(l));
          if (found === undefined) return;
          done();
          resolve(found);
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no such line from mam serve within ${timeoutMs} ms; stdout:\n${out}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        void exited.then(() => {
          done();
          reject(new Error(`mam serve exited; stdout:\n${out}`));
        });
        check();
      });
    },
    async stop(signal = "SIGTERM") {
      if (child.exitCode === null) child.kill(signal);
      return exited;
    },
  };
}

/** Run `mam serve` on `dataDir` expecting it to refuse to start: its exit code and what it said. */
export async function refusedServe(dataDir: string, env: Record<string, string> = {}): Promise<{ code: number | null; stderr: string }> {
  const child = spawnServe(dataDir, env);
  let err = "";
  child.stderr?.on("data", (d) => {
    err += String(d);
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
  const code = await new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)));
  clearTimeout(timer);
  return { code, stderr: err };
}
