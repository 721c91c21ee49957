/**
 * The DynamoDB store's atomic multi-write (`writeAtomically`, one TransactWriteItems)
 * on AWS's own DynamoDB Local, which runs transactions (dynalite does not:
 * tests/aws/atomic-unsupported.test.ts): both parts commit together or neither does,
 * whichever part's condition fails, and `settlePublished` writes its line and its
 * settle as that one request. Needs Java: the engine tier starts DynamoDB Local
 * through the one peer factory.
 */
import { DeleteTableCommand } from "@aws-sdk/client-dynamodb";
import { countRequests, createJobTable, DynamoJobStore, type RequestCounter } from "@mam/aws";
import type { AtomicWrite, EventLogEntry, JobRecord, NotificationIntent, RecordWrite } from "@mam/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type DynamoPeer, startDynamoPeer } from "../support/aws-peers.ts";
import { jobRecord } from "../support/records.ts";

/** The store with its protected primitive in reach of the test. */
class AtomicDynamoJobStore extends DynamoJobStore {
  atomically(writes: readonly AtomicWrite[]): Promise<boolean> {
    return this.writeAtomically(writes);
  }
}

let peer: DynamoPeer;
let counter: RequestCounter;
let tables = 0;
const drops: string[] = [];

beforeAll(async () => {
  peer = await startDynamoPeer();
  counter = countRequests(peer.client);
});
afterAll(async () => {
  for (const TableName of drops) await peer.client.send(new DeleteTableCommand({ TableName }));
  await peer?.close();
});

async function freshStore(): Promise<AtomicDynamoJobStore> {
  const tableName = `mam-atomic-${++tables}`;
  await createJobTable(peer.client, tableName);
  drops.push(tableName);
  return new AtomicDynamoJobStore({ client: peer.client, tableName });
}

const AT = "2030-01-01T00:00:00.000Z";
const intent = (id: string): NotificationIntent => ({ id, event: "completed", seq: 1, created_at: AT });
const owing = (id: string, intentId: string): JobRecord =>
  jobRecord(id, { status: "completed", created_at: AT, updated_at: AT, transition_seq: 3, pending_notification: intent(intentId) });
const line = (jobId: string, id: string, event = "published"): EventLogEntry => ({ job_id: jobId, at: AT, id, event });
/** The settle of `intentId`, as core builds it: only while that intent is owed. */
const settle = (jobId: string, intentId: string): RecordWrite => ({
  jobId,
  conditions: [{ kind: "intentIs", id: intentId }],
  set: {},
  unset: ["pending_notification"],
  bump: [],
  keys: { owed: null },
  feed: {},
});

describe("DynamoJobStore.writeAtomically on DynamoDB Local (TransactWriteItems)", () => {
  it("runs on an engine with transactions, and says so", async () => {
    expect(peer.gaps.noTransactions).toBe(false);
    expect((await freshStore()).capabilities.atomicMultiWrite).toBe(true);
  });

  it("commits both parts together, in one request", async () => {
    const store = await freshStore();
    await store.create(owing("job-1", "n-1"));
    counter.reset();
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("job-1", "e-1") },
      { kind: "update", write: settle("job-1", "n-1") },
    ]);
    expect(ok).toBe(true);
    expect(counter.byCommand).toEqual({ TransactWriteItemsCommand: 1 });
    expect((await store.get("job-1"))?.pending_notification).toBeUndefined();
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1")]);
    expect(await store.listOwed(10)).toEqual([]);
  });

  it("a failing condition on the update part leaves both unwritten", async () => {
    const store = await freshStore();
    const record = owing("job-1", "n-2");
    await store.create(record);
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("job-1", "e-1") },
      { kind: "update", write: settle("job-1", "n-1") },
    ]);
    expect(ok).toBe(false);
    expect(await store.get("job-1")).toEqual(record);
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([]);
    expect((await store.listOwed(10)).map((r) => r.job_id)).toEqual(["job-1"]);
  });

  it("a failing condition on the log part (the line is there) leaves both unwritten: the first line stays", async () => {
    const store = await freshStore();
    const record = owing("job-1", "n-1");
    await store.create(record);
    await store.appendEvent(line("job-1", "e-1", "first"));
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("job-1", "e-1", "second") },
      { kind: "update", write: settle("job-1", "n-1") },
    ]);
    expect(ok).toBe(false);
    expect(await store.get("job-1")).toEqual(record);
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1", "first")]);
  });

  it("a part on a job that does not exist fails the whole write", async () => {
    const store = await freshStore();
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("ghost", "e-1") },
      { kind: "update", write: settle("ghost", "n-1") },
    ]);
    expect(ok).toBe(false);
    expect((await store.listEvents("ghost", { limit: 10 })).items).toEqual([]);
    expect(await store.get("ghost")).toBeUndefined();
  });

  it("settlePublished commits the line and the settle as one TransactWriteItems", async () => {
    const store = await freshStore();
    await store.create(owing("job-1", "n-1"));
    counter.reset();
    expect(await store.settlePublished(line("job-1", "e-1"), "n-1")).toBe(true);
    expect(counter.byCommand).toEqual({ TransactWriteItemsCommand: 1 });
    expect((await store.get("job-1"))?.pending_notification).toBeUndefined();
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1")]);
  });

  it("settlePublished of an intent no longer owed keeps the line and settles nothing (line, then the settle that loses)", async () => {
    const store = await freshStore();
    const record = owing("job-1", "n-2");
    await store.create(record);
    expect(await store.settlePublished(line("job-1", "e-1"), "n-1")).toBe(false);
    expect(await store.get("job-1")).toEqual(record);
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1")]);
  });
});
