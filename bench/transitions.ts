import { statSync } from "node:fs";
import path from "node:path";
import { OPERATOR, parseFlags, randomIds, registerJob, systemClock, transitionJob } from "@mam/core";
import { openEmbeddedJobStore } from "@mam/local";
import Database from "better-sqlite3";
import { countingConnection } from "../tests/support/sqlite-rows-read.ts";
import { fixed, grouped, MiB, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";

/**
 * How many state transitions per second the engine commits on the embedded SQLite
 * store, against a bare better-sqlite3 loop doing the same conditional write (one
 * `UPDATE ... WHERE transition_seq = ? AND status IN (...) RETURNING doc`, autocommit,
 * same journal and durability settings). What mam adds on top is the engine's
 * checks, building the change, the store's SQL and JSON work, its extra columns and
 * indexes, and one await per transition.
 *
 * Goal: mam >= 0.5x the bare loop.
 */

const N = sizeFromEnv("MAM_BENCH_TRANSITIONS", process.env.MAM_BENCH_TRANSITIONS, 20_000);
const WARMUP = Math.min(1_000, N);
const ROUNDS = 3;
/**
 * Within a round the sides take turns in blocks of this many transitions, so a burst
 * of other work on the machine lands on both sides alike rather than on one round of
 * one side.
 */
const BLOCK = 500;
/** Auto-checkpoint keeps a WAL near 1000 pages (about 4 MiB); far beyond it, nobody checkpoints. */
const WAL_SANE = 64 * MiB;
const RATIO_GOAL = 0.5;

/**
 * Open a connection the way SqliteJobStore opens its own (keep in step with its
 * constructor): busy_timeout, then WAL. It sets no `synchronous`, so SQLite's WAL
 * default applies (better-sqlite3 builds with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1,
 * NORMAL: no fsync per commit, only at checkpoints).
 */
function openLikeTheStore(file: string): Database.Database {
  const db = new Database(file);
  db.pragma("busy_timeout = 5000");
  db.pragma("journal_mode = WAL");
  return db;
}

const SYNCHRONOUS = ["OFF", "NORMAL", "FULL", "EXTRA"];
function describePragmas(db: Database.Database): string {
  const sync = Number(db.pragma("synchronous", { simple: true }));
  return `journal_mode=${String(db.pragma("journal_mode", { simple: true }))}, synchronous=${SYNCHRONOUS[sync] ?? sync}`;
}

function walBytes(dbFile: string): number {
  try {
    return statSync(`${dbFile}-wal`).size;
  } catch {
    return 0;
  }
}

/** Milliseconds spent on `count` calls of `step`, each awaited. */
async function timed(count: number, step: () => unknown): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < count; i++) await step();
  return performance.now() - started;
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-transitions-");
try {
  const mamFile = path.join(tmp.dir, "mam.db");
  const bareFile = path.join(tmp.dir, "baseline.db");
  // mam: the engine over the store, as `mam serve` composes it (CAS on).
  const connection = countingConnection(mamFile);
  const store = openEmbeddedJobStore(connection.db);
  const deps = { jobs: store.jobs, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
  const job = await registerJob(deps, { job_id: "bench-transitions", prompt: "benchmark", agent: "claude" });
  let record = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
  let mamStep = 0;
  const mamTransition = async () => {
    const i = mamStep++;
    record = await transitionJob(
      deps,
      job.job_id,
      { action: "progress", expectedSeq: record.transition_seq, fields: { progress: { step: i } }, notify: false },
      OPERATOR,
    );
  };

  // Baseline: a plain table, the same conditional UPDATE, starting from the same document.
  const db = openLikeTheStore(bareFile);
  db.exec("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, transition_seq INTEGER NOT NULL, doc TEXT NOT NULL)");
  db.prepare("INSERT INTO jobs (job_id, status, transition_seq, doc) VALUES (?, ?, ?, ?)").run(
    record.job_id,
    record.status,
    record.transition_seq,
    JSON.stringify(record),
  );
  const update = db.prepare<[string, string, number], { doc: string }>(
    `UPDATE jobs SET transition_seq = transition_seq + 1, doc = json_set(doc, '$.progress', json(?))
     WHERE job_id = ? AND transition_seq = ? AND status IN ('running') RETURNING doc`,
  );
  let baseSeq = record.transition_seq;
  let baseStep = 0;
  // `.all()`, not `.get()`: SQLite runs the WAL auto-checkpoint only when a statement
  // steps to SQLITE_DONE. `.get()` stops at the RETURNING row, so a loop of them never
  // checkpoints and the WAL grows without bound; the baseline keeps the housekeeping
  // a long-running store needs. (The WAL sizes printed at the end show each side's.)
  const bareTransition = () => {
    const row = update.all(JSON.stringify({ step: baseStep++ }), record.job_id, baseSeq)[0];
    if (row === undefined) throw new Error(`the bare UPDATE lost its row at seq ${baseSeq}`);
    baseSeq += 1;
  };

  const probe = openLikeTheStore(mamFile);
  console.log(`pragmas: baseline ${describePragmas(db)}; a connection opened as the store opens its own: ${describePragmas(probe)}`);
  probe.close();
  console.log(
    `${grouped(N)} transitions per side per round, ${ROUNDS} rounds, sides taking turns in blocks of ${BLOCK}, ` +
      `after ${grouped(WARMUP)} warm-up transitions each`,
  );

  await timed(WARMUP, bareTransition);
  await timed(WARMUP, mamTransition);
  const readsBefore = connection.rowsRead();
  const bare: number[] = [];
  const mam: number[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    let bareMs = 0;
    let mamMs = 0;
    for (let done = 0; done < N; done += BLOCK) {
      const count = Math.min(BLOCK, N - done);
      bareMs += await timed(count, bareTransition);
      mamMs += await timed(count, mamTransition);
    }
    bare.push(N / (bareMs / 1000));
    mam.push(N / (mamMs / 1000));
    console.log(
      `round ${round}: bare better-sqlite3 ${grouped(bare.at(-1)!)}/s; mam transitionJob ${grouped(mam.at(-1)!)}/s ` +
        `(${(mam.at(-1)! / bare.at(-1)!).toFixed(2)}x)`,
    );
  }
  const expected = job.transition_seq + 1 + WARMUP + ROUNDS * N;
  if (record.transition_seq !== expected) throw new Error(`mam ended at seq ${record.transition_seq}, expected ${expected}`);
  console.log(`rows read by the store during ${grouped(ROUNDS * N)} committed transitions: ${connection.rowsRead() - readsBefore}`);
  const [bareWal, mamWal] = [walBytes(bareFile), walBytes(mamFile)];
  console.log(`WAL after the run: bare ${fixed(bareWal / MiB)} MiB, mam ${fixed(mamWal / MiB)} MiB (auto-checkpoint keeps one near 4 MiB)`);
  for (const [who, bytes] of [
    ["bare", bareWal],
    ["mam", mamWal],
  ] as const) {
    if (bytes > WAL_SANE) {
      console.log(
        `warning: ${who}'s WAL was never checkpointed (${fixed(bytes / MiB)} MiB): its rate skips the checkpoint work a ` +
          "long-running store must do, and its WAL grows with every write (see bench/README.md)",
      );
    }
  }
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));

  // The rates are each side's median round; the ratio is the median of the rounds'
  // own ratios, since within a round both sides met the same load.
  const bareRate = median(bare);
  const mamRate = median(mam);
  const ratio = median(mam.map((m, i) => m / bare[i]!));
  console.log(
    `transitions: ratio ${ratio.toFixed(2)}x bare better-sqlite3 (goal >= ${RATIO_GOAL}x) ${verdict(ratio >= RATIO_GOAL)}; ` +
      `mam ${grouped(mamRate)}/s (${fixed(1e6 / mamRate)} us each), bare ${grouped(bareRate)}/s (${fixed(1e6 / bareRate)} us each)`,
  );
  db.close();
  await store.close();
} finally {
  await tmp.dispose();
}
