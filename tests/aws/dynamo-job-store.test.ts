import {
  ConditionalCheckFailedException,
  DescribeTableCommand,
  DynamoDBClient,
  GetItemCommand,
  ProvisionedThroughputExceededException,
  PutItemCommand,
  QueryCommand,
  UpdateItemCommand,
} from "@aws-sdk/client-dynamodb";
import { marshall } from "@aws-sdk/util-dynamodb";
import {
  createJobTable,
  DynamoJobStore,
  feedWriteOfStreamRecord,
  JOB_ITEM_SK,
  JOB_TABLE_DEFINITION,
  jobItem,
  jobRecordOfNewImage,
  KEY_ATTRIBUTES,
  recordFromConditionFailure,
  storeFailure,
} from "@mam/aws";
import {
  type DispatchRecord,
  type JobRecord,
  MamError,
  NO_CONCURRENCY_CHECK,
  type NotificationIntent,
  noteOf,
  type Status,
  TransitionConflict,
} from "@mam/core";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type DynamoPeer, startDynamoPeer } from "../support/aws-peers.ts";
import { countRequests, type RequestCounter } from "../support/count-requests.ts";
import { deadPort } from "../support/dead-port.ts";
import { jobRecord } from "../support/records.ts";
import { rejection } from "../support/rejection.ts";

/** dynalite, or DynamoDB Local (MAM_DYNAMODB_PEER): where they differ, each test says what each shows. */
let peer: DynamoPeer;
let counter: RequestCounter;
let tableSeq = 0;

beforeAll(async () => {
  peer = await startDynamoPeer();
  counter = countRequests(peer.client);
});
afterAll(async () => {
  await peer.close();
});

/** A fresh table per test: tests share one peer, never each other's rows. */
async function freshStore(): Promise<DynamoJobStore> {
  const tableName = `mam-jobs-${++tableSeq}`;
  await createJobTable(peer.client, tableName);
  counter.reset();
  return new DynamoJobStore({ client: peer.client, tableName, transactions: !peer.gaps.noTransactions });
}

const T0 = Date.parse("2030-01-01T00:00:00.000Z");
const at = (seconds: number): string => new Date(T0 + seconds * 1000).toISOString();

/** A job on this file's timeline (created at T0). */
function job(id: string, over: Partial<JobRecord> = {}): JobRecord {
  return jobRecord(id, { prompt: `do ${id}`, created_at: at(0), updated_at: at(0), ...over });
}

function intent(id: string, seconds: number, seq = 1): NotificationIntent {
  return { id, event: "completed", seq, created_at: at(seconds) };
}

