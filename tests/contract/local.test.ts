import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { readdir, stat, symlink, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { type AtomicWrite, EVENT_PAGE_MAX_BYTES, type JobRecord, type JobStore, JobStoreBase, MamError } from "@mam/core";
import {
  type EmbeddedBroker,
  FileReportStore,
  MqttPublisher,
  openDataDir,
  openEmbeddedJobStore,
  SqliteJobStore,
  startEmbeddedBroker,
} from "@mam/local";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { deadPort } from "../support/dead-port.ts";
import { jobRecord as job } from "../support/records.ts";
import { countingConnection } from "../support/sqlite-rows-read.ts";
import { subscribe } from "../support/subscriber.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";
import { atomicWriteContract } from "./atomic-write.suite.ts";
import { jobStoreContract } from "./job-store.suite.ts";
import { publisherContract } from "./publisher.suite.ts";
import { reportStoreContract } from "./report-store.suite.ts";
import { statusCountsContract } from "./status-counts.suite.ts";

// ---------------------------------------------------------------- JobStore

jobStoreContract("SQLite (temp file, WAL)", async () => {
  const tmp = await tempDir("sqlite");
  const sqlite = new SqliteJobStore(path.join(tmp.dir, "mam.db"));
  return {
    store: sqlite,
    async close() {
      await sqlite.close();
      await tmp.remove();
    },
  };
});

// Racers are stores of their own on the same file (own connections), as processes sharing a data dir are.
statusCountsContract("SQLite (temp file, WAL)", "exact", async () => {
  const tmp = await tempDir("sqlite-counts");
  const file = path.join(tmp.dir, "mam.db");
  const sqlite = new SqliteJobStore(file);
  return {
    store: sqlite,
    racers: (n) => Array.from({ length: n }, () => new SqliteJobStore(file)),
    async close() {
      await sqlite.close();
      await tmp.remove();
    },
  };
});

/** The SQLite store with its protected atomic write in reach of the suite. */
class AtomicSqliteJobStore extends SqliteJobStore {
  atomically(writes: readonly AtomicWrite[]) {
    return this.writeAtomically(writes);
  }
}

atomicWriteContract("SQLite (temp file, WAL)", async () => {
  const tmp = await tempDir("sqlite-atomic");
  const store = new AtomicSqliteJobStore(path.join(tmp.dir, "mam.db"));
  return {
    store,
    atomically: (w) => store.atomically(w),
    async close() {
      await store.close();
      await tmp.remove();
    },
  };
});

// The composition `mam serve` and the CLI use: the record cache must keep the contract too.
jobStoreContract("SQLite behind its record cache (openEmbeddedJobStore)", async () => {
  const tmp = await tempDir("sqlite-cached");
  const embedded = openEmbeddedJobStore(path.join(tmp.dir, "mam.db"));
  return {
    store: embedded.jobs,
    async close() {
      await embedded.close();
      await tmp.remove();
    },
  };
});

describe("SqliteJobStore, beyond the contract", () => {
  let tmp: TempDir;
  let file: string;
  let store: SqliteJobStore;
  /** Job rows read on the store's connection (`countingConnection`): the adapter keeps no counter. */
  let rowsRead: () => number;
  const open = (): SqliteJobStore => {
    const connection = countingConnection(file);
    rowsRead = connection.rowsRead;
    return new SqliteJobStore(connection.db);
  };
  beforeEach(async () => {
    tmp = await tempDir("sqlite-x");
    file = path.join(tmp.dir, "mam.db");
    store = open();
  });
  afterEach(async () => {
    await store.close();
    await tmp.remove();
  });

  it("listOwed reads only the owed rows, through the partial index", async () => {
    for (let i = 0; i < 200; i++) await store.create(job(`bulk-${i}`));
    for (const id of ["owed-1", "owed-2"]) {
      await store.create(
        job(id, { pending_notification: { id: `i-${id}`, event: "completed", seq: 0, created_at: "2025-01-15T12:01:00.000Z" } }),
      );
    }
    const before = rowsRead();
    expect((await store.listOwed(100)).map((j) => j.job_id).sort()).toEqual(["owed-1", "owed-2"]);
    expect(rowsRead() - before).toBe(2);

    const peek = new Database(file, { readonly: true });
    try {
      const plan = peek
        .prepare(
          "EXPLAIN QUERY PLAN SELECT doc FROM jobs WHERE owed_intent_id IS NOT NULL AND owed_quarantined_id IS NOT owed_intent_id ORDER BY owed_at, job_id LIMIT ?",
        )
        .all(10) as { detail: string }[];
      expect(plan.map((p) => p.detail).join(" | ")).toMatch(/USING INDEX jobs_owed_due/);
      expect(peek.pragma("journal_mode", { simple: true })).toBe("wal");
    } finally {
      peek.close();
    }
  });

  it("the sweep's listOwed(dueBy) and listQuarantined read their own partial indexes, in index order, only the rows they return", async () => {
    const owedJob = (id: string, minute: number) =>
      job(id, { pending_notification: { id: `i-${id}`, event: "completed", seq: 0, created_at: `2025-01-15T12:${minute}:00.000Z` } });
    for (let i = 0; i < 100; i++) await store.create(job(`bulk-${i}`));
    for (let i = 10; i < 40; i++) await store.create(owedJob(`owed-${i}`, i));
    // 20 of them back off past the sweep's now, 5 are quarantined.
    for (let i = 10; i < 30; i++) {
      const later = { id: `i-owed-${i}`, event: "completed", seq: 0, created_at: `2025-01-15T12:${i}:00.000Z`, failures: 1 };
      expect(await store.reviseNotification(`owed-${i}`, { ...later, retry_at: "2025-01-15T14:00:00.000Z" })).toBe(true);
    }
    for (let i = 30; i < 35; i++) {
      const intent = { id: `i-owed-${i}`, event: "completed", seq: 0, created_at: `2025-01-15T12:${i}:00.000Z`, failures: 5 };
      expect(await store.reviseNotification(`owed-${i}`, { ...intent, quarantined_at: "2025-01-15T13:00:00.000Z" })).toBe(true);
    }

    let before = rowsRead();
    const due = await store.listOwed(100, { dueBy: "2025-01-15T13:30:00.000Z" });
    expect(due.map((j) => j.job_id)).toEqual(["owed-35", "owed-36", "owed-37", "owed-38", "owed-39"]);
    expect(rowsRead() - before).toBe(5);
    before = rowsRead();
    expect((await store.listQuarantined({ limit: 100 })).items).toHaveLength(5);
    expect(rowsRead() - before).toBe(5);

    const peek = new Database(file, { readonly: true });
    const plan = (sql: string, ...params: unknown[]) =>
      (peek.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((p) => p.detail).join(" | ");
    try {
      const sweep = plan(
        "SELECT doc, owed_intent_id, owed_revision FROM jobs WHERE owed_intent_id IS NOT NULL AND owed_quarantined_id IS NOT owed_intent_id AND owed_at <= ? ORDER BY owed_at, job_id LIMIT ?",
        "x",
        10,
      );
      expect(sweep).toMatch(/SEARCH jobs USING INDEX jobs_owed_due \(owed_at<\?\)/);
      expect(sweep).not.toMatch(/TEMP B-TREE/);
      const quarantined = plan(
        "SELECT doc FROM jobs WHERE owed_quarantined_id = owed_intent_id ORDER BY owed_at DESC, job_id DESC LIMIT ?",
        10,
      );
      expect(quarantined).toMatch(/USING INDEX jobs_owed_quarantined/);
      expect(quarantined).not.toMatch(/TEMP B-TREE/);
    } finally {
      peek.close();
    }
  });

  it("a record SQLite's JSON functions can no longer rewrite is still revised and quarantined, its intent kept beside the doc", async () => {
    // 999 levels of progress take the doc past SQLite's JSON depth limit (1,000):
    // every later json_set on the row fails, settling included.
    let deep: unknown = 1;
    for (let i = 0; i < 999; i++) deep = [deep];
    const owed = { id: "i-deep", event: "completed", seq: 1, created_at: "2025-01-15T12:01:00.000Z" };
    await store.create(job("deep"));
    // No write of the store makes such a doc any more (the transition's own feed rows
    // read it, and its batch fails whole: see below); a legacy record may still be one.
    const refused = { status: "completed" as const, progress: { deep } as JobRecord["progress"], pending_notification: owed };
    await expect(store.transition("deep", 0, { from: ["pending"], set: refused })).rejects.toThrow(/malformed JSON/);
    expect(await store.get("deep")).toMatchObject({ status: "pending", transition_seq: 0 });
    const raw = new Database(file);
    raw.pragma("ignore_check_constraints = ON"); // json_valid(doc) is the table's CHECK; the legacy doc fails it
    raw
      .prepare("UPDATE jobs SET status = 'completed', transition_seq = 1, owed_intent_id = ?, owed_at = ?, doc = ? WHERE job_id = 'deep'")
      .run(owed.id, owed.created_at, JSON.stringify({ ...job("deep"), ...refused, transition_seq: 1 }));
    raw.close();
    await expect(store.settleNotification("deep", "i-deep")).rejects.toThrow(/malformed JSON/);

    const marked = { ...owed, failures: 1, retry_at: "2025-01-15T12:05:00.000Z" };
    expect(await store.reviseNotification("deep", marked)).toBe(true);
    expect((await store.listOwed(10)).map((j) => j.pending_notification)).toEqual([marked]);
    expect(await store.listOwed(10, { dueBy: "2025-01-15T12:04:00.000Z" })).toEqual([]);

    const quarantined = { ...owed, failures: 5, quarantined_at: "2025-01-15T12:30:00.000Z" };
    expect(await store.reviseNotification("deep", quarantined)).toBe(true);
    expect(await store.listOwed(10)).toEqual([]);
    expect((await store.listQuarantined({ limit: 10 })).items.map((j) => j.pending_notification)).toEqual([quarantined]);
    // Still conditional on the intent id.
    expect(await store.reviseNotification("deep", { ...quarantined, id: "someone-else" })).toBe(false);
  });

  it("a record from before evidence_seq existed reads as 0 once the database is opened, and takes evidence writes and guarded commits", async () => {
    await store.create(job("legacy", { status: "running", transition_seq: 1, latest_attempt: 1 }));
    await store.close();
    const old = new Database(file);
    old.exec("UPDATE jobs SET doc = json_remove(doc, '$.evidence_seq'); PRAGMA user_version = 0;");
    old.close();

    store = new SqliteJobStore(file);
    expect(await store.get("legacy")).toMatchObject({ evidence_seq: 0 });
    expect(await store.recordEvidence("legacy", { guard: { attempt: 1 } })).toMatchObject({ evidence_seq: 1 });
    const done = await store.transition("legacy", 1, { from: ["running"], set: { status: "cancelled" }, evidence: { seq: 1, attempt: 1 } });
    expect(done).toMatchObject({ status: "cancelled", evidence_seq: 1 });
  });

  it("a database made before the sweep's owed columns gains them, and what it owed stays owed and due", async () => {
    await store.close();
    await tmp.remove();
    tmp = await tempDir("sqlite-old");
    file = path.join(tmp.dir, "mam.db");
    const old = new Database(file);
    old.exec(`CREATE TABLE jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, transition_seq INTEGER NOT NULL,
      created_at TEXT NOT NULL, updated_at TEXT NOT NULL, owed_intent_id TEXT NULL, owed_at TEXT NULL,
      doc TEXT NOT NULL CHECK (json_valid(doc)));
      CREATE INDEX jobs_owed ON jobs (owed_at) WHERE owed_intent_id IS NOT NULL;`);
    const owed = { id: "i-old", event: "completed", seq: 1, created_at: "2025-01-15T12:01:00.000Z" };
    const record = job("old", { status: "completed", transition_seq: 1, pending_notification: owed });
    old
      .prepare("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
      .run("old", "completed", 1, record.created_at, record.updated_at, owed.id, owed.created_at, JSON.stringify(record));
    old.close();

    store = new SqliteJobStore(file);
    expect((await store.listOwed(10, { dueBy: "2025-01-15T12:02:00.000Z" })).map((j) => j.job_id)).toEqual(["old"]);
    expect(await store.reviseNotification("old", { ...owed, failures: 5, quarantined_at: "2025-01-15T12:03:00.000Z" })).toBe(true);
    expect((await store.listQuarantined({ limit: 10 })).items.map((j) => j.job_id)).toEqual(["old"]);
    const peek = new Database(file, { readonly: true });
    try {
      const indexes = (
        peek.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs'").all() as { name: string }[]
      )
        .map((i) => i.name)
        .filter((n) => n.startsWith("jobs_owed"));
      expect(indexes.sort()).toEqual(["jobs_owed_due", "jobs_owed_quarantined"]);
    } finally {
      peek.close();
    }
  });

  it("a committed transition reads no row; a lost one reads the one it reports", async () => {
    await store.create(job("cost"));
    const before = rowsRead();
    await store.transition("cost", 0, { from: ["pending"], set: { status: "running" } });
    expect(rowsRead() - before).toBe(0);
    await expect(store.transition("cost", 0, { from: ["pending"], set: { status: "running" } })).rejects.toBeInstanceOf(MamError);
    expect(rowsRead() - before).toBe(1);
  });

  it("keeps the owed columns in step with pending_notification through transition, replace and settle", async () => {
    const owed = () => {
      const peek = new Database(file, { readonly: true });
      try {
        return peek.prepare("SELECT owed_intent_id, owed_at FROM jobs WHERE job_id = 'cols'").get();
      } finally {
        peek.close();
      }
    };
    await store.create(job("cols"));
    expect(owed()).toEqual({ owed_intent_id: null, owed_at: null });
    await store.transition("cols", 0, {
      from: ["pending"],
      set: { status: "completed", pending_notification: { id: "a", event: "completed", seq: 1, created_at: "2025-01-15T12:05:00.000Z" } },
    });
    expect(owed()).toEqual({ owed_intent_id: "a", owed_at: "2025-01-15T12:05:00.000Z" });
    await store.replaceNotification("cols", { id: "b", event: "completed", seq: 1, created_at: "2025-01-15T12:06:00.000Z" });
    expect(owed()).toEqual({ owed_intent_id: "b", owed_at: "2025-01-15T12:06:00.000Z" });
    expect(await store.settleNotification("cols", "b")).toBe(true);
    expect(owed()).toEqual({ owed_intent_id: null, owed_at: null });
  });

  /**
   * The commits in the WAL file: frames whose header names the database size after
   * the commit (non-zero only on a transaction's last frame), of the WAL's current
   * generation (salts as in its header). What SQLite itself wrote, read back.
   */
  function walCommits(): number {
    const wal = readFileSync(`${file}-wal`);
    if (wal.length < 32) return 0;
    const pageSize = wal.readUInt32BE(8);
    const [salt1, salt2] = [wal.readUInt32BE(16), wal.readUInt32BE(20)];
    let commits = 0;
    for (let at = 32; at + 24 + pageSize <= wal.length; at += 24 + pageSize) {
      if (wal.readUInt32BE(at + 8) !== salt1 || wal.readUInt32BE(at + 12) !== salt2) break;
      if (wal.readUInt32BE(at + 4) !== 0) commits++;
    }
    return commits;
  }

  const toRunning = { from: ["pending" as const], set: { status: "running" as const } };

  it("writes asked in one turn commit as one transaction, in order, each refusing alone (group commit)", async () => {
    for (const id of ["g1", "g2", "g3"]) await store.create(job(id));
    const before = walCommits();
    const outcomes = await Promise.allSettled([
      store.transition("g1", 0, toRunning),
      // The same expected seq as the write before it, in the same group: it sees that write, and loses.
      store.transition("g1", 0, toRunning),
      store.transition("nobody", 0, toRunning),
      store.transition("g2", 0, toRunning),
      store.replaceNotification("g3", { id: "g3-intent", event: "progress", seq: 0, created_at: "2025-01-15T12:05:00.000Z" }),
    ]);
    expect(walCommits() - before).toBe(1);
    expect(outcomes.map((o) => o.status)).toEqual(["fulfilled", "rejected", "rejected", "fulfilled", "fulfilled"]);
    const lost = (outcomes[1] as PromiseRejectedResult).reason;
    expect(lost).toMatchObject({ code: "job.transitionConflict" });
    expect(lost.current).toMatchObject({ job_id: "g1", status: "running", transition_seq: 1 });
    expect((outcomes[2] as PromiseRejectedResult).reason).toMatchObject({ code: "job.notFound" });
    // What committed is there, with its feed rows, and nothing of the refused ones.
    const peek = new Database(file, { readonly: true });
    try {
      const statuses = peek.prepare("SELECT job_id, status, transition_seq FROM jobs WHERE job_id LIKE 'g%' ORDER BY job_id").all();
      expect(statuses).toEqual([
        { job_id: "g1", status: "running", transition_seq: 1 },
        { job_id: "g2", status: "running", transition_seq: 1 },
        { job_id: "g3", status: "pending", transition_seq: 0 },
      ]);
      const kinds = peek
        .prepare("SELECT job_id, json_extract(row, '$.kind') AS kind FROM changes WHERE job_id LIKE 'g%' ORDER BY cursor")
        .all();
      expect(kinds.slice(3)).toEqual([
        { job_id: "g1", kind: "job.transitioned" },
        { job_id: "g2", kind: "job.transitioned" },
      ]);
    } finally {
      peek.close();
    }
    expect((await store.get("g3"))?.pending_notification?.id).toBe("g3-intent");
  });

  it("a write asked just before the store closes is committed before it closes", async () => {
    await store.create(job("closing"));
    const pending = store.transition("closing", 0, toRunning);
    await store.close();
    await expect(pending).resolves.toMatchObject({ status: "running" });
    store = new SqliteJobStore(file);
    expect((await store.get("closing"))?.status).toBe("running");
  });

  it("a group whose transaction cannot start commits none of its writes, and each is told store.unavailable", async () => {
    for (const id of ["busy-1", "busy-2"]) await store.create(job(id));
    const db = new Database(file);
    const other = new Database(file);
    other.pragma("busy_timeout = 0");
    // The store's own connection waits 50 ms for the lock, not its usual 5 s.
    const own = new SqliteJobStore(db);
    db.pragma("busy_timeout = 50");
    other.exec("BEGIN IMMEDIATE");
    try {
      const outcomes = await Promise.allSettled([own.transition("busy-1", 0, toRunning), own.transition("busy-2", 0, toRunning)]);
      expect(outcomes.map((o) => (o.status === "rejected" ? o.reason.code : o.status))).toEqual(["store.unavailable", "store.unavailable"]);
    } finally {
      other.exec("ROLLBACK");
      other.close();
    }
    expect((await own.get("busy-1"))?.status).toBe("pending");
    expect((await own.get("busy-2"))?.status).toBe("pending");
    // The store works again once the lock is free.
    await expect(own.transition("busy-1", 0, toRunning)).resolves.toMatchObject({ status: "running" });
    await own.close();
  });

  it("records survive closing and reopening the file", async () => {
    await store.create(job("durable"));
    await store.close();
    store = new SqliteJobStore(file);
    expect((await store.get("durable"))?.job_id).toBe("durable");
  });

  // Beyond the contract: no DynamoDB item is larger than a page (400 KB against 1 MiB).
  it("listEvents always returns at least one entry, however large", async () => {
    const entry = (id: string, data: Record<string, string>) => ({
      job_id: "one",
      id,
      at: `2025-01-15T12:00:0${id}.000Z`,
      event: "progress",
      data,
    });
    const huge = entry("0", { blob: "y".repeat(EVENT_PAGE_MAX_BYTES + 10) });
    const next = entry("1", { i: "1" });
    await store.appendEvent(huge);
    await store.appendEvent(next);
    const first = await store.listEvents("one", { limit: 10 });
    expect(first.items).toEqual([huge]);
    expect(first.cursor).toBeDefined();
    expect(await store.listEvents("one", { limit: 10, cursor: first.cursor! })).toEqual({ items: [next] });
  });
});

describe("the record cache on SQLite (as openEmbeddedJobStore opens the store)", () => {
  let tmp: TempDir;
  let file: string;
  let sqlite: SqliteJobStore;
  let store: JobStore;
  let rowsRead: () => number;
  beforeEach(async () => {
    tmp = await tempDir("sqlite-cache");
    file = path.join(tmp.dir, "mam.db");
    const connection = countingConnection(file);
    rowsRead = connection.rowsRead;
    sqlite = new SqliteJobStore(connection.db, { cache: {} });
    store = sqlite;
  });
  afterEach(async () => {
    await sqlite.close();
    await tmp.remove();
  });

  it("get answers a repeated read from the cache, and sees every commit at once: its own, another store's, a bare connection's", async () => {
    await store.create(job("cached"));
    const before = rowsRead();
    expect((await store.get("cached"))?.status).toBe("pending");
    expect((await store.get("cached"))?.status).toBe("pending");
    expect(rowsRead() - before).toBe(1); // the second read came from the cache

    // This store's own writes (data_version does not count them).
    await store.transition("cached", 0, { from: ["pending"], set: { status: "running" } });
    expect((await store.get("cached"))?.status).toBe("running");
    await store.replaceNotification("cached", { id: "n1", event: "completed", seq: 1, created_at: "2025-01-15T12:06:00.000Z" });
    expect((await store.get("cached"))?.pending_notification?.id).toBe("n1");
    expect(await store.settleNotification("cached", "n1")).toBe(true);
    expect((await store.get("cached"))?.pending_notification).toBeUndefined();

    // Another store on the same file, as the CLI opens it beside `mam serve`.
    const other = new SqliteJobStore(file);
    try {
      await other.transition("cached", 1, { from: ["running"], set: { status: "completed" } });
    } finally {
      await other.close();
    }
    expect((await store.get("cached"))?.status).toBe("completed");

    // A connection that is not a store at all.
    const bare = new Database(file);
    try {
      bare.prepare("UPDATE jobs SET doc = json_set(doc, '$.prompt', 'changed behind its back') WHERE job_id = 'cached'").run();
    } finally {
      bare.close();
    }
    expect((await store.get("cached"))?.prompt).toBe("changed behind its back");
  });

  it("a record get returns is frozen, so callers sharing it from the cache cannot change it for each other", async () => {
    await store.create(job("frozen", { expected_artifacts: ["commit"] }));
    const record = (await store.get("frozen"))!;
    expect(() => {
      (record as { status: string }).status = "completed";
    }).toThrow(TypeError);
    expect(() => (record.expected_artifacts as string[]).push("pr")).toThrow(TypeError);
    expect((await store.get("frozen"))?.status).toBe("pending");
  });

  it("openDataDir, the store `mam serve` and the CLI use, is the persistence base, and cached", async () => {
    const opened = openDataDir(path.join(tmp.dir, "data"));
    try {
      expect(opened.jobs).toBeInstanceOf(JobStoreBase);
      await opened.jobs.create(job("via-data-dir"));
      const first = await opened.jobs.get("via-data-dir");
      expect(await opened.jobs.get("via-data-dir")).toBe(first); // the same frozen record: from the cache
      await expect(opened.jobs.get("../x")).rejects.toMatchObject({ code: "input.jobId" });
    } finally {
      opened.close();
    }
  });

  it("asking data_version reads no row, and only another connection's commit moves it", async () => {
    await sqlite.create(job("v"));
    const before = rowsRead();
    const v1 = sqlite.dataVersion();
    await sqlite.transition("v", 0, { from: ["pending"], set: { status: "running" } });
    expect(sqlite.dataVersion()).toBe(v1);
    const other = new SqliteJobStore(file);
    try {
      await other.transition("v", 1, { from: ["running"], set: { status: "completed" } });
    } finally {
      await other.close();
    }
    expect(sqlite.dataVersion()).not.toBe(v1);
    expect(rowsRead() - before).toBe(0);
  });
});

// ---------------------------------------------------------------- ReportStore

reportStoreContract("files (temp dir)", async () => {
  const tmp = await tempDir("reports");
  return { store: new FileReportStore(path.join(tmp.dir, "root")), close: () => tmp.remove() };
});

describe("FileReportStore, beyond the contract", () => {
  let tmp: TempDir;
  let root: string;
  beforeEach(async () => {
    tmp = await tempDir("reports-x");
    root = path.join(tmp.dir, "root");
  });
  afterEach(() => tmp.remove());

  it("uses an absolute location as it is (the CLI finalizing where the report lies)", async () => {
    const store = new FileReportStore(root);
    const agentTree = path.join(tmp.dir, "agent-worktree", "out");
    const body = Buffer.from("agent's own report");
    await store.put(agentTree, "report-final.md", body);
    expect(store.describe(agentTree, "report-final.md")).toBe(path.join(agentTree, "report-final.md"));
    expect(await store.getBytes(agentTree, "report-final.md")).toEqual(body);
  });

  it("pathOf is the file that describe's mam-file:/// URI names, and refuses what describe refuses", async () => {
    const store = new FileReportStore(root);
    await store.put("reports/j/1", "report-final.md", Buffer.from("on disk"));
    const file = store.pathOf("reports/j/1", "report-final.md");
    expect(file).toBe(path.join(root, "reports", "j", "1", "report-final.md"));
    expect(readFileSync(file, "utf8")).toBe("on disk");
    expect(store.describe("reports/j/1", "report-final.md")).toBe("mam-file:///reports/j/1/report-final.md");
    const agentTree = path.join(tmp.dir, "agent-worktree");
    expect(store.pathOf(agentTree, "r.md")).toBe(store.describe(agentTree, "r.md"));
    expect(() => store.pathOf("reports/../../escaped", "x.md")).toThrow(expect.objectContaining({ code: "report.location" }));
    expect(() => store.pathOf("reports/j/1", "../x.md")).toThrow(expect.objectContaining({ code: "report.location" }));
  });

  it("refuses absolute locations when told to (the service)", async () => {
    const store = new FileReportStore(root, { allowAbsolute: false });
    await expect(store.put(path.join(tmp.dir, "elsewhere"), "x.md", Buffer.from("x"))).rejects.toMatchObject({ code: "report.location" });
    expect(await readdir(tmp.dir)).toEqual([]);
  });

  it("a refused '..' location writes nothing outside the root", async () => {
    const store = new FileReportStore(root);
    await expect(store.put("reports/../../escaped", "x.md", Buffer.from("x"))).rejects.toMatchObject({ code: "report.location" });
    expect(await readdir(tmp.dir)).toEqual([]);
  });

  it("refuses a location that leaves the root through a symlink", async () => {
    const store = new FileReportStore(root);
    await store.put("reports/ok/1", "a.md", Buffer.from("inside"));
    const outside = path.join(tmp.dir, "outside");
    await store.put(outside, "keep.md", Buffer.from("keep"));
    await symlink(outside, path.join(root, "reports", "link"));
    await expect(store.put("reports/link/1", "x.md", Buffer.from("x"))).rejects.toMatchObject({ code: "report.location" });
    await expect(store.getBytes("reports/link", "keep.md")).rejects.toMatchObject({ code: "report.location" });
    expect(await readdir(outside)).toEqual(["keep.md"]);
  });

  it("leaves no temp file behind, after a put or a failed one", async () => {
    const store = new FileReportStore(root);
    await store.put("reports/j/1", "report-final.md", Buffer.from("done"));
    const failing = async function* (): AsyncGenerator<Uint8Array> {
      yield Buffer.from("half");
      throw new Error("gone");
    };
    await expect(store.put("reports/j/1", "report-final.md", failing())).rejects.toThrow("gone");
    expect(await readdir(path.join(root, "reports", "j", "1"))).toEqual(["report-final.md"]);
  });

  it("describes an object of its own tree as mam-file:///<location>/<name>, never by its path on this machine", () => {
    const store = new FileReportStore(root, { allowAbsolute: false });
    expect(store.describe("reports/job-1/2", "report-final.md")).toBe("mam-file:///reports/job-1/2/report-final.md");
    expect(store.describe("reports/./job-1//2", "report-final.md")).toBe("mam-file:///reports/job-1/2/report-final.md");
    expect(store.describe("reports/a b/1", "x%.md")).toBe("mam-file:///reports/a%20b/1/x%25.md");
  });

  it("creates report files 0600 and directories 0700, and a pinned copy 0400", async () => {
    const store = new FileReportStore(root, { allowAbsolute: false });
    const body = Buffer.from("private");
    await store.put("reports/j/1", "report-final.md.tmp", body);
    await store.promote("reports/j/1", "report-final.md.tmp", "report-final.md");
    await store.put("reports/j/1", "report-manifest.json", Buffer.from("{}"));
    const digest = createHash("sha256").update(body).digest("hex");
    await store.copyOnce({ location: "reports/j/1", name: "report-final.md" }, { location: "reports/j/1/evidence", name: digest }, digest);
    const mode = async (p: string) => (await stat(path.join(root, p))).mode & 0o777;
    for (const dir of [".", "reports", "reports/j", "reports/j/1", "reports/j/1/evidence"]) expect(await mode(dir), dir).toBe(0o700);
    for (const file of ["reports/j/1/report-final.md", "reports/j/1/report-manifest.json"]) expect(await mode(file), file).toBe(0o600);
    expect(await mode(`reports/j/1/evidence/${digest}`)).toBe(0o400);
  });

  it("copyOnce: concurrent calls create the target once, and every one of them says whether it was the one", async () => {
    const store = new FileReportStore(root);
    const body = Buffer.alloc(2 * 1024 * 1024, "r");
    await store.put("reports/j/1", "report-final.md", body);
    const digest = createHash("sha256").update(body).digest("hex");
    const results = await Promise.all(
      Array.from({ length: 8 }, () =>
        store.copyOnce({ location: "reports/j/1", name: "report-final.md" }, { location: "reports/j/1/evidence", name: digest }, digest),
      ),
    );
    expect(results.filter((r) => r.created)).toHaveLength(1);
    expect(results.every((r) => r.bytes === body.byteLength)).toBe(true);
    expect(await readdir(path.join(root, "reports", "j", "1", "evidence"))).toEqual([digest]);
  });

  it("copyOnce refused (the source changed) leaves no temp file and no directory it made", async () => {
    const store = new FileReportStore(root);
    await store.put("reports/j/1", "report-final.md", Buffer.from("rewritten"));
    const digest = createHash("sha256").update("what was hashed").digest("hex");
    await expect(
      store.copyOnce({ location: "reports/j/1", name: "report-final.md" }, { location: "reports/j/1/evidence/deep", name: digest }, digest),
    ).rejects.toMatchObject({ code: "report.changed" });
    expect(await readdir(path.join(root, "reports", "j", "1"))).toEqual(["report-final.md"]);
  });

  it("messages name an object of its own tree by its mam-file URI, not by its path on this machine", async () => {
    const store = new FileReportStore(root, { allowAbsolute: false });
    const err = await store.promote("reports/j/1", "report-final.md.tmp", "report-final.md").catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "report.notFound" });
    expect((err as Error).message).toContain("mam-file:///reports/j/1/report-final.md.tmp");
    expect((err as Error).message).not.toContain(root);
  });

  it("hashes what is on disk, whoever wrote it", async () => {
    const store = new FileReportStore(root);
    await store.put("reports/j/1", "report-final.md", Buffer.from("first"));
    await writeFile(path.join(root, "reports", "j", "1", "report-final.md"), "tampered");
    expect((await store.hash("reports/j/1", "report-final.md"))?.sha256).toBe(createHash("sha256").update("tampered").digest("hex"));
  });
});

// ---------------------------------------------------------------- Publisher

const credentials = () => ({ username: "mam-service", password: randomBytes(16).toString("hex") });

publisherContract("MQTT to the embedded aedes broker", async () => {
  const publisherCredentials = credentials();
  const broker = await startEmbeddedBroker({ port: 0, publisherCredentials });
  const publisher = new MqttPublisher({ url: broker.url, ...publisherCredentials });
  return {
    publisher,
    subscribe: (topic) => subscribe(broker.url, topic),
    unreachable: async () => new MqttPublisher({ url: `mqtt://127.0.0.1:${await deadPort()}`, connectTimeoutMs: 1000 }),
    // No credentials: the broker lets it connect, then refuses its publish under mam/.
    refusing: () => new MqttPublisher({ url: broker.url }),
    async close() {
      await publisher.close();
      await broker.close();
    },
  };
});

publisherContract("in process, on the embedded aedes broker (mam serve's)", async () => {
  const broker = await startEmbeddedBroker({ port: 0, publisherCredentials: credentials() });
  const others: EmbeddedBroker[] = [];
  return {
    publisher: broker.publisher(),
    subscribe: (topic) => subscribe(broker.url, topic),
    // A closed broker's publisher: nothing is there to take the message.
    unreachable: async () => {
      const closed = await startEmbeddedBroker({ port: 0 });
      await closed.close();
      return closed.publisher();
    },
    // In process the refusal is the broker's rule for the topic, not the publisher's
    // login, so the refusing one is a second broker's that refuses every topic; that
    // nothing reaches the harness's subscriber then holds by construction.
    refusing: async () => {
      const refusing = await startEmbeddedBroker({ port: 0, refusePublish: () => true });
      others.push(refusing);
      return refusing.publisher();
    },
    async close() {
      for (const b of others) await b.close();
      await broker.close();
    },
  };
});

describe("MqttPublisher and the embedded broker, beyond the contract", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  async function broker(extra: { refusePublish?: (topic: string) => boolean } = {}) {
    const publisherCredentials = credentials();
    const b = await startEmbeddedBroker({ port: 0, publisherCredentials, ...extra });
    cleanup.push(() => b.close());
    return { ...b, publisherCredentials };
  }
  function publisher(options: ConstructorParameters<typeof MqttPublisher>[0]): MqttPublisher {
    const p = new MqttPublisher(options);
    cleanup.push(() => p.close());
    return p;
  }

  it("binds to loopback on a free port and names it in its url", async () => {
    const b = await broker();
    expect(b.port).toBeGreaterThan(0);
    expect(b.url).toBe(`mqtt://127.0.0.1:${b.port}`);
  });

  it("refuses the connection of a client with wrong credentials: publish.unreachable", async () => {
    const b = await broker();
    const p = publisher({ url: b.url, username: b.publisherCredentials.username, password: "wrong" });
    await expect(p.publish("mam/jobs/x/events", "{}")).rejects.toMatchObject({ code: "publish.unreachable" });
  });

  it("a broker that accepts TCP but never answers CONNECT: publish.unreachable after connectTimeoutMs", async () => {
    const sockets = new Set<net.Socket>();
    const silent = net.createServer((s) => {
      sockets.add(s);
    });
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    cleanup.push(async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    });
    const { port } = silent.address() as net.AddressInfo;
    const p = publisher({ url: `mqtt://127.0.0.1:${port}`, connectTimeoutMs: 300 });
    const err = await p.publish("mam/jobs/x/events", "{}").catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "publish.unreachable" });
    expect((err as Error).message).toContain(`MQTT broker at mqtt://127.0.0.1:${port} is unreachable`);
  });

  it("refusePublish refuses even the service, and the publisher works again on the next publish", async () => {
    const b = await broker({ refusePublish: (topic) => topic.endsWith("/blocked") });
    const p = publisher({ url: b.url, ...b.publisherCredentials });
    const sub = await subscribe(b.url, "mam/#");
    cleanup.push(() => sub.close());
    await expect(p.publish("mam/jobs/x/blocked", "no")).rejects.toMatchObject({ code: "publish.refused" });
    await p.publish("mam/jobs/x/events", "yes");
    expect(await sub.next()).toEqual({ topic: "mam/jobs/x/events", payload: "yes" });
  });

  it("nobody but the service publishes, outside mam/ too (issue 17); anyone may subscribe", async () => {
    const publisherCredentials = credentials();
    const b = await startEmbeddedBroker({ port: 0, publisherCredentials });
    cleanup.push(() => b.close());
    const sub = await subscribe(b.url, "elsewhere/#");
    cleanup.push(() => sub.close());
    const anonymous = publisher({ url: b.url });
    await expect(anonymous.publish("elsewhere/chat", "junk")).rejects.toMatchObject({ code: "publish.refused" });
    const service = publisher({ url: b.url, ...publisherCredentials });
    await service.publish("elsewhere/chat", "hello");
    expect(await sub.next()).toEqual({ topic: "elsewhere/chat", payload: "hello" });
  });

  it("close closes the listener and disconnects clients", async () => {
    const publisherCredentials = credentials();
    const b = await startEmbeddedBroker({ port: 0, publisherCredentials });
    const p = publisher({ url: b.url, ...publisherCredentials });
    await p.publish("mam/jobs/x/events", "one");
    await b.close();
    // The connected publisher fails one way or the other (its connection may or may
    // not have been seen closing yet); a fresh one finds nobody there.
    await expect(p.publish("mam/jobs/x/events", "two")).rejects.toMatchObject({ code: expect.stringMatching(/^publish\./) });
    const fresh = publisher({ url: b.url, ...publisherCredentials, connectTimeoutMs: 1000 });
    await expect(fresh.publish("mam/jobs/x/events", "three")).rejects.toMatchObject({ code: "publish.unreachable" });
    // The port is free again.
    const again = await startEmbeddedBroker({ port: b.port });
    await again.close();
  });
});
