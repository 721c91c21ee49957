/**
 * 32 concurrent transitions from the same transition_seq commit exactly once, 100
 * trials, on both backends.
 *
 * The racers are 32 worker threads per backend, each with its own connection: its
 * own SQLite connection on the same WAL file, or its own DynamoDB client to the same
 * DynamoDB peer (dynalite, or DynamoDB Local: MAM_DYNAMODB_PEER). (In one thread, synchronous better-sqlite3 calls never race, so the
 * SQLite half of this test needs threads or processes to mean anything.) The
 * workers are started once and reused: each trial registers and claims a fresh job
 * (seq 1), arms every worker with it, releases them together through a shared
 * Atomics word, and collects 32 outcomes.
 *
 * Why a bundle: a worker cannot load `.ts` by `execArgv: ["--import", "tsx"]` on
 * Node 20 ("Unknown file extension .ts"); registering tsx from a small .mjs works,
 * but every worker then runs its own loader thread and transpiles and loads zod and
 * the AWS SDK by itself — 32 of them took 55-75 s to start on 2 cores. So the test
 * bundles the two racer entry points once with esbuild (the tool that packages the
 * Lambdas), tree-shaken to the one store each needs, better-sqlite3 (native) kept
 * external, and the workers load plain JavaScript.
 */
import { rm } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import { type JobStore, OPERATOR, parseFlags, randomIds, registerJob, systemClock, transitionJob } from "@mam/core";
import { openEmbeddedJobStore } from "@mam/local";
import { build } from "esbuild";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ESM_REQUIRE_BANNER } from "../../scripts/lambda-bundle.mjs";
import { DYNAMODB_PEER, startDynamoPeer } from "../support/aws-peers.ts";
import { tempDir } from "../support/temp-dir.ts";
import { runsBackend } from "../support/test-env.ts";
import type { FromWorker, RaceTarget, RaceWorkerData, ToWorker } from "./protocol.ts";

const WORKERS = 32;
const TRIALS = 100;
/** The conflicts a loser may get: stale seq, or (had it read the new status first) refused. */
const LOSING_CODES = new Set(["job.transitionConflict", "job.transitionRefused"]);

type Outcome = Extract<FromWorker, { type: "outcome" }>;

let bundleDir: string;
let racerBundles: Record<RaceTarget["backend"], string>;

/**
 * Bundle racer-sqlite.ts and racer-dynamodb.ts, one self-contained ESM file each.
 * Our packages' sources are marked free of side effects so that importing one store
 * from `@mam/local` or `@mam/aws` does not drag in the broker, MQTT, S3 or IoT
 * clients: the DynamoDB racer is about 1 MB instead of 2, the SQLite one a fraction.
 */
async function bundleRacers(outDir: string): Promise<Record<RaceTarget["backend"], string>> {
  const require = createRequire(import.meta.url);
  const betterSqlite = pathToFileURL(require.resolve("better-sqlite3")).href;
  const packagesDir = fileURLToPath(new URL("../../packages/", import.meta.url));
  const entry = (name: string): string => fileURLToPath(new URL(`./${name}.ts`, import.meta.url));
  await build({
    entryPoints: { "racer-sqlite": entry("racer-sqlite"), "racer-dynamodb": entry("racer-dynamodb") },
    outdir: outDir,
    outExtension: { ".js": ".mjs" },
    bundle: true,
    platform: "node",
    target: "node20",
    format: "esm",
    mainFields: ["module", "main"],
    banner: { js: ESM_REQUIRE_BANNER },
    plugins: [
      {
        name: "racer-resolution",
        setup(b) {
          // Native: imported from where it is installed, whatever directory the bundle is in.
          b.onResolve({ filter: /^better-sqlite3$/ }, () => ({ path: betterSqlite, external: true }));
          b.onResolve({ filter: /^(@mam\/|\.)/ }, async (args) => {
            if (args.pluginData === "resolved") return undefined;
            const r = await b.resolve(args.path, {
              kind: args.kind,
              importer: args.importer,
              resolveDir: args.resolveDir,
              pluginData: "resolved",
            });
            if (r.errors.length > 0 || !r.path.startsWith(packagesDir)) return r;
            return { path: r.path, sideEffects: false };
          });
        },
      },
    ],
    logLevel: "warning",
  });
  return { sqlite: path.join(outDir, "racer-sqlite.mjs"), dynamodb: path.join(outDir, "racer-dynamodb.mjs") };
}

