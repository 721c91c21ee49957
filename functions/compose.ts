/**
 * The one composition root of the Lambda functions: configuration parsed once from
 * the environment (core's `parseConfig`), core's ports on AWS composed from it
 * (@mam/aws/deps, with real defaults), and one handler factory per function: the
 * Lambda shape of each (Hono's adapter, a stream batch's partial failures, the
 * schedule's counts). The entry points (`http.ts`, `stream-publisher.ts`,
 * `recovery-sweep.ts`) are one line each: `createXHandler(process.env)`.
 *
 * Everything is built on the first invocation, not at import, and once per
 * container: a memoized promise. A failed build (SSM throttled, a bad variable) is
 * forgotten, so the next invocation tries again instead of the container staying
 * broken until it is recycled.
 *
 *   import ........ first invocation ............... later invocations
 *   (nothing)       parse env, clients, [SSM read]   reuse
 *
 * Tests build handlers from the factories with their own env (local peers via
 * MAM_DYNAMODB_ENDPOINT / MAM_S3_ENDPOINT / MAM_IOT_ENDPOINT) and overrides, so no
 * module state is shared between them.
 */

import { BatchProcessor, EventType, processPartialResponse } from "@aws-lambda-powertools/batch";
import { type AppEnv, appOptionsOf, createApp, createTokenService, statusOf } from "@mam/api";
import { AWS_LIMITS, type AwsNotifierDeps, type AwsOverrides, awsDeps, awsNotifierDeps, feedRedriver, readSigningKey } from "@mam/aws/deps";
import type { FeedRedriveCounts } from "@mam/aws/feed-redrive";
import {
  type AttentionResult,
  ERROR_TABLE,
  type EvaluationResult,
  jsonLogger,
  type Logger,
  logEvent,
  MamError,
  type MetricsSink,
  NO_METRICS,
  once,
  parseConfig,
  problemType,
  type SweepPassResult,
  sweepPass,
} from "@mam/core";
import type { Context, DynamoDBBatchResponse, DynamoDBRecord, DynamoDBStreamEvent, ScheduledEvent } from "aws-lambda";
import type { Hono } from "hono";
import { type APIGatewayProxyResult, handle, type LambdaContext, type LambdaEvent } from "hono/aws-lambda";
import { flushStreamRecord, writeFeedRecord } from "./job-stream.ts";
import { type LogSink, stdoutLines } from "./log.ts";
import { createMetrics } from "./metrics.ts";

export type Env = Readonly<Record<string, string | undefined>>;

/** What a test (or another runtime) may swap; every field has a real default (the ports' are @mam/aws/deps'). */
export interface Overrides extends AwsOverrides {
  readonly log?: LogSink;
}

/** The Hono app with the AWS adapters behind core's ports. */
export async function composeHttpApp(env: Env, overrides: Overrides = {}, metrics: MetricsSink = NO_METRICS): Promise<Hono<AppEnv>> {
  const config = parseConfig(env, AWS_LIMITS);
  const deps = awsDeps(config, overrides, metrics);
  const tokens = createTokenService({
    signingKey: await readSigningKey(config, overrides),
    clock: deps.clock,
    agentTtlSeconds: config.agentTokenTtlSeconds,
  });
  return createApp({
    deps,
    tokens,
    ...appOptionsOf(config),
    log: overrides.log ?? stdoutLines,
    // One publish path per process: the stream publisher publishes every commit.
    publishInline: false,
    // API Gateway's HTTP API buffers a Lambda's whole answer: the feed's stream answers
    // the rows there now with `retry:` and ends (EventSource reconnects with Last-Event-ID).
    feed: { streaming: false },
  });
}

export async function composeNotifier(env: Env, overrides: Overrides = {}, metrics: MetricsSink = NO_METRICS): Promise<AwsNotifierDeps> {
  return awsNotifierDeps(parseConfig(env), overrides, metrics);
}

