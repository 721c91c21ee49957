/**
 * A stream poller of ours: a development stand-in for Lambda's event source mapping
 * (ESM) of a DynamoDB stream, so the stream function runs against real stream
 * records (AWS's DynamoDB Local) in tests and in `npm run offline`. It is not part of
 * the service: on AWS, Lambda does all of this.
 *
 * What it does, as the ESM configured in serverless.yml does:
 * - reads every shard of the table's stream (DescribeStream, paged), a child shard
 *   only once its parent was read to its end; GetShardIterator at TRIM_HORIZON or
 *   LATEST (LATEST for the shards open at start; a shard found later is read from
 *   its start, as Lambda does), then GetRecords;
 * - drops the records no filter pattern matches (`filterPatterns`: equality,
 *   `exists`, `prefix`, `anything-but`), as the ESM does before batching;
 * - calls the handler with the Lambda `DynamoDBStreamEvent` shape, at most
 *   `batchSize` records, per shard in stream order, one batch of a shard at a time;
 * - `ReportBatchItemFailures`: the batch is checkpointed up to the first failed
 *   item; from it on, the rest of the batch is retried (with
 *   `BisectBatchOnFunctionError` the batch is split there, so only that rest is
 *   sent again). A malformed answer (an empty, missing or unknown `itemIdentifier`)
 *   fails the whole batch;
 * - `BisectBatchOnFunctionError`: a handler that throws gets the batch back in two
 *   halves, each retried on its own;
 * - `MaximumRetryAttempts`: past it, the records still failing go to the
 *   on-failure destination (`failures`, and `onFailure`) in the shape Lambda sends
 *   to SQS, and the shard moves on past them; `MaximumRecordAgeInSeconds` likewise;
 * - an empty GetRecords answer waits `pollIntervalMs` (250 ms by default: Lambda
 *   polls each shard of a DynamoDB stream about four times a second) before the next
 *   read; `close()` ends that wait at once.
 *
 * What it does not imitate: several concurrent batches per shard
 * (`ParallelizationFactor`), the batching window, tumbling windows, the retry
 * back-off between attempts (it retries at once), refilling a retried batch with
 * records after it when bisect is off, checkpoints surviving a restart (it keeps
 * them in memory), and the iterator age metric. How attempts are counted after a
 * bisect is ours (each half keeps the count of the batch it came from), chosen so a
 * poison record always ends on the on-failure path after a bounded number of calls.
 */
import { randomUUID } from "node:crypto";
import { DescribeTableCommand, type DynamoDBClient } from "@aws-sdk/client-dynamodb";
import {
  type _Record,
  DescribeStreamCommand,
  type DynamoDBStreamsClient,
  GetRecordsCommand,
  GetShardIteratorCommand,
  type Shard,
} from "@aws-sdk/client-dynamodb-streams";
import { type OnFailureMessage, toLambdaRecord } from "@mam/aws/stream-records";
import type { DynamoDBBatchResponse, DynamoDBRecord, DynamoDBStreamEvent } from "aws-lambda";

export type { OnFailureMessage };

/** The stream event source mapping, as serverless.yml's `stream` event states it. */
export interface StreamEventSourceMapping {
  readonly batchSize: number;
  readonly startingPosition: "TRIM_HORIZON" | "LATEST";
  /** `functionResponseType: ReportBatchItemFailures`. */
  readonly reportBatchItemFailures: boolean;
  readonly bisectBatchOnFunctionError: boolean;
  /** -1: retry until the record expires (Lambda's default). */
  readonly maximumRetryAttempts: number;
  /** -1 or absent: no limit. */
  readonly maximumRecordAgeInSeconds?: number | undefined;
  /** Lambda event filter patterns (each an object pattern); absent or empty: every record. */
  readonly filterPatterns?: readonly unknown[] | undefined;
}

/** What the handler answered for one batch, as the ESM reads it. */
export type BatchOutcome =
  | { readonly kind: "succeeded" }
  | { readonly kind: "partial"; readonly failedSequenceNumbers: readonly string[] }
  | { readonly kind: "failed"; readonly message: string };

export interface Invocation {
  readonly shardId: string;
  readonly records: readonly DynamoDBRecord[];
  /** 1 for a batch's first call; counts the calls the records of this batch have had. */
  readonly attempt: number;
  readonly outcome: BatchOutcome;
}

