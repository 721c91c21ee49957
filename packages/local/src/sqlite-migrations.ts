import { type MigrationResult, type MigrationStep, pendingSteps } from "@mam/core";
import Database from "better-sqlite3";

/**
 * The embedded job database's schema versions, kept in `PRAGMA user_version`, and the
 * steps between them. `migrateSqlite` runs at every open (`SqliteJobStore`'s
 * constructor: `mam serve`, the CLI's `--data-dir` mode, `mam migrate`), each step in
 * a transaction of its own that also bumps `user_version`: SQLite's DDL and the
 * header's `user_version` are transactional, so a step that crashed left nothing and
 * the version says exactly which steps completed. The transaction is `BEGIN
 * IMMEDIATE` and re-reads the version under the write lock, so two processes opening
 * one file at once run each step once. Every `up` is idempotent all the same (IF NOT
 * EXISTS, a column added only when absent), so running one twice is harmless.
 *
 * A step's SQL is frozen as released: the store's queries may change, its steps do
 * not. A change of layout is a new step at the end, with its upgrade test from the
 * previous version's fixture (docs/adapters.md, "Storage versions and upgrades").
 *
 *   version 0 ... a new (empty) file, or a database from before versions
 *   version 1 ... the v1 layout: jobs, dispatches, events; evidence_seq on every record
 *   version 2 ... what v1 databases gained ad hoc: the owed columns and indexes, feed_before, the changes table
 *   version 3 ... the driver seam's writes (issue 18): write_token on jobs, the atomic_guard table
 *   version 4 ... the marks (issue 20): candidate_at and attention_at on jobs, their partial indexes
 *   version 5 ... the counts per status (issue 22): job_counts, status_before on jobs; existing jobs counted once
 */

/** The two parts of the owed index. A query is served by a partial index only when its WHERE names the index's own condition, so both are spelled once, here. */
export const OWED_DUE = "owed_intent_id IS NOT NULL AND owed_quarantined_id IS NOT owed_intent_id";
export const OWED_QUARANTINED = "owed_quarantined_id = owed_intent_id";
/** The candidate index's condition (see `OWED_DUE`): only marked jobs are in it. */
export const CANDIDATE_MARKED = "candidate_at IS NOT NULL";
/** The attention index's condition: only jobs the sweep is to look at again. */
export const ATTENTION_KEYED = "attention_at IS NOT NULL";

