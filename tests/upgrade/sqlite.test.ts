/**
 * Upgrading a `mam serve` data dir: the v1 fixture (fixtures/storage/v1/data-dir,
 * captured from main before storage versions) opened by this code. `mam serve`
 * migrates it at start; every completed job re-verifies against its pinned evidence;
 * the owed intent is sent by the start-up sweep to a real MQTT subscriber and the
 * quarantined one is not; listings, the feed, leases and usage read as they were
 * written. The steps are idempotent and resumable (a step crashed in its middle, by
 * SIGKILL, leaves the database at the version before it), and a database newer than
 * this code is refused, naming both versions, before anything listens.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import path from "node:path";
import { createTokenService, SCOPES } from "@mam/api";
import { runCli, startService } from "@mam/cli";
import { MamError, parseConfig, parseFlags, randomIds, reviewAttention, systemClock, verifyAttemptReport } from "@mam/core";
import { migrateDataDir, migrateSqlite, SQLITE_SCHEMA_VERSION, SQLITE_STEPS, SqliteJobStore, startEmbeddedBroker } from "@mam/local";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { refusedServe } from "../support/serve-process.ts";
import { subscribe } from "../support/subscriber.ts";
import { completedJobs, copyDataDir, expectations, FIXTURE_SIGNING_KEY } from "./fixtures.ts";

const V1 = expectations(1, "data-dir");
const operator = createTokenService({ signingKey: FIXTURE_SIGNING_KEY, clock: systemClock }).mintOperator(SCOPES);

/** The database's layout: every table's and index's SQL, and its version. */
function layoutOf(file: string): { version: number; schema: string[] } {
  const db = new Database(file, { readonly: true });
  try {
    const schema = (db.prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").all() as { sql: string | null }[]).map(
      (r) => JSON.stringify(r),
    );
    return { version: db.pragma("user_version", { simple: true }) as number, schema };
  } finally {
    db.close();
  }
}

function columnsOf(file: string, table: string): string[] {
  const db = new Database(file, { readonly: true });
  try {
    return (db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[]).map((c) => c.name);
  } finally {
    db.close();
  }
}

/** A v1 database as those stamped 1 before the change feed were: no feed_before, no changes table, no owed partial indexes. */
function makeOlderV1(file: string): void {
  const db = new Database(file);
  db.exec(`DROP INDEX jobs_owed_due; DROP INDEX jobs_owed_quarantined; ALTER TABLE jobs DROP COLUMN feed_before;
    DROP TABLE changes; DELETE FROM sqlite_sequence WHERE name = 'changes';`);
  db.close();
}