/** The function: its answer is read only with `reportBatchItemFailures`; a throw is a function error. */
export type StreamHandler = (event: DynamoDBStreamEvent) => Promise<DynamoDBBatchResponse | undefined>;

export interface StreamPollerOptions {
  readonly streams: DynamoDBStreamsClient;
  /** To find the table's latest stream ARN (DescribeTable). */
  readonly dynamodb: DynamoDBClient;
  readonly tableName: string;
  readonly handler: StreamHandler;
  readonly mapping: StreamEventSourceMapping;
  /** The function's ARN, as the on-failure message names it. */
  readonly functionArn?: string;
  /** The region the Lambda records name; default: what the stream record says. */
  readonly region?: string;
  readonly pollIntervalMs?: number;
  /** Awaited after every call of the handler, before anything else happens on that shard. */
  readonly onInvocation?: (invocation: Invocation) => void | Promise<void>;
  /** Awaited for each message sent to the on-failure destination. */
  readonly onFailure?: (message: OnFailureMessage) => void | Promise<void>;
  /** A read of the stream failed (it is tried again after the poll interval). */
  readonly onError?: (err: unknown) => void;
}

export interface StreamPoller {
  readonly streamArn: string;
  /** Every message sent to the on-failure destination, in order. */
  readonly failures: readonly OnFailureMessage[];
  /** Stop polling; resolves once every shard's loop has ended (a call in flight finishes first). */
  close(): Promise<void>;
}

const DEFAULT_POLL_INTERVAL_MS = 250;

