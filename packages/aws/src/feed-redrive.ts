/**
 * The feed's redrive: a stream batch the feed writer gave up on (its bounded retries
 * spent, or its records older than the mapping allows) reaches its on-failure queue as
 * a description of the range (`DDBStreamBatchInfo`: shard, first and last sequence
 * number), never the records. While the stream still holds that range (24 hours after
 * each record was written, DynamoDB Streams' retention), the records can be read again
 * and their rows written through the feed's idempotent marker
 * (`DynamoJobStore.writeStreamChanges`): a row already written is not written twice. The
 * recovery sweep runs this on every invocation, so a hole in the feed is filled late
 * rather than never; past the window the rows are lost, and the message stays in the
 * queue (its alarm keeps firing) for an operator to read.
 *
 * A message is deleted only once every record of its range was written; a range that
 * fails again stays in the queue and comes back after its visibility timeout.
 */
import {
  DynamoDBStreamsClient,
  type DynamoDBStreamsClientConfig,
  GetRecordsCommand,
  GetShardIteratorCommand,
} from "@aws-sdk/client-dynamodb-streams";
import { DeleteMessageCommand, ReceiveMessageCommand, SQSClient, type SQSClientConfig } from "@aws-sdk/client-sqs";
import type { LogEvent } from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import type { DynamoJobStore } from "./dynamo-job-store.ts";
import { type OnFailureMessage, toLambdaRecord } from "./stream-records.ts";

export interface FeedRedriveOptions {
  readonly sqs: Pick<SQSClient, "send">;
  readonly queueUrl: string;
  readonly streams: Pick<DynamoDBStreamsClient, "send">;
  readonly feed: Pick<DynamoJobStore, "writeStreamChanges">;
  /** At most this many messages per run (a sweep is bounded in time): 50 by default. */
  readonly maxMessages?: number;
  /** How long a message taken stays invisible to another run: 120 s by default. */
  readonly visibilityTimeoutSeconds?: number;
  /** One line per range that could not be redriven (why, and what it covers). */
  readonly log?: (entry: LogEvent) => void;
}

export interface FeedRedriveCounts {
  /** Messages taken from the queue. */
  readonly messages: number;
  /** Messages whose whole range was written (and deleted). */
  readonly redriven: number;
  /** Feed rows written (rows already there are not counted). */
  readonly rows: number;
  /** Messages left in the queue: the range failed again, or the message is not a range. */
  readonly failed: number;
  /** Of those, ranges the stream no longer holds (past its 24 h retention): their rows are lost. */
  readonly expired: number;
}

/** Read up to `maxMessages` of the queue and write each range's rows; never throws for one message. */
export async function redriveFeed(opts: FeedRedriveOptions): Promise<FeedRedriveCounts> {
  const max = opts.maxMessages ?? 50;
  const counts = { messages: 0, redriven: 0, rows: 0, failed: 0, expired: 0 };
  const log = opts.log ?? (() => undefined);
  while (counts.messages < max) {
    const out = await opts.sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: opts.queueUrl,
        MaxNumberOfMessages: Math.min(10, max - counts.messages),
        VisibilityTimeout: opts.visibilityTimeoutSeconds ?? 120,
        WaitTimeSeconds: 0,
      }),
    );
    const messages = out.Messages ?? [];
    if (messages.length === 0) break;
    for (const message of messages) {
      counts.messages += 1;
      const range = batchInfoOf(message.Body);
      if (range === undefined) {
        counts.failed += 1;
        log({
          level: "warn",
          event: "feed_redrive_failed",
          reason: "the message is not a DynamoDB stream batch description",
          message_id: message.MessageId,
        });
        continue;
      }
      try {
        counts.rows += await redriveRange(opts.streams, opts.feed, range);
        await opts.sqs.send(new DeleteMessageCommand({ QueueUrl: opts.queueUrl, ReceiptHandle: message.ReceiptHandle }));
        counts.redriven += 1;
      } catch (err) {
        counts.failed += 1;
        const name = (err as { name?: unknown } | null)?.name;
        const expired = name === "TrimmedDataAccessException" || name === "ResourceNotFoundException";
        if (expired) counts.expired += 1;
        log({
          level: "warn",
          event: "feed_redrive_failed",
          reason: expired
            ? "the stream no longer holds this range (past its 24 h retention, or the table's stream was replaced): its feed rows are lost"
            : `could not write the range's feed rows: ${err instanceof Error ? err.message : String(err)}`,
          shard_id: range.shardId,
          start_sequence_number: range.startSequenceNumber,
          end_sequence_number: range.endSequenceNumber,
        });
      }
    }
  }
  return counts;
}

type BatchInfo = OnFailureMessage["DDBStreamBatchInfo"];

function batchInfoOf(body: string | undefined): BatchInfo | undefined {
  try {
    const info = (JSON.parse(body ?? "") as Partial<OnFailureMessage>).DDBStreamBatchInfo;
    const digits = /^[0-9]{1,40}$/;
    if (
      typeof info?.streamArn === "string" &&
      typeof info.shardId === "string" &&
      digits.test(info.startSequenceNumber ?? "") &&
      digits.test(info.endSequenceNumber ?? "")
    ) {
      return info;
    }
  } catch {
    // not JSON: not a range
  }
  return undefined;
}

/** Every record of the range, in stream order, through the feed write; how many rows it wrote. */
async function redriveRange(streams: FeedRedriveOptions["streams"], feed: FeedRedriveOptions["feed"], range: BatchInfo): Promise<number> {
  const end = BigInt(range.endSequenceNumber);
  let iterator = (
    await streams.send(
      new GetShardIteratorCommand({
        StreamArn: range.streamArn,
        ShardId: range.shardId,
        ShardIteratorType: "AT_SEQUENCE_NUMBER",
        SequenceNumber: range.startSequenceNumber,
      }),
    )
  ).ShardIterator;
  let rows = 0;
  // An open shard may answer empty pages before the records: bounded, as a sweep is.
  for (let calls = 0; iterator !== undefined && calls < 1000; calls++) {
    const out = await streams.send(new GetRecordsCommand({ ShardIterator: iterator, Limit: 1000 }));
    for (const r of out.Records ?? []) {
      const sequence = r.dynamodb?.SequenceNumber;
      if (sequence === undefined) continue;
      if (BigInt(sequence) > end) return rows;
      const record: DynamoDBRecord = toLambdaRecord(r, range.streamArn);
      rows += await feed.writeStreamChanges(record);
      if (BigInt(sequence) === end) return rows;
    }
    iterator = out.NextShardIterator;
  }
  if (iterator === undefined) return rows; // the shard closed before the range's end: nothing more to read
  throw new Error(`the range's end (${range.endSequenceNumber}) was not reached in 1000 reads of shard ${range.shardId}`);
}

/** The clients a redrive needs, configured as the function's other AWS clients are. */
export function feedRedriveClients(
  config: Pick<SQSClientConfig & DynamoDBStreamsClientConfig, "region" | "credentials">,
  endpoints: { readonly sqs?: string | undefined; readonly streams?: string | undefined },
): { sqs: SQSClient; streams: DynamoDBStreamsClient } {
  const bounded = { maxAttempts: 3, requestHandler: { connectionTimeout: 1000, requestTimeout: 5000 } };
  return {
    sqs: new SQSClient({ ...config, ...bounded, ...(endpoints.sqs === undefined ? {} : { endpoint: endpoints.sqs }) }),
    streams: new DynamoDBStreamsClient({
      ...config,
      ...bounded,
      ...(endpoints.streams === undefined ? {} : { endpoint: endpoints.streams }),
    }),
  };
}
