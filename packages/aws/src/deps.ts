/**
 * Core's ports on AWS, composed from the configuration with real defaults: the
 * DynamoDB job store (at this code's table version), the S3 report store and the IoT
 * Core publisher, each SDK loaded when first used, and the token signing key (SSM).
 * Every AWS root (the Lambda functions in functions/, a scheduled evaluation, a
 * worker of another runtime over the same table) builds its ports here; it adds only
 * its own runtime's shape. Composing contacts nothing: the first call of a port does.
 *
 *   compose ............ first call of a port ........................ later calls
 *   clients, settings    the table's version item (one GetItem), the    reuse
 *                        SDK of S3 / IoT / SSM loaded on its first use
 */
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import type { SSMClient } from "@aws-sdk/client-ssm";
import { fromEnv } from "@aws-sdk/credential-providers";
import {
  type Clock,
  type Config,
  type ConfigProfile,
  type Deps,
  type Ids,
  type LogEvent,
  MamError,
  type MetricsSink,
  NO_METRICS,
  once,
  type Publisher,
  type ReportStore,
  randomIds,
  systemClock,
} from "@mam/core";
import type { AwsCredentialIdentityProvider } from "@smithy/types";
import { DynamoJobStore } from "./dynamo-job-store.ts";
import type { FeedRedriveCounts } from "./feed-redrive.ts";
import { s3Uri } from "./s3-keys.ts";
import { afterTableReady, prepareJobTable } from "./table-migrations.ts";

/** What a test (or another runtime) may swap; every field has a real default. */
export interface AwsOverrides {
  /** Credentials for every client; default: the environment's (the Lambda role's, `fromEnv()`). */
  readonly credentials?: { readonly accessKeyId: string; readonly secretAccessKey: string; readonly sessionToken?: string };
  /** Where the signing key is read from when only its parameter name is configured. */
  readonly ssm?: Pick<SSMClient, "send">;
  readonly clock?: Clock;
  readonly ids?: Ids;
  /**
   * Whether the DynamoDB engine runs TransactWriteItems (`DynamoJobStoreOptions.transactions`);
   * default true, as DynamoDB and DynamoDB Local do. A test on dynalite says false.
   */
  readonly transactions?: boolean;
}

/** The notifier's ports on AWS (the stream functions and the sweep): no report store, no tokens. */
export type AwsNotifierDeps = Pick<Deps, "jobs" | "publisher" | "clock" | "ids" | "metrics"> & {
  /** Where the feed writer writes the change feed's rows, and the sweep redrives them. */
  readonly feed?: Pick<DynamoJobStore, "writeStreamChanges">;
};

/** Every port of core on AWS (the API's): the notifier's, the report store and the flags. */
export type AwsDeps = Deps & AwsNotifierDeps;

/** The AWS settings a function needs, each named by its variable; one error names every one missing. */
const AWS_VARIABLES = {
  region: "AWS_REGION",
  tableName: "MAM_TABLE_NAME",
  bucketName: "MAM_BUCKET_NAME",
  iotEndpoint: "MAM_IOT_ENDPOINT",
} as const;
type AwsSetting = keyof typeof AWS_VARIABLES;

/** The AWS settings `wanted`, or `config.invalid` naming every variable missing. */
export function awsSettings<K extends AwsSetting>(config: Config, wanted: readonly K[]): Record<K, string> {
  const missing = wanted.filter((k) => config.aws[k] === undefined).map((k) => AWS_VARIABLES[k]);
  if (missing.length > 0) {
    throw new MamError("config.invalid", `invalid configuration: ${missing.join(", ")} required on AWS`, {
      issues: missing.map((variable) => ({ path: variable, message: "required on AWS" })),
    });
  }
  return Object.fromEntries(wanted.map((k) => [k, config.aws[k]])) as Record<K, string>;
}

/**
 * A synchronous Lambda request is at most 6 MB (6,291,456 bytes), and API Gateway's
 * HTTP API hands a binary body over base64-encoded inside that event: 4/3 of its
 * size. 4 MiB (4,194,304 bytes) is 5,592,408 bytes of base64, which leaves 699,048
 * bytes for the rest of the event (headers, path, request context). So on AWS no
 * body limit may exceed 4 MiB; a report larger than that goes by a presigned upload.
 */
export const AWS_BODY_LIMIT = 4 * 1024 * 1024;

