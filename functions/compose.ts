/**
 * The one composition root of the Lambda functions: configuration parsed once from
 * the environment (core's `parseConfig`), the AWS adapters built from it, and one
 * handler factory per function. The entry points (`http.ts`, `stream-publisher.ts`,
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
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import type { SSMClient } from "@aws-sdk/client-ssm";
import { fromEnv } from "@aws-sdk/credential-providers";
import { type AppEnv, appOptionsOf, createApp, createTokenService, statusOf } from "@mam/api";
import { DynamoJobStore } from "@mam/aws/dynamo";
import type { FeedRedriveCounts } from "@mam/aws/feed-redrive";
import { s3Uri } from "@mam/aws/s3-keys";
import { afterTableReady, prepareJobTable } from "@mam/aws/table-migrations";
import {
  type Clock,
  type Config,
  type ConfigProfile,
  type Deps,
  ERROR_TABLE,
  type Ids,
  MamError,
  type MetricsSink,
  NO_METRICS,
  type Publisher,
  parseConfig,
  problemType,
  type ReportStore,
  randomIds,
  recoverNotifications,
  systemClock,
} from "@mam/core";
import type { AwsCredentialIdentityProvider } from "@smithy/types";
import type { Context, DynamoDBBatchResponse, DynamoDBRecord, DynamoDBStreamEvent, ScheduledEvent } from "aws-lambda";
import type { Hono } from "hono";
import { type APIGatewayProxyResult, handle, type LambdaContext, type LambdaEvent } from "hono/aws-lambda";
import { flushStreamRecord, type StreamDeps, writeFeedRecord } from "./job-stream.ts";
import { type LogEvent, type LogSink, logEventLine, stdoutLines } from "./log.ts";
import { createMetrics } from "./metrics.ts";

export type Env = Readonly<Record<string, string | undefined>>;

/** What a test (or another runtime) may swap; every field has a real default. */
export interface Overrides {
  /** Credentials for every client; default: the environment's (the Lambda role's, `fromEnv()`). */
  readonly credentials?: { readonly accessKeyId: string; readonly secretAccessKey: string; readonly sessionToken?: string };
  /** Where the signing key is read from when only its parameter name is configured. */
  readonly ssm?: Pick<SSMClient, "send">;
  readonly clock?: Clock;
  readonly ids?: Ids;
  readonly log?: LogSink;
  /**
   * Whether the DynamoDB engine runs TransactWriteItems (`DynamoJobStoreOptions.transactions`);
   * default true, as DynamoDB and DynamoDB Local do. A test on dynalite says false.
   */
  readonly transactions?: boolean;
}

/** What the stream publisher and the sweep need: no report store, no tokens. */
/** A build that runs once; a failure is not remembered, so the next call retries. */
export function once<T>(build: () => Promise<T>): () => Promise<T> {
  let pending: Promise<T> | undefined;
  return () => {
    pending ??= build().catch((err: unknown) => {
      pending = undefined;
      throw err;
    });
    return pending;
  };
}

/** The AWS settings a function needs, each named by its variable; one error names every one missing. */
const AWS_VARIABLES = {
  region: "AWS_REGION",
  tableName: "MAM_TABLE_NAME",
  bucketName: "MAM_BUCKET_NAME",
  iotEndpoint: "MAM_IOT_ENDPOINT",
} as const;
type AwsSetting = keyof typeof AWS_VARIABLES;

function awsSettings<K extends AwsSetting>(config: Config, wanted: readonly K[]): Record<K, string> {
  const missing = wanted.filter((k) => config.aws[k] === undefined).map((k) => AWS_VARIABLES[k]);
  if (missing.length > 0) {
    throw new MamError("config.invalid", `invalid configuration: ${missing.join(", ")} required on AWS`, {
      issues: missing.map((variable) => ({ path: variable, message: "required on AWS" })),
    });
  }
  return Object.fromEntries(wanted.map((k) => [k, config.aws[k]])) as Record<K, string>;
}

/** The IoT data endpoint may be configured as a bare host name, as the console shows it. */
function iotEndpointUrl(endpoint: string): string {
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(endpoint) ? endpoint : `https://${endpoint}`;
}

/**
 * On Lambda the role's credentials are always in the environment (AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN): `fromEnv()` reads exactly those, so no
 * client resolves the SDK's default chain (profiles, SSO, IMDS, ...) at cold start.
 * `npm run offline` sets the same variables.
 */
function credentialsOf(overrides: Overrides): { credentials: NonNullable<Overrides["credentials"]> | AwsCredentialIdentityProvider } {
  return { credentials: overrides.credentials ?? fromEnv() };
}

