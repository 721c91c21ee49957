/**
 * The stream path end to end, on AWS's own DynamoDB Local: a commit through the real
 * DynamoDB JobStore -> the table's stream -> our stream poller -> the real stream
 * publisher handler (functions/compose.ts) -> IoT Core's HTTPS publish (the stand-in)
 * -> an MQTT subscriber on the broker.
 *
 * The poller (scripts/peers/stream-poller.ts) imitates Lambda's event source mapping
 * as serverless.yml configures it (batch size, ReportBatchItemFailures, bisect,
 * bounded retries, the on-failure destination, the filter): those are AWS's to do,
 * and here they are ours. What this file really tests is the handler's answer
 * (which records it publishes, which it reports failed) on real DynamoDB Local
 * stream records, and that the mapping's rules, applied to that answer, deliver
 * every committed intent.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { DeleteTableCommand, PutItemCommand } from "@aws-sdk/client-dynamodb";
import { IoTDataPlaneClient } from "@aws-sdk/client-iot-data-plane";
import { createJobTable, DynamoJobStore, IotPublisher } from "@mam/aws";
import {
  type JobRecord,
  type JobStore,
  OPERATOR,
  parseConfig,
  randomIds,
  registerJob,
  systemClock,
  type TransitionInput,
  transitionJob,
} from "@mam/core";
import { type EmbeddedBroker, startEmbeddedBroker } from "@mam/local";
import type { DynamoDBRecord } from "aws-lambda";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type DynamoDbLocal, startDynamoDbLocal } from "../../scripts/peers/dynamodb-local.ts";
import { type IotStandIn, startIotStandIn } from "../../scripts/peers/iot-stand-in.ts";
import type { Invocation, StreamHandler } from "../../scripts/peers/stream-poller.ts";
import { STREAM_MAPPING, type StreamPath, streamPath } from "../support/stream-path.ts";
import { barrier, type ReceivedMessage, type Subscription, subscribe } from "../support/subscriber.ts";

const REGION = "us-east-1";
const CREDENTIALS = { accessKeyId: "local", secretAccessKey: "local" };
/** Every commit is a few DynamoDB Local writes and two publishes: on a busy 2-core machine a test runs for tens of seconds. */
const PATH_TIMEOUT_MS = 180_000;
const MAPPING = STREAM_MAPPING;

let ddb: DynamoDbLocal;
let broker: EmbeddedBroker;
let standIn: IotStandIn;
const refused = new Set<string>();

beforeAll(async () => {
  const service = { username: "mam-iot-stand-in", password: randomBytes(16).toString("hex") };
  [ddb, broker] = await Promise.all([
    startDynamoDbLocal(),
    startEmbeddedBroker({ port: 0, publisherCredentials: service, refusePublish: (topic) => refused.has(topic) }),
  ]);
  standIn = await startIotStandIn(broker.url, { ...service, brokerTimeoutMs: 2000 });
});

afterAll(async () => {
  await standIn?.close();
  await broker?.close();
  await ddb?.close();
});

interface Pipeline extends StreamPath {
  readonly jobs: JobStore;
  readonly tableName: string;
}

const open: Pipeline[] = [];

afterEach(async () => {
  for (const p of open.splice(0)) await p.close();
  refused.clear();
});

/** `around` stands between the poller and the real handler (a test's stand-in for a function that crashes). */
async function pipeline(around: (handler: StreamHandler) => StreamHandler = (h) => h): Promise<Pipeline> {
  const tableName = `mam-stream-${randomUUID().slice(0, 8)}`;
  await createJobTable(ddb.client, tableName);
  const env = {
    AWS_REGION: REGION,
    MAM_TABLE_NAME: tableName,
    MAM_BUCKET_NAME: "unused",
    MAM_IOT_ENDPOINT: standIn.endpoint,
    MAM_DYNAMODB_ENDPOINT: ddb.endpoint,
  };
  const path = streamPath({
    dynamodb: ddb.client,
    streams: ddb.streams,
    tableName,
    env,
    overrides: { credentials: CREDENTIALS },
    region: REGION,
    around,
  });
  const p: Pipeline = {
    ...path,
    jobs: new DynamoJobStore({ client: ddb.client, tableName }),
    tableName,
    async close() {
      await path.close();
      await ddb.client.send(new DeleteTableCommand({ TableName: tableName }));
    },
  };
  open.push(p);
  return p;
}