describe("createJobTable", () => {
  it("creates the table, keys and indexes of JOB_TABLE_DEFINITION, asking for a stream of both images", async () => {
    counter.reset();
    await createJobTable(peer.client, "mam-jobs-def");
    const create = counter.calls.find((c) => c.command === "CreateTableCommand");
    expect(create?.input.StreamSpecification).toEqual({ StreamEnabled: true, StreamViewType: "NEW_AND_OLD_IMAGES" });
    expect(create?.input.BillingMode).toBe("PAY_PER_REQUEST");

    const { Table } = await peer.client.send(new DescribeTableCommand({ TableName: "mam-jobs-def" }));
    expect(Table?.KeySchema).toEqual(JOB_TABLE_DEFINITION.KeySchema);
    const indexes = Object.fromEntries((Table?.GlobalSecondaryIndexes ?? []).map((g) => [g.IndexName, g]));
    for (const g of JOB_TABLE_DEFINITION.GlobalSecondaryIndexes) {
      expect(indexes[g.IndexName]?.KeySchema).toEqual(g.KeySchema);
      expect(indexes[g.IndexName]?.Projection).toEqual({ ProjectionType: "ALL" });
    }
    expect(Object.keys(indexes).sort()).toEqual(["all", "attention", "by-status", "feed-by-job", "owed"]);
    // DynamoDB Local keeps the stream, as DynamoDB does. dynalite accepts the
    // StreamSpecification and keeps no stream (gaps.noStreams; locally the change
    // relay stands in for DynamoDB Streams).
    if (peer.gaps.noStreams) {
      expect(Table?.StreamSpecification).toBeUndefined();
      expect(Table?.LatestStreamArn).toBeUndefined();
    } else {
      expect(Table?.StreamSpecification).toEqual({ StreamEnabled: true, StreamViewType: "NEW_AND_OLD_IMAGES" });
      expect(Table?.LatestStreamArn).toMatch(/:table\/mam-jobs-def\/stream\//);
    }
  });

  it("is idempotent: an existing table is left as it is", async () => {
    await createJobTable(peer.client, "mam-jobs-twice");
    await expect(createJobTable(peer.client, "mam-jobs-twice")).resolves.toBeUndefined();
  });
});

describe("DynamoJobStore: records", () => {
  let store: DynamoJobStore;
  beforeEach(async () => {
    store = await freshStore();
  });

  it("creates and reads back a record exactly, with no key attributes leaking", async () => {
    const record = job("job-1", {
      progress: { step: 3, notes: ["a", "b"], nested: { ok: true, none: null, ratio: 0.25, big: 2 ** 60 } },
      agent_session: "sess-1",
      expected_artifacts: ["git_commit"],
    });
    await store.create(record);
    expect(await store.get("job-1")).toEqual(record);
    expect(await store.get("job-2")).toBeUndefined();
  });

  it("refuses a second create of the same id with job.exists, keeping the first", async () => {
    await store.create(job("job-1"));
    const err = await rejection(store.create(job("job-1", { prompt: "other" })));
    expect(err).toBeInstanceOf(MamError);
    expect((err as MamError).code).toBe("job.exists");
    expect((await store.get("job-1"))?.prompt).toBe("do job-1");
  });

  it("an item from before evidence_seq existed reads as 0, and takes evidence writes and guarded commits", async () => {
    const { evidence_seq: _, ...legacy } = job("job-1", { status: "running", transition_seq: 1, latest_attempt: 1 });
    await peer.client.send(
      new PutItemCommand({
        TableName: store.tableName,
        Item: marshall({ ...legacy, pk: "JOB#job-1", sk: "JOB" }, { removeUndefinedValues: true }),
      }),
    );
    expect(await store.get("job-1")).toMatchObject({ evidence_seq: 0 });
    // a commit guarded on the evidence it read (0, the attribute absent) commits
    const stay = { from: ["running" as const], set: { status: "running" as const }, evidence: { seq: 0, attempt: 1 } };
    expect(await store.transition("job-1", 1, stay)).toMatchObject({ transition_seq: 2 });
    expect(await store.recordEvidence("job-1", { guard: { attempt: 1 } })).toMatchObject({ evidence_seq: 1 });
    const err = await rejection(store.transition("job-1", 2, stay));
    expect((err as MamError).code).toBe("job.evidenceConflict");
    const cancel = { from: ["running" as const], set: { status: "cancelled" as const }, evidence: { seq: 1, attempt: 1 } };
    expect(await store.transition("job-1", 2, cancel)).toMatchObject({ status: "cancelled", evidence_seq: 1 });
  });

  it("core's guard (JobStoreBase) refuses an id unsafe in a key before it reaches the table", async () => {
    const guarded = store;
    counter.reset();
    const err = await rejection(guarded.create(job("JOB#x")));
    expect((err as MamError).code).toBe("input.jobId");
    expect(((await rejection(guarded.get("../x"))) as MamError).code).toBe("input.jobId");
    expect(counter.total).toBe(0);
  });
});

describe("DynamoJobStore: transition", () => {
  let store: DynamoJobStore;
  beforeEach(async () => {
    store = await freshStore();
    await store.create(job("job-1", { agent_session: "old" }));
    counter.reset();
  });

  it("commits with exactly one request (one UpdateItem) and returns the new record", async () => {
    const next = await store.transition("job-1", 0, {
      from: ["pending"],
      set: { status: "running", updated_at: at(10), progress: { step: 1 } },
      unset: ["agent_session"],
    });
    expect(counter.total).toBe(1);
    expect(counter.byCommand).toEqual({ UpdateItemCommand: 1 });
    expect(next).toEqual({
      ...job("job-1"),
      status: "running",
      transition_seq: 1,
      updated_at: at(10),
      progress: { step: 1 },
      activity_at: at(10),
    });
    expect(await store.get("job-1")).toEqual(next);
  });

  it("a stale expected seq writes nothing and throws TransitionConflict carrying the current record", async () => {
    await store.transition("job-1", 0, { from: ["pending"], set: { status: "running", updated_at: at(10) } });
    const before = await store.get("job-1");
    counter.reset();
    const err = await rejection(store.transition("job-1", 0, { from: ["pending", "running"], set: { status: "completed" } }));
    const cost = { ...counter.byCommand };
    expect(err).toBeInstanceOf(TransitionConflict);
    expect((err as TransitionConflict).code).toBe("job.transitionConflict");
    expect((err as TransitionConflict).current).toEqual(before);
    expect(await store.get("job-1")).toEqual(before);
    // DynamoDB (and DynamoDB Local) hands back the record the write lost to
    // (ReturnValuesOnConditionCheckFailure: ALL_OLD): the conflict costs the one
    // UpdateItem. dynalite returns no `Item` (gaps.noItemOnConditionFailure), so the
    // store reads the record once more.
    expect(cost).toEqual(peer.gaps.noItemOnConditionFailure ? { UpdateItemCommand: 1, GetItemCommand: 1 } : { UpdateItemCommand: 1 });
  });

  it("refuses a status the change does not allow, naming it (job.transitionRefused)", async () => {
    const err = await rejection(store.transition("job-1", 0, { from: ["running"], set: { status: "completed" } }));
    expect((err as TransitionConflict).code).toBe("job.transitionRefused");
    expect((err as TransitionConflict).message).toContain("pending");
    expect((await store.get("job-1"))?.transition_seq).toBe(0);
  });

  it("an empty `from` commits nothing and says why", async () => {
    const err = await rejection(store.transition("job-1", 0, { from: [], set: { status: "completed" } }));
    expect((err as TransitionConflict).code).toBe("job.transitionRefused");
  });

  it("without an expected seq (MAM_ENGINE_CAS=0) last writer wins, but the status still has to allow it", async () => {
    await store.transition("job-1", 0, { from: ["pending"], set: { status: "running" } });
    const next = await store.transition("job-1", NO_CONCURRENCY_CHECK, { from: ["running"], set: { progress: { n: 1 } } });
    expect(next.transition_seq).toBe(2);
    await store.transition("job-1", NO_CONCURRENCY_CHECK, { from: ["running"], set: { status: "cancelled" } });
    const err = await rejection(
      store.transition("job-1", NO_CONCURRENCY_CHECK, { from: ["pending", "running"], set: { status: "completed" } }),
    );
    expect((err as TransitionConflict).code).toBe("job.transitionRefused");
  });

  it("an unknown job is job.notFound", async () => {
    const err = await rejection(store.transition("nobody", 0, { from: ["pending"], set: { status: "running" } }));
    expect((err as MamError).code).toBe("job.notFound");
    const err2 = await rejection(store.transition("nobody", NO_CONCURRENCY_CHECK, { from: ["pending"], set: { status: "running" } }));
    expect((err2 as MamError).code).toBe("job.notFound");
  });

  it("of racing writers with the same expected seq exactly one commits; the others lose to its record", async () => {
    const results = await Promise.allSettled(
      Array.from({ length: 12 }, (_, i) =>
        store.transition("job-1", 0, { from: ["pending"], set: { status: "running", agent_session: `w${i}` } }),
      ),
    );
    const won = results.filter((r) => r.status === "fulfilled");
    const lost = results.filter((r): r is PromiseRejectedResult => r.status === "rejected");
    expect(won).toHaveLength(1);
    expect(lost).toHaveLength(11);
    const stored = await store.get("job-1");
    expect(stored?.transition_seq).toBe(1);
    for (const r of lost) {
      expect(r.reason).toBeInstanceOf(TransitionConflict);
      expect((r.reason as TransitionConflict).current.transition_seq).toBe(1);
    }
  });

  it("keeps the status index in step: the job moves from one status listing to the other", async () => {
    await store.transition("job-1", 0, { from: ["pending"], set: { status: "running", updated_at: at(5) } });
    expect((await store.list({ status: "pending", limit: 10 })).items).toEqual([]);
    expect((await store.list({ status: "running", limit: 10 })).items.map((j) => j.job_id)).toEqual(["job-1"]);
  });
});

describe("DynamoJobStore: notification bookkeeping and the owed index", () => {
  let store: DynamoJobStore;
  beforeEach(async () => {
    store = await freshStore();
    await store.create(job("job-1"));
  });

  it("a transition that writes an intent makes the job owed; unsetting it settles it", async () => {
    await store.transition("job-1", 0, {
      from: ["pending"],
      set: { status: "completed", updated_at: at(3), pending_notification: intent("n-1", 3) },
    });
    expect((await store.listOwed(10)).map((j) => j.pending_notification?.id)).toEqual(["n-1"]);
    await store.create(job("job-2"));
    await store.transition("job-2", 0, { from: ["pending"], set: { status: "running", pending_notification: intent("n-2", 4) } });
    await store.transition("job-2", 1, { from: ["running"], set: { status: "error" }, unset: ["pending_notification"] });
    expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["job-1"]);
    expect((await store.get("job-2"))?.pending_notification).toBeUndefined();
  });

  it("replaceNotification writes only the intent: no seq bump, no updated_at change", async () => {
    const before = await store.get("job-1");
    counter.reset();
    await store.replaceNotification("job-1", intent("n-1", 7));
    expect(counter.byCommand).toEqual({ UpdateItemCommand: 1 });
    expect(await store.get("job-1")).toEqual({ ...before, pending_notification: intent("n-1", 7) });
    await store.replaceNotification("job-1", intent("n-2", 8));
    expect((await store.get("job-1"))?.pending_notification?.id).toBe("n-2");
    const err = await rejection(store.replaceNotification("nobody", intent("n-3", 9)));
    expect((err as MamError).code).toBe("job.notFound");
  });

  it("settleNotification clears only the exact intent that was sent", async () => {
    await store.replaceNotification("job-1", intent("n-1", 7));
    await store.replaceNotification("job-1", intent("n-2", 8));
    expect(await store.settleNotification("job-1", "n-1")).toBe(false);
    expect((await store.get("job-1"))?.pending_notification?.id).toBe("n-2");
    expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["job-1"]);

    expect(await store.settleNotification("job-1", "n-2")).toBe(true);
    const after = await store.get("job-1");
    expect(after?.pending_notification).toBeUndefined();
    expect(after?.transition_seq).toBe(0);
    expect(await store.listOwed(10)).toEqual([]);
    expect(await store.settleNotification("job-1", "n-2")).toBe(false);
    expect(await store.settleNotification("nobody", "n-2")).toBe(false);
  });

  it("listOwed is one Query on the sparse `owed` index, oldest intent first, never a Scan", async () => {
    for (let i = 2; i <= 40; i++) await store.create(job(`job-${i}`));
    await store.replaceNotification("job-30", intent("n-30", 30));
    await store.replaceNotification("job-7", intent("n-7", 7));
    await store.replaceNotification("job-12", intent("n-12", 12));

    counter.reset();
    const owed = await store.listOwed(10);
    expect(owed.map((j) => j.job_id)).toEqual(["job-7", "job-12", "job-30"]);
    expect(counter.byCommand).toEqual({ QueryCommand: 1 });
    expect(counter.calls[0]?.input.IndexName).toBe("owed");

    // Its cost is the number owed, not the number of jobs: the index holds 3 of 40.
    const raw = await peer.client.send(
      new QueryCommand({
        TableName: store.tableName,
        IndexName: "owed",
        KeyConditionExpression: "owed_pk = :o",
        ExpressionAttributeValues: { ":o": { S: "OWED" } },
      }),
    );
    expect(raw.ScannedCount).toBe(3);

    expect((await store.listOwed(2)).map((j) => j.job_id)).toEqual(["job-7", "job-12"]);
  });

  it("the sweep's listOwed(dueBy) is one Query whose key condition stops at now: intents backing off or quarantined are never read", async () => {
    for (let i = 2; i <= 12; i++) await store.create(job(`job-${i}`));
    for (let i = 2; i <= 12; i++) await store.replaceNotification(`job-${i}`, intent(`n-${i}`, i));
    // 2..5 back off until second 100; 6..8 are quarantined; 9..12 are due.
    for (let i = 2; i <= 5; i++)
      expect(await store.reviseNotification(`job-${i}`, { ...intent(`n-${i}`, i), failures: 1, retry_at: at(100) })).toBe(true);
    for (let i = 6; i <= 8; i++) {
      expect(await store.reviseNotification(`job-${i}`, { ...intent(`n-${i}`, i), failures: 5, quarantined_at: at(50 + i) })).toBe(true);
    }

    counter.reset();
    const due = await store.listOwed(10, { dueBy: at(60) });
    expect(due.map((j) => j.job_id)).toEqual(["job-9", "job-10", "job-11", "job-12"]);
    expect(counter.byCommand).toEqual({ QueryCommand: 1 });
    const query = counter.calls[0]?.input as { IndexName?: string; KeyConditionExpression?: string; FilterExpression?: string };
    expect(query.IndexName).toBe("owed");
    expect(query.KeyConditionExpression).toBe("owed_pk = :owed AND owed_at <= :due");
    expect(query.FilterExpression).toBeUndefined();

    // What that key condition reads: the 4 due items, nothing else.
    const raw = await peer.client.send(
      new QueryCommand({
        TableName: store.tableName,
        IndexName: "owed",
        KeyConditionExpression: "owed_pk = :o AND owed_at <= :due",
        ExpressionAttributeValues: { ":o": { S: "OWED" }, ":due": { S: `${at(60)}#~` } },
      }),
    );
    expect(raw.ScannedCount).toBe(4);

    counter.reset();
    const quarantined = await store.listQuarantined({ limit: 2 });
    expect(quarantined.items.map((j) => j.job_id)).toEqual(["job-8", "job-7"]);
    const rest = await store.listQuarantined({ limit: 2, cursor: quarantined.cursor! });
    expect(rest.items.map((j) => j.job_id)).toEqual(["job-6"]);
    expect(rest.cursor).toBeUndefined();
    expect(counter.byCommand).toEqual({ QueryCommand: 2 });
    expect(counter.calls.map((c) => (c.input as { IndexName?: string }).IndexName)).toEqual(["owed", "owed"]);
    // A cursor of another listing is refused.
    const other = await store.list({ limit: 1 });
    await expect(store.listQuarantined({ limit: 2, cursor: other.cursor! })).rejects.toMatchObject({ code: "input.invalid" });
  });
});

