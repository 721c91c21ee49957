import { spawn } from "node:child_process";
import { readdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/**
 * `npm run bench [-- name...]`: run the benchmarks in this folder one after another,
 * each in a child process of its own (`node --import tsx bench/<name>.ts`), so each
 * one's peak RSS and warm-up are its own. Their output is forwarded as it comes; the
 * closing summary repeats each one's verdict lines (any line naming a goal with PASS
 * or FAIL).
 *
 * Benchmarks print PASS/FAIL against their goals but assert nothing: the exit code
 * is non-zero only when a benchmark could not run (it crashed or was killed).
 *
 * `--smoke` runs each one once at a tiny size (SMOKE below), with a time limit, to
 * show that every benchmark still runs to its end; its figures mean nothing. With
 * MAM_JSON_REPORT set (as .ci/run sets it for every tier), the run also writes a
 * report shaped like vitest's JSON reporter's: one test per benchmark, passed when
 * it ran to its end, failed when it crashed, was killed or ran out of time.
 */

const benchDir = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.dirname(benchDir);

const available = readdirSync(benchDir, { withFileTypes: true })
  .filter((e) => e.isFile() && e.name.endsWith(".ts") && e.name !== "run.ts")
  .map((e) => e.name.slice(0, -".ts".length))
  .sort();

/**
 * Each benchmark's knobs for `--smoke`: the smallest sizes at which it still takes
 * every step. A benchmark missing here runs at its full size (and says so).
 */
const SMOKE: Readonly<Record<string, Readonly<Record<string, string>>>> = {
  bundles: { MAM_BENCH_COLD_STARTS: "1" },
  feed: { MAM_BENCH_FEED_ROWS: "2000", MAM_BENCH_FEED_ROUNDS: "1" },
  hash: { MAM_BENCH_HASH_BYTES: "4M" },
  "hook-cold-start": { MAM_BENCH_HOOK_COLD_STARTS: "1" },
  http: { MAM_BENCH_HTTP_ROUNDS: "1", MAM_BENCH_HTTP_SECONDS: "1" },
  notify: { MAM_BENCH_NOTIFY: "200", MAM_BENCH_NOTIFY_RATE: "200", MAM_BENCH_NOTIFY_WORKERS: "4" },
  observe: { MAM_BENCH_OBSERVE_JOBS: "4", MAM_BENCH_OBSERVE_PER_JOB: "6", MAM_BENCH_OBSERVE_ROUNDS: "1" },
  subscribers: {
    MAM_BENCH_SUBSCRIBERS_N: "20",
    MAM_BENCH_SUBSCRIBERS_SESSIONS: "40",
    MAM_BENCH_SUBSCRIBERS_STALLED: "2",
    MAM_BENCH_SUBSCRIBERS_JUNK: "1",
  },
  sweep: { MAM_BENCH_SWEEP_JOBS: "200", MAM_BENCH_SWEEP_DUE: "5", MAM_BENCH_SWEEP_ROUNDS: "1" },
  transitions: { MAM_BENCH_TRANSITIONS: "1000" },
};
/** A smoke run that takes longer than this is stuck: it is killed and counts as a failure. */
const SMOKE_LIMIT_S = 300;

const args = process.argv.slice(2);
if (args.includes("--help") || args.includes("-h") || args.includes("--list")) {
  console.log(`usage: npm run bench [-- [--smoke] name...]\nbenchmarks: ${available.join(", ")}`);
  process.exit(0);
}
const smoke = args.includes("--smoke");
const asked = args.filter((a) => a !== "--smoke").map((a) => path.basename(a).replace(/\.ts$/, ""));
const unknown = asked.filter((a) => !available.includes(a));
if (unknown.length > 0) {
  console.error(`no such benchmark: ${unknown.join(", ")} (there are: ${available.join(", ")})`);
  process.exit(1);
}
const chosen = asked.length > 0 ? asked : available;
const jsonReport = process.env.MAM_JSON_REPORT;

interface Outcome {
  readonly name: string;
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly seconds: number;
  /** The benchmark's verdict lines: every stdout line that names a goal and says PASS or FAIL. */
  readonly verdicts: readonly string[];
}

const VERDICT = /\(goal [^)]*\).*\b(PASS|FAIL)\b/;

