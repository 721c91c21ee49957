import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createTokenService } from "@mam/api";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import { randomIds, registerJob, systemClock } from "@mam/core";
import { type BuildOptions, build, type Metafile } from "esbuild";
import { startDynalite } from "../tests/support/aws-peers.ts";
import { fixed, grouped, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";

/**
 * What the Lambda bundles hold, and what the http function's cold start costs.
 *
 * Sizes: each function bundled as `npm run package` bundles it, split by where the
 * bytes come from (esbuild's metafile): our own code (inputs not under
 * node_modules), the AWS SDK (@aws-sdk/*, @smithy/*, and the packages only they
 * import), and the other dependencies (hono, zod, ...). Goal: <= 600 KiB of our own
 * code in each bundle.
 *
 * Cold start: a fresh `node` process loads the http bundle (the AWS SDK is bundled,
 * so every module it uses is loaded and counted here) and answers one recorded
 * `GET /v1/jobs/{id}` (API Gateway HTTP API event) for a job that exists in a
 * dynalite started, with its table and job, before any timing. Timed from spawn to
 * the answer arriving on the child's stdout; median of MAM_BENCH_COLD_STARTS (10).
 * Baseline, measured the same way in turn: a bare hono/aws-lambda hello world
 * bundled with the same options. Both run with NODE_OPTIONS=--enable-source-maps,
 * as serverless.yml deploys them. Goal: mam <= 1.5x the baseline.
 */

const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const COLD_STARTS = sizeFromEnv("MAM_BENCH_COLD_STARTS", process.env.MAM_BENCH_COLD_STARTS, 10);
const OWN_GOAL_BYTES = 600 * 1024;
const RATIO_GOAL = 1.5;
const KiB = 1024;
const DEPLOYED_NODE_OPTIONS = "--enable-source-maps";

/** As scripts/package.mjs ENTRIES (it exports nothing: it packages when imported). */
const FUNCTIONS = {
  http: "functions/http.ts",
  "stream-publisher": "functions/stream-publisher.ts",
  "recovery-sweep": "functions/recovery-sweep.ts",
} as const;
const BASELINE = { name: "hello", entry: "bench/support/hello-lambda.ts" } as const;
const DRIVER = path.join(ROOT, "bench", "support", "lambda-cold-start.mjs");

/**
 * scripts/package.mjs's `bundle()` options, replicated: that script exports no build
 * function and runs the whole packaging (osls included) when imported. Keep the two
 * in step.
 */
const BANNER = [
  'import { createRequire as __mamCreateRequire } from "node:module";',
  "const require = __mamCreateRequire(import.meta.url);",
].join("\n");
function packageOptions(name: string, entry: string, outdir: string): BuildOptions & { metafile: true } {
  return {
    absWorkingDir: ROOT,
    entryPoints: { [name]: entry },
    outdir,
    outExtension: { ".js": ".mjs" },
    bundle: true,
    platform: "node",
    target: "node20",
    format: "esm",
    mainFields: ["module", "main"],
    minify: true,
    sourcemap: "linked",
    sourcesContent: false,
    legalComments: "none",
    banner: { js: BANNER },
    metafile: true,
    logLevel: "warning",
  };
}

// ---------------------------------------------------------------- sizes

interface Bundle {
  readonly name: string;
  readonly file: string;
  readonly bytes: number;
  readonly mapBytes: number;
  readonly metafile: Metafile;
  /** The entry point's input path. */
  readonly entry: string;
  /** The bundle's inputs with the bytes each left in the output. */
  readonly inputs: Readonly<Record<string, number>>;
}

async function bundleOne(name: string, entry: string, outRoot: string): Promise<Bundle> {
  const outdir = path.join(outRoot, name);
  const { metafile } = await build(packageOptions(name, entry, outdir));
  const outputs = Object.entries(metafile.outputs);
  const js = outputs.find(([file]) => file.endsWith(".mjs"));
  const map = outputs.find(([file]) => file.endsWith(".mjs.map"));
  if (js === undefined) throw new Error(`esbuild wrote no .mjs for ${name}`);
  return {
    name,
    file: path.join(outdir, `${name}.mjs`),
    bytes: js[1].bytes,
    mapBytes: map?.[1].bytes ?? 0,
    metafile,
    entry: js[1].entryPoint ?? entry,
    inputs: Object.fromEntries(Object.entries(js[1].inputs).map(([input, { bytesInOutput }]) => [input, bytesInOutput])),
  };
}

/** `node_modules/@smithy/core/dist-es/x.js` -> `@smithy/core`; our own files -> undefined. */
function packageOf(input: string): string | undefined {
  const at = input.lastIndexOf("node_modules/");
  if (at < 0) return undefined;
  const parts = input.slice(at + "node_modules/".length).split("/");
  return parts[0]?.startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0];
}

