/**
 * The DynamoDB change feed end to end on AWS's own DynamoDB Local, which has what
 * dynalite lacks: a stream and transactions. The Lambda's poller is stood in for by a
 * pump that reads the table's real stream (every shard, in order) and hands each record,
 * in Lambda's shape, to the stream function's feed write (`writeStreamChanges`). Needs
 * Java: the engine tier starts DynamoDB Local through the one peer factory.
 */
import { DeleteTableCommand } from "@aws-sdk/client-dynamodb";
import type { DynamoDBStreamsClient } from "@aws-sdk/client-dynamodb-streams";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import {
  type ChangeQuery,
  type ChangeRow,
  type FeedPage,
  OPERATOR,
  parseFlags,
  randomIds,
  registerJob,
  systemClock,
  transitionJob,
} from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { changeFeedContract } from "../contract/feed.suite.ts";
import { type DynamoPeer, startDynamoPeer } from "../support/aws-peers.ts";
import { StreamPump } from "../support/stream-pump.ts";

let peer: DynamoPeer & { readonly streams: DynamoDBStreamsClient };
let tables = 0;

beforeAll(async () => {
  const started = await startDynamoPeer();
  // The feed on DynamoDB is derived from the table's stream: only an engine with one shows it.
  if (started.streams === undefined) throw new Error(`tests/engine needs DynamoDB Local's stream; ${started.engine} keeps none`);
  peer = { ...started, streams: started.streams, close: () => started.close() };
}, 300_000);
afterAll(async () => {
  await peer?.close();
});

/** The store with the stream function behind it: a feed read first pumps what the stream holds. */
class PumpedStore extends DynamoJobStore {
  pump: StreamPump | undefined;
  override async listChanges(query: ChangeQuery): Promise<FeedPage> {
    await this.pump?.pump();
    return super.listChanges(query);
  }
  override async feedHead(query?: Pick<ChangeQuery, "jobId">): Promise<string> {
    await this.pump?.pump();
    return super.feedHead(query);
  }
}

async function freshTable(): Promise<{ dynamo: PumpedStore; tableName: string; pump: StreamPump; drop(): Promise<void> }> {
  const tableName = `mam-feed-${++tables}`;
  await createJobTable(peer.client, tableName);
  // No feed delay: every row a test reads was written before it read (the pump ran first).
  const dynamo = new PumpedStore({ client: peer.client, tableName, feedDelayMs: 0 });
  const pump = new StreamPump(peer, tableName, (record) => dynamo.writeStreamChanges(record));
  return { dynamo, tableName, pump, drop: async () => void (await peer.client.send(new DeleteTableCommand({ TableName: tableName }))) };
}

changeFeedContract("DynamoDB Local (rows derived from its stream)", async () => {
  const t = await freshTable();
  t.dynamo.pump = t.pump;
  return { store: t.dynamo, close: t.drop };
});

describe("the DynamoDB feed's stream derivation, on DynamoDB Local", () => {
  it("a replayed stream record writes nothing new", async () => {
    const t = await freshTable();
    try {
      const store = t.dynamo;
      const deps = { jobs: store, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
      await registerJob(deps, { job_id: "replayed", prompt: "p", agent: "codex" }, OPERATOR);
      await transitionJob(deps, "replayed", { action: "claim", expectedSeq: 0 }, OPERATOR);
      const records: DynamoDBRecord[] = [];
      const recorder = new StreamPump(peer, t.tableName, async (r) => {
        records.push(r);
        return t.dynamo.writeStreamChanges(r);
      });
      expect(await recorder.pump()).toBe(2);
      for (const r of records) expect(await t.dynamo.writeStreamChanges(r)).toBe(0);
      const rows = (await store.listChanges({ limit: 100 })).items;
      expect(rows.map((r) => [r.kind, r.actor.type])).toEqual([
        ["job.registered", "operator"],
        ["job.transitioned", "operator"],
      ]);
    } finally {
      await t.drop();
    }
  });

  it("concurrent writers while a reader pages with cursors (and the stream is pumped): no cursor skips a row", async () => {
    const t = await freshTable();
    try {
      const store = t.dynamo;
      const deps = { jobs: store, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
      const writer = async (w: number) => {
        for (let i = 0; i < 15; i++) {
          const jobId = `w${w}-${i}`;
          await registerJob(deps, { job_id: jobId, prompt: "p", agent: "codex" }, OPERATOR);
          await transitionJob(deps, jobId, { action: "claim", expectedSeq: 0 }, OPERATOR);
        }
      };
      let finished = false;
      const writing = Promise.all([0, 1, 2, 3].map(writer)).finally(() => {
        finished = true;
      });
      const seen: ChangeRow[] = [];
      let after: string | undefined;
      for (;;) {
        const wasFinished = finished;
        await t.pump.pump();
        const page = await store.listChanges({ limit: 5, ...(after === undefined ? {} : { after }) });
        seen.push(...page.items);
        after = page.cursor;
        if (wasFinished && page.items.length === 0) break;
      }
      await writing;
      await t.pump.pump();
      const whole = (await store.listChanges({ limit: 1000 })).items;
      expect(whole).toHaveLength(4 * 15 * 2);
      expect(seen.map((r) => r.cursor)).toEqual(whole.map((r) => r.cursor));
      // One job's rows in its own order.
      const mine = (await store.listChanges({ limit: 100, jobId: "w2-7" })).items;
      expect(mine.map((r) => r.kind)).toEqual(["job.registered", "job.transitioned"]);
    } finally {
      await t.drop();
    }
  }, 120_000);
});
