import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";

/** One frame of a V8 CPU profile. */
export interface CallFrame {
  readonly functionName: string;
  readonly url: string;
  readonly lineNumber: number;
  readonly columnNumber: number;
}

/** The part of a V8 CPU profile (`node --cpu-prof`) the benchmarks read. */
export interface CpuProfile {
  readonly nodes: readonly { readonly id: number; readonly callFrame: CallFrame; readonly children?: readonly number[] }[];
  readonly startTime: number;
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

/** `node --cpu-prof` writing to `dir`, sampling every `intervalUs`. */
export const cpuProfArgs = (dir: string, intervalUs: number): string[] => [
  "--cpu-prof",
  "--cpu-prof-interval",
  String(intervalUs),
  "--cpu-prof-dir",
  dir,
];

/** The main thread's profile in `dir` (a loader thread, such as tsx's, writes one too: thread id != 0). */
export function readMainThreadProfile(dir: string): CpuProfile {
  const file = readdirSync(dir).find((f) => /^CPU\.\d+\.\d+\.\d+\.0\.\d+\.cpuprofile$/.test(f));
  if (file === undefined) throw new Error(`no main-thread profile in ${dir}: ${readdirSync(dir).join(", ")}`);
  return JSON.parse(readFileSync(path.join(dir, file), "utf8")) as CpuProfile;
}

/**
 * Every sample of `profile`, sorted by `kindOf` (given the sample's stack, innermost
 * frame first; decided once per distinct stack) and handed to `add` with the time it
 * was taken (the profile's monotonic clock, microseconds) and the microseconds it
 * stands for. A sample whose kind is `undefined` is left out.
 */
export function tallySamples<K>(
  profile: CpuProfile,
  kindOf: (stack: readonly CallFrame[]) => K | undefined,
  add: (kind: K, atUs: number, us: number) => void,
): void {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parentOf = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parentOf.set(c, n.id);
  const memo = new Map<number, K | undefined>();
  const classify = (leaf: number): K | undefined => {
    if (memo.has(leaf)) return memo.get(leaf);
    const stack: CallFrame[] = [];
    for (let id: number | undefined = leaf; id !== undefined; id = parentOf.get(id)) stack.push(byId.get(id)!.callFrame);
    const kind = kindOf(stack);
    memo.set(leaf, kind);
    return kind;
  };
  let at = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    at += profile.timeDeltas[i] ?? 0;
    const kind = classify(profile.samples[i]!);
    if (kind !== undefined) add(kind, at, profile.timeDeltas[i + 1] ?? 0);
  }
}
