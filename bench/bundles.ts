import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { SourceMap } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createTokenService } from "@mam/api";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import { randomIds, registerJob, systemClock } from "@mam/core";
import { build, type Metafile, type Plugin } from "esbuild";
import { parseDocument } from "yaml";
import { buildDashboard } from "../packages/dashboard/build.mjs";
import { LAMBDA_ENTRIES, lambdaBuildOptions } from "../scripts/lambda-bundle.mjs";
import { startDynalite } from "../tests/support/aws-peers.ts";
import { type CallFrame, type CpuProfile, cpuProfArgs, readMainThreadProfile, tallySamples } from "./support/cpu-profile.ts";
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
 * bundled with the same options. Measured alongside, as a reference point: the same
 * shape doing one GetItem through @aws-sdk/lib-dynamodb (what the SDK alone costs).
 * All run with the NODE_OPTIONS serverless.yml deploys (read from it: none since the
 * cold-start work; the .map files still ship for debugging).
 * Goal: mam <= 1.15x the SDK reference (the floor the SDK itself sets: no function
 * that reads DynamoDB through the bundled SDK starts faster). The hello ratio is
 * printed beside it. The Lambda runtime's own SDK (nodejs22.x ships one) cannot be
 * measured here: the bundles carry their pinned SDK and use nothing of the runtime's.
 *
 * Where the goal is missed (or with MAM_BENCH_PROFILE=1): one cold start of each
 * under `node --cpu-prof`, its samples sorted by what they were doing (bundle code
 * by package, through the source map), split into loading and first request; and
 * the cost of --enable-source-maps, measured in turn. MAM_BENCH_WHAT_IF=1 adds
 * builds of the http function with dependencies stubbed out, to price the changes
 * bench/README.md recommends.
 */

const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const COLD_STARTS = sizeFromEnv("MAM_BENCH_COLD_STARTS", process.env.MAM_BENCH_COLD_STARTS, 10);
const OWN_GOAL_BYTES = 600 * 1024;
const RATIO_GOAL = 1.15;
const KiB = 1024;
/** NODE_OPTIONS exactly as serverless.yml deploys it (provider.environment; empty when unset). */
const DEPLOYED_NODE_OPTIONS = deployedNodeOptions();

function deployedMaps(): boolean {
  return DEPLOYED_NODE_OPTIONS.includes("--enable-source-maps");
}

function deployedNodeOptions(): string {
  const doc = parseDocument(readFileSync(path.join(ROOT, "serverless.yml"), "utf8"), { logLevel: "silent" });
  if (doc.errors.length > 0) throw new Error(`serverless.yml: ${doc.errors[0]?.message}`);
  const value = doc.getIn(["provider", "environment", "NODE_OPTIONS"]);
  if (value !== undefined && typeof value !== "string")
    throw new Error("serverless.yml: provider.environment.NODE_OPTIONS is not a string");
  return value ?? "";
}

const FUNCTIONS = LAMBDA_ENTRIES;
const BASELINE = { name: "hello", entry: "bench/support/hello-lambda.ts" } as const;
const SDK_REFERENCE = { name: "sdk-reference", entry: "bench/support/dynamodb-lambda.ts" } as const;
const DRIVER = path.join(ROOT, "bench", "support", "lambda-cold-start.mjs");

// ---------------------------------------------------------------- sizes

interface Bundle {
  readonly name: string;
  readonly file: string;
  readonly bytes: number;
  readonly mapBytes: number;
  /** Chunks loaded only on first use (dynamic imports), not at a cold start. */
  readonly lazyBytes: number;
  readonly metafile: Metafile;
  /** The entry point's input path. */
  readonly entry: string;
  /** The bundle's inputs with the bytes each left in the output. */
  readonly inputs: Readonly<Record<string, number>>;
}