export const SQLITE_STEPS: readonly MigrationStep<Database.Database>[] = [
  {
    version: 1,
    describe: "the v1 layout: the jobs, dispatches and events tables and their indexes; every record carries evidence_seq (0 where absent)",
    up(db) {
      db.exec(`
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  transition_seq INTEGER NOT NULL,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL,
  owed_intent_id TEXT NULL,
  owed_at TEXT NULL,
  doc TEXT NOT NULL CHECK (json_valid(doc))
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, updated_at, job_id);
CREATE TABLE IF NOT EXISTS dispatches (
  job_id TEXT NOT NULL,
  attempt_id INTEGER NOT NULL,
  doc TEXT NOT NULL CHECK (json_valid(doc)),
  PRIMARY KEY (job_id, attempt_id)
);
CREATE TABLE IF NOT EXISTS events (
  rowid INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL,
  id TEXT NOT NULL,
  at TEXT NOT NULL,
  doc TEXT NOT NULL CHECK (json_valid(doc)),
  UNIQUE (job_id, id)
);
CREATE INDEX IF NOT EXISTS events_by_time ON events (job_id, at, id);
UPDATE jobs SET doc = json_set(doc, '$.evidence_seq', 0) WHERE json_type(doc, '$.evidence_seq') IS NULL;`);
    },
  },
  {
    version: 2,
    describe:
      "what v1 databases gained by ad-hoc ALTER TABLE: owed_quarantined_id, owed_revision and feed_before on jobs; the owed partial indexes in place of jobs_owed and jobs_by_updated; the changes table (the feed starts when it does)",
    up(db) {
      const columns = new Set((db.prepare("PRAGMA table_info(jobs)").all() as { name: string }[]).map((c) => c.name));
      for (const column of ["owed_quarantined_id", "owed_revision", "feed_before"]) {
        if (!columns.has(column)) db.exec(`ALTER TABLE jobs ADD COLUMN ${column} TEXT NULL`);
      }
      // The change feed: one row per change a write made (core's `changeRowsOf`), `row`
      // the row's JSON without its cursor, time and job. AUTOINCREMENT: a cursor is
      // never reused, even after the newest rows were deleted.
      db.exec(`
DROP INDEX IF EXISTS jobs_by_updated;
DROP INDEX IF EXISTS jobs_owed;
CREATE INDEX IF NOT EXISTS jobs_owed_due ON jobs (owed_at, job_id) WHERE ${OWED_DUE};
CREATE INDEX IF NOT EXISTS jobs_owed_quarantined ON jobs (owed_at, job_id) WHERE ${OWED_QUARANTINED};
CREATE TABLE IF NOT EXISTS changes (
  cursor INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  at TEXT NOT NULL,
  row TEXT NOT NULL CHECK (json_valid(row))
);
CREATE INDEX IF NOT EXISTS changes_by_job ON changes (job_id, cursor);`);
    },
  },
  {
    version: 3,
    describe:
      "the SQL driver seam's writes: write_token on jobs (the token of the write that last changed a row, which the feed rows of the same batch select on) and atomic_guard (a one-column table whose CHECK fails a batch whose conditional part changed no row)",
    up(db) {
      const columns = new Set((db.prepare("PRAGMA table_info(jobs)").all() as { name: string }[]).map((c) => c.name));
      if (!columns.has("write_token")) db.exec("ALTER TABLE jobs ADD COLUMN write_token TEXT NULL");
      db.exec("CREATE TABLE IF NOT EXISTS atomic_guard (held INTEGER NOT NULL CHECK (held = 1))");
    },
  },
  {
    version: 4,
    describe:
      "the marks: candidate_at on jobs (when the scheduled evaluation is next due, core's sortable time; NULL: not a candidate) and attention_at (when the sweep next looks for staleness or a deadline; NULL: never), each with its partial index (jobs_candidates, jobs_attention: (key, job_id) where the key is set), so the sweep reads only the jobs due; no record carries a mark before it, and each running job is due for a look at once",
    up(db) {
      const columns = new Set((db.prepare("PRAGMA table_info(jobs)").all() as { name: string }[]).map((c) => c.name));
      for (const column of ["candidate_at", "attention_at"]) {
        if (!columns.has(column)) db.exec(`ALTER TABLE jobs ADD COLUMN ${column} TEXT NULL`);
      }
      db.exec(`CREATE INDEX IF NOT EXISTS jobs_candidates ON jobs (candidate_at, job_id) WHERE ${CANDIDATE_MARKED}`);
      db.exec(`CREATE INDEX IF NOT EXISTS jobs_attention ON jobs (attention_at, job_id) WHERE ${ATTENTION_KEYED}`);
      // A job running before the index would never be in it (only a claim, a dispatch and
      // the sweep key it): each is due at its last update, so the sweep's first look sets
      // its key from the whole record. Only the unkeyed are written: idempotent.
      db.exec(`UPDATE jobs SET attention_at = updated_at, doc = json_set(doc, '$.attention_at', updated_at)
        WHERE status = 'running' AND attention_at IS NULL`);
    },
  },
  {
    version: 5,
    describe:
      "the counts per status: job_counts (status, n), which every create and status-changing write moves in its own batch, and status_before on jobs (the status the row left at the last write that moved it, which that batch's count statements read); the jobs already there counted once",
    up(db) {
      const columns = new Set((db.prepare("PRAGMA table_info(jobs)").all() as { name: string }[]).map((c) => c.name));
      if (!columns.has("status_before")) db.exec("ALTER TABLE jobs ADD COLUMN status_before TEXT NULL");
      db.exec("CREATE TABLE IF NOT EXISTS job_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID");
      // A recount, not an increment: the step runs under the write lock (no write moves
      // a count meanwhile), so running it again, or after a crash, leaves the same counts.
      db.exec("DELETE FROM job_counts");
      db.exec("INSERT INTO job_counts (status, n) SELECT status, count(*) FROM jobs GROUP BY status");
    },
  },
];

/** The version this code reads and writes. */
export const SQLITE_SCHEMA_VERSION = SQLITE_STEPS.length;

export function sqliteSchemaVersion(db: Database.Database): number {
  return db.pragma("user_version", { simple: true }) as number;
}

/**
 * Bring the database to the last of `steps` (this code's steps unless a test hands
 * others), one transaction per step; refuse (`store.version`, nothing written) a
 * database newer than the steps know. `onStep` is told after each step committed
 * (tests stop a run there, as a crash would).
 */
export function migrateSqlite(
  db: Database.Database,
  opts: { steps?: readonly MigrationStep<Database.Database>[]; onStep?: (version: number) => void } = {},
): MigrationResult {
  const steps = opts.steps ?? SQLITE_STEPS;
  const store = `the job database ${db.name}`;
  const from = sqliteSchemaVersion(db);
  const applied: { version: number; describe: string }[] = [];
  for (const step of pendingSteps(steps, from, store)) {
    const ran = db
      .transaction(() => {
        // Under the write lock: another process may have run this step while we waited.
        if (sqliteSchemaVersion(db) >= step.version) return false;
        void step.up(db);
        db.pragma(`user_version = ${step.version}`);
        return true;
      })
      .immediate();
    if (ran) applied.push({ version: step.version, describe: step.describe });
    opts.onStep?.(step.version);
  }
  return { from, to: Math.max(from, sqliteSchemaVersion(db)), applied };
}

/**
 * Migrate a database file on a connection of its own (made if absent), and close it:
 * what `mam serve` does first at start, before anything listens, and what `mam
 * migrate --data-dir` does. WAL as the store opens it, so a running reader is not blocked.
 */
export function migrateDatabaseFile(file: string, opts: Parameters<typeof migrateSqlite>[1] = {}): MigrationResult {
  const db = new Database(file);
  try {
    db.pragma("busy_timeout = 5000");
    db.pragma("journal_mode = WAL");
    return migrateSqlite(db, opts);
  } finally {
    db.close();
  }
}