/**
 * The notifier's ports, on a table at this code's schema version: the store's first
 * call in a container reads the version item (one GetItem); a table behind by cheap
 * steps only is brought up then, one behind a costlier step (or newer than this code)
 * answers that call, and every one after it, `store.version`, naming `mam migrate
 * --table <name>` (or both versions), until it is migrated (a refusal is not
 * remembered: `once`). Composing contacts nothing.
 */
function notifierDeps(config: Config, overrides: Overrides, metrics: MetricsSink): StreamDeps {
  const { region, tableName, iotEndpoint } = awsSettings(config, ["region", "tableName", "iotEndpoint"]);
  const dynamodb = new DynamoDBClient({
    region,
    ...(config.aws.dynamodbEndpoint === undefined ? {} : { endpoint: config.aws.dynamodbEndpoint }),
    ...credentialsOf(overrides),
    // Bounds every call (a feed write among them) to about 10 s with its retries: the
    // feed delay (30 s) is chosen above it (docs/notifications.md).
    maxAttempts: 3,
    requestHandler: { connectionTimeout: 1000, requestTimeout: 2000 },
  });
  // The IoT client and its SDK are loaded on the first publish, not at cold start:
  // most requests of the http function (reads, refusals) never publish.
  const publisher = lazyPublisher(async () => {
    const [{ IoTDataPlaneClient }, { IotPublisher }] = await Promise.all([
      import("@aws-sdk/client-iot-data-plane"),
      import("@mam/aws/iot"),
    ]);
    const iot = new IoTDataPlaneClient({
      endpoint: iotEndpointUrl(iotEndpoint),
      region,
      maxAttempts: 3,
      ...credentialsOf(overrides),
    });
    return new IotPublisher({ client: iot, timeoutMs: config.publishTimeoutMs });
  });
  const ready = once(() => prepareJobTable({ client: dynamodb, tableName }));
  const dynamo = afterTableReady(new DynamoJobStore({ client: dynamodb, tableName, transactions: overrides.transactions ?? true }), ready);
  return {
    jobs: dynamo,
    feed: dynamo,
    publisher,
    clock: overrides.clock ?? systemClock,
    ids: overrides.ids ?? randomIds,
    metrics,
  };
}

/** A publisher built on its first publish (a failed build is retried on the next). */
function lazyPublisher(build: () => Promise<Publisher>): Publisher {
  const get = once(build);
  return { publish: async (topic, payload) => (await get()).publish(topic, payload) };
}

/**
 * The S3 module (client and SDK) is loaded on the first report operation, not at
 * cold start: most requests (job reads, transitions, the gate's early refusals)
 * never touch S3, and loading it costs ~45 ms and ~140 KiB of a cold start
 * (bench/bundles.ts). Addresses are computed without it.
 */
function lazyReportStore(bucket: string, build: () => Promise<ReportStore>): ReportStore {
  let store: Promise<ReportStore> | undefined;
  const get = (): Promise<ReportStore> => {
    store ??= build().catch((e: unknown) => {
      store = undefined;
      throw e;
    });
    return store;
  };
  return {
    put: async (location, name, body) => (await get()).put(location, name, body),
    getBytes: async (location, name) => (await get()).getBytes(location, name),
    read: async (location, name) => (await get()).read(location, name),
    exists: async (location, name) => (await get()).exists(location, name),
    promote: async (location, from, to) => (await get()).promote(location, from, to),
    hash: async (location, name) => (await get()).hash(location, name),
    delete: async (location, name) => (await get()).delete(location, name),
    copyOnce: async (from, to, sha256) => (await get()).copyOnce(from, to, sha256),
    retire: async (location, name) => (await get()).retire(location, name),
    describe: (location, name) => s3Uri(bucket, location, name),
    copy: async (from, to) => optional(await get(), "copy")(from, to),
    uploadUrl: async (location, name, declared) => optional(await get(), "uploadUrl")(location, name, declared),
  };
}

function optional<K extends "copy" | "uploadUrl">(store: ReportStore, method: K): NonNullable<ReportStore[K]> {
  const fn = store[method];
  if (fn === undefined) throw new MamError("internal", `the report store has no ${method}`);
  return fn.bind(store) as NonNullable<ReportStore[K]>;
}

/**
 * A synchronous Lambda request is at most 6 MB (6,291,456 bytes), and API Gateway's
 * HTTP API hands a binary body over base64-encoded inside that event: 4/3 of its
 * size. 4 MiB (4,194,304 bytes) is 5,592,408 bytes of base64, which leaves 699,048
 * bytes for the rest of the event (headers, path, request context). So on AWS no
 * body limit may exceed 4 MiB; a report larger than that goes by a presigned upload.
 */