async function bundleOne(name: string, entry: string, outRoot: string): Promise<Bundle> {
  const outdir = path.join(outRoot, name);
  const { metafile } = await build(lambdaBuildOptions(ROOT, name, entry, outdir));
  const outputs = metafile.outputs;
  const main = Object.entries(outputs).find(([file, o]) => file.endsWith(".mjs") && o.entryPoint === entry);
  if (main === undefined) throw new Error(`esbuild wrote no entry .mjs for ${name}`);
  // What a cold start loads: the entry and the chunks it imports statically. Chunks
  // reached only by a dynamic import (the S3 store) load on first use, and are
  // reported apart.
  const loaded = new Set<string>();
  const queue = [main[0]];
  for (let file = queue.pop(); file !== undefined; file = queue.pop()) {
    if (loaded.has(file)) continue;
    loaded.add(file);
    for (const i of outputs[file]?.imports ?? []) if (i.kind === "import-statement" && !i.external) queue.push(i.path);
  }
  const inputs: Record<string, number> = {};
  let bytes = 0;
  let mapBytes = 0;
  for (const file of loaded) {
    const o = outputs[file];
    if (o === undefined) continue;
    bytes += o.bytes;
    mapBytes += outputs[`${file}.map`]?.bytes ?? 0;
    for (const [input, { bytesInOutput }] of Object.entries(o.inputs)) inputs[input] = (inputs[input] ?? 0) + bytesInOutput;
  }
  const lazyBytes = Object.entries(outputs)
    .filter(([file]) => file.endsWith(".mjs") && !loaded.has(file))
    .reduce((n, [, o]) => n + o.bytes, 0);
  return {
    name,
    file: path.join(outdir, `${name}.mjs`),
    bytes,
    mapBytes,
    lazyBytes,
    metafile,
    entry: main[1].entryPoint ?? entry,
    inputs,
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
  console.log(
    `${"".padEnd(18)}${pad(".mjs", 9)}${pad(".map", 9)}${pad("ours", 9)}${pad("AWS SDK", 9)}${pad("other", 9)}${pad("glue", 7)}${pad("lazy", 9)}`,
  );
  for (const b of bundles) {
    const s = splits.get(b.name)!;
    console.log(
      `${b.name.padEnd(18)}${pad(kib(b.bytes), 9)}${pad(kib(b.mapBytes), 9)}${pad(kib(s.own), 9)}${pad(kib(s.sdk), 9)}${pad(kib(s.other), 9)}${pad(kib(s.glue), 7)}${pad(kib(b.lazyBytes), 9)}`,
    );
  }
  console.log(
    "  .mjs = what a cold start loads (the entry and its static chunks); lazy = chunks loaded on first use (the S3 store; SDK credential providers Lambda never needs)",
  );
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

/**
 * The dashboard's files, counted apart: the http function serves them from beside its
 * bundle (read on the first request for the page), so no cold start loads them and
 * none of their bytes is in the sizes above.
 */
async function printDashboard(): Promise<void> {
  const { sizes } = await buildDashboard(path.join(ROOT, ".bench-tmp", "dashboard"));
  const total = Object.values(sizes).reduce((a, b) => a + b, 0);
  console.log(
    `\ndashboard files beside the http bundle (not in it; read on the first request for the page): ${Object.entries(sizes)
      .map(([f, n]) => `${f} ${kib(n)} KiB`)
      .join(", ")}; ${kib(total)} KiB in all`,
  );
}

// ---------------------------------------------------------------- cold start

interface ColdStart {
  /** Parent's clock: spawn to the answer line read from the child's stdout. */
  readonly ms: number;
  /** Child's clock (ms since its process started): driver began, bundle imported, handler answered. */
  readonly started: number;
  readonly imported: number;
  readonly answered: number;
  /** The import's end on the monotonic clock (microseconds), as a --cpu-prof profile is stamped. */
  readonly importedClockUs: number;
  /** Child's CPU (user + system, ms) from its start to the answer: less sensitive to a busy machine than `ms`. */
  readonly cpuMs: number;
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
    const r = JSON.parse(line) as {
      started: number;
      imported: number;
      answered: number;
      importedClockUs: number;
      cpuMs: number;
      response: { statusCode: number; body: string };
    };
    const { started, imported, answered, importedClockUs, cpuMs } = r;
    result = { ms, started, imported, answered, importedClockUs, cpuMs, statusCode: r.response.statusCode, body: r.response.body };
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
  /** The child's environment, when not the one the whole measurement uses. */
  readonly env?: Record<string, string>;
}

async function measureColdStarts(sides: readonly Side[], eventFile: string, env: Record<string, string>, runs: number): Promise<void> {
  // One untimed start each first: the bundle file and node itself into the page cache.
  for (const side of sides) await coldStart(side.file, eventFile, side.env ?? env);
  for (let run = 1; run <= runs; run++) {
    for (const side of sides) side.runs.push(await coldStart(side.file, eventFile, side.env ?? env));
  }
}

function describeRuns(side: Side): string {
  const m = (pick: (r: ColdStart) => number) => fixed(median(side.runs.map(pick)));
  return (
    `${side.name}: median ${m((r) => r.ms)} ms spawn-to-answer ` +
    `(node start ${m((r) => r.started)} ms, import ${m((r) => r.imported - r.started)} ms, first request ${m((r) => r.answered - r.imported)} ms; ` +
    `CPU ${m((r) => r.cpuMs)} ms); ` +
    `runs ${side.runs.map((r) => fixed(r.ms, 0)).join(" ")}`
  );
}

// ---------------------------------------------------------------- where the time goes

/**
 * Sort every sample of one cold start's profile into what it was doing, by the
 * innermost frame that says so: bundle code is named by the package its source map
 * points to; Node's own work by kind (loading a built-in such as the undici behind
 * Request/Response on first use, compiling the bundle, --enable-source-maps' own
 * work). Split at the import's end: loading the bundle, then the first request.
 */
function whereTheTimeGoes(
  profile: CpuProfile,
  bundleFile: string,
  importedClockUs: number,
): Map<string, { load: number; request: number }> {
  const bundleUrl = `file://${bundleFile}`;
  const map = new SourceMap(JSON.parse(readFileSync(`${bundleFile}.map`, "utf8")) as ConstructorParameters<typeof SourceMap>[0]);
  const kindOf = (stack: readonly CallFrame[]): string => {
    const top = stack[0];
    if (top !== undefined && top.url === "") {
      const native = { "(garbage collector)": "garbage collection", "(idle)": "idle (waiting on I/O)", "(program)": "V8 native (program)" }[
        top.functionName
      ];
      return native ?? `V8 native ${top.functionName}`;
    }
    for (const frame of stack) {
      if (frame.functionName === "maybeCacheSourceMap") return "Node: --enable-source-maps bookkeeping";
      if (["requireBuiltin", "compileForPublicLoader", "compileForInternalLoader"].includes(frame.functionName))
        return "Node: built-ins loaded on first use (undici for Request/Response, http, crypto...)";
      if (frame.url === bundleUrl) {
        const source = map.findEntry(frame.lineNumber, frame.columnNumber) as { originalSource?: string };
        const input = source.originalSource?.replace(/^(\.\.\/)+/, "").replace(/^.*?\/node_modules\//, "node_modules/");
        return input === undefined
          ? "bundle: module top level, esbuild init helpers"
          : `bundle: ${packageOf(input) ?? `(ours) ${ownArea(input.replace(/^.*?\/(packages|functions|bench)\//, "$1/"))}`}`;
      }
      if (frame.functionName === "compileSourceTextModule") return "V8: compiling the bundle (parse)";
      if (frame.url.endsWith("lambda-cold-start.mjs")) return "driver";
    }
    return "Node: start-up and module loader";
  };
  const out = new Map<string, { load: number; request: number }>();
  tallySamples(profile, kindOf, (kind, at, us) => {
    const row = out.get(kind) ?? { load: 0, request: 0 };
    if (at <= importedClockUs) row.load += us / 1000;
    else row.request += us / 1000;
    out.set(kind, row);
  });
  return out;
}

async function profileColdStart(side: Side, eventFile: string, env: Record<string, string>, dir: string): Promise<void> {
  const profDir = path.join(dir, `profile-${side.name.replace(/\W+/g, "-")}`);
  const run = await coldStart(side.file, eventFile, env, cpuProfArgs(profDir, 250));
  const rows = [...whereTheTimeGoes(readMainThreadProfile(profDir), side.file, run.importedClockUs)];
  const sum = (pick: (r: { load: number; request: number }) => number) => rows.reduce((n, [, r]) => n + pick(r), 0);
  console.log(
    `  ${side.name}, one profiled cold start (node --cpu-prof, 250 us samples; the profiler slows it): ${fixed(run.ms)} ms spawn-to-answer, ` +
      `${fixed(sum((r) => r.load))} ms sampled loading + ${fixed(sum((r) => r.request))} ms first request`,
  );
  console.log(`    ${"load ms".padStart(8)} ${"req ms".padStart(7)}  what`);
  for (const [kind, r] of rows.sort((a, b) => b[1].load + b[1].request - (a[1].load + a[1].request)).slice(0, 14)) {
    console.log(`    ${pad(fixed(r.load), 8)} ${pad(fixed(r.request), 7)}  ${kind}`);
  }
}

/**
 * What-if builds of the http function (MAM_BENCH_WHAT_IF=1): the same entry and
 * options with one dependency replaced by a stub, each of which still answers the
 * measured request (the signing key comes from the environment, S3 is built lazily,
 * Lambda hands the role's credentials over as environment variables). They put a
 * figure on each change recommended in bench/README.md; they are not shipped.
 */
const STUBS: Readonly<Record<string, Record<string, string>>> = {
  // The SSM client, S3, credential-chain and Powertools Metrics stubs this had are
  // done for real (each loaded lazily, credentials from the environment). What is
  // left is @mam/api's own shape (bench/README.md), which no stub can stand in for
  // and still answer the request. Add a variant here to price a change:
  //   "no X": { "x-package": "export ... // a stub that still answers the GET" },
};

function stubPlugin(modules: Readonly<Record<string, string>>): Plugin {
  const names = Object.keys(modules);
  return {
    name: "bench-stubs",
    setup(b) {
      b.onResolve({ filter: /^@aws-sdk\// }, (args) =>
        names.includes(args.path) ? { path: args.path, namespace: "bench-stub" } : undefined,
      );
      b.onLoad({ filter: /.*/, namespace: "bench-stub" }, (args) => ({
        contents: modules[args.path] ?? "",
        loader: "js",
        resolveDir: ROOT,
      }));
    },
  };
}

async function whatIf(
  mam: Side,
  hello: Side,
  eventFile: string,
  deployed: Record<string, string>,
  /** The deployed NODE_OPTIONS with --enable-source-maps flipped (added when not deployed, removed when deployed). */
  flippedMaps: Record<string, string>,
  dir: string,
) {
  const stubs: [string, Record<string, string>][] = Object.entries(STUBS);
  if (stubs.length === 0) {
    console.log("\nwhat if (MAM_BENCH_WHAT_IF=1): no stubs left to price (STUBS in bench/bundles.ts)");
    return;
  }
  const variants =
    stubs.length > 1 ? [...stubs, ["all stubs", Object.assign({}, ...stubs.map(([, m]) => m))] as [string, Record<string, string>]] : stubs;
  const sides: Side[] = [
    { name: hello.name, file: hello.file, runs: [] },
    { name: "mam http (as is)", file: mam.file, runs: [] },
  ];
  const sizes = new Map<string, number>();
  for (const [label, modules] of variants) {
    const name = `http-${label.replace(/\W+/g, "-")}`;
    const options = lambdaBuildOptions(ROOT, name, FUNCTIONS.http, path.join(dir, name));
    const { metafile } = await build({ ...options, plugins: [...(options.plugins ?? []), stubPlugin(modules)] });
    sizes.set(label, Object.values(metafile.outputs).find((o) => o.entryPoint === FUNCTIONS.http)?.bytes ?? 0);
    sides.push({ name: label, file: path.join(dir, name, `${name}.mjs`), runs: [] });
  }
  const last = sides.at(-1)!;
  const flipped = `${last.name}, ${deployedMaps() ? "no source maps" : "with --enable-source-maps"}`;
  sides.push({ name: flipped, file: last.file, runs: [], env: flippedMaps });
  sizes.set(flipped, sizes.get(last.name) ?? 0);
  await measureColdStarts(sides, eventFile, deployed, COLD_STARTS);
  const ms = (side: Side) => median(side.runs.map((r) => r.ms));
  const base = ms(sides[0]!);
  const ref = ms(sides[1]!);
  console.log(
    `\nwhat if (MAM_BENCH_WHAT_IF=1): the http bundle with dependencies stubbed out (each variant still answers the request), ` +
      `${COLD_STARTS} cold starts each, all sides in turn:`,
  );
  for (const side of sides) {
    const size = sizes.get(side.name);
    console.log(
      `  ${side.name.padEnd(26)} ${pad(fixed(ms(side)), 7)} ms, ${(ms(side) / base).toFixed(2)}x hello` +
        `${side === sides[0] ? "" : ` (${ms(side) <= ref ? "-" : "+"}${fixed(Math.abs(ref - ms(side)))} ms)`}` +
        `${size === undefined ? "" : `, .mjs ${kib(size)} KiB`}; import ${fixed(median(side.runs.map((r) => r.imported - r.started)))} ms, ` +
        `first request ${fixed(median(side.runs.map((r) => r.answered - r.imported)))} ms`,
    );
  }
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-bundles-");
const dynalite = await startDynalite();
try {
  const bundles: Bundle[] = [];
  for (const [name, entry] of Object.entries(FUNCTIONS)) bundles.push(await bundleOne(name, entry, tmp.dir));
  const hello = await bundleOne(BASELINE.name, BASELINE.entry, tmp.dir);
  const sdkReference = await bundleOne(SDK_REFERENCE.name, SDK_REFERENCE.entry, tmp.dir);
  const splits = printSizes([...bundles, hello, sdkReference]);
  await printDashboard();
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
  const deployed = env(DEPLOYED_NODE_OPTIONS);

  const http = bundles.find((b) => b.name === "http")!;
  for (const b of [http, sdkReference]) {
    const check = await coldStart(b.file, eventFile, deployed);
    const answer = JSON.parse(check.body) as { job_id?: string };
    if (check.statusCode !== 200 || answer.job_id !== JOB_ID)
      throw new Error(`the ${b.name} bundle answered ${check.statusCode}: ${check.body}`);
  }
  console.log(`\ncold start: http (and the SDK reference) answer GET /v1/jobs/${JOB_ID} with 200 and the record (checked before timing)`);
  console.log(
    `cold starts: ${COLD_STARTS} per side after one untimed start each, sides in turn, NODE_OPTIONS=${DEPLOYED_NODE_OPTIONS} (as deployed); ` +
      `the AWS SDK is inside the bundle (nothing external), so every module it loads is counted; ` +
      `the signing key is in the environment (deployed, it is read from SSM at cold start: one more round trip, not measured here)`,
  );
  const base: Side = { name: "hello (hono/aws-lambda)", file: hello.file, runs: [] };
  const sdk: Side = { name: "SDK reference (hono + lib-dynamodb GetItem)", file: sdkReference.file, runs: [] };
  const mam: Side = { name: "mam http", file: http.file, runs: [] };
  await measureColdStarts([base, sdk, mam], eventFile, deployed, COLD_STARTS);
  for (const side of [base, sdk, mam]) console.log(describeRuns(side));
  const ms = (side: Side) => median(side.runs.map((r) => r.ms));
  const ratio = ms(mam) / ms(sdk);
  const cpu = (side: Side) => median(side.runs.map((r) => r.cpuMs));
  console.log(
    `the SDK reference is ${(ms(sdk) / ms(base)).toFixed(2)}x hello; mam is ${(ms(mam) / ms(base)).toFixed(2)}x hello and ${ratio.toFixed(2)}x the SDK reference ` +
      `(by the children's CPU, which waiting for a core does not inflate: ${(cpu(mam) / cpu(sdk)).toFixed(2)}x the SDK reference, ${(cpu(mam) / cpu(base)).toFixed(2)}x hello)`,
  );
  console.log(
    "not measured here: the Lambda runtime's own AWS SDK (nodejs22.x ships one). The bundles carry the SDK versions the lockfile pins " +
      "(they run on this machine's Node 20 and target nodejs22.x) and load nothing from the runtime's, so its cost or saving cannot be seen here",
  );

  if (ratio > RATIO_GOAL || process.env.MAM_BENCH_PROFILE === "1") {
    console.log(`\nwhere the time goes (${ratio > RATIO_GOAL ? "the goal is missed" : "MAM_BENCH_PROFILE=1"}):`);
    for (const side of [sdk, mam]) await profileColdStart(side, eventFile, deployed, tmp.dir);
    // The flag's own cost: both bundles with and without it, all four in turn
    // (serverless.yml decides which of the two is deployed).
    const withMaps = env(`${DEPLOYED_NODE_OPTIONS.replace(/--enable-source-maps/g, "")} --enable-source-maps`.trim());
    const noMaps = env(DEPLOYED_NODE_OPTIONS.replace(/--enable-source-maps/g, "").trim());
    const flag = [
      { name: sdk.name, file: sdk.file, runs: [] as ColdStart[], env: withMaps },
      { name: sdk.name, file: sdk.file, runs: [] as ColdStart[], env: noMaps },
      { name: mam.name, file: mam.file, runs: [] as ColdStart[], env: withMaps },
      { name: mam.name, file: mam.file, runs: [] as ColdStart[], env: noMaps },
    ];
    await measureColdStarts(flag, eventFile, deployed, COLD_STARTS);
    const [sdkMaps, sdkBare, mamMaps, mamBare] = flag.map(ms) as [number, number, number, number];
    console.log(
      `  --enable-source-maps (${deployedMaps() ? "deployed" : "not deployed"}), ${COLD_STARTS} cold starts of each of the four in turn: ` +
        `SDK reference ${fixed(sdkMaps)} ms with, ${fixed(sdkBare)} ms without; ` +
        `mam ${fixed(mamMaps)} ms with, ${fixed(mamBare)} ms without: the flag costs mam ${fixed(mamMaps - mamBare)} ms ` +
        `(ratio with it on both sides: ${(mamMaps / sdkMaps).toFixed(2)}x, without: ${(mamBare / sdkBare).toFixed(2)}x)`,
    );
    if (ratio > RATIO_GOAL) {
      console.log(
        [
          "  what would buy the rest back (not done):",
          "  - the API without its OpenAPI machinery at cold start: zod's classic API (~190 KiB; its namespace keeps every schema kind and the",
          "    JSON-schema converters), zod-to-openapi (~30 KiB) and the route schemas are parsed and evaluated to build the OpenAPIHono app a GET",
          "    needs; @mam/api would register its routes without them and build the document on the first /openapi.json (a change to @mam/api)",
          "  - packages/api and packages/core themselves (~115 KiB beside the reference): what a read does not use, behind dynamic imports",
          "  - V8's compile cache (Node 22's module.enableCompileCache) shipped in the zip: built by the runtime's exact Node, so not from here",
        ].join("\n"),
      );
    }
  }
  if (process.env.MAM_BENCH_WHAT_IF === "1") {
    const withoutFlag = DEPLOYED_NODE_OPTIONS.replace(/--enable-source-maps/g, "").trim();
    const flippedMaps = env(deployedMaps() ? withoutFlag : `${withoutFlag} --enable-source-maps`.trim());
    await whatIf(mam, base, eventFile, deployed, flippedMaps, tmp.dir);
  }

  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
  console.log(
    `bundles: our own code ${kib(worstOwn)} KiB in the largest (goal <= ${OWN_GOAL_BYTES / KiB} KiB) ${verdict(worstOwn <= OWN_GOAL_BYTES)}; ` +
      `ours + non-SDK deps ${kib(worstNonSdk)} KiB; http .mjs ${kib(http.bytes)} KiB`,
  );
  console.log(
    `cold start: ratio ${ratio.toFixed(2)}x the SDK reference (goal <= ${RATIO_GOAL}x) ${verdict(ratio <= RATIO_GOAL)}; ` +
      `mam ${fixed(ms(mam))} ms, SDK reference ${fixed(ms(sdk))} ms, hello ${fixed(ms(base))} ms (median of ${grouped(COLD_STARTS)} each); ` +
      `by CPU ${(cpu(mam) / cpu(sdk)).toFixed(2)}x (${fixed(cpu(mam))} vs ${fixed(cpu(sdk))} ms)`,
  );
} finally {
  await dynalite.close();
  await tmp.dispose();
}