describe("upgrading a v1 data dir (fixtures/storage/v1/data-dir)", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });
  const copy = async () => {
    const t = await copyDataDir(1);
    cleanup.push(() => t.remove());
    return { dir: t.dir, db: path.join(t.dir, "mam.db") };
  };

  it("mam serve upgrades it at start, and every job reads as it was: completions re-verify on their pinned evidence, the owed intent is sent to a subscriber, the quarantined one stays, listings, feed, leases and usage", async () => {
    const { dir, db } = await copy();
    expect(layoutOf(db).version).toBe(1);
    // An external broker, so the subscriber is there before the start-up sweep publishes.
    const mqtt = { username: "mam-service", password: randomBytes(8).toString("hex") };
    const broker = await startEmbeddedBroker({ port: 0, publisherCredentials: mqtt });
    cleanup.push(() => broker.close());
    const sub = await subscribe(broker.url, "mam/jobs/+/events");
    cleanup.push(() => sub.close());
    const logs: string[] = [];
    const service = await startService(
      parseConfig({
        MAM_DATA_DIR: dir,
        MAM_PORT: "0",
        MAM_MQTT_URL: broker.url,
        MAM_MQTT_USERNAME: mqtt.username,
        MAM_MQTT_PASSWORD: mqtt.password,
        MAM_SWEEP_INTERVAL_SECONDS: "86400",
      }),
      (line) => logs.push(line),
    );
    cleanup.push(() => service.stop());
    expect(logs.map((l) => JSON.parse(l))).toContainEqual(
      expect.objectContaining({
        msg: "job database upgraded",
        from: 1,
        to: SQLITE_SCHEMA_VERSION,
        steps: [
          expect.objectContaining({ version: 2 }),
          expect.objectContaining({ version: 3 }),
          expect.objectContaining({ version: 4 }),
          expect.objectContaining({ version: 5 }),
        ],
      }),
    );
    expect(layoutOf(db).version).toBe(SQLITE_SCHEMA_VERSION);
    const get = async (url: string) => {
      const res = await fetch(new URL(url, service.url), { headers: { authorization: `Bearer ${operator}` } });
      expect(res.status, url).toBe(200);
      // biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field in assertions
      return (await res.json()) as Record<string, any>;
    };

    // The owed intent, sent by the start-up sweep; the quarantined one never.
    const owed = V1["j-owed"]?.owed_intent_id;
    const sent = await sub.waitFor((m) => m.topic === "mam/jobs/j-owed/events", 10_000);
    expect(JSON.parse(sent.payload)).toMatchObject({ event: "cancelled", job_id: "j-owed", data: { notification_intent: { id: owed } } });
    await expect.poll(async () => (await get("/v1/jobs/j-owed")).pending_notification).toBeUndefined();
    const quarantined = await get("/v1/jobs/j-quarantined");
    expect(quarantined.pending_notification).toMatchObject({ id: V1["j-quarantined"]?.owed_intent_id, quarantined_at: expect.any(String) });
    expect(sub.received.filter((m) => m.topic === "mam/jobs/j-quarantined/events")).toEqual([]);

    // Every completion, on its pinned evidence: over the API and through core.
    expect(completedJobs(V1).sort()).toEqual(["j-agent-done", "j-gate-done"]);
    for (const jobId of completedJobs(V1)) {
      const v = await get(`/v1/jobs/${jobId}/attempts/1/verification`);
      expect(v, jobId).toMatchObject({ ok: true, matches_completion: true, pinned: { ok: true } });
      const core = await verifyAttemptReport(service.deps, jobId, 1);
      expect(core, jobId).toMatchObject({ ok: true, matchesCompletion: true });
      const record = await get(`/v1/jobs/${jobId}`);
      expect(record.completed_evidence, jobId).toEqual(V1[jobId]?.completed_evidence);
      expect(record.completed_by).toBe(V1[jobId]?.completed_by);
    }

    // Each job as it was, the issue 17 fields included.
    for (const [jobId, e] of Object.entries(V1)) {
      const r = await get(`/v1/jobs/${jobId}`);
      expect(r, jobId).toMatchObject({ status: e.status, transition_seq: e.transition_seq, evidence_seq: e.evidence_seq });
      expect(r.agent_usage, jobId).toEqual(e.agent_usage);
      expect(r.upload_in_flight, jobId).toEqual(e.upload_in_flight);
      expect(r.finalize_in_progress, jobId).toEqual(e.finalize_in_progress);
    }
    expect(V1["j-running"]?.upload_in_flight).toMatchObject({ declared: true });
    expect(V1["j-finalizing"]?.finalize_in_progress).toBeDefined();

    // Listing by status, newest first.
    const byStatus = async (status: string) =>
      ((await get(`/v1/jobs?status=${status}`)).items as { job_id: string }[]).map((j) => j.job_id).sort();
    for (const status of ["pending", "running", "completed", "error", "cancelled"]) {
      const want = Object.entries(V1)
        .filter(([, e]) => e.status === status)
        .map(([id]) => id)
        .sort();
      expect(await byStatus(status), status).toEqual(want);
    }

    // The feed: the v1 rows, then the rows of what happened since (the sweep's settle).
    const v1Rows = (
      new Database(path.join(import.meta.dirname, "../../fixtures/storage/v1/data-dir/mam.db"), { readonly: true })
        .prepare("SELECT count(*) AS n FROM changes")
        .get() as { n: number }
    ).n;
    expect(v1Rows).toBeGreaterThan(0);
    const feed = await get("/v1/events?limit=500");
    expect(feed.items.length).toBeGreaterThanOrEqual(v1Rows);
    expect(new Set(feed.items.map((r: { job_id: string }) => r.job_id))).toEqual(new Set(Object.keys(V1)));
  });

  it("running the migration again is a no-op; running a step's up twice changes nothing", async () => {
    const { dir, db } = await copy();
    const started = performance.now();
    expect(migrateDataDir(dir)).toMatchObject({
      from: 1,
      to: SQLITE_SCHEMA_VERSION,
      applied: [{ version: 2 }, { version: 3 }, { version: 4 }, { version: 5 }],
    });
    const ms = performance.now() - started;
    // Step 4 put every running job in the attention index, due now (its first look sets its key); no other job.
    const keyed = new Database(db, { readonly: true });
    try {
      const rows = keyed.prepare("SELECT job_id, status, attention_at, json_extract(doc, '$.attention_at') AS doc_at FROM jobs").all() as {
        job_id: string;
        status: string;
        attention_at: string | null;
        doc_at: string | null;
      }[];
      expect(rows.filter((r) => r.attention_at !== null).map((r) => r.job_id)).toEqual(
        rows.filter((r) => r.status === "running").map((r) => r.job_id),
      );
      expect(rows.some((r) => r.status === "running")).toBe(true);
      for (const r of rows) expect(r.doc_at, r.job_id).toBe(r.attention_at);
    } finally {
      keyed.close();
    }
    const after = layoutOf(db);
    expect(migrateDataDir(dir)).toEqual({ from: SQLITE_SCHEMA_VERSION, to: SQLITE_SCHEMA_VERSION, applied: [] });
    expect(layoutOf(db)).toEqual(after);
    // Each step's up, again, on a database it already ran on.
    const conn = new Database(db);
    for (const step of SQLITE_STEPS) conn.transaction(() => step.up(conn))();
    conn.close();
    expect(layoutOf(db)).toEqual(after);
    expect(ms).toBeLessThan(5_000);
  });

  it("an older v1 layout (stamped 1 before the feed: no feed_before, no changes table, no owed indexes) gets them, and the store writes feed rows", async () => {
    const { dir, db } = await copy();
    makeOlderV1(db);
    expect(columnsOf(db, "jobs")).not.toContain("feed_before");
    migrateDataDir(dir);
    expect(columnsOf(db, "jobs")).toContain("feed_before");
    const names = layoutOf(db).schema.map((s) => JSON.parse(s).name);
    expect(names).toEqual(expect.arrayContaining(["changes", "changes_by_job", "jobs_owed_due", "jobs_owed_quarantined"]));
    const store = new SqliteJobStore(db);
    try {
      expect((await store.listOwed(10)).map((r) => r.job_id)).toEqual(["j-owed"]);
      // A write on the upgraded layout commits its feed row with it (feed_before, changes).
      const cancelled = await store.transition("j-pending", 0, {
        from: ["pending"],
        set: { status: "cancelled", updated_at: "2026-12-01T00:00:00.000Z" },
      });
      expect(cancelled.status).toBe("cancelled");
      const rows = await store.listChanges({ limit: 10, jobId: "j-pending" });
      expect(rows.items.map((r) => r.kind)).toEqual(["job.transitioned"]);
    } finally {
      await store.close();
    }
  });

  it("the jobs of a database made before the counts are counted once by step 5 (issue 22): a second run, a step's up run again, and the writes after it keep the counts exact", async () => {
    const { dir, db } = await copy();
    const want = { pending: 0, running: 0, completed: 0, error: 0, cancelled: 0 } as Record<string, number>;
    for (const e of Object.values(V1)) want[e.status] = (want[e.status] ?? 0) + 1;
    expect(Object.values(want).reduce((a, b) => a + b, 0)).toBe(Object.keys(V1).length);
    migrateDataDir(dir);
    const store = new SqliteJobStore(db);
    try {
      expect(await store.countByStatus()).toEqual({ counts: want, consistency: "exact" });
      // The step's up again (a crash before its version was recorded): a recount, never an increment.
      const conn = new Database(db);
      conn.transaction(() => SQLITE_STEPS[4]?.up(conn))();
      conn.close();
      expect(migrateDataDir(dir).applied).toEqual([]);
      expect((await store.countByStatus()).counts).toEqual(want);
      // A job from before the upgrade moves its count like any other.
      await store.transition("j-pending", 0, { from: ["pending"], set: { status: "cancelled", updated_at: "2026-12-01T00:00:00.000Z" } });
      expect((await store.countByStatus()).counts).toEqual({ ...want, pending: want.pending! - 1, cancelled: want.cancelled! + 1 });
    } finally {
      await store.close();
    }
  });

  it("the running jobs of a database made before the attention index are in it after the upgrade, due at once: the sweep looks at them, so one silent since before the upgrade is marked stale (issue 20)", async () => {
    const { dir, db } = await copy();
    migrateDataDir(dir);
    const running = Object.entries(V1)
      .filter(([, e]) => e.status === "running")
      .map(([id]) => id)
      .sort();
    expect(running.length).toBeGreaterThan(0);
    const store = new SqliteJobStore(db);
    try {
      const due = await store.listAttention(100, { dueBy: "2100-01-01T00:00:00.000Z" });
      expect(due.map((r) => r.job_id).sort()).toEqual(running);
      for (const r of due) expect(r.attention_at, r.job_id).toBe(r.updated_at);
      // Silent since before the upgrade (the fixture's jobs are days old): marked at the first look.
      const pass = await reviewAttention({ jobs: store, clock: systemClock, ids: randomIds, flags: parseFlags({}) });
      expect(pass).toMatchObject({ due: running.length, stale: running.length });
      expect((await store.list({ limit: 10, mark: "stale" })).items.map((r) => r.job_id).sort()).toEqual(running);
    } finally {
      await store.close();
    }
  });

  it("a step that crashed in its middle (SIGKILL inside its transaction) left the version before it, and the next start resumes", async () => {
    const { dir, db } = await copy();
    makeOlderV1(db);
    // A process that runs step 2's up and is killed before its transaction commits.
    const child = spawnSync(
      process.execPath,
      [
        "--import",
        "tsx",
        "-e",
        `import Database from "better-sqlite3";
         import { SQLITE_STEPS } from "@mam/local";
         const db = new Database(${JSON.stringify(db)});
         db.exec("BEGIN IMMEDIATE");
         SQLITE_STEPS[1].up(db);
         process.kill(process.pid, "SIGKILL");`,
      ],
      { cwd: path.join(import.meta.dirname, "../.."), encoding: "utf8" },
    );
    expect(child.signal, child.stderr).toBe("SIGKILL");
    expect(layoutOf(db).version).toBe(1);
    expect(columnsOf(db, "jobs")).not.toContain("feed_before");
    expect(migrateDataDir(dir)).toMatchObject({ from: 1, to: SQLITE_SCHEMA_VERSION });
    expect(columnsOf(db, "jobs")).toContain("feed_before");
  });

  it("a run stopped between steps (a fresh database stopped after step 1) resumes at step 2; a step that throws bumps nothing", async () => {
    const { db } = await copy();
    const fresh = path.join(path.dirname(db), "fresh.db");
    const conn = new Database(fresh);
    try {
      expect(() =>
        migrateSqlite(conn, {
          onStep: (v) => {
            if (v === 1) throw new Error("killed between steps");
          },
        }),
      ).toThrow("killed between steps");
      expect(conn.pragma("user_version", { simple: true })).toBe(1);
      const failing = [SQLITE_STEPS[0]!, { ...SQLITE_STEPS[1]!, up: halfWay }];
      expect(() => migrateSqlite(conn, { steps: failing })).toThrow("half way");
      expect(conn.pragma("user_version", { simple: true })).toBe(1);
      expect(migrateSqlite(conn)).toMatchObject({
        from: 1,
        to: SQLITE_SCHEMA_VERSION,
        applied: [{ version: 2 }, { version: 3 }, { version: 4 }, { version: 5 }],
      });
    } finally {
      conn.close();
    }
    /** Step 2's whole up, then a throw before its transaction commits. */
    function halfWay(d: Database.Database): never {
      void SQLITE_STEPS[1]?.up(d);
      throw new Error("half way");
    }
  });

  it("a database stamped with a future version is refused, naming both versions: mam serve and mam migrate exit 1, no stack trace, nothing written", async () => {
    const { dir, db } = await copy();
    const conn = new Database(db);
    conn.pragma("user_version = 99");
    conn.close();
    const before = layoutOf(db);
    expect(() => migrateDataDir(dir)).toThrow(MamError);
    try {
      migrateDataDir(dir);
    } catch (e) {
      expect(e).toMatchObject({ code: "store.version", details: { found_version: 99, known_version: SQLITE_SCHEMA_VERSION } });
    }
    expect(() => new SqliteJobStore(db)).toThrow(/schema version 99, newer than this mam knows \(version 5\)/);
    const served = await refusedServe(dir);
    expect(served.code).toBe(1);
    expect(served.stderr).toMatch(/mam serve: the job database .*mam\.db is at schema version 99, newer than this mam knows \(version 5\)/);
    expect(served.stderr).not.toMatch(/\n\s+at /);
    const io = captureIo({});
    expect(await runCli(["migrate", "--data-dir", dir, "--json"], io)).toBe(1);
    expect(JSON.parse(io.out.join(""))).toMatchObject({ error: { code: "store.version" } });
    expect(layoutOf(db)).toEqual(before);
  });

  it("mam migrate --data-dir upgrades and says what it did; a second run has nothing to do", async () => {
    const { dir } = await copy();
    const io = captureIo({});
    expect(await runCli(["migrate", "--data-dir", dir, "--json"], io)).toBe(0);
    expect(JSON.parse(io.out.join(""))).toMatchObject({
      from: 1,
      to: SQLITE_SCHEMA_VERSION,
      applied: [{ version: 2 }, { version: 3 }, { version: 4 }, { version: 5 }],
    });
    const again = captureIo({});
    expect(await runCli(["migrate", "--data-dir", dir], again)).toBe(0);
    expect(again.out.join("")).toMatch(/at schema version 5, nothing to do/);
  });
});
