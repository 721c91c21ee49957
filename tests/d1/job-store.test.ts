/**
 * `npm run test:d1`: the JobStore contract and a race for one transition on
 * Cloudflare's D1 (Miniflare, workerd, driven from Node through the Worker binding in
 * `d1-binding.ts`): the SQL store (`SqlJobStore`) over `D1Driver`, unchanged from the
 * one `mam serve` runs over better-sqlite3. Every write is one D1 batch; nothing here
 * imitates D1.
 */
import { type AtomicWrite, JobRecordSchema, type MamError, TransitionConflict } from "@mam/core";
import { D1Driver, SqlJobStore } from "@mam/local";
import { describe, expect, it } from "vitest";
import { atomicWriteContract } from "../contract/atomic-write.suite.ts";
import { changeFeedContract } from "../contract/feed.suite.ts";
import { jobStoreContract } from "../contract/job-store.suite.ts";
import { statusCountsContract } from "../contract/status-counts.suite.ts";
import { jobRecord } from "../support/records.ts";
import { sqlLayoutStatements } from "../support/sql-layout.ts";
import { d1ForFile } from "./d1-binding.ts";

const d1 = d1ForFile();
const database = d1.database;

/** The database emptied of the last test's tables, and the store's layout made afresh. */
async function freshLayout(): Promise<D1Driver> {
  const driver = await d1.emptied();
  await driver.batch(sqlLayoutStatements());
  return driver;
}

jobStoreContract("SQL store on D1 (Miniflare, workerd)", async () => {
  const driver = await freshLayout();
  return { store: new SqlJobStore(driver), close: async () => undefined };
});

// The feed (its head included, issue 22) over the same seam: the head is one SELECT of the driver's.
changeFeedContract("SQL store on D1 (Miniflare, workerd)", async () => {
  const driver = await freshLayout();
  return { store: new SqlJobStore(driver), close: async () => undefined };
});

statusCountsContract("SQL store on D1 (Miniflare, workerd)", "exact", async () => {
  const driver = await freshLayout();
  const db = await database();
  return {
    store: new SqlJobStore(driver),
    // Each racer its own driver on the binding: concurrent requests into workerd.
    racers: (n) => Array.from({ length: n }, () => new SqlJobStore(new D1Driver(db))),
    close: async () => undefined,
  };
});

/** The SQL store with its protected atomic write in reach of the suite. */
class AtomicSqlJobStore extends SqlJobStore {
  atomically(writes: readonly AtomicWrite[]) {
    return this.writeAtomically(writes);
  }
}

atomicWriteContract("SQL store on D1 (Miniflare, workerd)", async () => {
  const store = new AtomicSqlJobStore(await freshLayout());
  return { store, atomically: (w) => store.atomically(w), close: async () => undefined };
});

const RACERS = 32;
const TRIALS = Number(process.env.MAM_RACE_TRIALS ?? 5);

describe("the SQL store on D1: racing writers", () => {
  it(`${RACERS} stores racing for one transition from the same seq: exactly one commits, its feed row alone is written, the rest conflict (${TRIALS} trials)`, async () => {
    await freshLayout();
    const db = await database();
    // A store per racer, each its own driver on the binding: concurrent requests into workerd.
    const racers = Array.from({ length: RACERS }, () => new SqlJobStore(new D1Driver(db)));
    const started = performance.now();
    let conflicts = 0;
    for (let trial = 0; trial < TRIALS; trial++) {
      const jobId = `race-${trial}`;
      await racers[0]!.create(jobRecord(jobId));
      const outcomes = await Promise.allSettled(
        racers.map((store, i) =>
          store.transition(jobId, 0, { from: ["pending"], set: { status: "running", agent_session: `racer-${i}` } }),
        ),
      );
      const won = outcomes.filter((o) => o.status === "fulfilled");
      expect(won).toHaveLength(1);
      for (const o of outcomes) {
        if (o.status === "rejected") {
          expect(o.reason).toBeInstanceOf(TransitionConflict);
          expect((o.reason as MamError).code).toBe("job.transitionConflict");
          conflicts++;
        }
      }
      const record = await racers[1]!.get(jobId);
      expect(JobRecordSchema.parse(record)).toMatchObject({ status: "running", transition_seq: 1 });
      const winner = (won[0] as PromiseFulfilledResult<{ agent_session?: string }>).value.agent_session;
      expect(record?.agent_session).toBe(winner);
      const rows = (await racers[2]!.listChanges({ limit: 100, jobId })).items;
      expect(rows.map((r) => r.kind)).toEqual(["job.registered", "job.transitioned"]);
    }
    const ms = performance.now() - started;
    console.log(`D1 race: ${TRIALS} trials of ${RACERS} racers, ${conflicts} conflicts, ${(ms / TRIALS).toFixed(1)} ms a trial`);
    expect(conflicts).toBe(TRIALS * (RACERS - 1));
    // The whole tier took 21 s on a quiet 2-core machine; under a load of 4-9 (other tiers, benches) this test alone passed 30 s
    // — the bound is for a hang, not a speed goal.
  }, 180_000);
});