/** Start polling the table's stream; resolves once every shard known at start has its iterator. */
export async function startStreamPoller(opts: StreamPollerOptions): Promise<StreamPoller> {
  const { mapping } = opts;
  if (!Number.isInteger(mapping.batchSize) || mapping.batchSize < 1 || mapping.batchSize > 10_000) {
    throw new Error(`batchSize must be 1..10000, got ${mapping.batchSize}`);
  }
  const matches = compileFilters(mapping.filterPatterns ?? []);
  const table = await opts.dynamodb.send(new DescribeTableCommand({ TableName: opts.tableName }));
  const streamArn = table.Table?.LatestStreamArn;
  if (streamArn === undefined) throw new Error(`table ${opts.tableName} has no stream (StreamSpecification)`);
  const pollIntervalMs = opts.pollIntervalMs ?? DEFAULT_POLL_INTERVAL_MS;
  const functionArn = opts.functionArn ?? "arn:aws:lambda:us-east-1:000000000000:function:stream-poller";
  const failures: OnFailureMessage[] = [];

  let stopping = false;
  const wakers = new Set<() => void>();
  /** The poll interval's wait; `close()` ends it at once. */
  const pause = (): Promise<void> =>
    stopping
      ? Promise.resolve()
      : new Promise((resolve) => {
          const done = (): void => {
            clearTimeout(timer);
            wakers.delete(done);
            resolve();
          };
          const timer = setTimeout(done, pollIntervalMs);
          wakers.add(done);
        });

  const shards = new Map<string, { readonly shard: Shard; readonly finished: Promise<void> }>();
  const loops: Promise<void>[] = [];

  async function describeShards(): Promise<Shard[]> {
    const all: Shard[] = [];
    let start: string | undefined;
    do {
      const out = await opts.streams.send(new DescribeStreamCommand({ StreamArn: streamArn, ExclusiveStartShardId: start }));
      all.push(...(out.StreamDescription?.Shards ?? []));
      start = out.StreamDescription?.LastEvaluatedShardId;
    } while (start !== undefined);
    return all;
  }

  /** Start a loop for every shard not yet known; a child waits for its parent (when the parent is still in the stream). */
  async function discover(initial: boolean): Promise<void> {
    const found = await describeShards();
    const byId = new Map(found.map((s) => [s.ShardId ?? "", s]));
    const pendingStarts: Promise<void>[] = [];
    const ensure = (shard: Shard): Promise<void> => {
      const id = shard.ShardId ?? "";
      const known = shards.get(id);
      if (known !== undefined) return known.finished;
      const parentId = shard.ParentShardId;
      const parent = parentId === undefined ? undefined : byId.get(parentId);
      const parentDone = parent === undefined ? (shards.get(parentId ?? "")?.finished ?? Promise.resolve()) : ensure(parent);
      // LATEST applies to the shards open when the mapping starts; any other shard is read from its start.
      const open = shard.SequenceNumberRange?.EndingSequenceNumber === undefined;
      const position = initial && mapping.startingPosition === "LATEST" && open ? "LATEST" : "TRIM_HORIZON";
      let iteratorReady: (() => void) | undefined;
      const ready = new Promise<void>((r) => {
        iteratorReady = r;
      });
      // Start-up waits for the iterators of the shards that can be read now, not for a parent to be read out.
      if (initial && parentId === undefined) pendingStarts.push(ready);
      else if (initial && parent === undefined && !shards.has(parentId ?? "")) pendingStarts.push(ready);
      const finished = parentDone.then(() =>
        readShard(shard, initial && mapping.startingPosition === "LATEST" && !open, position, iteratorReady),
      );
      shards.set(id, { shard, finished });
      loops.push(finished);
      return finished;
    };
    for (const shard of found) ensure(shard);
    await Promise.all(pendingStarts);
  }

  /** One shard, in order, one batch at a time; resolves when the shard was read to its end (or on close). */
  async function readShard(shard: Shard, skip: boolean, position: "LATEST" | "TRIM_HORIZON", ready?: () => void): Promise<void> {
    const shardId = shard.ShardId ?? "";
    if (skip || stopping) {
      // A shard already closed when a LATEST mapping starts holds nothing newer than the start.
      ready?.();
      return;
    }
    let iterator: string | undefined;
    let lastSequence: string | undefined;
    const acquire = async (): Promise<string | undefined> => {
      const out = await opts.streams.send(
        new GetShardIteratorCommand({
          StreamArn: streamArn,
          ShardId: shardId,
          ...(lastSequence === undefined
            ? { ShardIteratorType: position }
            : { ShardIteratorType: "AFTER_SEQUENCE_NUMBER", SequenceNumber: lastSequence }),
        }),
      );
      return out.ShardIterator;
    };
    try {
      iterator = await acquire();
    } finally {
      ready?.();
    }
    const pending: DynamoDBRecord[] = [];
    // No iterator: nothing left to read in this shard.
    let closed = iterator === undefined;
    while (!stopping) {
      if (!closed && pending.length < mapping.batchSize && iterator !== undefined) {
        let records: _Record[];
        try {
          const out = await opts.streams.send(new GetRecordsCommand({ ShardIterator: iterator, Limit: 1000 }));
          records = out.Records ?? [];
          iterator = out.NextShardIterator;
        } catch (err) {
          const name = (err as { name?: unknown }).name;
          if (name === "ResourceNotFoundException") return; // the table (and its stream) is gone
          if (name === "ExpiredIteratorException") {
            iterator = await acquire().catch(() => iterator);
            if (iterator === undefined) closed = true;
          } else {
            opts.onError?.(err);
          }
          await pause();
          continue;
        }
        if (iterator === undefined) closed = true;
        for (const r of records) {
          lastSequence = r.dynamodb?.SequenceNumber ?? lastSequence;
          const lambdaRecord = toLambdaRecord(r, streamArn as string, opts.region);
          if (matches(lambdaRecord)) pending.push(lambdaRecord);
        }
        if (records.length === 0 && pending.length === 0) {
          if (closed) break;
          await pause();
          continue;
        }
      }
      if (pending.length === 0) {
        if (closed) break;
        continue;
      }
      const batch = pending.splice(0, mapping.batchSize);
      await deliver(shardId, batch);
    }
    if (closed && !stopping) {
      // Read to its end: its children (if any exist yet) may start now.
      await discover(false).catch((err: unknown) => opts.onError?.(err));
    }
  }

  async function invoke(records: readonly DynamoDBRecord[]): Promise<BatchOutcome> {
    let answer: DynamoDBBatchResponse | undefined;
    try {
      answer = (await opts.handler({ Records: records.map((r) => structuredClone(r)) })) ?? undefined;
    } catch (err) {
      return { kind: "failed", message: err instanceof Error ? err.message : String(err) };
    }
    if (!mapping.reportBatchItemFailures) return { kind: "succeeded" };
    const failures = answer?.batchItemFailures ?? [];
    if (failures.length === 0) return { kind: "succeeded" };
    const known = new Set(records.map((r) => r.dynamodb?.SequenceNumber));
    const ids = failures.map((f) => f?.itemIdentifier);
    if (ids.some((id) => typeof id !== "string" || id === "" || !known.has(id))) {
      return { kind: "failed", message: `malformed batchItemFailures: ${JSON.stringify(failures)}` };
    }
    return { kind: "partial", failedSequenceNumbers: ids as string[] };
  }

  /** One batch until it succeeded or went to the on-failure destination. */
  async function deliver(shardId: string, batch: DynamoDBRecord[]): Promise<void> {
    const queue: { records: DynamoDBRecord[]; attempts: number }[] = [{ records: batch, attempts: 0 }];
    const exhausted = (attempts: number): boolean => mapping.maximumRetryAttempts >= 0 && attempts > mapping.maximumRetryAttempts;
    while (queue.length > 0 && !stopping) {
      const item = queue.shift() as { records: DynamoDBRecord[]; attempts: number };
      const tooOld = item.records.filter((r) => expired(r));
      if (tooOld.length > 0) {
        // Records past their age are not sent again: they go to the destination, the rest goes on.
        await sendToFailure(shardId, tooOld, item.attempts, "RecordAgeExceeded", undefined);
        item.records = item.records.filter((r) => !expired(r));
        if (item.records.length === 0) continue;
      }
      const outcome = await invoke(item.records);
      const attempts = item.attempts + 1;
      await opts.onInvocation?.({ shardId, records: item.records, attempt: attempts, outcome });
      if (outcome.kind === "succeeded") continue;
      if (outcome.kind === "partial") {
        const first = Math.min(
          ...outcome.failedSequenceNumbers.map((s) => item.records.findIndex((r) => r.dynamodb?.SequenceNumber === s)),
        );
        const rest = item.records.slice(first);
        if (exhausted(attempts)) await sendToFailure(shardId, rest, attempts, "RetryAttemptsExhausted", undefined);
        else queue.unshift({ records: rest, attempts });
        continue;
      }
      if (exhausted(attempts)) {
        await sendToFailure(shardId, item.records, attempts, "RetryAttemptsExhausted", "Unhandled");
      } else if (mapping.bisectBatchOnFunctionError && item.records.length > 1) {
        const half = Math.ceil(item.records.length / 2);
        queue.unshift({ records: item.records.slice(0, half), attempts }, { records: item.records.slice(half), attempts });
      } else {
        queue.unshift({ records: item.records, attempts });
      }
    }
  }

  function expired(record: DynamoDBRecord): boolean {
    const max = mapping.maximumRecordAgeInSeconds;
    const created = record.dynamodb?.ApproximateCreationDateTime;
    if (max === undefined || max < 0 || created === undefined) return false;
    return Date.now() / 1000 - created > max;
  }

  async function sendToFailure(
    shardId: string,
    records: readonly DynamoDBRecord[],
    attempts: number,
    condition: OnFailureMessage["requestContext"]["condition"],
    functionError: string | undefined,
  ): Promise<void> {
    const first = records[0];
    const last = records[records.length - 1];
    const arrival = (r: DynamoDBRecord | undefined): string =>
      new Date((r?.dynamodb?.ApproximateCreationDateTime ?? 0) * 1000).toISOString();
    const message: OnFailureMessage = {
      requestContext: { requestId: randomUUID(), functionArn, condition, approximateInvokeCount: attempts },
      responseContext: { statusCode: 200, executedVersion: "$LATEST", ...(functionError === undefined ? {} : { functionError }) },
      version: "1.0",
      timestamp: new Date().toISOString(),
      DDBStreamBatchInfo: {
        shardId,
        startSequenceNumber: first?.dynamodb?.SequenceNumber ?? "",
        endSequenceNumber: last?.dynamodb?.SequenceNumber ?? "",
        approximateArrivalOfFirstRecord: arrival(first),
        approximateArrivalOfLastRecord: arrival(last),
        batchSize: records.length,
        streamArn: streamArn as string,
      },
    };
    failures.push(message);
    await opts.onFailure?.(message);
  }

  await discover(true);
  return {
    streamArn,
    failures,
    async close() {
      stopping = true;
      for (const wake of [...wakers]) wake();
      // Loops may be added while others end (a closed shard discovers its children): wait for all.
      for (let seen = 0; seen < loops.length; seen = loops.length) await Promise.allSettled(loops.slice(seen));
    },
  };
}