const isSdkPackage = (pkg: string) => pkg.startsWith("@aws-sdk/") || pkg.startsWith("@smithy/");

/** `packages/api/src/app.ts` -> `packages/api`; `functions/compose.ts` -> `functions`. */
function ownArea(input: string): string {
  const parts = input.split("/");
  return parts[0] === "packages" ? `packages/${parts[1]}` : (parts[0] ?? input);
}

interface Split {
  readonly own: number;
  readonly sdk: number;
  /** Non-SDK packages that only the SDK imports (counted in `sdk` too). */
  readonly sdkOnlyDeps: number;
  readonly sdkOnlyNames: readonly string[];
  readonly other: number;
  /** The output's bytes that come from no input: the banner and esbuild's runtime helpers. */
  readonly glue: number;
  readonly byPackage: ReadonlyMap<string, number>;
  readonly ownFiles: ReadonlyMap<string, number>;
}

/**
 * Split a bundle's bytes. A non-SDK package counts as the SDK's when our code and
 * the other deps cannot reach it without going through SDK code (the import graph in
 * the metafile): e.g. mnemonist, imported by @aws-sdk/endpoint-cache.
 */
function split(bundle: Bundle): Split {
  const graph = bundle.metafile.inputs;
  const reached = new Set<string>();
  const queue = [bundle.entry];
  for (let next = queue.pop(); next !== undefined; next = queue.pop()) {
    if (reached.has(next)) continue;
    reached.add(next);
    for (const imp of graph[next]?.imports ?? []) {
      const pkg = packageOf(imp.path);
      if (imp.external !== true && !(pkg !== undefined && isSdkPackage(pkg))) queue.push(imp.path);
    }
  }
  let own = 0;
  let sdk = 0;
  let sdkOnlyDeps = 0;
  let other = 0;
  const sdkOnlyNames = new Set<string>();
  const byPackage = new Map<string, number>();
  const ownFiles = new Map<string, number>();
  for (const [input, bytes] of Object.entries(bundle.inputs)) {
    const pkg = packageOf(input);
    if (pkg === undefined) {
      own += bytes;
      ownFiles.set(input, bytes);
      byPackage.set(`(ours) ${ownArea(input)}`, (byPackage.get(`(ours) ${ownArea(input)}`) ?? 0) + bytes);
      continue;
    }
    byPackage.set(pkg, (byPackage.get(pkg) ?? 0) + bytes);
    if (isSdkPackage(pkg)) sdk += bytes;
    else if (!reached.has(input)) {
      sdk += bytes;
      sdkOnlyDeps += bytes;
      if (bytes > 0) sdkOnlyNames.add(pkg);
    } else other += bytes;
  }
  return {
    own,
    sdk,
    sdkOnlyDeps,
    sdkOnlyNames: [...sdkOnlyNames].sort(),
    other,
    glue: bundle.bytes - own - sdk - other,
    byPackage,
    ownFiles,
  };
}

const kib = (bytes: number, digits = 1) => fixed(bytes / KiB, digits);
const pad = (s: string, n: number) => s.padStart(n);