/** The body limits behind API Gateway and Lambda (`parseConfig(env, AWS_LIMITS)`). */
export const AWS_LIMITS: ConfigProfile = {
  reportBodyLimit: { default: AWS_BODY_LIMIT, max: AWS_BODY_LIMIT, why: "a Lambda event is at most 6 MB, a body base64-encoded in it" },
  jsonBodyLimit: { default: 1024 * 1024, max: AWS_BODY_LIMIT, why: "a Lambda event is at most 6 MB, a body base64-encoded in it" },
};

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
function credentialsOf(overrides: AwsOverrides): { credentials: NonNullable<AwsOverrides["credentials"]> | AwsCredentialIdentityProvider } {
  return { credentials: overrides.credentials ?? fromEnv() };
}

/**
 * The notifier's ports, on a table at this code's schema version: the store's first
 * call in a container reads the version item (one GetItem); a table behind by cheap
 * steps only is brought up then, one behind a costlier step (or newer than this code)
 * answers that call, and every one after it, `store.version`, naming `mam migrate
 * --table <name>` (or both versions), until it is migrated (a refusal is not
 * remembered: `once`).
 */
export function awsNotifierDeps(config: Config, overrides: AwsOverrides = {}, metrics: MetricsSink = NO_METRICS): AwsNotifierDeps {
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
      import("./iot-publisher.ts"),
    ]);
    const iot = new IoTDataPlaneClient({ endpoint: iotEndpointUrl(iotEndpoint), region, maxAttempts: 3, ...credentialsOf(overrides) });
    return new IotPublisher({ client: iot, timeoutMs: config.publishTimeoutMs });
  });
  const ready = once(() => prepareJobTable({ client: dynamodb, tableName }));
  const dynamo = afterTableReady(new DynamoJobStore({ client: dynamodb, tableName, transactions: overrides.transactions ?? true }), ready);
  return { jobs: dynamo, feed: dynamo, publisher, clock: overrides.clock ?? systemClock, ids: overrides.ids ?? randomIds, metrics };
}

/**
 * Every port on AWS: the notifier's and the S3 report store, whose module (client and
 * SDK) is loaded on the first report operation, not at cold start: most requests (job
 * reads, transitions, the gate's early refusals) never touch S3, and loading it costs
 * ~45 ms and ~140 KiB of a cold start (bench/bundles.ts). No `disk`: DynamoDB and S3
 * have no disk of ours for an agent to starve, so no disk floor is kept
 * (MAM_DISK_FLOOR_BYTES is read and unused); their quotas are what bound an agent.
 */
export function awsDeps(config: Config, overrides: AwsOverrides = {}, metrics: MetricsSink = NO_METRICS): AwsDeps {
  const { region, bucketName: bucket } = awsSettings(config, ["region", "tableName", "bucketName", "iotEndpoint"]);
  const reports = lazyReportStore(bucket, async () => {
    const { S3ReportStore, createS3Client } = await import("./s3-report-store.ts");
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
  return { ...awsNotifierDeps(config, overrides, metrics), reports, flags: config.flags };
}

/** A publisher built on its first publish (a failed build is retried on the next). */
function lazyPublisher(build: () => Promise<Publisher>): Publisher {
  const get = once(build);
  return { publish: async (topic, payload) => (await get()).publish(topic, payload) };
}

/** A report store built on its first operation (a failed build is retried on the next); addresses are computed without it. */
function lazyReportStore(bucket: string, build: () => Promise<ReportStore>): ReportStore {
  const get = once(build);
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
export async function readSigningKey(config: Config, overrides: AwsOverrides = {}): Promise<string> {
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

/**
 * The sweep's redrive of the feed's on-failure queue (feed-redrive.ts), when
 * MAM_FEED_FAILURE_QUEUE_URL names it; its SDKs are loaded only then.
 */
export async function feedRedriver(
  config: Config,
  overrides: AwsOverrides,
  deps: AwsNotifierDeps,
): Promise<((log: (entry: LogEvent) => void) => Promise<FeedRedriveCounts>) | undefined> {
  const queueUrl = config.aws.feedFailureQueueUrl;
  const feed = deps.feed;
  if (queueUrl === undefined || feed === undefined) return undefined;
  const { region } = awsSettings(config, ["region"]);
  const { feedRedriveClients, redriveFeed } = await import("./feed-redrive.ts");
  const clients = feedRedriveClients(
    { region, ...credentialsOf(overrides) },
    { sqs: config.aws.sqsEndpoint, streams: config.aws.dynamodbEndpoint },
  );
  return (log) => redriveFeed({ ...clients, queueUrl, feed, log });
}