beforeAll(async () => {
  bundleDir = (await tempDir("races")).dir;
  racerBundles = await bundleRacers(bundleDir);
}, 60_000);
afterAll(async () => {
  if (bundleDir) await rm(bundleDir, { recursive: true, force: true });
});

/** 32 racers over one target, started once, armed and released per trial. */
class RacerPool {
  readonly #workers: Worker[];
  readonly #go: Int32Array;
  #onMessage: (m: FromWorker) => void = () => undefined;
  #onFailure: (e: Error) => void = () => undefined;

  private constructor(workers: Worker[], go: Int32Array) {
    this.#workers = workers;
    this.#go = go;
    for (const w of workers) {
      w.on("message", (m: FromWorker) =>
        m.type === "fatal" ? this.#onFailure(new Error(`worker ${m.worker}: ${m.message}`)) : this.#onMessage(m),
      );
      w.on("error", (e) => this.#onFailure(e));
    }
  }

  static async start(target: RaceTarget): Promise<RacerPool> {
    const shared = new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT);
    // Each AWS SDK instance warns once about Node 20's end of support: 32 copies of it say nothing more.
    const env = { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: "true" };
    const workers = Array.from({ length: WORKERS }, (_, worker) => {
      const workerData: RaceWorkerData = { worker, target, go: shared };
      // No execArgv: the racers are plain JavaScript and need none of the test process's flags.
      return new Worker(racerBundles[target.backend], { workerData, env, execArgv: [] });
    });
    const pool = new RacerPool(workers, new Int32Array(shared));
    await pool.#collect(WORKERS, (m) => m.type === "ready", 60_000);
    return pool;
  }

  /** Arm every worker with `jobId`, release them at once, and return their 32 outcomes. */
  async trial(trial: number, jobId: string): Promise<Outcome[]> {
    const armed = this.#collect(WORKERS, (m) => m.type === "armed" && m.trial === trial, 20_000);
    for (const w of this.#workers) w.postMessage({ type: "arm", trial, jobId } satisfies ToWorker);
    await armed;
    const outcomes = this.#collect(WORKERS, (m) => m.type === "outcome" && m.trial === trial, 30_000);
    Atomics.store(this.#go, 0, trial);
    Atomics.notify(this.#go, 0);
    return (await outcomes) as Outcome[];
  }

  async close(): Promise<void> {
    await Promise.all(
      this.#workers.map(
        (w) =>
          new Promise<void>((resolve) => {
            const force = setTimeout(() => void w.terminate(), 5000);
            w.once("exit", () => {
              clearTimeout(force);
              resolve();
            });
            w.postMessage({ type: "close" } satisfies ToWorker);
          }),
      ),
    );
  }

  #collect(count: number, match: (m: FromWorker) => boolean, timeoutMs: number): Promise<FromWorker[]> {
    return new Promise((resolve, reject) => {
      const got: FromWorker[] = [];
      const timer = setTimeout(
        () => reject(new Error(`only ${got.length} of ${count} workers answered within ${timeoutMs} ms`)),
        timeoutMs,
      );
      this.#onFailure = (e) => {
        clearTimeout(timer);
        reject(e);
      };
      this.#onMessage = (m) => {
        if (!match(m)) return;
        got.push(m);
        if (got.length === count) {
          clearTimeout(timer);
          resolve(got);
        }
      };
    });
  }
}

