/**
 * The counts per status on DynamoDB (issue 22), end to end on DynamoDB Local: the
 * store's writes, the table's real stream pumped through the feed writer
 * (`writeStreamChanges`, which moves the counter items under each record's marker),
 * and `countByStatus`. dynalite (npm test) has neither a stream nor transactions, so
 * the counts never move there; the derivation itself is pure and tested in npm test
 * (tests/contract/feed-stream.test.ts). Needs Java.
 */
import { DeleteTableCommand, PutItemCommand } from "@aws-sdk/client-dynamodb";
import type { DynamoDBStreamsClient } from "@aws-sdk/client-dynamodb-streams";
import { marshall } from "@aws-sdk/util-dynamodb";
import { createJobTable, DynamoJobStore, jobItem, markJobItemsCounted, migrateJobTable, TABLE_STEPS } from "@mam/aws";
import type { JobRecord } from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { statusCountsContract } from "../contract/status-counts.suite.ts";
import { type DynamoPeer, startDynamoPeer } from "../support/aws-peers.ts";
import { jobRecord as job } from "../support/records.ts";
import { StreamPump } from "../support/stream-pump.ts";

let peer: DynamoPeer & { readonly streams: DynamoDBStreamsClient };
let tables = 0;

beforeAll(async () => {
  const started = await startDynamoPeer();
  if (started.streams === undefined) throw new Error(`tests/engine needs DynamoDB Local's stream; ${started.engine} keeps none`);
  peer = { ...started, streams: started.streams, close: () => started.close() };
}, 300_000);
afterAll(async () => {
  await peer?.close();
});

async function freshTable() {
  const tableName = `mam-counts-${++tables}`;
  await createJobTable(peer.client, tableName);
  const store = new DynamoJobStore({ client: peer.client, tableName, feedDelayMs: 0 });
  const pump = new StreamPump(peer, tableName, (record) => store.writeStreamChanges(record));
  return {
    tableName,
    store,
    pump,
    drop: async () => void (await peer.client.send(new DeleteTableCommand({ TableName: tableName }))),
  };
}

statusCountsContract("DynamoDB Local (counted by the feed writer, from the stream)", "eventual", async () => {
  const t = await freshTable();
  return {
    store: t.store,
    settle: async () => void (await t.pump.pump()),
    racers: (n) => Array.from({ length: n }, () => new DynamoJobStore({ client: peer.client, tableName: t.tableName })),
    close: t.drop,
  };
});

/** A job item as a mam from before the counts wrote it: no `counted` mark. */
async function putOldItem(tableName: string, record: JobRecord): Promise<void> {
  const { counted: _c, ...item } = jobItem(record) as Record<string, unknown>;
  await peer.client.send(new PutItemCommand({ TableName: tableName, Item: marshall(item, { removeUndefinedValues: true }) }));
}

describe("the counts on DynamoDB Local: the feed writer's marker, and storage step 4", () => {
  it("a re-delivered stream batch (every record handed to the feed writer again) counts nothing twice", async () => {
    const t = await freshTable();
    try {
      const records: DynamoDBRecord[] = [];
      const recorder = new StreamPump(peer, t.tableName, async (r) => {
        records.push(r);
        return t.store.writeStreamChanges(r);
      });
      await t.store.create(job("again-1"));
      await t.store.create(job("again-2"));
      await t.store.transition("again-1", 0, { from: ["pending"], set: { status: "running" } });
      await t.store.transition("again-1", 1, { from: ["running"], set: { status: "completed" } });
      await recorder.pump();
      // The stream holds every item's writes (the feed writer's own among them); four are the job's.
      expect(records.filter((r) => r.dynamodb?.NewImage?.sk?.S === "JOB")).toHaveLength(4);
      const once = (await t.store.countByStatus()).counts;
      expect(once).toEqual({ pending: 1, running: 0, completed: 1, error: 0, cancelled: 0 });
      // The whole batch again, and again concurrently: Lambda's retry of a batch, a redrive.
      for (const r of records) expect(await t.store.writeStreamChanges(r)).toBe(0);
      await Promise.all(records.map((r) => t.store.writeStreamChanges(r)));
      expect((await t.store.countByStatus()).counts).toEqual(once);
    } finally {
      await t.drop();
    }
  });

  it("step 4 counts the jobs from before the counts once (each by the stream record of its mark), racing transitions, and a second run counts nothing", async () => {
    const t = await freshTable();
    try {
      // Items an older mam wrote: no mark, so neither their creates nor their moves are counted.
      const statuses = ["pending", "running", "running", "completed", "error", "cancelled"] as const;
      for (const [i, status] of statuses.entries()) {
        await putOldItem(t.tableName, job(`old-${i}`, { status, transition_seq: status === "pending" ? 0 : 1 }));
      }
      await t.store.transition("old-1", 1, { from: ["running"], set: { status: "completed" } });
      await t.store.create(job("new-1"));
      await t.pump.pump();
      expect((await t.store.countByStatus()).counts).toEqual({ pending: 1, running: 0, completed: 0, error: 0, cancelled: 0 });

      // The step, racing an agent's transitions of items it has not marked yet.
      const [marked] = await Promise.all([
        markJobItemsCounted({ client: peer.client, tableName: t.tableName, run: "all" }),
        t.store.transition("old-0", 0, { from: ["pending"], set: { status: "running" } }),
        t.store.transition("old-2", 1, { from: ["running"], set: { status: "error" } }),
      ]);
      expect(marked).toBe(6);
      await t.store.transition("old-0", 1, { from: ["running"], set: { status: "cancelled" } });
      await t.pump.pump();
      const after = (await t.store.countByStatus()).counts;
      // old-0 cancelled, old-1 completed, old-2 error, old-3 completed, old-4 error, old-5 cancelled; new-1 pending.
      expect(after).toEqual({ pending: 1, running: 0, completed: 2, error: 2, cancelled: 2 });

      // Again (a crash before the bump, a second operator): nothing left to mark, nothing counted twice.
      expect(await markJobItemsCounted({ client: peer.client, tableName: t.tableName, run: "all" })).toBe(0);
      await t.pump.pump();
      expect((await t.store.countByStatus()).counts).toEqual(after);
    } finally {
      await t.drop();
    }
  });

  it("the step is the table's version 4, run by `mam migrate` and refused where a function starts (a Scan is not cheap)", async () => {
    expect(TABLE_STEPS.at(-1)).toMatchObject({ version: 4 });
    expect(TABLE_STEPS.at(-1)?.cheap).not.toBe(true);
    const t = await freshTable();
    try {
      // createJobTable stamps the latest version: nothing pending.
      expect(await migrateJobTable({ client: peer.client, tableName: t.tableName }, { run: "cheap" })).toMatchObject({ applied: [] });
    } finally {
      await t.drop();
    }
  });
});