function runOne(name: string): Promise<Outcome> {
  const started = performance.now();
  const { MAM_JSON_REPORT: _report, ...inherited } = process.env;
  const knobs = smoke ? SMOKE[name] : undefined;
  const sizes = knobs ? Object.entries(knobs).map(([k, v]) => `${k}=${v}`) : ["none set for it (SMOKE in bench/run.ts): full size"];
  if (smoke) console.log(`smoke: ${sizes.join(" ")}`);
  const child = spawn(process.execPath, ["--import", "tsx", path.join("bench", `${name}.ts`)], {
    cwd: repoRoot,
    env: { ...inherited, ...knobs },
    stdio: ["inherit", "pipe", "inherit"],
  });
  const limit = smoke
    ? setTimeout(() => {
        console.error(`${name}: still running after ${SMOKE_LIMIT_S} s in a smoke run: killing it`);
        child.kill("SIGTERM");
      }, SMOKE_LIMIT_S * 1000)
    : undefined;
  const verdicts: string[] = [];
  const keep = (line: string) => {
    if (VERDICT.test(line)) verdicts.push(line);
  };
  let partial = "";
  child.stdout.setEncoding("utf8").on("data", (text: string) => {
    process.stdout.write(text);
    const lines = (partial + text).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) keep(line);
  });
  const done = (code: number | null, signal: NodeJS.Signals | null): Outcome => {
    clearTimeout(limit);
    keep(partial);
    return { name, code, signal, seconds: (performance.now() - started) / 1000, verdicts };
  };
  return new Promise((resolve) => {
    child.once("error", (e) => {
      console.error(`${name}: could not start: ${e.message}`);
      resolve(done(null, null));
    });
    child.once("close", (code, signal) => resolve(done(code, signal)));
  });
}

const outcomes: Outcome[] = [];
for (const name of chosen) {
  console.log(`\n=== bench/${name}.ts ===`);
  outcomes.push(await runOne(name));
}

const how = (o: Outcome) => (o.code === 0 ? "ran" : o.signal !== null ? `killed by ${o.signal}` : `exited ${o.code ?? "without starting"}`);

console.log(`\n=== summary${smoke ? " (smoke: tiny sizes, the verdicts mean nothing)" : ""} ===`);
for (const o of outcomes) {
  console.log(`${o.name}: ${how(o)} in ${o.seconds.toFixed(1)} s`);
  for (const line of o.verdicts) console.log(`  ${line}`);
}
if (jsonReport) writeFileSync(jsonReport, `${JSON.stringify(vitestLikeReport(outcomes), null, 2)}\n`);
process.exitCode = outcomes.every((o) => o.code === 0) ? 0 : 1;

/**
 * The fields of vitest's JSON report that .ci/run reads: one file per benchmark,
 * holding one test, "runs to its end", passed when the benchmark exited 0.
 */
function vitestLikeReport(all: readonly Outcome[]) {
  const passed = all.filter((o) => o.code === 0).length;
  return {
    numTotalTestSuites: all.length,
    numPassedTestSuites: passed,
    numFailedTestSuites: all.length - passed,
    numTotalTests: all.length,
    numPassedTests: passed,
    numFailedTests: all.length - passed,
    numPendingTests: 0,
    numTodoTests: 0,
    success: passed === all.length,
    testResults: all.map((o) => {
      const status = o.code === 0 ? "passed" : "failed";
      return {
        name: path.join(repoRoot, "bench", `${o.name}.ts`),
        status,
        message: o.code === 0 ? "" : `bench/${o.name}.ts ${how(o)}`,
        assertionResults: [
          {
            fullName: `bench/${o.name}.ts runs to its end${smoke ? " (smoke)" : ""}`,
            title: "runs to its end",
            status,
            duration: Math.round(o.seconds * 1000),
            failureMessages: o.code === 0 ? [] : [`bench/${o.name}.ts ${how(o)} after ${o.seconds.toFixed(1)} s`],
          },
        ],
      };
    }),
  };
}