describe("DynamoJobStore: dispatches and events", () => {
  let store: DynamoJobStore;
  beforeEach(async () => {
    store = await freshStore();
    await store.create(job("job-1"));
  });

  const dispatch = (attempt: number, over: Partial<DispatchRecord> = {}): DispatchRecord => ({
    job_id: "job-1",
    attempt_id: attempt,
    agent_session_uuid: `sess-${attempt}`,
    pane_process_generation: attempt,
    anchor: { started_at: at(attempt), workspace_revision: `rev-${attempt}` },
    recorded_at: at(attempt),
    ...over,
  });

  it("records each attempt once: a second write of it is dispatch.exists and changes nothing", async () => {
    await store.recordDispatch(dispatch(1));
    const err = await rejection(store.recordDispatch(dispatch(1, { agent_session_uuid: "intruder" })));
    expect((err as MamError).code).toBe("dispatch.exists");
    expect(await store.getDispatch("job-1", 1)).toEqual(dispatch(1));
    expect(await store.getDispatch("job-1", 2)).toBeUndefined();
  });

  it("latest_attempt moves up numerically (10 after 9), never down", async () => {
    for (const a of [9, 10]) await store.recordEvidence("job-1", { guard: { newAttempt: a } });
    const err = await rejection(store.recordEvidence("job-1", { guard: { newAttempt: 2 } }));
    expect((err as MamError).code).toBe("dispatch.outOfOrder");
    expect((await store.get("job-1"))?.latest_attempt).toBe(10);
  });

  it("keeps the event log oldest first, bounded by the limit; the same entry twice is one line", async () => {
    const entry = (id: string, seconds: number) => ({ job_id: "job-1", at: at(seconds), id, event: "progress", data: { id } });
    await store.appendEvent(entry("e3", 3));
    await store.appendEvent(entry("e1", 1));
    await store.appendEvent(entry("e2", 2));
    await store.appendEvent(entry("e2", 2));
    expect((await store.listEvents("job-1", { limit: 10 })).items.map((e) => e.id)).toEqual(["e1", "e2", "e3"]);
    expect((await store.listEvents("job-1", { limit: 2 })).items).toEqual([entry("e1", 1), entry("e2", 2)]);
    expect(await store.listEvents("job-2", { limit: 10 })).toEqual({ items: [] });
  });
});