const deps = (jobs: JobStore) => ({ jobs, clock: systemClock, ids: randomIds, flags: parseConfig({}).flags });

/** One committed transition carrying an intent; returns the record it committed. */
async function commit(jobs: JobStore, jobId: string, input: TransitionInput): Promise<JobRecord> {
  return transitionJob(deps(jobs), jobId, { notify: true, ...input }, OPERATOR);
}

async function register(jobs: JobStore, jobId: string): Promise<void> {
  await registerJob(deps(jobs), { job_id: jobId, prompt: `work on ${jobId}`, agent: "claude-code" });
}

const intentOf = (m: ReceivedMessage): string | undefined => {
  try {
    return (JSON.parse(m.payload) as { data?: { notification_intent?: { id?: string } } }).data?.notification_intent?.id;
  } catch {
    return undefined;
  }
};
const intentOfRecord = (r: DynamoDBRecord): string | undefined => r.dynamodb?.NewImage?.pending_notification?.M?.id?.S;
const intentId = (job: JobRecord): string => job.pending_notification?.id ?? "";
const countOf = (sub: Subscription, id: string): number => sub.received.filter((m) => intentOf(m) === id).length;
/** How many calls of the handler carried the record holding this intent. */
const callsCarrying = (invocations: readonly Invocation[], id: string): number =>
  invocations.filter((i) => i.records.some((r) => intentOfRecord(r) === id)).length;

function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN;
}

/** A publisher through the stand-in, for barriers (the stand-in has the service's right to publish under mam/). */
function barrierPublisher(): { publisher: IotPublisher; close(): void } {
  const client = new IoTDataPlaneClient({ endpoint: standIn.endpoint, region: REGION, credentials: CREDENTIALS });
  return { publisher: new IotPublisher({ client }), close: () => client.destroy() };
}