function printSizes(bundles: readonly Bundle[]): Map<string, Split> {
  const splits = new Map(bundles.map((b) => [b.name, split(b)]));
  console.log("\nbundle sizes (KiB; esbuild metafile bytes in output, minified):");
  console.log(`${"".padEnd(18)}${pad(".mjs", 9)}${pad(".map", 9)}${pad("ours", 9)}${pad("AWS SDK", 9)}${pad("other", 9)}${pad("glue", 7)}`);
  for (const b of bundles) {
    const s = splits.get(b.name)!;
    console.log(
      `${b.name.padEnd(18)}${pad(kib(b.bytes), 9)}${pad(kib(b.mapBytes), 9)}${pad(kib(s.own), 9)}${pad(kib(s.sdk), 9)}${pad(kib(s.other), 9)}${pad(kib(s.glue), 7)}`,
    );
  }
  const http = bundles.find((b) => b.name === "http");
  if (http !== undefined) {
    const s = splits.get("http")!;
    console.log(
      `  AWS SDK = @aws-sdk/*, @smithy/* and what only they import (${kib(s.sdkOnlyDeps)} KiB in http: ${s.sdkOnlyNames.join(", ")}); ` +
        `glue = banner + esbuild runtime helpers`,
    );
    console.log("  http bundle, top packages by bytes in output:");
    const top = [...s.byPackage].sort((a, b) => b[1] - a[1]).slice(0, 12);
    for (const [pkg, bytes] of top) console.log(`    ${pad(kib(bytes), 7)} KiB  ${pkg}`);
    console.log("  http bundle, our largest files:");
    for (const [file, bytes] of [...s.ownFiles].sort((a, b) => b[1] - a[1]).slice(0, 6))
      console.log(`    ${pad(kib(bytes), 7)} KiB  ${file}`);
  }
  return splits;
}

// ---------------------------------------------------------------- cold start

interface ColdStart {
  /** Parent's clock: spawn to the answer line read from the child's stdout. */
  readonly ms: number;
  /** Child's clock (ms since its process started): driver began, bundle imported, handler answered. */
  readonly started: number;
  readonly imported: number;
  readonly answered: number;
  readonly statusCode: number;
  readonly body: string;
}

const SIGNING_KEY = "bench-signing-key-0123456789abcdef-0123456789";
const JOB_ID = "job-fixture-1";

function coldStart(
  bundleFile: string,
  eventFile: string,
  env: Record<string, string>,
  extraArgs: readonly string[] = [],
): Promise<ColdStart> {
  const spawned = performance.now();
  const child = spawn(process.execPath, [...extraArgs, DRIVER, bundleFile, eventFile], { env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  let result: ColdStart | undefined;
  child.stdout.setEncoding("utf8").on("data", (s: string) => {
    out += s;
    if (result !== undefined) return;
    const line = /^MAM_COLD_START (.*)$/m.exec(out)?.[1];
    if (line === undefined) return;
    const ms = performance.now() - spawned;
    const r = JSON.parse(line) as { started: number; imported: number; answered: number; response: { statusCode: number; body: string } };
    result = {
      ms,
      started: r.started,
      imported: r.imported,
      answered: r.answered,
      statusCode: r.response.statusCode,
      body: r.response.body,
    };
  });
  child.stderr.setEncoding("utf8").on("data", (s: string) => {
    err += s;
  });
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => {
      if (code === 0 && result !== undefined) resolve(result);
      else reject(new Error(`cold start of ${bundleFile} exited ${code}: ${err.trim() || out.trim()}`));
    });
  });
}

/** The recorded GET event, carrying a real operator token. */
function getJobEvent(token: string): unknown {
  const event = JSON.parse(readFileSync(path.join(ROOT, "fixtures", "lambda", "http-api-v2-get-job.json"), "utf8")) as {
    headers: Record<string, string>;
  };
  return { ...event, headers: { ...event.headers, authorization: `Bearer ${token}` } };
}

interface Side {
  readonly name: string;
  readonly file: string;
  readonly runs: ColdStart[];
}

async function measureColdStarts(sides: readonly Side[], eventFile: string, env: Record<string, string>, runs: number): Promise<void> {
  // One untimed start each first: the bundle file and node itself into the page cache.
  for (const side of sides) await coldStart(side.file, eventFile, env);
  for (let run = 1; run <= runs; run++) {
    for (const side of sides) side.runs.push(await coldStart(side.file, eventFile, env));
  }
}

