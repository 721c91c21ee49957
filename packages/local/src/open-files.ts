import { readFileSync } from "node:fs";

/**
 * The soft limit on this process's open files (RLIMIT_NOFILE), where the system
 * says it: Linux's `/proc/self/limits`. Node has no getrlimit, and a child's
 * `ulimit -n` would report the child's. Undefined elsewhere, or when unlimited.
 */
export function softOpenFileLimit(limitsFile = "/proc/self/limits"): number | undefined {
  let text: string;
  try {
    text = readFileSync(limitsFile, "utf8");
  } catch {
    return undefined;
  }
  const soft = /^Max open files\s+(\S+)/m.exec(text)?.[1];
  if (soft === undefined || !/^\d+$/.test(soft)) return undefined;
  return Number(soft);
}

/** Where the soft limit cannot be read: the commonest default soft limit. */
const ASSUMED_OPEN_FILES = 1024;

/**
 * The most HTTP connections to hold at once: `configured` when set (> 0), else the
 * soft open-file limit less `reserve` (descriptors the store, reports and the broker
 * need), never below 16. `soft`: `softOpenFileLimit()`, or undefined where unknown (1024 assumed).
 */
export function connectionCap(configured: number, reserve: number, soft: number | undefined): number {
  if (configured > 0) return configured;
  return Math.max(16, (soft ?? ASSUMED_OPEN_FILES) - reserve);
}