describe("the DynamoDB stream path on DynamoDB Local (our poller imitates Lambda's event source mapping)", () => {
  it(
    "every committed intent reaches the subscriber: 50 commits over 10 jobs, counted by intent id",
    async () => {
      const p = await pipeline();
      const sub = await subscribe(broker.url, "mam/jobs/+/events");
      try {
        await p.start();
        const jobIds = Array.from({ length: 10 }, (_, i) => `stream-job-${i}`);
        const latencies: number[] = [];
        const committed: string[] = [];
        /** Commit-to-subscriber: from the commit's answer to the subscriber holding its message. */
        const delivered = async (job: JobRecord): Promise<void> => {
          const id = intentId(job);
          committed.push(id);
          const at = performance.now();
          await sub.waitFor((m) => intentOf(m) === id, 30_000);
          latencies.push(performance.now() - at);
        };
        // Ten jobs at once, each committing its next change once the last one was delivered (as an agent's
        // progress would go): at most ten records in the stream at a time.
        await Promise.all(
          jobIds.map(async (jobId) => {
            await register(p.jobs, jobId);
            let job = await commit(p.jobs, jobId, { action: "claim", expectedSeq: 0 });
            await delivered(job);
            for (let n = 0; n < 3; n++) {
              job = await commit(p.jobs, jobId, { action: "progress", expectedSeq: job.transition_seq, fields: { progress: { step: n } } });
              await delivered(job);
            }
            await delivered(await commit(p.jobs, jobId, { action: "completed", expectedSeq: job.transition_seq }));
          }),
        );

        expect(new Set(committed).size).toBe(50);
        for (const id of committed) expect(countOf(sub, id)).toBeGreaterThanOrEqual(1);
        // Nothing failed, so nothing was sent twice and nothing went to the on-failure destination.
        const { publisher, close } = barrierPublisher();
        try {
          const end = await barrier(sub, publisher, "mam/jobs/stream-barrier/events");
          const delivered = sub.received.slice(0, end).map(intentOf);
          expect(delivered.filter((id) => id !== undefined).sort()).toEqual([...committed].sort());
        } finally {
          close();
        }
        expect(p.failures).toEqual([]);
        expect(p.invocations.every((i) => i.outcome.kind === "succeeded")).toBe(true);

        const sorted = [...latencies].sort((a, b) => a - b);
        console.log(
          `stream commit-to-subscriber latency on DynamoDB Local (${sorted.length} commits, poller poll interval 250 ms): ` +
            `p50 ${percentile(sorted, 50).toFixed(0)} ms, p99 ${percentile(sorted, 99).toFixed(0)} ms, max ${sorted.at(-1)?.toFixed(0)} ms`,
        );
      } finally {
        await sub.close();
      }
    },
    PATH_TIMEOUT_MS,
  );

  it(
    "a record whose publish fails is retried alone; the records before it in its batch are not sent again",
    async () => {
      const p = await pipeline();
      const sub = await subscribe(broker.url, "mam/jobs/+/events");
      const refusedJob = "stream-refused";
      const refusedTopic = `mam/jobs/${refusedJob}/events`;
      refused.add(refusedTopic);
      try {
        // Committed before the poller starts, so they are read in one batch: nine jobs, then the refused one, last.
        const good: string[] = [];
        for (let i = 0; i < 9; i++) {
          const jobId = `stream-ok-${i}`;
          await register(p.jobs, jobId);
          good.push(intentId(await commit(p.jobs, jobId, { action: "claim", expectedSeq: 0 })));
        }
        await register(p.jobs, refusedJob);
        const failing = intentId(await commit(p.jobs, refusedJob, { action: "claim", expectedSeq: 0 }));
        expect(good.length + 1).toBeLessThanOrEqual(MAPPING.batchSize);

        // The broker refuses the topic for the first two calls that carry the record, then takes it.
        await p.start((i) => {
          if (i.records.some((r) => intentOfRecord(r) === failing) && i.attempt === 2) refused.delete(refusedTopic);
        });
        await sub.waitFor((m) => intentOf(m) === failing, 15_000);
        await p.invocation((i) => i.outcome.kind === "succeeded" && i.records.some((r) => intentOfRecord(r) === failing));

        const [first, ...retries] = p.invocations.filter((i) => i.records.some((r) => intentOfRecord(r) === failing));
        expect(first?.records.map(intentOfRecord)).toEqual([...good, failing]);
        expect(first?.outcome).toEqual({ kind: "partial", failedSequenceNumbers: [first?.records.at(-1)?.dynamodb?.SequenceNumber] });
        // Retried alone: each retry held only the failed record, until the broker took it.
        expect(retries.map((i) => i.records.map(intentOfRecord))).toEqual([[failing], [failing]]);
        // A batch whose every record failed is a function error: Powertools' processPartialResponse throws
        // (FullBatchFailureError) rather than naming them all; a batch of one cannot be bisected, so it is retried whole.
        expect(retries.map((i) => [i.attempt, i.outcome.kind])).toEqual([
          [2, "failed"],
          [3, "succeeded"],
        ]);
        // The others were in one call and reached the subscriber once each.
        const { publisher, close } = barrierPublisher();
        try {
          await barrier(sub, publisher, "mam/jobs/stream-barrier/events");
        } finally {
          close();
        }
        for (const id of good) {
          expect(callsCarrying(p.invocations, id)).toBe(1);
          expect(countOf(sub, id)).toBe(1);
        }
        expect(countOf(sub, failing)).toBe(1);
        expect(p.failures).toEqual([]);
      } finally {
        await sub.close();
      }
    },
    PATH_TIMEOUT_MS,
  );

  it(
    "a poison record (a job item that is not a job record) ends on the on-failure path after the bounded retries, and does not block what follows",
    async () => {
      const p = await pipeline();
      const sub = await subscribe(broker.url, "mam/jobs/+/events");
      try {
        await register(p.jobs, "before-poison");
        const before = intentId(await commit(p.jobs, "before-poison", { action: "claim", expectedSeq: 0 }));
        // A job item owing an intent, as the stream filter lets through, that no job record schema accepts.
        const poisonIntent = randomUUID();
        await ddb.client.send(
          new PutItemCommand({
            TableName: p.tableName,
            Item: {
              pk: { S: "JOB#poison" },
              sk: { S: "JOB" },
              job_id: { S: "poison" },
              status: { S: "not-a-status" },
              pending_notification: { M: { id: { S: poisonIntent }, event: { S: "completed" } } },
            },
          }),
        );
        const behind: string[] = [];
        for (const jobId of ["behind-poison-1", "behind-poison-2"]) {
          await register(p.jobs, jobId);
          behind.push(intentId(await commit(p.jobs, jobId, { action: "claim", expectedSeq: 0 })));
        }

        await p.start();
        await p.firstFailure;

        const poisonCalls = p.invocations.filter((i) => i.records.some((r) => intentOfRecord(r) === poisonIntent));
        expect(poisonCalls).toHaveLength(1 + MAPPING.maximumRetryAttempts);
        for (const call of poisonCalls) expect(call.outcome).toMatchObject({ kind: "partial" });
        const [message] = p.failures;
        expect(p.failures).toHaveLength(1);
        const poisonSeq = poisonCalls[0]?.records.find((r) => intentOfRecord(r) === poisonIntent)?.dynamodb?.SequenceNumber;
        expect(message?.requestContext).toMatchObject({ condition: "RetryAttemptsExhausted", approximateInvokeCount: 6 });
        expect(message?.DDBStreamBatchInfo).toMatchObject({ startSequenceNumber: poisonSeq, batchSize: 3 });
        expect(message?.DDBStreamBatchInfo.streamArn).toMatch(/^arn:aws:dynamodb:/);

        // The record before it was sent once; those behind it reached the subscriber (again on each retry: at least once).
        expect(callsCarrying(p.invocations, before)).toBe(1);
        expect(countOf(sub, before)).toBe(1);
        for (const id of behind) expect(countOf(sub, id)).toBeGreaterThanOrEqual(1);
        // And the stream goes on: a commit after it is delivered.
        await register(p.jobs, "after-poison");
        const after = intentId(await commit(p.jobs, "after-poison", { action: "claim", expectedSeq: 0 }));
        await sub.waitFor((m) => intentOf(m) === after, 15_000);
        await p.invocation((i) => i.outcome.kind === "succeeded" && i.records.some((r) => intentOfRecord(r) === after));
        expect(callsCarrying(p.invocations, after)).toBe(1);
      } finally {
        await sub.close();
      }
    },
    PATH_TIMEOUT_MS,
  );
  it(
    "a function that throws gets its batch bisected until the record it throws on is alone; that one ends on the on-failure path",
    async () => {
      // The handler itself never throws for a record (it reports it); a crash (a timeout, out of memory) does.
      let crashIntent = "";
      const p = await pipeline((handler) => async (event) => {
        if (event.Records.some((r) => intentOfRecord(r) === crashIntent)) throw new Error("the function crashed");
        return handler(event);
      });
      const sub = await subscribe(broker.url, "mam/jobs/+/events");
      try {
        const ids: string[] = [];
        for (const jobId of ["crash-a", "crash-b", "crash-c", "crash-d"]) {
          await register(p.jobs, jobId);
          ids.push(intentId(await commit(p.jobs, jobId, { action: "claim", expectedSeq: 0 })));
        }
        const [a, b, crashing, d] = ids as [string, string, string, string];
        crashIntent = crashing;
        await p.start();
        const message = await p.firstFailure;
        await p.invocation((i) => i.outcome.kind === "succeeded" && i.records.some((r) => intentOfRecord(r) === d));

        const crashCalls = p.invocations.filter((i) => i.records.some((r) => intentOfRecord(r) === crashing));
        // [a b c d] -> [a b] ok, [c d] -> [c] (alone, retried), [d] ok: the record's calls are bounded by the retries.
        expect(crashCalls.map((i) => i.records.map(intentOfRecord))).toEqual([
          [a, b, crashing, d],
          [crashing, d],
          [crashing],
          [crashing],
          [crashing],
          [crashing],
        ]);
        expect(crashCalls).toHaveLength(1 + MAPPING.maximumRetryAttempts);
        expect(message.requestContext).toMatchObject({ condition: "RetryAttemptsExhausted", approximateInvokeCount: 6 });
        expect(message.responseContext.functionError).toBe("Unhandled");
        expect(message.DDBStreamBatchInfo).toMatchObject({ batchSize: 1 });
        expect(message.DDBStreamBatchInfo.startSequenceNumber).toBe(message.DDBStreamBatchInfo.endSequenceNumber);
        for (const id of [a, b, d]) {
          await sub.waitFor((m) => intentOf(m) === id, 15_000);
          expect(
            p.invocations.filter((i) => i.outcome.kind === "succeeded" && i.records.some((r) => intentOfRecord(r) === id)),
          ).toHaveLength(1);
        }
        expect(countOf(sub, crashing)).toBe(0);
      } finally {
        await sub.close();
      }
    },
    PATH_TIMEOUT_MS,
  );
});
