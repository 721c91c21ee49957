/**
 * The DynamoDB store's atomic multi-write on dynalite, the npm test peer, which has no
 * TransactWriteItems: a store that expects transactions answers `store.unsupported`
 * naming the operation and writes nothing; one built with `transactions: false` says
 * it has no atomic multi-write, refuses it without a request, and settles a published
 * intent as two writes, line first. (tests/engine/atomic-multi-write.test.ts shows the
 * transaction itself on DynamoDB Local.)
 */
import { createJobTable, DynamoJobStore } from "@mam/aws";
import { type AtomicOutcome, type AtomicWrite, type EventLogEntry, type JobRecord, MamError } from "@mam/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type DynamoPeer, startDynalite } from "../support/aws-peers.ts";
import { countRequests, type RequestCounter } from "../support/count-requests.ts";
import { jobRecord } from "../support/records.ts";
import { rejection } from "../support/rejection.ts";

class AtomicDynamoJobStore extends DynamoJobStore {
  atomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome> {
    return this.writeAtomically(writes);
  }
}

let peer: DynamoPeer;
let counter: RequestCounter;
let tables = 0;

beforeAll(async () => {
  peer = await startDynalite();
  counter = countRequests(peer.client);
});
afterAll(async () => {
  await peer?.close();
});

async function freshStore(transactions?: boolean): Promise<AtomicDynamoJobStore> {
  const tableName = `mam-atomic-${++tables}`;
  await createJobTable(peer.client, tableName);
  return new AtomicDynamoJobStore({ client: peer.client, tableName, ...(transactions === undefined ? {} : { transactions }) });
}

const AT = "2030-01-01T00:00:00.000Z";
const owing = (id: string): JobRecord =>
  jobRecord(id, {
    status: "completed",
    created_at: AT,
    updated_at: AT,
    pending_notification: { id: "n-1", event: "completed", seq: 1, created_at: AT },
  });
const line: EventLogEntry = { job_id: "job-1", at: AT, id: "e-1", event: "published" };
const parts: AtomicWrite[] = [
  { kind: "insertEvent", entry: line },
  {
    kind: "update",
    write: {
      jobId: "job-1",
      conditions: [{ kind: "intentIs", id: "n-1" }],
      set: {},
      unset: ["pending_notification"],
      bump: [],
      keys: { owed: null },
      feed: {},
    },
  },
];

describe("DynamoJobStore.writeAtomically on dynalite (no TransactWriteItems)", () => {
  it("expecting transactions, the engine's refusal is store.unsupported naming TransactWriteItems, and nothing is written", async () => {
    expect(peer.gaps.noTransactions).toBe(true);
    const store = await freshStore();
    await store.create(owing("job-1"));
    const err = await rejection(store.atomically(parts));
    expect(err).toBeInstanceOf(MamError);
    expect((err as MamError).code).toBe("store.unsupported");
    expect((err as MamError).message).toMatch(/TransactWriteItems.*UnknownOperationException/);
    expect(await store.get("job-1")).toEqual(owing("job-1"));
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([]);
  });

  it("built with transactions: false, it offers no atomic multi-write and refuses one without a request", async () => {
    const store = await freshStore(false);
    await store.create(owing("job-1"));
    expect(store.capabilities.atomicMultiWrite).toBe(false);
    counter.reset();
    const err = await rejection(store.atomically(parts));
    expect((err as MamError).code).toBe("store.unsupported");
    expect((err as MamError).message).toMatch(/TransactWriteItems/);
    expect(counter.total).toBe(0);
    expect(await store.get("job-1")).toEqual(owing("job-1"));
  });

  it("built with transactions: false, settlePublished is the line, then the settle", async () => {
    const store = await freshStore(false);
    await store.create(owing("job-1"));
    counter.reset();
    expect(await store.settlePublished(line, "n-1")).toBe(true);
    expect(counter.calls.map((c) => c.command)).toEqual(["PutItemCommand", "UpdateItemCommand"]);
    expect((await store.get("job-1"))?.pending_notification).toBeUndefined();
    expect((await store.listEvents("job-1", { limit: 10 })).items).toEqual([line]);
  });
});