/**
 * A function's build, once per container (`once`: a failure is not remembered). A
 * build that fails — a bad variable, the signing key unreadable, a table at another
 * version — is one log line, `<function>_start_failed` with its code and the message
 * naming what to change, and is thrown again: the invocation fails, the next builds again.
 */
function startOnce<T>(fn: "http" | "stream" | "sweep", logger: Logger, build: () => Promise<T>): () => Promise<T> {
  const get = once(build);
  return async () => {
    try {
      return await get();
    } catch (err) {
      const code = err instanceof MamError ? err.code : "internal";
      logEvent(logger, { level: "error", event: `${fn}_start_failed`, code, message: err instanceof Error ? err.message : String(err) });
      throw err;
    }
  };
}

export type HttpHandler = (event: LambdaEvent, context?: LambdaContext) => Promise<APIGatewayProxyResult>;

/**
 * `handle(app)` from hono/aws-lambda over an app built on the first request. A
 * request that finds the app cannot be built still gets a problem document (500 for
 * bad configuration, 503 otherwise), not API Gateway's bare "Internal Server Error";
 * the cause goes to the log, not to the caller.
 */
export function createHttpHandler(env: Env, overrides: Overrides = {}): HttpHandler {
  const logger = jsonLogger(overrides.log ?? stdoutLines);
  const metrics = createMetrics(env);
  const lambda = startOnce("http", logger, async () => handle(await composeHttpApp(env, overrides, metrics.sink)));
  return async (event, context) => {
    let run: Awaited<ReturnType<typeof lambda>>;
    try {
      run = await lambda();
    } catch (err) {
      const e = err instanceof MamError ? err : undefined;
      return startFailure(
        e?.code === "config.invalid" || e?.code === "store.version" ? e.code : "store.unavailable",
        context?.awsRequestId,
      );
    }
    try {
      return await run(event, context);
    } finally {
      await metrics.flush();
    }
  };
}

function startFailure(
  code: "config.invalid" | "store.version" | "store.unavailable",
  requestId: string | undefined,
): APIGatewayProxyResult {
  const { title } = ERROR_TABLE[code];
  const status = statusOf(code);
  return {
    statusCode: status,
    headers: { "content-type": "application/problem+json", "cache-control": "no-store" },
    isBase64Encoded: false,
    body: JSON.stringify({
      type: problemType(code),
      title,
      status,
      detail: "the service could not start; the cause is in its log",
      code,
      request_id: requestId ?? "unknown",
    }),
  };
}

export type StreamPublisherHandler = (event: DynamoDBStreamEvent, context?: Context) => Promise<DynamoDBBatchResponse>;

/**
 * One stream batch, record by record in stream order, through `handle`; the records it
 * threw for are reported (`batchItemFailures`, by SequenceNumber), so Lambda retries
 * from the first of them and not the whole batch.
 */
function streamBatchHandler(
  env: Env,
  overrides: Overrides,
  handle: (deps: AwsNotifierDeps, record: DynamoDBRecord, logger: Logger) => Promise<void>,
): StreamPublisherHandler {
  const logger = jsonLogger(overrides.log ?? stdoutLines);
  const metrics = createMetrics(env);
  const deps = startOnce("stream", logger, () => composeNotifier(env, overrides, metrics.sink));
  // DynamoDBStreams, not SQS: the type decides which field names a failed record.
  const processor = new BatchProcessor(EventType.DynamoDBStreams);
  return async (event, context) => {
    const d = await deps();
    const recordHandler = (record: DynamoDBRecord): Promise<void> => handle(d, record, logger);
    try {
      return await processPartialResponse(event, recordHandler, processor, {
        ...(context === undefined ? {} : { context }),
        processInParallel: false,
      });
    } finally {
      await metrics.flush();
    }
  };
}

/**
 * The stream publisher: DynamoDB stream batch -> publish each intent a write committed,
 * one record at a time in stream order (two intents of one job go out in the order
 * they were committed); a record whose publish failed is reported and retried. It
 * writes no feed row: that is the feed writer's, on a mapping of its own, so a failed
 * or slow publish never holds back, retries or drops a feed row.
 */
