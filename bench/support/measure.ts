import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

/**
 * Small helpers shared by the benchmarks. Each benchmark is its own entry point (its
 * own process, so its peak RSS is its own), reads its few knobs from the environment
 * at the top, and prints ratios against a baseline measured in the same run: the
 * absolute figures depend on the machine, the ratios much less.
 */

export const MiB = 1024 * 1024;

export function median(values: readonly number[]): number {
  if (values.length === 0) throw new Error("median of nothing");
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export function verdict(pass: boolean): "PASS" | "FAIL" {
  return pass ? "PASS" : "FAIL";
}

export function fixed(n: number, digits = 1): string {
  return n.toFixed(digits);
}

/** 12345.6 -> "12,346" */
export function grouped(n: number): string {
  return Math.round(n).toLocaleString("en-US");
}

/**
 * A positive integer knob from the environment, with an optional binary suffix
 * (`64M`, `1G`, `512K`). Unset or empty gives the default; anything else stops the
 * benchmark with a message naming the variable.
 */
export function sizeFromEnv(name: string, value: string | undefined, dflt: number): number {
  if (value === undefined || value.trim() === "") return dflt;
  const m = /^\s*(\d+)\s*([kmg]?)i?b?\s*$/i.exec(value);
  const scale = { "": 1, k: 1024, m: MiB, g: 1024 * MiB }[(m?.[2] ?? "").toLowerCase()];
  const n = m && scale !== undefined ? Number(m[1]) * scale : Number.NaN;
  if (!Number.isSafeInteger(n) || n <= 0) {
    console.error(`${name} must be a positive integer, optionally with K, M or G (got ${JSON.stringify(value)})`);
    process.exit(1);
  }
  return n;
}

/** A fresh directory under the OS temp dir, removed by `dispose` (and on Ctrl-C). */
export async function tempDir(prefix: string): Promise<{ dir: string; dispose(): Promise<void> }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
  const onSignal = (signal: NodeJS.Signals) => {
    void rm(dir, { recursive: true, force: true }).finally(() => process.exit(signal === "SIGINT" ? 130 : 143));
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  return {
    dir,
    async dispose() {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Collect garbage before a memory measurement, so the figure is the operation's own
 * growth and not the previous phase's garbage. The child is started as plain
 * `node --import tsx`, without `--expose-gc`, so the flag is set at run time.
 */
export const collectGarbage: () => void = (() => {
  setFlagsFromString("--expose-gc");
  const gc = runInNewContext("gc") as unknown;
  return typeof gc === "function" ? (gc as () => void) : () => undefined;
})();

export interface RssGrowth {
  /** RSS when the measurement started. */
  readonly before: number;
  /** Highest RSS seen (sampled, and at the end). */
  readonly peak: number;
  /** `process.resourceUsage().maxRSS` (the process's lifetime peak) at start and end, in bytes. */
  readonly maxRssBefore: number;
  readonly maxRssAfter: number;
  /**
   * The larger of the sampled growth and the growth of the lifetime peak: sampling can
   * miss a spike shorter than the interval; the lifetime peak hides growth that stays
   * under an earlier phase's peak. Each covers the other's blind spot.
   */
  readonly growth: number;
  /** Minor page faults meanwhile: each is a fresh page of memory touched, so churn through new buffers shows here. */
  readonly minorPageFaults: number;
}

/**
 * Run `fn` while sampling RSS every `intervalMs`. The operation must yield to the
 * event loop now and then (every streamed chunk does), or the sampler sees only the
 * start and the end.
 */
export async function measureRss<T>(fn: () => Promise<T>, intervalMs = 5): Promise<{ result: T; rss: RssGrowth }> {
  const before = process.memoryUsage.rss();
  const usageBefore = process.resourceUsage();
  const maxRssBefore = usageBefore.maxRSS * 1024;
  let peak = before;
  const timer = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
  }, intervalMs);
  try {
    const result = await fn();
    peak = Math.max(peak, process.memoryUsage.rss());
    const usageAfter = process.resourceUsage();
    const maxRssAfter = usageAfter.maxRSS * 1024;
    const growth = Math.max(peak - before, maxRssAfter - maxRssBefore, 0);
    const minorPageFaults = usageAfter.minorPageFault - usageBefore.minorPageFault;
    return { result, rss: { before, peak, maxRssBefore, maxRssAfter, growth, minorPageFaults } };
  } finally {
    clearInterval(timer);
  }
}

/**
 * The machine and how busy it is: on a small machine shared with other work the
 * absolute figures swing a lot; the ratios (both sides measured in turn) much less.
 */
export function machineNote(): string {
  const cores = os.availableParallelism();
  const load = os.loadavg();
  const busy = load[0]! > cores * 0.75 ? ` (busy: other work is running; expect noisy figures)` : "";
  return `machine: ${cores} cores, ${os.cpus()[0]?.model.trim() ?? "unknown cpu"}, node ${process.version}; load average ${load.map((l) => l.toFixed(1)).join(" ")}${busy}`;
}
