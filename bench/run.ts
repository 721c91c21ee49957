import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
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
 */

const benchDir = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.dirname(benchDir);

const available = readdirSync(benchDir, { withFileTypes: true })
  .filter((e) => e.isFile() && e.name.endsWith(".ts") && e.name !== "run.ts")
  .map((e) => e.name.slice(0, -".ts".length))
  .sort();

const args = process.argv.slice(2);
if (args.includes("--help") || args.includes("-h") || args.includes("--list")) {
  console.log(`usage: npm run bench [-- name...]\nbenchmarks: ${available.join(", ")}`);
  process.exit(0);
}
const asked = args.map((a) => path.basename(a).replace(/\.ts$/, ""));
const unknown = asked.filter((a) => !available.includes(a));
if (unknown.length > 0) {
  console.error(`no such benchmark: ${unknown.join(", ")} (there are: ${available.join(", ")})`);
  process.exit(1);
}
const chosen = asked.length > 0 ? asked : available;

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
  const child = spawn(process.execPath, ["--import", "tsx", path.join("bench", `${name}.ts`)], {
    cwd: repoRoot,
    stdio: ["inherit", "pipe", "inherit"],
  });
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

console.log("\n=== summary ===");
for (const o of outcomes) {
  const how = o.code === 0 ? "ran" : o.signal !== null ? `killed by ${o.signal}` : `exited ${o.code ?? "without starting"}`;
  console.log(`${o.name}: ${how} in ${o.seconds.toFixed(1)} s`);
  for (const line of o.verdicts) console.log(`  ${line}`);
}
process.exitCode = outcomes.every((o) => o.code === 0) ? 0 : 1;