describe("DynamoJobStore: list", () => {
  let store: DynamoJobStore;
  beforeEach(async () => {
    store = await freshStore();
  });

  async function seed(specs: [id: string, seconds: number, status?: Status][]): Promise<void> {
    for (const [id, s, status] of specs) await store.create(job(id, { updated_at: at(s), status: status ?? "pending" }));
  }

  async function all(query: { status?: Status; limit: number }): Promise<string[][]> {
    const pages: string[][] = [];
    let cursor: string | undefined;
    do {
      const page = await store.list({ ...query, ...(cursor === undefined ? {} : { cursor }) });
      pages.push(page.items.map((j) => j.job_id));
      cursor = page.cursor;
    } while (cursor !== undefined);
    return pages;
  }

  it("pages newest first across every status, ties by job id; the last page has no cursor", async () => {
    await seed([
      ["a", 1],
      ["b", 5, "running"],
      ["c", 3, "completed"],
      ["d", 5],
      ["e", 2, "error"],
      ["f", 4],
      ["g", 6, "running"],
    ]);
    expect(await all({ limit: 3 })).toEqual([["g", "d", "b"], ["f", "c", "e"], ["a"]]);
    // A page that ends exactly at the end has no cursor (no empty trailing page).
    expect(await all({ limit: 7 })).toEqual([["g", "d", "b", "f", "c", "e", "a"]]);
    // Only job records are listed: dispatches and events share the partition, not the index.
    await store.appendEvent({ job_id: "a", at: at(9), id: "e1", event: "progress" });
    expect((await store.list({ limit: 50 })).items).toHaveLength(7);
  });

  it("filters by status through the status index, newest first", async () => {
    await seed([
      ["a", 1, "running"],
      ["b", 2],
      ["c", 3, "running"],
      ["d", 4, "running"],
    ]);
    counter.reset();
    expect(await all({ status: "running", limit: 2 })).toEqual([["d", "c"], ["a"]]);
    expect(counter.calls.every((c) => c.input.IndexName === "by-status")).toBe(true);
    expect(await all({ status: "cancelled", limit: 2 })).toEqual([[]]);
  });

  it("orders by the instant, whatever offset a time was written with", async () => {
    await store.create(job("east", { updated_at: "2030-01-01T01:30:00+02:00" })); // 23:30Z the day before
    await store.create(job("utc", { updated_at: "2030-01-01T00:00:00Z" }));
    await store.create(job("millis", { updated_at: "2030-01-01T00:00:00.500Z" }));
    expect((await store.list({ limit: 10 })).items.map((j) => j.job_id)).toEqual(["millis", "utc", "east"]);
    // The record keeps the time as written; only the index key is normalised.
    expect((await store.get("east"))?.updated_at).toBe("2030-01-01T01:30:00+02:00");
  });

  it("refuses a cursor it did not hand out, or one from another listing", async () => {
    await seed([
      ["a", 1, "running"],
      ["b", 2, "running"],
    ]);
    const page = await store.list({ status: "running", limit: 1 });
    expect(page.cursor).toBeDefined();
    for (const cursor of ["garbage", Buffer.from("{}").toString("base64url"), page.cursor ?? ""]) {
      const err = await rejection(store.list({ limit: 1, cursor }));
      expect((err as MamError).code).toBe("input.invalid");
    }
    const err = await rejection(store.list({ status: "pending", limit: 1, cursor: page.cursor ?? "" }));
    expect((err as MamError).code).toBe("input.invalid");
  });
});

