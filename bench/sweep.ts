import { cp, mkdir, open, readdir, rm, stat } from "node:fs/promises";
import path from "node:path";
import {
  type Deps,
  evaluateDueCandidates,
  evaluateJob,
  type JobStore,
  type ObservedState,
  type Observer,
  type Publisher,
  parseFlags,
  RECORDED,
  type ReportStore,
  randomIds,
  recordObservation,
} from "@mam/core";
import { FileReportStore, openEmbeddedJobStore } from "@mam/local";
import type Database from "better-sqlite3";
import { type ReadyJob, readyJob } from "../tests/seed/scenario.ts";
import { TestClock } from "../tests/support/clock.ts";
import { jobRecord } from "../tests/support/records.ts";
import { countingConnection } from "../tests/support/sqlite-rows-read.ts";
import { fixed, grouped, MiB, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";

/**
 * The sweep's evaluation of due candidates (issue 20) on the embedded stores
 * (`SqliteJobStore` through `openEmbeddedJobStore`, `FileReportStore`), against
 * evaluating the same candidates directly.
 *
 * One store is built: MAM_BENCH_SWEEP_JOBS (10,000) running jobs, of which
 * MAM_BENCH_SWEEP_DUE (100) are due candidates made through the real path (the seed's
 * `readyJob`: registered, claimed, opted in, dispatched, report finalized; then a
 * watcher's `working`, `idle`, and after the settle window a covering `idle` repeat,
 * each through `recordObservation`), a tenth (at most 1,000) marked candidates due
 * later (written straight with `jobs.create`, the mark in the record), and the rest
 * running without a mark (the same). Every timed pass gets a fresh copy of that
 * store's files, since a completion is terminal, and a clock at the instant the build
 * ended.
 *
 * - reads: what the sweep's part reads through the JobStore port (records returned by
 *   each read method) and the job rows SQLite hands back, for one pass over the due
 *   candidates. Goal: at most READS_PER_DUE x due records, whatever the number of jobs.
 * - rate: candidates completed per second by `evaluateDueCandidates` (budget: every
 *   due candidate, bytes unbounded) against `evaluateJob(deps, id, RECORDED)` on the
 *   same candidates one after another; MAM_BENCH_SWEEP_ROUNDS (3) rounds after one
 *   uncounted pass of each, the order turned every round. Goal: the sweep >= 0.5x
 *   direct evaluation (the median of the rounds' ratios). Each side also prints the
 *   wall time per candidate in each store method.
 */

const JOBS = sizeFromEnv("MAM_BENCH_SWEEP_JOBS", process.env.MAM_BENCH_SWEEP_JOBS, 10_000);
const DUE = sizeFromEnv("MAM_BENCH_SWEEP_DUE", process.env.MAM_BENCH_SWEEP_DUE, 100);
const ROUNDS = sizeFromEnv("MAM_BENCH_SWEEP_ROUNDS", process.env.MAM_BENCH_SWEEP_ROUNDS, 3);
const LATER = Math.min(1_000, Math.floor(JOBS / 10));
const READS_PER_DUE = 3;
const RATE_GOAL = 0.5;
/** Past the claude-code backend's settle window (30 s): the repeat's span covers it. */
const PAST_WINDOW_MS = 31_000;
const START = "2026-11-20T10:10:00.000Z";
const FLAGS = parseFlags({ MAM_AUTO_COMPLETE: "1" });
const WATCHER: Observer = { kind: "watcher", name: "herdr-1" };
/** The gate's commit owes a notification, which the relay (not running here) would publish. */
const NO_PUBLISHER: Publisher = { publish: async () => undefined };
/** The port's read methods, each counted by the records it hands back. */
const READS = ["get", "getDispatch", "listCandidates", "list", "listOwed", "listQuarantined", "listEvents", "listChanges"] as const;
type Read = (typeof READS)[number];
/** Wall time spent in one store method, and how many calls. */
interface Spent {
  readonly ms: number;
  readonly calls: number;
}

if (DUE + LATER > JOBS) throw new Error(`MAM_BENCH_SWEEP_DUE (${DUE}) plus the marks due later (${LATER}) exceed the ${JOBS} jobs`);

/** How many records a read handed back: a record, a list of them, or a page. */
function recordsIn(answer: unknown): number {
  if (answer === undefined) return 0;
  if (Array.isArray(answer)) return answer.length;
  const items = (answer as { items?: unknown }).items;
  return Array.isArray(items) ? items.length : 1;
}

/**
 * `target` with every method timed into `spent` (wall time by method name, `prefix`
 * before it), and the read methods' records counted into `reads`.
 */
function instrumented<T extends object>(target: T, prefix: string, spent: Map<string, Spent>, reads?: Record<Read, number>): T {
  return new Proxy(target, {
    get(t, prop) {
      const value = Reflect.get(t, prop, t);
      if (typeof value !== "function" || typeof prop !== "string") return value;
      const bound = (value as (...a: unknown[]) => unknown).bind(t);
      const counted = reads !== undefined && (READS as readonly string[]).includes(prop);
      return (...args: unknown[]) => {
        const started = performance.now();
        const answer = bound(...args);
        if (!(answer instanceof Promise)) return answer;
        return answer.then((got: unknown) => {
          const was = spent.get(`${prefix}${prop}`) ?? { ms: 0, calls: 0 };
          spent.set(`${prefix}${prop}`, { ms: was.ms + performance.now() - started, calls: was.calls + 1 });
          if (counted) reads[prop as Read] += recordsIn(got);
          return got;
        });
      };
    },
  });
}

function see(deps: Deps, job: ReadyJob, state: ObservedState) {
  const dispatch = job.scenario.dispatch_context;
  return recordObservation(
    deps,
    job.jobId,
    {
      state,
      source_kind: "pane_status",
      attempt_id: job.attemptId,
      agent_session_uuid: dispatch.agent_session_uuid,
      pane_process_generation: dispatch.pane_process_generation,
      pane_id: dispatch.pane_id,
      observed_at: deps.clock.now().toISOString(),
    },
    WATCHER,
  );
}

const depsOver = (jobs: JobStore, reports: ReportStore, clock: TestClock): Deps => ({
  jobs,
  reports,
  publisher: NO_PUBLISHER,
  clock,
  ids: randomIds,
  flags: FLAGS,
});

interface Template {
  readonly dir: string;
  /** The clock's reading when the build ended: every pass runs at it. */
  readonly at: string;
  /** The due candidates, in the order they were made. */
  readonly due: readonly string[];
}

async function buildTemplate(dir: string): Promise<Template> {
  const reportRoot = path.join(dir, "reports");
  await mkdir(reportRoot, { recursive: true });
  const store = openEmbeddedJobStore(path.join(dir, "mam.db"));
  const clock = new TestClock(START);
  const deps = depsOver(store.jobs, new FileReportStore(reportRoot), clock);
  try {
    const ready: ReadyJob[] = [];
    for (let i = 0; i < DUE; i++) ready.push(await readyJob(deps, {}));
    for (const job of ready) await see(deps, job, "working");
    clock.advance(2_000);
    for (const job of ready) await see(deps, job, "idle");
    clock.advance(PAST_WINDOW_MS);
    const now = clock.now().toISOString();
    for (const job of ready) {
      const repeat = await see(deps, job, "idle");
      const mark = repeat.job.candidate_at;
      if (!repeat.coalesced || mark === undefined || Date.parse(mark) > Date.parse(now)) {
        throw new Error(
          `job ${job.jobId}: the covering idle repeat left no due mark (coalesced ${repeat.coalesced}, candidate_at ${mark})`,
        );
      }
    }
    // The rest straight into the store, in batches a group commit can share.
    const others = Array.from({ length: JOBS - DUE }, (_, i) => {
      const id = `bench-sweep-${String(i).padStart(6, "0")}`;
      const running = { status: "running", agent: "claude-code", transition_seq: 1, created_at: START, updated_at: now } as const;
      return i < LATER
        ? jobRecord(id, { ...running, candidate_at: new Date(Date.parse(now) + 60_000 + i * 1_000).toISOString() })
        : jobRecord(id, running);
    });
    for (let i = 0; i < others.length; i += 500) {
      await Promise.all(others.slice(i, i + 500).map((record) => store.jobs.create(record)));
    }
    return { dir, at: now, due: ready.map((j) => j.jobId) };
  } finally {
    await store.close();
  }
}

interface Side {
  readonly deps: Deps;
  readonly reads: Record<Read, number>;
  /** Wall time in each store method, by `jobs.<method>` and `reports.<method>`. */
  readonly spent: Map<string, Spent>;
  readonly connection: { db: Database.Database; rowsRead(): number };
  /** SQL text of the read statements that name `candidate_at`, for their query plan. */
  readonly candidateSql: Set<string>;
  close(): Promise<void>;
}

let copies = 0;
/** A fresh copy of the template's files, opened as `mam serve` opens its store, counted. */
async function openCopy(template: Template, root: string): Promise<Side> {
  const dir = path.join(root, `copy-${copies++}`);
  await cp(template.dir, dir, { recursive: true });
  // On disk before the pass starts, so the copy's write-back does not land in a timed pass.
  await syncTree(dir);
  const connection = countingConnection(path.join(dir, "mam.db"));
  const candidateSql = new Set<string>();
  const prepare = connection.db.prepare.bind(connection.db);
  connection.db.prepare = ((sql: string) => {
    const statement = prepare(sql);
    if (statement.reader && statement.readonly && /candidate_at/.test(sql)) candidateSql.add(sql);
    return statement;
  }) as typeof connection.db.prepare;
  const store = openEmbeddedJobStore(connection.db);
  const reads = Object.fromEntries(READS.map((r) => [r, 0])) as Record<Read, number>;
  const spent = new Map<string, Spent>();
  const files = new FileReportStore(path.join(dir, "reports"));
  const reports = instrumented(files, "reports.", spent);
  const deps = depsOver(instrumented(store.jobs, "jobs.", spent, reads), reports, new TestClock(template.at));
  return {
    deps,
    reads,
    spent,
    connection,
    candidateSql,
    async close() {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function syncTree(dir: string): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue;
    const handle = await open(path.join(entry.parentPath, entry.name), "r");
    try {
      await handle.sync();
    } finally {
      await handle.close();
    }
  }
}

interface Pass {
  readonly ms: number;
  readonly reads: Record<Read, number>;
  readonly rows: number;
  readonly spent: ReadonlyMap<string, Spent>;
  readonly plan: readonly string[];
}

const SIDES = ["sweep", "direct"] as const;
type SideName = (typeof SIDES)[number];

async function runPass(side: SideName, template: Template, root: string): Promise<Pass> {
  const s = await openCopy(template, root);
  try {
    const rowsBefore = s.connection.rowsRead();
    const started = performance.now();
    if (side === "sweep") {
      const result = await evaluateDueCandidates(s.deps as Parameters<typeof evaluateDueCandidates>[0], {
        budget: { evaluations: DUE, bytes: Number.MAX_SAFE_INTEGER },
      });
      if (result.due !== DUE || result.completed !== DUE) {
        const other = result.results.find((r) => r.outcome !== "completed");
        throw new Error(`sweep: ${result.due} due, ${result.completed} completed of ${DUE}; first other: ${JSON.stringify(other ?? null)}`);
      }
    } else {
      for (const id of template.due) {
        const answer = await evaluateJob(s.deps, id, RECORDED);
        if (!answer.committed) throw new Error(`direct: job ${id} not completed: ${answer.reason}`);
      }
    }
    const ms = performance.now() - started;
    const rows = s.connection.rowsRead() - rowsBefore;
    const reads = { ...s.reads };
    const spent = new Map(s.spent);
    // The marks due later are still there, untouched (read after the figures are taken).
    const later = await s.deps.jobs.listCandidates(LATER + 1, { dueBy: "9999-12-31T23:59:59.999Z" });
    if (later.length !== LATER) throw new Error(`${side}: ${later.length} marks left after the pass, not the ${LATER} due later`);
    const plan = [...s.candidateSql].flatMap((sql) =>
      (s.connection.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...sqlParams(sql)) as { detail: string }[]).map((r) => r.detail),
    );
    return { ms, reads, rows, spent, plan };
  } finally {
    await s.close();
  }
}

/** Placeholder values for a statement's parameters: a query plan does not depend on them. */
function sqlParams(sql: string): unknown[] {
  return Array.from({ length: (sql.match(/\?/g) ?? []).length }, () => null);
}

const readsLine = (p: Pass) =>
  `${grouped(total(p.reads))} records (${READS.filter((r) => p.reads[r] > 0)
    .map((r) => `${r} ${grouped(p.reads[r])}`)
    .join(", ")}); SQLite job rows ${grouped(p.rows)}`;
/** Each store method's time per candidate, the largest first, and the rest (the gate's own work and the awaits between). */
function breakdown(all: readonly Pass[]): string {
  const names = [...new Set(all.flatMap((p) => [...p.spent.keys()]))];
  const per = (p: Pass, name: string) => ((p.spent.get(name)?.ms ?? 0) * 1000) / DUE;
  const calls = (name: string) => {
    const each = median(all.map((p) => (p.spent.get(name)?.calls ?? 0) / DUE));
    return Number.isInteger(each) ? String(each) : fixed(each, 2);
  };
  const rows = names.map((name) => ({ name, us: median(all.map((p) => per(p, name))) })).sort((a, b) => b.us - a.us);
  const rest = median(all.map((p) => (p.ms * 1000) / DUE - names.reduce((sum, name) => sum + per(p, name), 0)));
  return `${fixed(median(all.map((p) => (p.ms * 1000) / DUE)), 0)} us: ${rows
    .map((r) => `${r.name} ${fixed(r.us, 0)} (${calls(r.name)} a candidate)`)
    .join(", ")}, the rest ${fixed(rest, 0)}`;
}
const total = (reads: Record<Read, number>) => READS.reduce((sum, r) => sum + reads[r], 0);
const rate = (p: Pass) => DUE / (p.ms / 1000);

console.log(
  `sweep: ${grouped(JOBS)} running jobs, ${grouped(DUE)} due candidates, ${grouped(LATER)} marked due later, ${ROUNDS} rounds; ${machineNote()}`,
);
const tmp = await tempDir("mam-bench-sweep-");
try {
  const buildStarted = performance.now();
  const template = await buildTemplate(path.join(tmp.dir, "template"));
  const dbBytes = (await stat(path.join(template.dir, "mam.db"))).size;
  console.log(
    `built the store in ${fixed((performance.now() - buildStarted) / 1000)} s (mam.db ${fixed(dbBytes / MiB)} MiB); ` +
      "each pass runs on a fresh copy of its files",
  );

  // One pass of each side first, not counted: the code paths warm up before any round is timed.
  for (const side of SIDES) await runPass(side, template, tmp.dir);
  const passes: Record<SideName, Pass[]> = { sweep: [], direct: [] };
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? SIDES : ([...SIDES].reverse() as SideName[]);
    for (const side of order) passes[side].push(await runPass(side, template, tmp.dir));
    const [sweep, direct] = [passes.sweep.at(-1) as Pass, passes.direct.at(-1) as Pass];
    console.log(
      `round ${round + 1} (${order.join(", ")}): sweep ${grouped(rate(sweep))} candidates/s (${fixed(sweep.ms)} ms), ` +
        `direct ${grouped(rate(direct))}/s (${fixed(direct.ms)} ms): ${fixed(rate(sweep) / rate(direct), 2)}x`,
    );
  }

  const sweepPass = passes.sweep[0] as Pass;
  const directPass = passes.direct[0] as Pass;
  console.log(`  sweep pass read: ${readsLine(sweepPass)}`);
  console.log(`  direct evaluation read: ${readsLine(directPass)}`);
  console.log(`  the sweep's candidate query plan: ${sweepPass.plan.join("; ") || "(no statement naming candidate_at was prepared)"}`);
  for (const side of SIDES) console.log(`  where a ${side} candidate's time goes (medians of the rounds): ${breakdown(passes[side])}`);
  const ratios = passes.sweep.map((p, i) => rate(p) / rate(passes.direct[i] as Pass));
  const ratio = median(ratios);
  const worstReads = Math.max(...passes.sweep.map((p) => total(p.reads)));
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
  console.log(`records read: ${grouped(worstReads)} (due ${grouped(DUE)}, jobs ${grouped(JOBS)})`);
  console.log(
    `sweep reads: ${grouped(worstReads)} records for ${grouped(DUE)} due of ${grouped(JOBS)} jobs ` +
      `(goal <= ${READS_PER_DUE} x due = ${grouped(READS_PER_DUE * DUE)}) ${verdict(worstReads <= READS_PER_DUE * DUE)}; ` +
      `SQLite job rows ${grouped(Math.max(...passes.sweep.map((p) => p.rows)))}`,
  );
  console.log(
    `sweep pass: ${fixed(ratio, 2)}x direct evaluation (goal >= ${RATE_GOAL}x) ${verdict(ratio >= RATE_GOAL)}; ` +
      `rounds ${fixed(Math.min(...ratios), 2)}-${fixed(Math.max(...ratios), 2)}x (${ratios.map((r) => fixed(r, 2)).join(" ")}); ` +
      `sweep ${grouped(median(passes.sweep.map(rate)))} candidates/s, direct ${grouped(median(passes.direct.map(rate)))}/s`,
  );
} finally {
  await tmp.dispose();
}
