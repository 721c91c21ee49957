/**
 * The DynamoDB change feed end to end on AWS's own DynamoDB Local, which has what
 * dynalite lacks: a stream and transactions. The Lambda's poller is stood in for by a
 * pump that reads the table's real stream (every shard, in order) and hands each record,
 * in Lambda's shape, to the stream function's feed write (`writeStreamChanges`). Needs
 * Java (scripts/peers/dynamodb-local.ts).
 */
import { spawn } from "node:child_process";
import net from "node:net";
import path from "node:path";
import { DeleteTableCommand, DescribeTableCommand, DynamoDBClient, ListTablesCommand } from "@aws-sdk/client-dynamodb";
import {
  type _Record,
  DescribeStreamCommand,
  DynamoDBStreamsClient,
  GetRecordsCommand,
  GetShardIteratorCommand,
} from "@aws-sdk/client-dynamodb-streams";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import {
  type ChangeQuery,
  type ChangeRow,
  ForwardingJobStore,
  guardJobStore,
  type JobStore,
  OPERATOR,
  parseFlags,
  randomIds,
  registerJob,
  systemClock,
  transitionJob,
} from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type DynamoDbLocal, dynamoDbLocalDir } from "../../scripts/peers/dynamodb-local.ts";
import { changeFeedContract } from "../contract/feed.suite.ts";

let peer: DynamoDbLocal;
let tables = 0;

beforeAll(async () => {
  peer = await startPeer();
}, 300_000);
afterAll(async () => {
  await peer?.close();
});

/**
 * DynamoDB Local from its npm package's jar (`dynamoDbLocalDir`), waited for until it
 * answers: scripts/peers' helper gives up after 50 refused connections, which a loaded
 * machine outlasts (its listener binds seconds after it prints its configuration).
 * Each retry follows a refusal, until a deadline.
 */
async function startPeer(): Promise<DynamoDbLocal> {
  const dir = dynamoDbLocalDir();
  const port = await freePort();
  const child = spawn(
    "java",
    [
      `-Djava.library.path=${path.join(dir, "DynamoDBLocal_lib")}`,
      "-jar",
      path.join(dir, "DynamoDBLocal.jar"),
      "-inMemory",
      "-sharedDb",
      "-disableTelemetry",
      "-port",
      String(port),
    ],
    { stdio: ["ignore", "ignore", "ignore"] },
  );
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const endpoint = `http://127.0.0.1:${port}`;
  const credentials = { accessKeyId: "local", secretAccessKey: "local" };
  const client = new DynamoDBClient({ endpoint, region: "us-east-1", credentials });
  const streams = new DynamoDBStreamsClient({ endpoint, region: "us-east-1", credentials });
  const deadline = Date.now() + 240_000;
  for (;;) {
    try {
      await client.send(new ListTablesCommand({ Limit: 1 }));
      break;
    } catch (e) {
      if (Date.now() > deadline || child.exitCode !== null) {
        child.kill("SIGKILL");
        throw e;
      }
      await new Promise((r) => setImmediate(r));
    }
  }
  return {
    endpoint,
    client,
    streams,
    async close() {
      client.destroy();
      streams.destroy();
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Reads a table's stream from its start, shard by shard, remembering where each shard was left. */
class StreamPump {
  readonly #iterators = new Map<string, string | undefined>();
  constructor(
    readonly tableName: string,
    readonly write: (record: DynamoDBRecord) => Promise<number>,
  ) {}

  /** Hand every record not yet pumped to the feed write, in each shard's order; how many rows were written. */
  async pump(): Promise<number> {
    const { Table } = await peer.client.send(new DescribeTableCommand({ TableName: this.tableName }));
    const { StreamDescription } = await peer.streams.send(new DescribeStreamCommand({ StreamArn: Table!.LatestStreamArn! }));
    let written = 0;
    for (const shard of StreamDescription?.Shards ?? []) {
      let iterator = this.#iterators.get(shard.ShardId!);
      if (!this.#iterators.has(shard.ShardId!)) {
        iterator = (
          await peer.streams.send(
            new GetShardIteratorCommand({ StreamArn: Table!.LatestStreamArn!, ShardId: shard.ShardId!, ShardIteratorType: "TRIM_HORIZON" }),
          )
        ).ShardIterator;
      }
      while (iterator !== undefined) {
        const out = await peer.streams.send(new GetRecordsCommand({ ShardIterator: iterator }));
        for (const r of out.Records ?? []) written += await this.write(lambdaShape(r));
        iterator = out.NextShardIterator;
        if ((out.Records ?? []).length === 0) break;
      }
      this.#iterators.set(shard.ShardId!, iterator);
    }
    return written;
  }
}

/** A Streams API record as Lambda hands it over: the creation time in epoch seconds. */
function lambdaShape(r: _Record): DynamoDBRecord {
  const created = r.dynamodb?.ApproximateCreationDateTime;
  return {
    ...r,
    dynamodb: { ...r.dynamodb, ...(created === undefined ? {} : { ApproximateCreationDateTime: created.getTime() / 1000 }) },
  } as unknown as DynamoDBRecord;
}

/** The store with the stream function behind it: a feed read first pumps what the stream holds. */
class PumpedStore extends ForwardingJobStore {
  constructor(
    inner: JobStore,
    readonly pump: StreamPump,
  ) {
    super(inner);
  }
  override async listChanges(query: ChangeQuery) {
    await this.pump.pump();
    return this.inner.listChanges(query);
  }
}

async function freshTable(): Promise<{ dynamo: DynamoJobStore; tableName: string; pump: StreamPump; drop(): Promise<void> }> {
  const tableName = `mam-feed-${++tables}`;
  await createJobTable(peer.client, tableName);
  // No feed delay: every row a test reads was written before it read (the pump ran first).
  const dynamo = new DynamoJobStore({ client: peer.client, tableName, feedDelayMs: 0 });
  const pump = new StreamPump(tableName, (record) => dynamo.writeStreamChanges(record));
  return { dynamo, tableName, pump, drop: async () => void (await peer.client.send(new DeleteTableCommand({ TableName: tableName }))) };
}

changeFeedContract("DynamoDB Local (rows derived from its stream)", async () => {
  const t = await freshTable();
  return { store: new PumpedStore(guardJobStore(t.dynamo), t.pump), close: t.drop };
});

describe("the DynamoDB feed's stream derivation, on DynamoDB Local", () => {
  it("a replayed stream record writes nothing new", async () => {
    const t = await freshTable();
    try {
      const store = guardJobStore(t.dynamo);
      const deps = { jobs: store, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
      await registerJob(deps, { job_id: "replayed", prompt: "p", agent: "codex" }, OPERATOR);
      await transitionJob(deps, "replayed", { action: "claim", expectedSeq: 0 }, OPERATOR);
      const records: DynamoDBRecord[] = [];
      const recorder = new StreamPump(t.tableName, async (r) => {
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
      const store = guardJobStore(t.dynamo);
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
