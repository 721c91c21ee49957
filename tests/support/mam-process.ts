import { spawn } from "node:child_process";
import { join } from "node:path";

const ROOT = new URL("../..", import.meta.url).pathname;
/** The `mam` command as users run it. */
export const MAM = join(ROOT, "packages/cli/bin/mam.js");

export interface ProcessRun {
  /** Exit status; null when it was killed. */
  readonly status: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Run `node <args>` to its end in `cwd` with only PATH and `env` in its environment:
 * its exit status and both streams; `stdin`, what it reads on stdin. `killAfterMs`: a process expected to end at once
 * that has not by then is SIGKILLed (status null) rather than left to hang the test.
 */
export async function runNode(
  args: readonly string[],
  opts: {
    readonly cwd?: string;
    readonly env?: Record<string, string>;
    readonly killAfterMs?: number;
    readonly stdin?: string;
    /** Write `stdin` but never close it: a peer that holds the pipe open. */
    readonly keepStdinOpen?: boolean;
    /** Close the reading end of its stdout at once: a reader that went away (its writes fail with EPIPE). */
    readonly closeStdout?: boolean;
  } = {},
): Promise<ProcessRun> {
  const child = spawn(process.execPath, args, {
    cwd: opts.cwd ?? ROOT,
    env: { PATH: process.env.PATH ?? "", ...opts.env },
    stdio: [opts.stdin === undefined ? "ignore" : "pipe", "pipe", "pipe"],
  });
  if (opts.stdin !== undefined) {
    if (opts.keepStdinOpen === true) child.stdin?.write(opts.stdin);
    else child.stdin?.end(opts.stdin);
  }
  if (opts.closeStdout === true) child.stdout?.destroy();
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (d: Buffer) => {
    stdout += d.toString();
  });
  child.stderr?.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const timer = opts.killAfterMs === undefined ? undefined : setTimeout(() => child.kill("SIGKILL"), opts.killAfterMs);
  try {
    const status = await new Promise<number | null>((resolve, reject) => {
      child.once("error", reject);
      child.once("close", (c) => resolve(c));
    });
    return { status, stdout, stderr };
  } finally {
    clearTimeout(timer);
  }
}

/** `mam <args>` as its own process (see `runNode`). */
export function runMam(args: readonly string[], opts: Parameters<typeof runNode>[1] = {}): Promise<ProcessRun> {
  return runNode([MAM, ...args], opts);
}