/**
 * Lambda's event filtering, the part of its syntax a pattern here may use: a pattern
 * is an object whose leaves are arrays of matchers (a literal, `{exists: bool}`,
 * `{prefix: string}`, `{"anything-but": [...]}`); a record passes if any pattern
 * matches. Anything else is refused when the poller starts, never ignored.
 */
export function compileFilters(patterns: readonly unknown[]): (record: DynamoDBRecord) => boolean {
  if (patterns.length === 0) return () => true;
  const compiled = patterns.map((p) => compilePattern(typeof p === "string" ? (JSON.parse(p) as unknown) : unwrapPattern(p), "pattern"));
  return (record) => compiled.some((m) => m(record));
}

/** serverless.yml writes patterns as objects; CloudFormation's `Filters` as `{Pattern: "<json>"}`. */
function unwrapPattern(p: unknown): unknown {
  if (typeof p === "object" && p !== null && "Pattern" in p && typeof (p as { Pattern: unknown }).Pattern === "string") {
    return JSON.parse((p as { Pattern: string }).Pattern) as unknown;
  }
  return p;
}

type Matcher = (value: unknown) => boolean;

function compilePattern(pattern: unknown, where: string): Matcher {
  if (Array.isArray(pattern)) {
    const leaves = pattern.map((m, i) => compileLeaf(m, `${where}[${i}]`));
    return (value) => leaves.some((leaf) => leaf(value));
  }
  if (typeof pattern !== "object" || pattern === null) throw new Error(`filter ${where}: expected an object or an array of matchers`);
  const fields = Object.entries(pattern).map(([key, sub]) => [key, compilePattern(sub, `${where}.${key}`)] as const);
  return (value) => {
    const obj = typeof value === "object" && value !== null ? (value as Record<string, unknown>) : {};
    return fields.every(([key, m]) => m(obj[key]));
  };
}