describe("DynamoJobStore: failures", () => {
  it("an unreachable table is a retryable store.unavailable", async () => {
    // The table's endpoint gone: a client aimed at a port nobody answers on.
    const client = new DynamoDBClient({
      endpoint: `http://127.0.0.1:${await deadPort()}`,
      region: "us-east-1",
      credentials: { accessKeyId: "local", secretAccessKey: "local" },
    });
    try {
      const store = new DynamoJobStore({ client, tableName: "mam-jobs-gone" });
      const err = await rejection(store.get("job-1"));
      expect(err).toBeInstanceOf(MamError);
      expect((err as MamError).code).toBe("store.unavailable");
      expect((err as MamError).retryable).toBe(true);
      const err2 = await rejection(store.transition("job-1", 0, { from: ["pending"], set: { status: "running" } }));
      expect((err2 as MamError).code).toBe("store.unavailable");
    } finally {
      client.destroy();
    }
  });

  it("throttling is a retryable store.unavailable; a validation fault is not retryable", () => {
    const throttled = new ProvisionedThroughputExceededException({ message: "slow down", $metadata: { httpStatusCode: 400 } });
    expect(storeFailure(throttled, "x").code).toBe("store.unavailable");
    const bad = Object.assign(new Error("bad expression"), { name: "ValidationException", $metadata: { httpStatusCode: 400 } });
    expect(storeFailure(bad, "x").code).toBe("internal");
    expect(storeFailure(new TypeError("a bug of ours"), "x").code).toBe("internal");
  });
});