export const AWS_BODY_LIMIT = 4 * 1024 * 1024;
const AWS_LIMITS: ConfigProfile = {
  reportBodyLimit: { default: AWS_BODY_LIMIT, max: AWS_BODY_LIMIT, why: "a Lambda event is at most 6 MB, a body base64-encoded in it" },
  jsonBodyLimit: { default: 1024 * 1024, max: AWS_BODY_LIMIT, why: "a Lambda event is at most 6 MB, a body base64-encoded in it" },
};

const SSM_CONFIGURATION_ERRORS = new Set([
  "ParameterNotFound",
  "ParameterVersionNotFound",
  "AccessDeniedException",
  "InvalidKeyId",
  "ValidationException",
]);

/**
 * The token signing key: MAM_TOKEN_SIGNING_KEY when set (tests, local runs);
 * otherwise read once, at cold start, from the SSM SecureString whose name is
 * MAM_TOKEN_SIGNING_KEY_PARAMETER. Packaging never reads it: the name is
 * configuration, the value exists only in the account.
 */
export async function readSigningKey(config: Config, overrides: Overrides = {}): Promise<string> {
  if (config.tokenSigningKey !== undefined) return config.tokenSigningKey;
  const name = config.tokenSigningKeyParameter;
  if (name === undefined) {
    throw new MamError(
      "config.invalid",
      "invalid configuration: set MAM_TOKEN_SIGNING_KEY_PARAMETER (the SSM parameter's name) or MAM_TOKEN_SIGNING_KEY",
      { issues: [{ path: "MAM_TOKEN_SIGNING_KEY_PARAMETER", message: "required on AWS" }] },
    );
  }
  const region = awsSettings(config, ["region"]);
  // The SSM client is loaded only here, on the branch that reads SSM (a chunk of its
  // own): a function given its key in the environment never loads it.
  const { GetParameterCommand, SSMClient } = await import("@aws-sdk/client-ssm");
  const ssm = overrides.ssm ?? new SSMClient({ ...region, ...credentialsOf(overrides) });
  let value: string | undefined;
  try {
    const out = await ssm.send(new GetParameterCommand({ Name: name, WithDecryption: true }));
    value = out.Parameter?.Value;
  } catch (err) {
    const failure = (err as { name?: unknown } | null)?.name;
    const sdkError = typeof failure === "string" ? failure : "Error";
    // Missing parameter or no right to it: an operator must act. Anything else
    // (throttled, unreachable): retryable, and the next invocation tries again.
    const code = SSM_CONFIGURATION_ERRORS.has(sdkError) ? "config.invalid" : "store.unavailable";
    // The parameter's name is what an operator can act on; the SDK's message may quote the role.
    throw new MamError(code, `could not read the token signing key from SSM parameter ${name}: ${sdkError}`, { cause: err });
  }
  if (value === undefined || value.length < 32) {
    throw new MamError("config.invalid", `the SSM parameter ${name} must hold a signing key of at least 32 characters`);
  }
  return value;
}

