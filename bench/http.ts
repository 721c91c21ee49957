import type { ChildProcess } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { type CallFrame, type CpuProfile, cpuProfArgs, readMainThreadProfile, tallySamples } from "./support/cpu-profile.ts";
import type { LoadPlan, LoadResult } from "./support/load.ts";
import { fixed, grouped, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";
import { CAN_PIN, cleanEnv, LOAD_CPU, type Mam, SERVER_CPU, spawnNode, startMam, stop, waitForLine } from "./support/serve.ts";

/**
 * Requests per second `mam serve` sustains on `GET /v1/jobs/{id}` (operator token,
 * SQLite store and its checked cache, the request log line, ETag), against one bare Hono route on
 * @hono/node-server answering the same JSON body, both driven by the same load
 * generator in a separate process (bench/support/load.ts): 50 keep-alive
 * connections over loopback, MAM_BENCH_HTTP_SECONDS (2) per run after 1 s of
 * warm-up, MAM_BENCH_HTTP_ROUNDS (10) rounds of one run per side, the sides in
 * turn and the order swapped every round (bare-mam, mam-bare, ...). Many short
 * runs rather than a few long ones: this machine has spells of some seconds in
 * which a server's syscalls cost more, and a 10 s run that fell into one swung a
 * round's ratio from 0.55x to 0.36x; alternating often puts both sides through
 * the same spells, and the median of the rounds' ratios is the typical one.
 * Each server is a child process of its own, started the way `npm start` starts
 * mam (node --import tsx); this process only orchestrates. With two or more CPUs
 * and `taskset`, the server runs on CPU 0 and the load generator on CPU 1: left to
 * the scheduler, the two sometimes share one core and the figures swing by 1.5x.
 *
 * Also: `mam serve`'s start-up, spawn to the "mam serving on" line, over a fresh
 * data dir (it writes credentials.json and creates the database) and on restarts.
 *
 * Goal: mam >= 0.4x the bare route's requests/s (the median of the rounds' ratios),
 * with the API built on Hono's idioms (issue 9): its middleware chain, the
 * validators @hono/zod-openapi derives from each route's declaration, `c.json`. A
 * benchmark never justifies bypassing the framework; where the ratio falls short,
 * the profile below says where the time goes.
 */

const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const SECONDS = sizeFromEnv("MAM_BENCH_HTTP_SECONDS", process.env.MAM_BENCH_HTTP_SECONDS, 2);
const CONNECTIONS = 50;
const WARMUP_SECONDS = 1;
const ROUNDS = sizeFromEnv("MAM_BENCH_HTTP_ROUNDS", process.env.MAM_BENCH_HTTP_ROUNDS, 10);
const PROFILE_SECONDS = 5;
const PROFILE_INTERVAL_US = 200;
const STARTS = 3;
const RATIO_GOAL = 0.4;
const JOB_ID = "bench-http-job";
const CLIENT = process.env.MAM_BENCH_HTTP_CLIENT === "agent" ? "agent" : "raw";

async function startBaseline(recordFile: string, nodeArgs: readonly string[] = []): Promise<{ child: ChildProcess; url: string }> {
  const child = spawnNode(SERVER_CPU, [...nodeArgs, "--import", "tsx", "bench/support/hono-server.ts", recordFile], {
    cwd: ROOT,
    env: cleanEnv({}),
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await waitForLine(child, "stdout", /MAM_BASELINE listening on (http:\/\/\S+)/, "the baseline server");
  return { child, url };
}

/** utime + stime of a process so far, in seconds (Linux /proc; undefined elsewhere). */
function cpuSeconds(pid: number | undefined): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100; // clock ticks; USER_HZ is 100 on Linux
  } catch {
    return undefined;
  }
}

interface Measured extends LoadResult {
  /** The server's CPU time over the measured window, as a share of one core. */
  readonly serverCpuShare: number | undefined;
}

async function drive(url: string, headers: Record<string, string>, server: ChildProcess, seconds = SECONDS): Promise<Measured> {
  const plan: LoadPlan = { url, headers, connections: CONNECTIONS, seconds, warmupSeconds: WARMUP_SECONDS, client: CLIENT };
  const load = spawnNode(LOAD_CPU, ["--import", "tsx", "bench/support/load.ts", JSON.stringify(plan)], {
    cwd: ROOT,
    env: cleanEnv({}),
    stdio: ["ignore", "pipe", "inherit"],
  });
  await waitForLine(load, "stdout", /MAM_LOAD measuring\n/, "the load generator");
  const cpuBefore = cpuSeconds(server.pid);
  const opened = performance.now();
  const line = await waitForLine(load, "stdout", /MAM_LOAD (\{.*\})\n/, "the load generator");
  const window = (performance.now() - opened) / 1000;
  const cpuAfter = cpuSeconds(server.pid);
  if (load.exitCode === null && load.signalCode === null) await new Promise((r) => load.once("exit", r));
  const result = JSON.parse(line) as LoadResult;
  return {
    ...result,
    serverCpuShare: cpuBefore === undefined || cpuAfter === undefined ? undefined : (cpuAfter - cpuBefore) / window,
  };
}

// ---------------------------------------------------------------- where the time goes

/**
 * What a server's CPU went to, by concern. A sample belongs to the first concern,
 * in this order, that any frame of its stack shows: so the HMAC and the zod parse
 * inside token verification count as verification, the write(2) under the log
 * line as logging, and the writev(2) of the answer as the socket write. Otherwise
 * it belongs to the layer of its innermost frame that has one (LAYERS): middleware
 * calls the rest of the chain synchronously, so "any frame" would put Hono's own
 * work under whichever of our middleware ran first.
 */
const CONCERNS: readonly [string, (f: CallFrame) => boolean][] = [
  ["auth: verify the bearer token (HMAC-SHA256, zod claims)", (f) => f.url.includes("/packages/api/src/tokens.")],
  ["store: SQLite (the data_version check; a read and JSON.parse on a cache miss)", (f) => f.url.includes("/packages/local/src/")],
  ["log: the request line, written synchronously to stdout", (f) => f.functionName === "writeSync" || f.url.includes("sync_write_stream")],
  ["socket: writing the answer (writev)", (f) => f.functionName === "writev" || f.functionName === "writevGeneric"],
  [
    "zod: the route's validators (path parameters, checked by the access middleware and by the route's validator)",
    (f) => f.url.includes("/node_modules/zod/") || f.url.includes("/node_modules/@hono/zod-validator/"),
  ],
  ["mam core (getJob)", (f) => f.url.includes("/packages/core/src/")],
];
const LAYERS: readonly [string, (f: CallFrame) => boolean][] = [
  ["mam api: our middleware (request log line, bearer auth, access) and the handler", (f) => f.url.includes("/packages/api/src/")],
  [
    "hono: routing, middleware chain (request id, method-not-allowed, validator), context, c.json, Headers",
    (f) => f.url.includes("/node_modules/hono/") || f.url.includes("/node_modules/@hono/zod-openapi/"),
  ],
  ["@hono/node-server: request and response adapter", (f) => f.url.includes("/node_modules/@hono/node-server/")],
  ["node:http: parsing, headers, socket reads", (f) => f.url.startsWith("node:_http") || f.url.startsWith("node:internal/http")],
  ["undici: Request/Headers objects", (f) => f.url.startsWith("node:internal/deps/undici")],
];
const OTHER = "other: Node internals, event loop, V8";
const GC = "garbage collection";

/** CPU ms per concern over `windowUs`; idle time is left out. */
function concernsOf(profile: CpuProfile, windowUs: readonly [number, number]): Map<string, number> {
  const ms = new Map<string, number>();
  tallySamples(
    profile,
    (stack) => {
      const top = stack[0]?.functionName;
      if (top === "(idle)") return undefined;
      if (top === "(garbage collector)") return GC;
      const concern = CONCERNS.find(([, matches]) => stack.some(matches))?.[0];
      if (concern !== undefined) return concern;
      for (const frame of stack) {
        const layer = LAYERS.find(([, matches]) => matches(frame))?.[0];
        if (layer !== undefined) return layer;
      }
      return OTHER;
    },
    (kind, at, us) => {
      if (at >= windowUs[0] && at <= windowUs[1]) ms.set(kind, (ms.get(kind) ?? 0) + us / 1000);
    },
  );
  return ms;
}

function describe(name: string, m: Measured): string {
  const pct = (share: number | undefined) => (share === undefined ? "?" : `${fixed(share * 100, 0)}%`);
  return (
    `${name}: ${grouped(m.rps)} req/s (${grouped(m.requests)} in ${fixed(m.seconds, 1)} s), p50 ${fixed(m.p50Ms, 2)} ms, ` +
    `p99 ${fixed(m.p99Ms, 2)} ms, max ${fixed(m.maxMs, 1)} ms, ${fixed(m.bodyBytes / Math.max(1, m.requests), 0)} B/answer, ` +
    `${m.errors} errors${m.firstError ? ` (first: ${m.firstError})` : ""}; CPU: server ${pct(m.serverCpuShare)} of a core ` +
    `(${m.serverCpuShare === undefined ? "?" : fixed((m.serverCpuShare * 1e6) / m.rps, 0)} us/request), load generator ${pct(m.cpuShare)}; ` +
    `${m.socketsOpened} sockets`
  );
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-http-");
const children: ChildProcess[] = [];
try {
  const dataDir = path.join(tmp.dir, "data");
  const logFile = path.join(tmp.dir, "mam-serve.log");

  // Start-up: the first start over an empty data dir, then restarts over it.
  const startMs: number[] = [];
  let mam: Mam | undefined;
  for (let i = 0; i < STARTS; i++) {
    if (mam !== undefined) await stop(mam.child);
    mam = await startMam(dataDir, logFile);
    children.push(mam.child);
    startMs.push(mam.startMs);
  }
  if (mam === undefined) throw new Error("mam serve never started");
  console.log(
    `mam serve start-up (node --import tsx packages/cli/src/main.ts serve, spawn to "mam serving on"): ` +
      `first start ${fixed(startMs[0]!, 0)} ms (empty data dir), restarts ${startMs
        .slice(1)
        .map((ms) => `${fixed(ms, 0)} ms`)
        .join(", ")}`,
  );

  const credentials = JSON.parse(readFileSync(path.join(dataDir, "credentials.json"), "utf8")) as { operator_token: string };
  const headers = { authorization: `Bearer ${credentials.operator_token}`, accept: "application/json" };
  const created = await fetch(`${mam.url}/v1/jobs`, {
    method: "POST",
    headers: { ...headers, "content-type": "application/json" },
    body: JSON.stringify({
      job_id: JOB_ID,
      prompt: "Fix the flaky test in tests/unit",
      agent: "claude-code",
      expected_artifacts: ["commit"],
    }),
  });
  if (created.status !== 201) throw new Error(`registering the job answered ${created.status}: ${await created.text()}`);
  const jobUrl = `${mam.url}/v1/jobs/${JOB_ID}`;
  const answer = await fetch(jobUrl, { headers });
  const body = await answer.text();
  if (answer.status !== 200) throw new Error(`GET ${jobUrl} answered ${answer.status}: ${body}`);
  const recordFile = path.join(tmp.dir, "record.json");
  writeFileSync(recordFile, body);

  const baseline = await startBaseline(recordFile);
  children.push(baseline.child);
  const baselineUrl = `${baseline.url}/v1/jobs/${JOB_ID}`;
  const check = await fetch(baselineUrl);
  if (check.status !== 200 || (await check.text()) !== body) throw new Error("the baseline does not answer mam's body");
  console.log(
    `GET /v1/jobs/{id}: both answer 200 with the same ${Buffer.byteLength(body)}-byte JSON record; ` +
      `${CONNECTIONS} keep-alive connections; ${ROUNDS} rounds of ${WARMUP_SECONDS} s warm-up + ${SECONDS} s measured per side, the order swapped every round; ` +
      `load generator: ${CLIENT === "raw" ? "raw keep-alive sockets" : "node:http keep-alive Agent"} (MAM_BENCH_HTTP_CLIENT=raw|agent; ` +
      `autocannon is not installed), its own process; ` +
      `${CAN_PIN ? `servers pinned to CPU ${SERVER_CPU}, load generator to CPU ${LOAD_CPU} (taskset)` : "no CPU pinning (one CPU, or no taskset)"}`,
  );

  const requestLines = () =>
    readFileSync(logFile, "utf8")
      .split("\n")
      .filter((l) => l.includes('"msg":"request"')).length;
  const linesBefore = requestLines();
  const bareRuns: Measured[] = [];
  const mamRuns: Measured[] = [];
  const ratios: number[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    let b: Measured;
    let m: Measured;
    if (round % 2 === 1) {
      b = await drive(baselineUrl, headers, baseline.child);
      m = await drive(jobUrl, headers, mam.child);
    } else {
      m = await drive(jobUrl, headers, mam.child);
      b = await drive(baselineUrl, headers, baseline.child);
    }
    bareRuns.push(b);
    mamRuns.push(m);
    ratios.push(m.rps / b.rps);
    console.log(`round ${round} (${round % 2 === 1 ? "bare first" : "mam first"}): ratio ${(m.rps / b.rps).toFixed(2)}x`);
    console.log(`  ${describe("bare Hono route", b)}`);
    console.log(`  ${describe("mam serve", m)}`);
  }
  const sent = mamRuns.reduce((n, r) => n + r.requests, 0);
  console.log(
    `mam logged ${grouped(requestLines() - linesBefore)} request lines (to a file; ${grouped(sent)} measured requests, plus warm-ups)`,
  );

  await stop(baseline.child);
  await stop(mam.child);
  const ratio = median(ratios);
  const bareRps = median(bareRuns.map((r) => r.rps));
  const mamRps = median(mamRuns.map((r) => r.rps));
  const cpuPerRequest = (runs: Measured[]) => median(runs.map((r) => ((r.serverCpuShare ?? Number.NaN) * 1e6) / r.rps));
  const bareCpu = cpuPerRequest(bareRuns);
  const mamCpu = cpuPerRequest(mamRuns);
  const pick = (runs: Measured[], f: (r: Measured) => number) => median(runs.map(f));
  console.log(
    `medians: bare ${grouped(bareRps)} req/s, p50 ${fixed(
      pick(bareRuns, (r) => r.p50Ms),
      2,
    )} ms, p99 ${fixed(
      pick(bareRuns, (r) => r.p99Ms),
      2,
    )} ms, ` +
      `${fixed(bareCpu, 0)} us server CPU/request; mam ${grouped(mamRps)} req/s, p50 ${fixed(
        pick(mamRuns, (r) => r.p50Ms),
        2,
      )} ms, ` +
      `p99 ${fixed(
        pick(mamRuns, (r) => r.p99Ms),
        2,
      )} ms, ${fixed(mamCpu, 0)} us server CPU/request (by CPU: ${(bareCpu / mamCpu).toFixed(2)}x)`,
  );

  if (ratio < RATIO_GOAL || process.env.MAM_BENCH_PROFILE === "1") {
    // One more run each, servers under `node --cpu-prof`, only the measured window counted.
    const seconds = PROFILE_SECONDS;
    const bareDir = path.join(tmp.dir, "profile-bare");
    const mamDir = path.join(tmp.dir, "profile-mam");
    const profiledBare = await startBaseline(recordFile, cpuProfArgs(bareDir, PROFILE_INTERVAL_US));
    children.push(profiledBare.child);
    const bareRun = await drive(`${profiledBare.url}/v1/jobs/${JOB_ID}`, headers, profiledBare.child, seconds);
    await stop(profiledBare.child);
    const profiledMam = await startMam(dataDir, logFile, cpuProfArgs(mamDir, PROFILE_INTERVAL_US));
    children.push(profiledMam.child);
    const mamRun = await drive(`${profiledMam.url}/v1/jobs/${JOB_ID}`, headers, profiledMam.child, seconds);
    await stop(profiledMam.child);
    const bareUs = concernsOf(readMainThreadProfile(bareDir), bareRun.windowUs);
    const mamUs = concernsOf(readMainThreadProfile(mamDir), mamRun.windowUs);
    const perRequest = (ms: number | undefined, run: Measured) => ((ms ?? 0) * 1000) / Math.max(1, run.requests);
    const total = (m: Map<string, number>, run: Measured) =>
      perRequest(
        [...m.values()].reduce((a, b) => a + b, 0),
        run,
      );
    console.log(
      `\nwhere the time goes (${ratio < RATIO_GOAL ? "the goal is missed" : "MAM_BENCH_PROFILE=1"}): server CPU per request, ` +
        `one more ${seconds} s run each under node --cpu-prof (${PROFILE_INTERVAL_US} us samples; idle left out; the profiler slows both): ` +
        `bare ${grouped(bareRun.rps)} req/s, mam ${grouped(mamRun.rps)} req/s`,
    );
    console.log(`  ${"bare us".padStart(8)} ${"mam us".padStart(8)}  what`);
    const kinds = [...new Set([...mamUs.keys(), ...bareUs.keys()])].sort(
      (a, b) => perRequest(mamUs.get(b), mamRun) - perRequest(mamUs.get(a), mamRun),
    );
    for (const kind of kinds) {
      console.log(
        `  ${fixed(perRequest(bareUs.get(kind), bareRun)).padStart(8)} ${fixed(perRequest(mamUs.get(kind), mamRun)).padStart(8)}  ${kind}`,
      );
    }
    console.log(`  ${fixed(total(bareUs, bareRun)).padStart(8)} ${fixed(total(mamUs, mamRun)).padStart(8)}  total`);
  }

  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
  const clean = [...bareRuns, ...mamRuns].every((r) => r.errors === 0);
  console.log(
    `http: ratio ${ratio.toFixed(2)}x the bare route (goal >= ${RATIO_GOAL}x) ${verdict(ratio >= RATIO_GOAL && clean)}` +
      `${clean ? "" : " (errors: see above)"} (rounds ${ratios.map((r) => r.toFixed(2)).join(" ")}); ` +
      `mam ${grouped(mamRps)} req/s, bare ${grouped(bareRps)} req/s; ` +
      `mam serve start-up ${fixed(median(startMs.slice(1)), 0)} ms (median restart), ${fixed(startMs[0]!, 0)} ms first`,
  );
} finally {
  for (const child of children) await stop(child);
  await tmp.dispose();
}
