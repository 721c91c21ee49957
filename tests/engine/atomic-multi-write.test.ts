/**
 * The DynamoDB store's atomic multi-write (`writeAtomically`, one TransactWriteItems)
 * on AWS's own DynamoDB Local, which runs transactions (dynalite does not:
 * tests/aws/atomic-unsupported.test.ts): both parts commit together or neither does,
 * whichever part's condition fails; an optional part that does not hold leaves the
 * others to commit without it; and `settlePublished` writes its line and its settle
 * as that one request (two when the intent is no longer owed: the line alone again). Needs Java: the engine tier starts DynamoDB Local
 * through the one peer factory.
 */
import { DeleteTableCommand } from "@aws-sdk/client-dynamodb";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import type { AtomicOutcome, AtomicWrite } from "@mam/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { line, owing, settle } from "../contract/atomic-write.suite.ts";
import { type DynamoPeer, startDynamoPeer } from "../support/aws-peers.ts";
import { countRequests, type RequestCounter } from "../support/count-requests.ts";

/** The store with its protected primitive in reach of the test. */
class AtomicDynamoJobStore extends DynamoJobStore {
  atomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome> {
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
    expect(ok).toEqual({ committed: true, held: [] });
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
    expect(ok).toEqual({ committed: false });
    expect(await store.get("job-1")).toEqual(record);
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([]);
    expect((await store.listOwed(10)).map((r) => r.job_id)).toEqual(["job-1"]);
  });

  it("a line that is there counts as written (its Put's condition failing alone): the update commits in a second request, the first line stays", async () => {
    const store = await freshStore();
    await store.create(owing("job-1", "n-1"));
    await store.appendEvent(line("job-1", "e-1", "first"));
    counter.reset();
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("job-1", "e-1", "second") },
      { kind: "update", write: settle("job-1", "n-1") },
    ]);
    expect(ok).toEqual({ committed: true, held: [] });
    expect(counter.byCommand).toEqual({ TransactWriteItemsCommand: 2 });
    expect((await store.get("job-1"))?.pending_notification).toBeUndefined();
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1", "first")]);
  });

  it("a part on a job that does not exist fails the whole write", async () => {
    const store = await freshStore();
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("ghost", "e-1") },
      { kind: "update", write: settle("ghost", "n-1") },
    ]);
    expect(ok).toEqual({ committed: false });
    expect((await store.listEvents("ghost", { limit: 10 })).items).toEqual([]);
    expect(await store.get("ghost")).toBeUndefined();
  });

  it("an optional update that does not hold is left out: the line commits without it, in a second request", async () => {
    const store = await freshStore();
    const record = owing("job-1", "n-2");
    await store.create(record);
    counter.reset();
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("job-1", "e-1") },
      { kind: "update", write: settle("job-1", "n-1"), optional: true },
    ]);
    expect(ok).toEqual({ committed: true, held: [false] });
    expect(counter.byCommand).toEqual({ TransactWriteItemsCommand: 2 });
    expect(await store.get("job-1")).toEqual(record);
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1")]);
  });

  it("a line that is there counts as written: an optional update that holds commits without it", async () => {
    const store = await freshStore();
    await store.create(owing("job-1", "n-1"));
    await store.appendEvent(line("job-1", "e-1", "first"));
    const ok = await store.atomically([
      { kind: "insertEvent", entry: line("job-1", "e-1", "second") },
      { kind: "update", write: settle("job-1", "n-1"), optional: true },
    ]);
    expect(ok).toEqual({ committed: true, held: [true] });
    expect((await store.get("job-1"))?.pending_notification).toBeUndefined();
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1", "first")]);
  });

  it("a required update that does not hold still leaves everything unwritten, optional parts included", async () => {
    const store = await freshStore();
    await store.create(owing("job-1", "n-1"));
    await store.create(owing("job-2", "n-2"));
    const ok = await store.atomically([
      { kind: "update", write: settle("job-1", "n-1"), optional: true },
      { kind: "update", write: settle("job-2", "n-other") },
    ]);
    expect(ok).toEqual({ committed: false });
    expect((await store.get("job-1"))?.pending_notification?.id).toBe("n-1");
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

  it("settlePublished of an intent no longer owed keeps the line and settles nothing (the optional settle left out, the line sent again alone)", async () => {
    const store = await freshStore();
    const record = owing("job-1", "n-2");
    await store.create(record);
    expect(await store.settlePublished(line("job-1", "e-1"), "n-1")).toBe(false);
    expect(await store.get("job-1")).toEqual(record);
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line("job-1", "e-1")]);
  });
});