describe("the job item layout (job-item.ts)", () => {
  it("its key attributes are exactly the table's attribute definitions", () => {
    expect([...KEY_ATTRIBUTES].sort()).toEqual(JOB_TABLE_DEFINITION.AttributeDefinitions.map((a) => a.AttributeName).sort());
  });

  it("a stream's new image of a job item reads back as the record, stripped of keys; one that is not a record is internal, naming the field", () => {
    const record = job("job-1", { status: "running", pending_notification: intent("n-1", 4), progress: { ratio: 0.5, big: 2 ** 60 } });
    const image = marshall(jobItem(record), { removeUndefinedValues: true, allowImpreciseNumbers: true }) as Parameters<
      typeof jobRecordOfNewImage
    >[0];
    expect(image.owed_pk).toEqual({ S: "OWED" });
    expect(jobRecordOfNewImage(image, "record 1")).toEqual(record);
    const { prompt: _gone, ...broken } = image;
    const err = (() => {
      try {
        return jobRecordOfNewImage(broken, "stream record 7");
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(MamError);
    expect(err).toMatchObject({ code: "internal", message: "stream record 7 holds a job item that is not a job record" });
    expect((err as MamError).issues.map((i) => i.path)).toEqual(["NewImage.prompt"]);
  });
});

describe("DynamoJobStore: the feed's note on the item (issue 17)", () => {
  it("an upload declaration's evidence write leaves its actor and what it declared on the item; the stream derivation of that write is report.upload_declared by that actor", async () => {
    const dynamo = await freshStore();
    const store = dynamo;
    await store.create(job("decl-1", { status: "running", transition_seq: 1, latest_attempt: 1 }));
    const item = async () =>
      (await peer.client.send(new GetItemCommand({ TableName: dynamo.tableName, Key: marshall({ pk: "JOB#decl-1", sk: JOB_ITEM_SK }) })))
        .Item;
    const before = await item();
    const declared = { sha256: "f".repeat(64), bytes: 41_943_040 };
    const agent = { kind: "agent", jobId: "decl-1", attemptId: 1, tokenId: "jti-decl" } as const;
    await store.recordEvidence("decl-1", { guard: { attempt: 1 }, note: noteOf(agent, { declared }) });
    const after = await item();
    expect(JSON.parse(after?.feed_note?.S ?? "null")).toEqual({ actor: { type: "agent", token_id: "jti-decl" }, declared });
    const record = {
      eventID: "e-decl",
      eventName: "MODIFY",
      dynamodb: { SequenceNumber: "100", OldImage: before, NewImage: after, StreamViewType: "NEW_AND_OLD_IMAGES" },
    } as unknown as Parameters<typeof feedWriteOfStreamRecord>[0];
    const rows = feedWriteOfStreamRecord(record, at(10))?.rows ?? [];
    expect(rows.map((r) => [r.row.kind, r.row.actor, r.row.data])).toEqual([
      ["report.upload_declared", { type: "agent", token_id: "jti-decl" }, { attempt_id: 1, ...declared }],
    ]);
  });
});

describe("the record a lost write comes back with (DynamoDB's ALL_OLD)", () => {
  it("comes back from the engine on a failed condition and reads as the stored record (DynamoDB Local); dynalite sends none", async () => {
    const store = await freshStore();
    const stored = job("job-1", { status: "running", transition_seq: 4, progress: { big: 2 ** 60, list: [1.5] } });
    await store.create(stored);
    const err = await rejection(
      peer.client.send(
        new UpdateItemCommand({
          TableName: store.tableName,
          Key: { pk: { S: "JOB#job-1" }, sk: { S: "JOB" } },
          UpdateExpression: "SET transition_seq = :next",
          ConditionExpression: "transition_seq = :stale",
          ExpressionAttributeValues: { ":next": { N: "1" }, ":stale": { N: "0" } },
          ReturnValuesOnConditionCheckFailure: "ALL_OLD",
        }),
      ),
    );
    expect(err).toBeInstanceOf(ConditionalCheckFailedException);
    expect(recordFromConditionFailure(err)).toEqual(peer.gaps.noItemOnConditionFailure ? undefined : stored);
  });

  // The translation on the SDK's own exception, shaped as DynamoDB sends it: on
  // every engine, whatever it returns.
  it("is unmarshalled and stripped of key attributes", () => {
    const err = new ConditionalCheckFailedException({
      message: "The conditional request failed",
      $metadata: { httpStatusCode: 400 },
      Item: {
        pk: { S: "JOB#job-1" },
        sk: { S: "JOB" },
        gsi1pk: { S: "STATUS#running" },
        gsi1sk: { S: `${at(4)}#job-1` },
        gsi2pk: { S: "JOBS" },
        gsi2sk: { S: `${at(4)}#job-1` },
        owed_pk: { S: "OWED" },
        owed_at: { S: `${at(4)}#job-1` },
        job_id: { S: "job-1" },
        prompt: { S: "do job-1" },
        agent: { S: "claude" },
        role: { S: "Worker" },
        status: { S: "running" },
        iteration: { N: "0" },
        transition_seq: { N: "3" },
        evidence_seq: { N: "0" },
        expected_artifacts: { L: [{ S: "git_commit" }] },
        auto_complete: { BOOL: false },
        progress: { M: { big: { N: "12345678901234567890" }, none: { NULL: true }, list: { L: [{ N: "1.5" }] } } },
        pending_notification: { M: { id: { S: "n-1" }, event: { S: "running" }, seq: { N: "3" }, created_at: { S: at(4) } } },
        created_at: { S: at(0) },
        updated_at: { S: at(4) },
      },
    });
    expect(recordFromConditionFailure(err)).toEqual(
      job("job-1", {
        status: "running",
        transition_seq: 3,
        expected_artifacts: ["git_commit"],
        updated_at: at(4),
        progress: { big: Number("12345678901234567890"), none: null, list: [1.5] },
        pending_notification: { id: "n-1", event: "running", seq: 3, created_at: at(4) },
      }),
    );
    expect(recordFromConditionFailure(new ConditionalCheckFailedException({ message: "x", $metadata: {} }))).toBeUndefined();
  });
});