interface TrialReport {
  readonly anomalies: string[];
  /** From the first call made to the last outcome, ms. */
  readonly durationMs: number;
  /** Between the first and the last call made, ms: how close together the racers fired. */
  readonly startSpreadMs: number;
  /** The most calls in flight at one instant (made, not yet settled). */
  readonly peakInFlight: number;
  readonly winner: number | undefined;
  readonly losingCodes: readonly string[];
}

async function judgeTrial(store: JobStore, jobId: string, outcomes: readonly Outcome[]): Promise<TrialReport> {
  const anomalies: string[] = [];
  const winners = outcomes.filter((o) => o.result.committed);
  const losers = outcomes.flatMap((o) => (o.result.committed ? [] : [o.result]));
  if (winners.length !== 1) anomalies.push(`${jobId}: ${winners.length} commits (workers ${winners.map((w) => w.worker).join(", ")})`);
  for (const w of winners) {
    if (w.result.committed && w.result.seq !== 2) anomalies.push(`${jobId}: worker ${w.worker} committed seq ${w.result.seq}`);
  }
  for (const l of losers) {
    if (!LOSING_CODES.has(l.code)) anomalies.push(`${jobId}: a loser got ${l.code}: ${l.message}`);
    else if (l.currentSeq !== 2) anomalies.push(`${jobId}: a loser lost to seq ${l.currentSeq}, not the committed seq 2`);
  }
  const final = await store.get(jobId);
  if (final?.transition_seq !== 2 || final.status !== "completed") {
    anomalies.push(`${jobId}: final record has seq ${final?.transition_seq}, status ${final?.status}`);
  }
  const winner = winners[0];
  if (winner?.result.committed && final?.pending_notification?.id !== winner.result.intentId) {
    anomalies.push(`${jobId}: the stored intent ${final?.pending_notification?.id} is not the winner's ${winner.result.intentId}`);
  }
  const starts = outcomes.map((o) => o.startedAt);
  const settles = outcomes.map((o) => o.settledAt);
  return {
    anomalies,
    durationMs: Math.max(...settles) - Math.min(...starts),
    startSpreadMs: Math.max(...starts) - Math.min(...starts),
    peakInFlight: peakInFlight(outcomes),
    winner: winner?.worker,
    losingCodes: losers.map((l) => l.code),
  };
}

function peakInFlight(outcomes: readonly Outcome[]): number {
  // Settles sort before starts at the same instant: touching calls did not overlap.
  const edges = outcomes.flatMap((o) => [
    { at: o.startedAt, delta: 1 },
    { at: o.settledAt, delta: -1 },
  ]);
  edges.sort((a, b) => a.at - b.at || a.delta - b.delta);
  let inFlight = 0;
  let peak = 0;
  for (const e of edges) {
    inFlight += e.delta;
    peak = Math.max(peak, inFlight);
  }
  return peak;
}

const quantile = (xs: readonly number[], q: number): number => {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
};
const ms = (x: number): string => `${x.toFixed(1)} ms`;

interface Backend {
  readonly store: JobStore;
  readonly target: RaceTarget;
  close(): Promise<void>;
}

