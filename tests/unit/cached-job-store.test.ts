/**
 * CachedJobStore, the read cache `mam serve` puts around its store, on core's
 * in-memory store with a version the test moves by hand (on SQLite it is
 * `data_version`: tests/contract/local.test.ts shows it there, against real
 * connections).
 */
import { type JobRecord, type JobStore, MemoryJobStore } from "@mam/core";
import { CachedJobStore } from "@mam/local";
import { beforeEach, describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";

/** The memory store, counting the reads that reach it, and holding a read when told to. */
class CountingStore extends MemoryJobStore {
  reads = 0;
  hold: Promise<void> | undefined;
  override async get(jobId: string): Promise<JobRecord | undefined> {
    this.reads += 1;
    const hold = this.hold;
    const record = await super.get(jobId);
    await hold;
    return record;
  }
}

let inner: CountingStore;
let version: number;
let cached: JobStore;
beforeEach(async () => {
  inner = new CountingStore();
  version = 1;
  cached = new CachedJobStore(inner, { version: () => version, capacity: 2 });
  for (const id of ["a", "b", "c"]) await inner.create(job(id));
});

describe("CachedJobStore", () => {
  it("answers a repeated read from what it read, while the version stands still", async () => {
    expect(await cached.get("a")).toEqual(job("a"));
    expect(await cached.get("a")).toEqual(job("a"));
    expect(inner.reads).toBe(1);
    version = 2; // another writer committed
    expect(await cached.get("a")).toEqual(job("a"));
    expect(inner.reads).toBe(2);
  });

  it("forgets on every write through it, whatever the write's outcome", async () => {
    await cached.get("a");
    await cached.transition("a", 0, { from: ["pending"], set: { status: "running" } });
    expect((await cached.get("a"))?.status).toBe("running");
    await expect(cached.transition("a", 0, { from: ["pending"], set: { status: "running" } })).rejects.toMatchObject({
      code: "job.transitionConflict",
    });
    const reads = inner.reads;
    await cached.get("a");
    expect(inner.reads).toBe(reads + 1);
  });

  it("does not keep a read that was in flight while a write went through", async () => {
    let release!: () => void;
    inner.hold = new Promise((r) => {
      release = r;
    });
    const stale = cached.get("a"); // reads pending, then waits
    inner.hold = undefined;
    await cached.transition("a", 0, { from: ["pending"], set: { status: "running" } });
    release();
    expect((await stale)?.status).toBe("pending"); // what it read, handed back, but not kept
    expect((await cached.get("a"))?.status).toBe("running");
  });

  it("keeps at most `capacity` records, the oldest read going first, and hands out frozen records", async () => {
    await cached.get("a");
    await cached.get("b");
    await cached.get("c"); // a goes
    const reads = inner.reads;
    await cached.get("b");
    await cached.get("c");
    expect(inner.reads).toBe(reads);
    await cached.get("a");
    expect(inner.reads).toBe(reads + 1);
    const record = (await cached.get("a")) as JobRecord;
    expect(Object.isFrozen(record)).toBe(true);
    expect(() => (record.expected_artifacts as string[]).push("x")).toThrow(TypeError);
  });
});