/** The Hono app with the AWS adapters behind core's ports. */
export async function composeHttpApp(env: Env, overrides: Overrides = {}, metrics: MetricsSink = NO_METRICS): Promise<Hono<AppEnv>> {
  const config = parseConfig(env, AWS_LIMITS);
  const { region, bucketName: bucket } = awsSettings(config, ["region", "tableName", "bucketName", "iotEndpoint"]);
  const base = notifierDeps(config, overrides, metrics);
  const reports = lazyReportStore(bucket, async () => {
    const { S3ReportStore, createS3Client } = await import("@mam/aws/s3");
    return new S3ReportStore({
      bucket,
      client: createS3Client({
        region,
        ...(config.aws.s3Endpoint === undefined ? {} : { endpoint: config.aws.s3Endpoint }),
        ...credentialsOf(overrides),
      }),
      maxBodyBytes: config.reportBodyLimit,
    });
  });
  // No `disk`: DynamoDB and S3 have no disk of ours for an agent to starve, so no disk
  // floor is kept here (MAM_DISK_FLOOR_BYTES is read and unused); their quotas are what bound an agent.
  const deps: Deps = { ...base, reports, flags: config.flags };
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

export async function composeNotifier(env: Env, overrides: Overrides = {}, metrics: MetricsSink = NO_METRICS): Promise<StreamDeps> {
  return notifierDeps(parseConfig(env), overrides, metrics);
}

export type HttpHandler = (event: LambdaEvent, context?: LambdaContext) => Promise<APIGatewayProxyResult>;

/**
 * `handle(app)` from hono/aws-lambda over an app built on the first request. A
 * request that finds the app cannot be built still gets a problem document (500 for
 * bad configuration, 503 otherwise), not API Gateway's bare "Internal Server Error";
 * the cause goes to the log, not to the caller.
 */
export function createHttpHandler(env: Env, overrides: Overrides = {}): HttpHandler {
  const log = overrides.log ?? stdoutLines;
  const metrics = createMetrics(env);
  const lambda = once(async () => handle(await composeHttpApp(env, overrides, metrics.sink)));
  return async (event, context) => {
    let run: Awaited<ReturnType<typeof lambda>>;
    try {
      run = await lambda();
    } catch (err) {
      const e = err instanceof MamError ? err : undefined;
      logEventLine(log, {
        level: "error",
        event: "http_start_failed",
        code: e?.code ?? "internal",
        message: err instanceof Error ? err.message : String(err),
      });
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
  handle: (deps: StreamDeps, record: DynamoDBRecord, log: LogSink) => Promise<void>,
): StreamPublisherHandler {
  const log = overrides.log ?? stdoutLines;
  const metrics = createMetrics(env);
  const deps = once(() => composeNotifier(env, overrides, metrics.sink));
  // DynamoDBStreams, not SQS: the type decides which field names a failed record.
  const processor = new BatchProcessor(EventType.DynamoDBStreams);
  return async (event, context) => {
    const d = await deps();
    const recordHandler = (record: DynamoDBRecord): Promise<void> => handle(d, record, log);
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

/**
 * The sweep's redrive of the feed's on-failure queue (packages/aws feed-redrive.ts),
 * when MAM_FEED_FAILURE_QUEUE_URL names it; its SDKs are loaded only then.
 */
async function feedRedriver(
  config: Config,
  overrides: Overrides,
  deps: StreamDeps,
): Promise<((log: (entry: LogEvent) => void) => Promise<FeedRedriveCounts>) | undefined> {
  const queueUrl = config.aws.feedFailureQueueUrl;
  const feed = deps.feed;
  if (queueUrl === undefined || feed === undefined) return undefined;
  const { region } = awsSettings(config, ["region"]);
  const { feedRedriveClients, redriveFeed } = await import("@mam/aws/feed-redrive");
  const clients = feedRedriveClients(
    { region, ...credentialsOf(overrides) },
    { sqs: config.aws.sqsEndpoint, streams: config.aws.dynamodbEndpoint },
  );
  return (log) => redriveFeed({ ...clients, queueUrl, feed, log });
}

export interface SweepCounts {
  readonly owed: number;
  readonly sent: number;
  readonly failed: number;
  readonly quarantined: number;
  readonly not_tried: number;
  /** The feed's redrive (absent when no feed failure queue is configured). */
  readonly feed_redrive?: FeedRedriveCounts;
}

export type RecoverySweepHandler = (event: ScheduledEvent, context?: Context) => Promise<SweepCounts>;

/**
 * Scheduled: re-send every owed notification that is due. A failed send is counted,
 * not thrown: the intent stays owed, backs off, and is quarantined after
 * MAM_SWEEP_MAX_FAILURES failures of its own (one log line each). Only a sweep that
 * could not run at all (the store unreachable) fails the invocation.
 */
export function createRecoverySweepHandler(env: Env, overrides: Overrides = {}): RecoverySweepHandler {
  const log = overrides.log ?? stdoutLines;
  const metrics = createMetrics(env);
  const config = once(async () => {
    const parsed = parseConfig(env);
    const deps = notifierDeps(parsed, overrides, metrics.sink);
    return {
      policy: parsed.sweep,
      graceMs: parsed.sweepGraceSeconds * 1000,
      budgetMs: parsed.sweepBudgetSeconds * 1000,
      deps,
      redrive: await feedRedriver(parsed, overrides, deps),
    };
  });
  return async () => {
    const { policy, graceMs, budgetMs, deps, redrive } = await config();
    let result: Awaited<ReturnType<typeof recoverNotifications>>;
    let feedRedrive: FeedRedriveCounts | undefined;
    try {
      // Fresh intents are the stream publisher's: the sweep takes only what it missed.
      result = await recoverNotifications(deps, { policy, graceMs, budgetMs, log: (entry) => logEventLine(log, entry) });
      // After the notifications (what subscribers are owed first); a redrive that cannot
      // run (the queue or the stream unreachable) is logged and tried again next time.
      feedRedrive = await redrive?.((entry) => logEventLine(log, entry)).catch((err: unknown) => {
        logEventLine(log, { level: "warn", event: "feed_redrive_failed", reason: err instanceof Error ? err.message : String(err) });
        return undefined;
      });
    } finally {
      await metrics.flush();
    }
    const counts: SweepCounts = {
      owed: result.owed,
      sent: result.sent,
      failed: result.failed,
      quarantined: result.quarantined,
      not_tried: result.not_tried,
      ...(feedRedrive === undefined ? {} : { feed_redrive: feedRedrive }),
    };
    logEventLine(log, { level: "info", event: "recovery_sweep", ...counts });
    return counts;
  };
}