function compileLeaf(m: unknown, where: string): Matcher {
  if (m === null || typeof m === "string" || typeof m === "number" || typeof m === "boolean") return (v) => v === m;
  if (typeof m === "object") {
    const entries = Object.entries(m);
    const [op, arg] = entries[0] ?? [];
    if (entries.length === 1 && op === "exists" && typeof arg === "boolean") return (v) => (v !== undefined) === arg;
    if (entries.length === 1 && op === "prefix" && typeof arg === "string") return (v) => typeof v === "string" && v.startsWith(arg);
    if (entries.length === 1 && op === "anything-but") {
      const banned = Array.isArray(arg) ? arg : [arg];
      return (v) => v !== undefined && !banned.includes(v);
    }
  }
  throw new Error(`filter ${where}: ${JSON.stringify(m)} is not a matcher this poller imitates (literal, exists, prefix, anything-but)`);
}

/** The stream event of a function in serverless.yml -> the mapping. */
export function mappingOfServerlessStreamEvent(stream: Readonly<Record<string, unknown>>): StreamEventSourceMapping {
  const num = (key: string, fallback: number): number => {
    const v = stream[key];
    return typeof v === "number" ? v : fallback;
  };
  const position = stream.startingPosition;
  if (position !== "TRIM_HORIZON" && position !== "LATEST")
    throw new Error(`startingPosition ${String(position)} is not TRIM_HORIZON or LATEST`);
  const patterns = stream.filterPatterns;
  return {
    batchSize: num("batchSize", 100),
    startingPosition: position,
    reportBatchItemFailures: stream.functionResponseType === "ReportBatchItemFailures",
    bisectBatchOnFunctionError: stream.bisectBatchOnFunctionError === true,
    maximumRetryAttempts: num("maximumRetryAttempts", -1),
    maximumRecordAgeInSeconds: num("maximumRecordAgeInSeconds", -1),
    filterPatterns: Array.isArray(patterns) ? patterns : [],
  };
}