export function createStreamPublisherHandler(env: Env, overrides: Overrides = {}): StreamPublisherHandler {
  return streamBatchHandler(env, overrides, flushStreamRecord);
}

/**
 * The feed writer: DynamoDB stream batch -> the change feed's rows of each job item's
 * write (idempotent: a replayed record writes nothing new). A record whose write failed
 * is reported and retried; past the mapping's retries its range goes to the feed's
 * on-failure queue, which the sweep redrives.
 */
export function createFeedWriterHandler(env: Env, overrides: Overrides = {}): StreamPublisherHandler {
  return streamBatchHandler(env, overrides, writeFeedRecord);
}

export interface SweepCounts {
  readonly owed: number;
  readonly sent: number;
  readonly failed: number;
  readonly quarantined: number;
  readonly not_tried: number;
  /** The due candidates the pass evaluated, after the notifications (issue 20). */
  readonly candidates: Omit<EvaluationResult, "results">;
  /** The jobs due for a look, marked stale or overdue or looked at again later (issue 20). */
  readonly attention: Omit<AttentionResult, "results">;
  /** The feed's redrive (absent when no feed failure queue is configured). */
  readonly feed_redrive?: FeedRedriveCounts;
}

export type RecoverySweepHandler = (event: ScheduledEvent, context?: Context) => Promise<SweepCounts>;

/**
 * Scheduled: one sweep pass (core's `sweepPass`): re-send every owed notification that
 * is due, then evaluate the due candidates within their own budget. A failed send is
 * counted, not thrown: the intent stays owed, backs off, and is quarantined after
 * MAM_SWEEP_MAX_FAILURES failures of its own (one log line each). Only a sweep that
 * could not run at all (the store unreachable) fails the invocation. Composed from
 * the same deps as the http function (`awsDeps`): evaluating reads reports, and the
 * report store is built at the first evaluation only.
 */
export function createRecoverySweepHandler(env: Env, overrides: Overrides = {}): RecoverySweepHandler {
  const logger = jsonLogger(overrides.log ?? stdoutLines);
  const metrics = createMetrics(env);
  const config = startOnce("sweep", logger, async () => {
    const parsed = parseConfig(env);
    const deps = awsDeps(parsed, overrides, metrics.sink);
    return {
      policy: parsed.sweep,
      graceMs: parsed.sweepGraceSeconds * 1000,
      budgetMs: parsed.sweepBudgetSeconds * 1000,
      evaluation: parsed.sweepEvaluation,
      deps,
      redrive: await feedRedriver(parsed, overrides, deps),
    };
  });
  return async () => {
    const { policy, graceMs, budgetMs, evaluation, deps, redrive } = await config();
    let result: SweepPassResult;
    let feedRedrive: FeedRedriveCounts | undefined;
    try {
      // Fresh intents are the stream publisher's: the sweep takes only what it missed.
      result = await sweepPass(deps, { policy, graceMs, budgetMs, evaluation, log: (entry) => logEvent(logger, entry) });
      // After the notifications and the evaluations; a redrive that cannot run (the
      // queue or the stream unreachable) is logged and tried again next time.
      feedRedrive = await redrive?.((entry) => logEvent(logger, entry)).catch((err: unknown) => {
        logEvent(logger, { level: "warn", event: "feed_redrive_failed", reason: err instanceof Error ? err.message : String(err) });
        return undefined;
      });
    } finally {
      await metrics.flush();
    }
    const { notifications: n, candidates, attention } = result;
    const { results: _each, ...evaluated } = candidates;
    const { results: _looks, ...looked } = attention;
    const counts: SweepCounts = {
      owed: n.owed,
      sent: n.sent,
      failed: n.failed,
      quarantined: n.quarantined,
      not_tried: n.not_tried,
      candidates: evaluated,
      attention: looked,
      ...(feedRedrive === undefined ? {} : { feed_redrive: feedRedrive }),
    };
    logEvent(logger, { level: "info", event: "recovery_sweep", ...counts });
    return counts;
  };
}
