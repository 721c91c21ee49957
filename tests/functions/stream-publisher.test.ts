/**
 * The stream publisher as Lambda runs it: a recorded DynamoDB Streams batch into the
 * handler, against dynalite (the items the images show) and the IoT stand-in in
 * front of a real MQTT broker that refuses one job's topic.
 */

import type { AttributeValue } from "@aws-sdk/client-dynamodb";
import { PutItemCommand } from "@aws-sdk/client-dynamodb";
import type { DynamoDBRecord, DynamoDBStreamEvent, AttributeValue as StreamAttributeValue } from "aws-lambda";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createStreamPublisherHandler } from "../../functions/compose.ts";
import { owedJobRecord } from "../../functions/job-stream.ts";
import { subscribe } from "../support/subscriber.ts";
import { CREDENTIALS, lambdaContext, lambdaFixture, memoryLog, type Peers, startPeers, TRANSACTIONS } from "./support.ts";

const REFUSED_JOB = "stream-refused";
const REFUSED_TOPIC = `mam/jobs/${REFUSED_JOB}/events`;

let peers: Peers;

beforeAll(async () => {
  peers = await startPeers();
  peers.refusedTopics.add(REFUSED_TOPIC);
});

afterAll(async () => {
  await peers?.close();
});

const batch = (): DynamoDBStreamEvent => lambdaFixture<DynamoDBStreamEvent>("dynamodb-stream-batch.json");
const seqOf = (r: DynamoDBRecord): string => r.dynamodb?.SequenceNumber ?? "";
const jobOf = (r: DynamoDBRecord): string => r.dynamodb?.NewImage?.job_id?.S ?? "";
const intentOf = (r: DynamoDBRecord): string => r.dynamodb?.NewImage?.pending_notification?.M?.id?.S ?? "";

/** The table as the stream saw it: each record's new image, put as the item it is. */
async function seedFromImages(table: string, event: DynamoDBStreamEvent): Promise<void> {
  for (const r of event.Records) {
    const image = r.dynamodb?.NewImage;
    if (image === undefined) continue;
    await peers.dynamo.client.send(new PutItemCommand({ TableName: table, Item: image as Record<string, AttributeValue> }));
  }
}