function raceSuite(name: string, open: () => Promise<Backend>): void {
  describe(`32 concurrent transitions from one seq: ${name}`, () => {
    let backend: Backend;
    let pool: RacerPool;
    let startupMs = 0;

    beforeAll(async () => {
      backend = await open();
      const t0 = performance.now();
      pool = await RacerPool.start(backend.target);
      startupMs = performance.now() - t0;
      // Bounds, not speed goals (those live in bench/): on 2 shared cores under load,
      // DynamoDB Local took up to 98 s to start and the 32 workers 38 s.
    }, 300_000);
    afterAll(async () => {
      await pool?.close();
      await backend?.close();
    });

    it(`commit exactly once in each of ${TRIALS} trials (workers with their own connections)`, async () => {
      const deps = { jobs: backend.store, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
      const reports: TrialReport[] = [];
      const t0 = performance.now();
      const cpu0 = process.cpuUsage();
      const elu0 = performance.eventLoopUtilization();
      for (let trial = 1; trial <= TRIALS; trial++) {
        const jobId = `race-${trial}`;
        const job = await registerJob(deps, { job_id: jobId, prompt: "race", agent: "codex" });
        const claimed = await transitionJob(deps, jobId, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
        expect(claimed.transition_seq).toBe(1);
        reports.push(await judgeTrial(backend.store, jobId, await pool.trial(trial, jobId)));
      }
      const totalMs = performance.now() - t0;
      const cpu = process.cpuUsage(cpu0);
      const elu = performance.eventLoopUtilization(elu0).utilization;

      const codes: Record<string, number> = {};
      for (const c of reports.flatMap((r) => r.losingCodes)) codes[c] = (codes[c] ?? 0) + 1;
      const durations = reports.map((r) => r.durationMs);
      const spreads = reports.map((r) => r.startSpreadMs);
      const distinctWinners = new Set(reports.map((r) => r.winner)).size;
      const peaks = reports.map((r) => r.peakInFlight);
      console.log(
        [
          `[races] ${name}: ${TRIALS} trials x ${WORKERS} workers in ${(totalMs / 1000).toFixed(1)} s`,
          `(workers started in ${(startupMs / 1000).toFixed(1)} s);`,
          `process CPU ${((cpu.user + cpu.system) / 1e6).toFixed(1)} s, main thread (the test${name.includes("dynalite") ? " and dynalite" : ""}) busy ${(100 * elu).toFixed(0)}%;`,
          `trial (first call to last outcome) median ${ms(quantile(durations, 0.5))}, p95 ${ms(quantile(durations, 0.95))}, max ${ms(Math.max(...durations))};`,
          `calls fired within median ${ms(quantile(spreads, 0.5))}, p95 ${ms(quantile(spreads, 0.95))};`,
          `calls in flight at once: median peak ${quantile(peaks, 0.5)}, max ${Math.max(...peaks)}, all 32 in ${peaks.filter((p) => p === WORKERS).length}/${TRIALS} trials;`,
          `${distinctWinners} distinct winning workers; losers: ${JSON.stringify(codes)}`,
        ].join(" "),
      );

      expect(reports.flatMap((r) => r.anomalies)).toEqual([]);
      expect(reports.filter((r) => r.winner !== undefined)).toHaveLength(TRIALS);
      expect(Object.values(codes).reduce((a, b) => a + b, 0)).toBe(TRIALS * (WORKERS - 1));
      // 150 s for the 100 trials on DynamoDB Local at a load average of 14; dynalite's
      // passed 240 s at a load average of 35. A bound for a shared machine, not a goal.
    }, 600_000);
  });
}

if (runsBackend("embedded"))
  raceSuite("SQLite (one WAL file, a connection per worker)", async () => {
    const dir = (await tempDir("races-sqlite")).dir;
    const dbFile = path.join(dir, "mam.db");
    // Opened first, here: the schema and WAL mode exist before 32 connections open the file.
    const embedded = openEmbeddedJobStore(dbFile);
    return {
      store: embedded.jobs,
      target: { backend: "sqlite", dbFile },
      async close() {
        await embedded.close();
        await rm(dir, { recursive: true, force: true });
      },
    };
  });

raceSuite(`DynamoDB (${DYNAMODB_PEER}, a client per worker)`, async () => {
  const peer = await startDynamoPeer();
  const tableName = "mam-races";
  await createJobTable(peer.client, tableName);
  return {
    store: new DynamoJobStore({ client: peer.client, tableName, transactions: !peer.gaps.noTransactions }),
    target: { backend: "dynamodb", endpoint: peer.endpoint, tableName },
    close: () => peer.close(),
  };
});