function describeRuns(side: Side): string {
  const m = (pick: (r: ColdStart) => number) => fixed(median(side.runs.map(pick)));
  return (
    `${side.name}: median ${m((r) => r.ms)} ms spawn-to-answer ` +
    `(node start ${m((r) => r.started)} ms, import ${m((r) => r.imported - r.started)} ms, first request ${m((r) => r.answered - r.imported)} ms); ` +
    `runs ${side.runs.map((r) => fixed(r.ms, 0)).join(" ")}`
  );
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-bundles-");
const dynalite = await startDynalite();
try {
  const bundles: Bundle[] = [];
  for (const [name, entry] of Object.entries(FUNCTIONS)) bundles.push(await bundleOne(name, entry, tmp.dir));
  const hello = await bundleOne(BASELINE.name, BASELINE.entry, tmp.dir);
  const splits = printSizes([...bundles, hello]);
  const worstOwn = Math.max(...bundles.map((b) => splits.get(b.name)!.own));
  const worstNonSdk = Math.max(...bundles.map((b) => splits.get(b.name)!.own + splits.get(b.name)!.other));

  // The peer, its table and the job exist before any timing starts.
  const table = "mam-bench-cold-start";
  await createJobTable(dynalite.client, table);
  const jobs = new DynamoJobStore({ client: dynalite.client, tableName: table });
  await registerJob(
    { jobs, clock: systemClock, ids: randomIds },
    { job_id: JOB_ID, prompt: "Fix the flaky test in tests/unit", agent: "claude-code", expected_artifacts: ["commit"] },
  );
  const token = createTokenService({ signingKey: SIGNING_KEY, clock: systemClock }).mintOperator(["read", "write", "gate", "ops"]);
  const eventFile = path.join(tmp.dir, "get-job-event.json");
  writeFileSync(eventFile, JSON.stringify(getJobEvent(token)));

  // What a Lambda container has: no inherited shell settings, no ~/.aws files.
  const env = (nodeOptions: string): Record<string, string> => ({
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    HOME: tmp.dir,
    NODE_OPTIONS: nodeOptions,
    AWS_REGION: "us-east-1",
    AWS_ACCESS_KEY_ID: "bench",
    AWS_SECRET_ACCESS_KEY: "bench",
    MAM_TABLE_NAME: table,
    MAM_BUCKET_NAME: "mam-bench-reports",
    MAM_IOT_ENDPOINT: "http://127.0.0.1:9",
    MAM_DYNAMODB_ENDPOINT: dynalite.endpoint,
    MAM_TOKEN_SIGNING_KEY: SIGNING_KEY,
    MAM_REPORT_BODY_LIMIT: "4194304",
  });

  const http = bundles.find((b) => b.name === "http")!;
  const check = await coldStart(http.file, eventFile, env(DEPLOYED_NODE_OPTIONS));
  const answer = JSON.parse(check.body) as { job_id?: string };
  if (check.statusCode !== 200 || answer.job_id !== JOB_ID) throw new Error(`the http bundle answered ${check.statusCode}: ${check.body}`);
  console.log(`\ncold start: http answers GET /v1/jobs/${JOB_ID} with 200 and the record (checked before timing)`);
  console.log(
    `cold starts: ${COLD_STARTS} per side after one untimed start each, alternating sides, NODE_OPTIONS=${DEPLOYED_NODE_OPTIONS} (as deployed); ` +
      `the AWS SDK is inside the bundle (nothing external), so every module it loads is counted`,
  );
  const base: Side = { name: "hello (hono/aws-lambda)", file: hello.file, runs: [] };
  const mam: Side = { name: "mam http", file: http.file, runs: [] };
  await measureColdStarts([base, mam], eventFile, env(DEPLOYED_NODE_OPTIONS), COLD_STARTS);
  console.log(describeRuns(base));
  console.log(describeRuns(mam));
  const ratio = median(mam.runs.map((r) => r.ms)) / median(base.runs.map((r) => r.ms));

  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
  console.log(
    `bundles: our own code ${kib(worstOwn)} KiB in the largest (goal <= ${OWN_GOAL_BYTES / KiB} KiB) ${verdict(worstOwn <= OWN_GOAL_BYTES)}; ` +
      `ours + non-SDK deps ${kib(worstNonSdk)} KiB; http .mjs ${kib(http.bytes)} KiB`,
  );
  console.log(
    `cold start: ratio ${ratio.toFixed(2)}x hello (goal <= ${RATIO_GOAL}x) ${verdict(ratio <= RATIO_GOAL)}; ` +
      `mam ${fixed(median(mam.runs.map((r) => r.ms)))} ms, hello ${fixed(median(base.runs.map((r) => r.ms)))} ms (${grouped(COLD_STARTS)} each)`,
  );
} finally {
  await dynalite.close();
  await tmp.dispose();
}