describe("stream publisher (DynamoDB Streams -> IoT Core, partial batch failures)", () => {
  let table: string;
  beforeEach(async () => {
    table = await peers.newTable();
  });

  it("publishes each committed intent, settles it, and reports only the record whose publish failed", async () => {
    const event = batch();
    await seedFromImages(table, event);
    const [ok1, refused, ok2] = event.Records as [DynamoDBRecord, DynamoDBRecord, DynamoDBRecord];
    expect(jobOf(refused)).toBe(REFUSED_JOB);
    const subscriber = await subscribe(peers.broker.url, "mam/#");
    const log = memoryLog();
    try {
      const handler = createStreamPublisherHandler(peers.env(table), {
        credentials: CREDENTIALS,
        transactions: TRANSACTIONS,
        log: log.sink,
      });
      const response = await handler(event, lambdaContext("mam-dev-streamPublisher"));

      expect(response).toEqual({ batchItemFailures: [{ itemIdentifier: seqOf(refused) }] });

      // Subscribers got the two good intents, per job and on the fan-in, in stream order.
      const received = [];
      for (let i = 0; i < 4; i++) received.push(await subscriber.next());
      expect(received.map((m) => m.topic)).toEqual([
        `mam/jobs/${jobOf(ok1)}/events`,
        "mam/events",
        `mam/jobs/${jobOf(ok2)}/events`,
        "mam/events",
      ]);
      const payload = JSON.parse(received[0]?.payload ?? "{}") as Record<string, unknown>;
      expect(payload).toMatchObject({
        event: "completed",
        job_id: jobOf(ok1),
        seq: 3,
        data: { notification_intent: { id: intentOf(ok1), seq: 3 }, status: "completed" },
      });
      await expect(subscriber.next(300)).rejects.toThrow(/no message/);

      const store = peers.store(table);
      // Settled: the good ones owe nothing; the refused one is still owed, for a retry or the sweep.
      expect((await store.get(jobOf(ok1)))?.pending_notification).toBeUndefined();
      expect((await store.get(jobOf(ok2)))?.pending_notification).toBeUndefined();
      expect((await store.get(REFUSED_JOB))?.pending_notification?.id).toBe(intentOf(refused));
      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual([REFUSED_JOB]);

      // Every attempt is in the job's event log, the failed one with its code.
      const [failedAttempt] = (await store.listEvents(REFUSED_JOB, { limit: 10 })).items;
      expect(failedAttempt).toMatchObject({ event: "published", data: { outcome: "failed", code: "publish.refused" } });
      const [sentAttempt] = (await store.listEvents(jobOf(ok1), { limit: 10 })).items;
      expect(sentAttempt).toMatchObject({ event: "published", data: { outcome: "acknowledged" } });

      expect(log.entries()).toEqual([
        expect.objectContaining({
          event: "stream_publish_failed",
          job_id: REFUSED_JOB,
          intent_id: intentOf(refused),
          sequence_number: seqOf(refused),
          code: "publish.refused",
        }),
      ]);
    } finally {
      await subscriber.close();
    }
  });

  it("seeing the same batch again does no harm: duplicates at most, nothing settled twice, the same failure", async () => {
    const event = batch();
    await seedFromImages(table, event);
    const handler = createStreamPublisherHandler(peers.env(table), {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: () => undefined,
    });
    const first = await handler(event);
    const accepted = peers.iot.accepted.length;
    const again = await handler(batch());
    expect(again).toEqual(first);
    // The replay re-sends the two intents (consumers drop them by intent id) ...
    const resent = peers.iot.accepted
      .slice(accepted)
      .map((m) => JSON.parse(m.payload.toString("utf8")) as { data: { notification_intent: { id: string } } });
    expect(new Set(resent.map((p) => p.data.notification_intent.id))).toEqual(
      new Set([intentOf(event.Records[0] as DynamoDBRecord), intentOf(event.Records[2] as DynamoDBRecord)]),
    );
    // ... and the settled records stay settled: settling is conditional on the intent id.
    const store = peers.store(table);
    expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual([REFUSED_JOB]);
  });

  it("once the broker takes the refused topic again, Lambda's retry of that record succeeds", async () => {
    const event = batch();
    await seedFromImages(table, event);
    const handler = createStreamPublisherHandler(peers.env(table), {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: () => undefined,
    });
    expect((await handler(event)).batchItemFailures).toHaveLength(1);
    peers.refusedTopics.delete(REFUSED_TOPIC);
    try {
      // Lambda retries from the first failed record onwards.
      const retry: DynamoDBStreamEvent = { Records: batch().Records.slice(1) };
      expect(await handler(retry)).toEqual({ batchItemFailures: [] });
      expect(await peers.store(table).listOwed(10)).toEqual([]);
    } finally {
      peers.refusedTopics.add(REFUSED_TOPIC);
    }
  });

  it("records that commit no intent are no-op successes: event-log and dispatch items, a settle, a kept intent, a REMOVE", async () => {
    const event = lambdaFixture<DynamoDBStreamEvent>("dynamodb-stream-noop-batch.json");
    const accepted = peers.iot.accepted.length;
    const handler = createStreamPublisherHandler(peers.env(table), {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: () => undefined,
    });
    expect(await handler(event)).toEqual({ batchItemFailures: [] });
    expect(peers.iot.accepted.length).toBe(accepted);
    for (const r of event.Records) expect(owedJobRecord(r)).toBeUndefined();
  });

  it("a job item that is not a valid job record fails that record alone (bounded retries, then the on-failure queue)", async () => {
    const event = batch();
    await seedFromImages(table, event);
    const broken = structuredClone(event.Records[0] as DynamoDBRecord);
    const image = broken.dynamodb?.NewImage as Record<string, StreamAttributeValue>;
    image.status = { S: "finished" };
    image.pending_notification = { M: { ...image.pending_notification?.M, id: { S: "9e0f1a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b" } } };
    (broken.dynamodb as { SequenceNumber: string }).SequenceNumber = "44215845000000000174504399999";
    const handler = createStreamPublisherHandler(peers.env(table), {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: () => undefined,
    });
    const response = await handler({ Records: [event.Records[0] as DynamoDBRecord, broken] });
    expect(response).toEqual({ batchItemFailures: [{ itemIdentifier: "44215845000000000174504399999" }] });
    expect(() => owedJobRecord(broken)).toThrow(/not a job record/);
  });

  it("a batch whose every record fails is a function error (Lambda bisects and retries it)", async () => {
    const event = batch();
    await seedFromImages(table, event);
    const handler = createStreamPublisherHandler(peers.env(table), {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: () => undefined,
    });
    await expect(handler({ Records: [event.Records[1] as DynamoDBRecord] })).rejects.toThrow(/All records failed processing/);
  });

  it("reads the job record out of the new image: key and index attributes stripped, numbers as numbers", () => {
    const record = owedJobRecord(batch().Records[0] as DynamoDBRecord);
    expect(record).toEqual({
      job_id: "stream-ok-1",
      prompt: "Work on stream-ok-1",
      agent: "claude-code",
      role: "Worker",
      status: "completed",
      iteration: 0,
      transition_seq: 3,
      evidence_seq: 0,
      expected_artifacts: ["commit"],
      auto_complete: false,
      pending_notification: {
        id: "0c7f3a52-5d1e-4b8a-9f6e-2a1b3c4d5e61",
        event: "completed",
        seq: 3,
        created_at: "2025-01-15T12:00:01.000Z",
      },
      created_at: "2025-01-15T11:00:00.000Z",
      updated_at: "2025-01-15T12:00:01.000Z",
    });
  });
});
