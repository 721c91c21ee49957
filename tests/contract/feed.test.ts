import path from "node:path";
import { MemoryJobStore } from "@mam/core";
import { changeRelay, openEmbeddedJobStore, SqliteJobStore } from "@mam/local";
import Database from "better-sqlite3";
import { describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";
import { tempDir } from "../support/temp-dir.ts";
import { changeFeedContract } from "./feed.suite.ts";

// The feed on the in-memory reference adapter and on SQLite (bare, and as `mam serve`
// composes it: the record cache and the change relay in front). DynamoDB: feed-aws.test.ts.

changeFeedContract("in memory (core's reference adapter)", async () => ({
  store: new MemoryJobStore(),
  close: async () => undefined,
}));

changeFeedContract("SQLite (temp file, WAL)", async () => {
  const tmp = await tempDir("feed-sqlite");
  const sqlite = new SqliteJobStore(path.join(tmp.dir, "mam.db"));
  return {
    store: sqlite,
    async close() {
      await sqlite.close();
      await tmp.remove();
    },
  };
});

changeFeedContract("SQLite behind its record cache and the change relay (as mam serve composes it)", async () => {
  const tmp = await tempDir("feed-sqlite-served");
  const embedded = openEmbeddedJobStore(path.join(tmp.dir, "mam.db"), { hooks: [changeRelay(() => undefined)] });
  return {
    store: embedded.jobs,
    async close() {
      await embedded.close();
      await tmp.remove();
    },
  };
});

describe("the SQLite feed, beyond the contract", () => {
  it("a database from before the feed opens, keeps its jobs, and records changes from then on", async () => {
    const tmp = await tempDir("feed-migrate");
    try {
      const file = path.join(tmp.dir, "mam.db");
      // The schema as it stood before the feed: the store made it, then the feed's table is
      // dropped and the file stamped 1, as databases from before the feed are (sqlite-migrations.ts).
      const first = new SqliteJobStore(file);
      await first.create(job("old-job"));
      await first.close();
      const raw = new Database(file);
      raw.exec("DROP TABLE changes; PRAGMA user_version = 1;");
      raw.close();

      const reopened = new SqliteJobStore(file);
      const store = reopened;
      try {
        expect((await store.get("old-job"))?.job_id).toBe("old-job");
        expect((await store.listChanges({ limit: 10 })).items).toEqual([]);
        await store.transition("old-job", 0, { from: ["pending"], set: { status: "running" } });
        const rows = (await store.listChanges({ limit: 10 })).items;
        expect(rows.map((r) => [r.job_id, r.kind, r.data?.action])).toEqual([["old-job", "job.transitioned", "claim"]]);
      } finally {
        await reopened.close();
      }
    } finally {
      await tmp.remove();
    }
  });

  it("the store's commit hooks are told of every write that committed, and of none that was refused, so a stream reads at once", async () => {
    const tmp = await tempDir("feed-signal");
    const embedded = openEmbeddedJobStore(path.join(tmp.dir, "mam.db"));
    try {
      const relay = embedded.jobs;
      let signals = 0;
      const stop = relay.onCommitted(() => {
        signals += 1;
      });
      await relay.create(job("sig-1"));
      await relay.transition("sig-1", 0, { from: ["pending"], set: { status: "running" } });
      await relay.recordEvidence("sig-1", { guard: { newAttempt: 1 } });
      expect(signals).toBe(3);
      await expect(relay.transition("sig-1", 0, { from: ["pending"], set: { status: "running" } })).rejects.toThrow();
      expect(signals).toBe(3);
      stop();
      await relay.create(job("sig-2"));
      expect(signals).toBe(3);
    } finally {
      await embedded.close();
      await tmp.remove();
    }
  });
});
