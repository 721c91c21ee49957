import * as z from "zod";
import { allowedBackends } from "./allowlist.ts";
import { MamError } from "./errors.ts";

const bit = (name: string, dflt: "0" | "1") =>
  z
    .enum(["0", "1"], { message: `${name} must be 0 or 1` })
    .default(dflt)
    .transform((v) => v === "1");

const int = (name: string, dflt: number, min: number, max: number) =>
  z.coerce
    .number({ message: `${name} must be a number` })
    .int(`${name} must be an integer`)
    .min(min, `${name} must be at least ${min}`)
    .max(max, `${name} must be at most ${max}`)
    .default(dflt);

const MQTT_SCHEMES = new Set(["mqtt:", "mqtts:", "ws:", "wss:"]);

const list = z
  .string()
  .transform((s) =>
    s
      .split(",")
      .map((x) => x.trim())
      .filter((x) => x !== ""),
  )
  .optional();

/**
 * Every environment variable mam reads, parsed once at start-up into a typed
 * config that is passed in; nothing reads `process.env` deeper in. Any value this
 * schema does not accept is a start-up error naming the variable.
 */
export const EnvSchema = z.object({
  MAM_AUTO_COMPLETE: bit("MAM_AUTO_COMPLETE", "0"),
  MAM_AUTO_COMPLETE_BACKENDS: list,
  MAM_ENGINE_CAS: bit("MAM_ENGINE_CAS", "1"),
  MAM_HOST: z.string().min(1).default("127.0.0.1"),
  MAM_PORT: int("MAM_PORT", 8787, 0, 65535),
  MAM_DATA_DIR: z.string().min(1).default(".mam"),
  MAM_MQTT_URL: z
    .string()
    .url("MAM_MQTT_URL must be a URL such as mqtt://127.0.0.1:1883")
    // (zod runs these after a failed .url() too: an unparsable URL is that check's to name.)
    .refine(
      (u) => !URL.canParse(u) || MQTT_SCHEMES.has(new URL(u).protocol),
      "MAM_MQTT_URL must be an mqtt://, mqtts://, ws:// or wss:// URL",
    )
    .refine((u) => {
      if (!URL.canParse(u)) return true;
      const url = new URL(u);
      return url.username === "" && url.password === "";
    }, "MAM_MQTT_URL must carry no credentials (it is printed at start-up): set MAM_MQTT_USERNAME and MAM_MQTT_PASSWORD")
    .optional(),
  MAM_MQTT_PORT: int("MAM_MQTT_PORT", 1883, 0, 65535),
  MAM_MQTT_USERNAME: z.string().min(1).optional(),
  MAM_MQTT_PASSWORD: z.string().min(1).optional(),
  MAM_MQTT_CLIENT_ID: z
    .string()
    .regex(/^[A-Za-z0-9_-]{1,23}$/, "MAM_MQTT_CLIENT_ID must be 1 to 23 letters, digits, '-' or '_' (what every MQTT 3.1.1 broker accepts)")
    .default("mam-service"),
  MAM_MQTT_MAX_PACKET_BYTES: int("MAM_MQTT_MAX_PACKET_BYTES", 64 * 1024, 1024, 16 * 1024 * 1024),
  MAM_MQTT_MAX_SESSIONS_PER_NAME: int("MAM_MQTT_MAX_SESSIONS_PER_NAME", 16, 1, 10_000),
  MAM_MQTT_MAX_SESSIONS: int("MAM_MQTT_MAX_SESSIONS", 1000, 1, 1_000_000),
  MAM_MQTT_MAX_QUEUED_BYTES_PER_SESSION: int("MAM_MQTT_MAX_QUEUED_BYTES_PER_SESSION", 4 * 1024 * 1024, 64 * 1024, 1024 * 1024 * 1024),
  MAM_MQTT_MAX_INFLIGHT_INBOUND: int("MAM_MQTT_MAX_INFLIGHT_INBOUND", 32, 1, 65_535),
  MAM_MQTT_MAX_OUTGOING_BYTES: int("MAM_MQTT_MAX_OUTGOING_BYTES", 256 * 1024, 16 * 1024, 256 * 1024 * 1024),
  // Accepted as a bearer with every scope: as hard to guess as the signing key behind the other tokens.
  MAM_OPERATOR_TOKEN: z
    .string()
    .min(32, "MAM_OPERATOR_TOKEN must be at least 32 characters (it is accepted as an operator token with every scope)")
    .optional(),
  MAM_TOKEN_SIGNING_KEY: z.string().min(32, "MAM_TOKEN_SIGNING_KEY must be at least 32 characters").optional(),
  MAM_TOKEN_SIGNING_KEY_PARAMETER: z.string().min(1).optional(),
  MAM_AGENT_TOKEN_TTL_SECONDS: int("MAM_AGENT_TOKEN_TTL_SECONDS", 86_400, 60, 30 * 86_400),
  MAM_JSON_BODY_LIMIT: int("MAM_JSON_BODY_LIMIT", 1024 * 1024, 1024, 64 * 1024 * 1024),
  MAM_REPORT_BODY_LIMIT: int("MAM_REPORT_BODY_LIMIT", 10 * 1024 * 1024, 1024, 1024 * 1024 * 1024),
  // One PUT: S3 takes at most 5 GiB in a single (presigned) PUT.
  MAM_REPORT_UPLOAD_LIMIT: int("MAM_REPORT_UPLOAD_LIMIT", 256 * 1024 * 1024, 1024, 5 * 1024 * 1024 * 1024),
  MAM_REPORT_UPLOAD_TTL_SECONDS: int("MAM_REPORT_UPLOAD_TTL_SECONDS", 900, 60, 3600),
  // What one job's agents may send (issue 17). The byte defaults hold several report
  // cycles at the largest upload (MAM_REPORT_UPLOAD_LIMIT, 256 MiB) and its re-send.
  MAM_QUOTA_JOB_EVENTS: int("MAM_QUOTA_JOB_EVENTS", 10_000, 1, 10_000_000),
  MAM_QUOTA_ATTEMPT_BYTES: int("MAM_QUOTA_ATTEMPT_BYTES", 1024 * 1024 * 1024, 1024 * 1024, 2 ** 40),
  MAM_QUOTA_JOB_BYTES: int("MAM_QUOTA_JOB_BYTES", 4 * 1024 * 1024 * 1024, 1024 * 1024, 2 ** 42),
  // The free space agents' writes must leave on the data dir's disk, for the service's own records (issue 17).
  MAM_DISK_FLOOR_BYTES: int("MAM_DISK_FLOOR_BYTES", 64 * 1024 * 1024, 0, 2 ** 50),
  // How long a finalize in progress holds its attempt at most (issue 17): a process that
  // crashed mid-finalize wedges the attempt for no longer than this.
  MAM_FINALIZE_LEASE_SECONDS: int("MAM_FINALIZE_LEASE_SECONDS", 300, 10, 3600),
  MAM_SWEEP_INTERVAL_SECONDS: int("MAM_SWEEP_INTERVAL_SECONDS", 30, 1, 86_400),
  MAM_SWEEP_MAX_FAILURES: int("MAM_SWEEP_MAX_FAILURES", 5, 1, 100),
  MAM_SWEEP_BACKOFF_SECONDS: int("MAM_SWEEP_BACKOFF_SECONDS", 60, 1, 86_400),
  MAM_SWEEP_GRACE_SECONDS: int("MAM_SWEEP_GRACE_SECONDS", 5, 0, 3_600),
  MAM_SWEEP_BUDGET_SECONDS: int("MAM_SWEEP_BUDGET_SECONDS", 20, 1, 86_400),
  MAM_PUBLISH_TIMEOUT_MS: int("MAM_PUBLISH_TIMEOUT_MS", 5000, 100, 120_000),
  MAM_FEED_MAX_STREAMS: int("MAM_FEED_MAX_STREAMS", 64, 1, 10_000),
  MAM_FEED_STREAMS_PER_AGENT: int("MAM_FEED_STREAMS_PER_AGENT", 4, 1, 10_000),
  MAM_FEED_STREAMS_PER_OPERATOR: int("MAM_FEED_STREAMS_PER_OPERATOR", 16, 1, 10_000),
  MAM_FEED_OPERATOR_RESERVE: int("MAM_FEED_OPERATOR_RESERVE", 16, 0, 10_000),
  MAM_FEED_WRITE_TIMEOUT_MS: int("MAM_FEED_WRITE_TIMEOUT_MS", 10_000, 100, 600_000),
  MAM_HTTP_HEADERS_TIMEOUT_MS: int("MAM_HTTP_HEADERS_TIMEOUT_MS", 10_000, 100, 600_000),
  MAM_HTTP_REQUEST_TIMEOUT_MS: int("MAM_HTTP_REQUEST_TIMEOUT_MS", 300_000, 0, 24 * 3_600_000),
  MAM_HTTP_KEEP_ALIVE_TIMEOUT_MS: int("MAM_HTTP_KEEP_ALIVE_TIMEOUT_MS", 5_000, 100, 600_000),
  MAM_HTTP_MAX_CONNECTIONS: int("MAM_HTTP_MAX_CONNECTIONS", 0, 0, 1_000_000),
  MAM_FD_RESERVE: int("MAM_FD_RESERVE", 128, 16, 100_000),
  MAM_STOP_GRACE_SECONDS: int("MAM_STOP_GRACE_SECONDS", 10, 0, 600),
  MAM_TABLE_NAME: z.string().min(3).optional(),
  MAM_BUCKET_NAME: z.string().min(3).optional(),
  MAM_IOT_ENDPOINT: z.string().min(1).optional(),
  MAM_DYNAMODB_ENDPOINT: z.string().url().optional(),
  MAM_S3_ENDPOINT: z.string().url().optional(),
  MAM_FEED_FAILURE_QUEUE_URL: z.string().url("MAM_FEED_FAILURE_QUEUE_URL must be the SQS queue's URL").optional(),
  MAM_SQS_ENDPOINT: z.string().url().optional(),
  AWS_REGION: z.string().min(1).optional(),
  MAM_API_URL: z.string().url("MAM_API_URL must be a URL such as http://127.0.0.1:8787").optional(),
  MAM_TOKEN: z.string().min(1).optional(),
});

/**
 * The rules between variables. The service never connects to an external broker
 * anonymously: there, anyone could take its client id or publish under mam/ beside
 * it. (A URL that failed its own checks is named there alone.)
 */
const EnvRules = EnvSchema.superRefine((e, ctx) => {
  if (e.MAM_MQTT_URL === undefined || !URL.canParse(e.MAM_MQTT_URL)) return;
  for (const name of ["MAM_MQTT_USERNAME", "MAM_MQTT_PASSWORD"] as const) {
    if (e[name] === undefined) {
      ctx.addIssue({
        code: "custom",
        path: [name],
        message: `${name} is required with MAM_MQTT_URL: the service connects to an external broker with MAM_MQTT_USERNAME and MAM_MQTT_PASSWORD, never anonymously`,
      });
    }
  }
});

/**
 * When the recovery sweep retries an owed intent that keeps failing for a reason of
 * its own (refused by the broker, too large, a record that cannot be flushed or
 * settled), and when it gives up on it for now.
 */
export interface SweepPolicy {
  /** The N-th failure of its own quarantines the intent (MAM_SWEEP_MAX_FAILURES). */
  readonly maxFailures: number;
  /** The wait after the first failure, doubled after each next one up to 64 times (MAM_SWEEP_BACKOFF_SECONDS). */
  readonly backoffMs: number;
}

export interface Flags {
  readonly autoComplete: boolean;
  readonly engineCas: boolean;
  /** The evidence-backed allowlist, narrowed by MAM_AUTO_COMPLETE_BACKENDS. */
  readonly allowedBackends: readonly string[];
  /** What one job's agents may send (`chargeAgentUsage`). */
  readonly quotas: Quotas;
  /**
   * The free bytes an agent's upload, declaration or event must leave on the stores'
   * disk (MAM_DISK_FLOOR_BYTES; 0: none), where there is one (`Deps.disk`): room kept
   * for the service's own records and the operators' writes, which the floor never refuses.
   */
  readonly diskFloorBytes: number;
  /** How long an upload in flight and a finalize in progress hold their attempt at most (`takeLease`). */
  readonly leases: LeaseBounds;
}

/** Bounds on the one upload in flight and the one finalize in progress of an attempt (issue 17). */
export interface LeaseBounds {
  /** A report PUT through the service's route, and a declaration (MAM_REPORT_UPLOAD_TTL_SECONDS). */
  readonly uploadSeconds: number;
  /** A finalize (MAM_FINALIZE_LEASE_SECONDS). */
  readonly finalizeSeconds: number;
}

/** Bounds on what a job's agents send (issue 17), kept by core on every backend. */
export interface Quotas {
  /** Events an agent may publish to one job (MAM_QUOTA_JOB_EVENTS). */
  readonly jobEvents: number;
  /** Bytes (event data, report bodies, upload declarations) one attempt may send (MAM_QUOTA_ATTEMPT_BYTES). */
  readonly attemptBytes: number;
  /** The same, over every attempt of the job (MAM_QUOTA_JOB_BYTES). */
  readonly jobBytes: number;
}

export interface Config {
  readonly flags: Flags;
  readonly host: string;
  readonly port: number;
  readonly dataDir: string;
  readonly mqttUrl: string | undefined;
  readonly mqttPort: number;
  /** The service's credentials on an external broker (required with MAM_MQTT_URL). */
  readonly mqttUsername: string | undefined;
  readonly mqttPassword: string | undefined;
  /** The service publisher's client id, on either broker; the embedded one reserves it. */
  readonly mqttClientId: string;
  /** The embedded broker's largest packet, fixed header included. */
  readonly mqttMaxPacketBytes: number;
  /** The embedded broker's bounds on persistent sessions (which need a login), on their queues, and on a client's QoS 2 state. */
  readonly mqttSessions: {
    /** The most persistent sessions one token name may own. */
    readonly maxPerName: number;
    /** The most persistent sessions in all. */
    readonly max: number;
    /** The most bytes (topics and payloads) queued unacknowledged for one session. */
    readonly maxQueuedBytes: number;
    /** QoS 2 publishes one client may have awaiting their PUBREL. */
    readonly maxInflightInbound: number;
    /** Bytes written to a client and not yet read by it, beyond which it is dropped (a logged-in one has room for its queue besides). */
    readonly maxOutgoingBytes: number;
  };
  readonly operatorToken: string | undefined;
  readonly tokenSigningKey: string | undefined;
  readonly tokenSigningKeyParameter: string | undefined;
  readonly agentTokenTtlSeconds: number;
  readonly jsonBodyLimit: number;
  readonly reportBodyLimit: number;
  /** The largest report an upload may declare (`POST .../report/upload`): what goes around the API's body limit. */
  readonly reportUploadLimit: number;
  /** How long an issued upload URL stays good. */
  readonly reportUploadTtlSeconds: number;
  readonly sweepIntervalSeconds: number;
  /** When an owed intent that keeps failing is retried, and when it is quarantined. */
  readonly sweep: SweepPolicy;
  /**
   * The sweep takes only intents due at least this long ago (created, or their
   * `retry_at` after a failure), so it never races the path that publishes each
   * commit (the change relay, the stream publisher).
   */
  readonly sweepGraceSeconds: number;
  /** Each sweep pass's time budget: what is not tried by then waits for the next pass. */
  readonly sweepBudgetSeconds: number;
  readonly publishTimeoutMs: number;
  /** The change feed's stream: its bounds on open streams, in all and per principal, and on a write. */
  readonly feedStreams: {
    readonly maxStreams: number;
    /** Per agent token's (job, attempt). */
    readonly perAgent: number;
    /** Per operator token (its id, or MAM_OPERATOR_TOKEN's name). */
    readonly perOperator: number;
    /** Of `maxStreams`, this many only operator tokens may take. */
    readonly operatorReserve: number;
    /** A stream whose write does not complete within this is closed (a reader that stopped reading). */
    readonly writeTimeoutMs: number;
  };
  /** `mam serve`'s HTTP server: Node's timeouts and a cap on open connections. */
  readonly http: {
    readonly headersTimeoutMs: number;
    readonly requestTimeoutMs: number;
    readonly keepAliveTimeoutMs: number;
    /** 0: the soft open-file limit less `fdReserve`. */
    readonly maxConnections: number;
    /** File descriptors kept back from connections for the store, reports and the broker. */
    readonly fdReserve: number;
  };
  /** How long `mam serve` waits for open connections on stop before it closes them. */
  readonly stopGraceSeconds: number;
  /** CLI API mode. */
  readonly apiUrl: string | undefined;
  readonly token: string | undefined;
  readonly aws: {
    readonly tableName: string | undefined;
    readonly bucketName: string | undefined;
    readonly iotEndpoint: string | undefined;
    readonly dynamodbEndpoint: string | undefined;
    readonly s3Endpoint: string | undefined;
    /** The feed writer's on-failure queue, which the sweep redrives (absent: no redrive). */
    readonly feedFailureQueueUrl: string | undefined;
    readonly sqsEndpoint: string | undefined;
    readonly region: string | undefined;
  };
}

/**
 * What a runtime allows of a body limit, where it is stricter than the schema: its
 * own default, and a ceiling above which a configured value is a start-up error
 * naming the variable and `why` (the AWS composition root: a Lambda event's 6 MB).
 */
export interface BodyLimitCeiling {
  readonly default: number;
  readonly max: number;
  readonly why: string;
}

/** A runtime's stricter body limits (none: the schema's own defaults and ranges). */
export interface ConfigProfile {
  readonly jsonBodyLimit?: BodyLimitCeiling;
  readonly reportBodyLimit?: BodyLimitCeiling;
}

function bodyLimit(
  name: string,
  parsed: number,
  env: Readonly<Record<string, string | undefined>>,
  ceiling: BodyLimitCeiling | undefined,
): number {
  if (ceiling === undefined) return parsed;
  if (env[name] === undefined) return ceiling.default;
  if (parsed > ceiling.max) {
    const message = `${name} must be at most ${ceiling.max} here (${ceiling.why}), not ${parsed}`;
    throw new MamError("config.invalid", `invalid configuration: ${name}: ${message}`, { issues: [{ path: name, message }] });
  }
  return parsed;
}

/**
 * Parse the environment once. Throws `config.invalid` naming every bad variable.
 * `profile` narrows the body limits for a runtime (the AWS composition root's).
 */
export function parseConfig(env: Readonly<Record<string, string | undefined>>, profile: ConfigProfile = {}): Config {
  // An empty variable means unset, as a shell user expects of `MAM_X= cmd`.
  const cleaned = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ""));
  const r = EnvRules.safeParse(cleaned);
  if (!r.success) {
    const issues = r.error.issues.map((i) => ({ path: String(i.path[0] ?? "(env)"), message: i.message }));
    throw new MamError("config.invalid", `invalid configuration: ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`, {
      issues,
    });
  }
  const e = r.data;
  return {
    flags: {
      autoComplete: e.MAM_AUTO_COMPLETE,
      engineCas: e.MAM_ENGINE_CAS,
      allowedBackends: allowedBackends(e.MAM_AUTO_COMPLETE_BACKENDS),
      quotas: { jobEvents: e.MAM_QUOTA_JOB_EVENTS, attemptBytes: e.MAM_QUOTA_ATTEMPT_BYTES, jobBytes: e.MAM_QUOTA_JOB_BYTES },
      diskFloorBytes: e.MAM_DISK_FLOOR_BYTES,
      leases: { uploadSeconds: e.MAM_REPORT_UPLOAD_TTL_SECONDS, finalizeSeconds: e.MAM_FINALIZE_LEASE_SECONDS },
    },
    host: e.MAM_HOST,
    port: e.MAM_PORT,
    dataDir: e.MAM_DATA_DIR,
    mqttUrl: e.MAM_MQTT_URL,
    mqttPort: e.MAM_MQTT_PORT,
    mqttUsername: e.MAM_MQTT_USERNAME,
    mqttPassword: e.MAM_MQTT_PASSWORD,
    mqttClientId: e.MAM_MQTT_CLIENT_ID,
    mqttMaxPacketBytes: e.MAM_MQTT_MAX_PACKET_BYTES,
    mqttSessions: {
      maxPerName: e.MAM_MQTT_MAX_SESSIONS_PER_NAME,
      max: e.MAM_MQTT_MAX_SESSIONS,
      maxQueuedBytes: e.MAM_MQTT_MAX_QUEUED_BYTES_PER_SESSION,
      maxInflightInbound: e.MAM_MQTT_MAX_INFLIGHT_INBOUND,
      maxOutgoingBytes: e.MAM_MQTT_MAX_OUTGOING_BYTES,
    },
    operatorToken: e.MAM_OPERATOR_TOKEN,
    tokenSigningKey: e.MAM_TOKEN_SIGNING_KEY,
    tokenSigningKeyParameter: e.MAM_TOKEN_SIGNING_KEY_PARAMETER,
    agentTokenTtlSeconds: e.MAM_AGENT_TOKEN_TTL_SECONDS,
    jsonBodyLimit: bodyLimit("MAM_JSON_BODY_LIMIT", e.MAM_JSON_BODY_LIMIT, cleaned, profile.jsonBodyLimit),
    reportBodyLimit: bodyLimit("MAM_REPORT_BODY_LIMIT", e.MAM_REPORT_BODY_LIMIT, cleaned, profile.reportBodyLimit),
    reportUploadLimit: e.MAM_REPORT_UPLOAD_LIMIT,
    reportUploadTtlSeconds: e.MAM_REPORT_UPLOAD_TTL_SECONDS,
    sweepIntervalSeconds: e.MAM_SWEEP_INTERVAL_SECONDS,
    sweep: { maxFailures: e.MAM_SWEEP_MAX_FAILURES, backoffMs: e.MAM_SWEEP_BACKOFF_SECONDS * 1000 },
    sweepGraceSeconds: e.MAM_SWEEP_GRACE_SECONDS,
    sweepBudgetSeconds: e.MAM_SWEEP_BUDGET_SECONDS,
    publishTimeoutMs: e.MAM_PUBLISH_TIMEOUT_MS,
    feedStreams: {
      maxStreams: e.MAM_FEED_MAX_STREAMS,
      perAgent: e.MAM_FEED_STREAMS_PER_AGENT,
      perOperator: e.MAM_FEED_STREAMS_PER_OPERATOR,
      operatorReserve: e.MAM_FEED_OPERATOR_RESERVE,
      writeTimeoutMs: e.MAM_FEED_WRITE_TIMEOUT_MS,
    },
    http: {
      headersTimeoutMs: e.MAM_HTTP_HEADERS_TIMEOUT_MS,
      requestTimeoutMs: e.MAM_HTTP_REQUEST_TIMEOUT_MS,
      keepAliveTimeoutMs: e.MAM_HTTP_KEEP_ALIVE_TIMEOUT_MS,
      maxConnections: e.MAM_HTTP_MAX_CONNECTIONS,
      fdReserve: e.MAM_FD_RESERVE,
    },
    stopGraceSeconds: e.MAM_STOP_GRACE_SECONDS,
    apiUrl: e.MAM_API_URL,
    token: e.MAM_TOKEN,
    aws: {
      tableName: e.MAM_TABLE_NAME,
      bucketName: e.MAM_BUCKET_NAME,
      iotEndpoint: e.MAM_IOT_ENDPOINT,
      dynamodbEndpoint: e.MAM_DYNAMODB_ENDPOINT,
      s3Endpoint: e.MAM_S3_ENDPOINT,
      feedFailureQueueUrl: e.MAM_FEED_FAILURE_QUEUE_URL,
      sqsEndpoint: e.MAM_SQS_ENDPOINT,
      region: e.AWS_REGION,
    },
  };
}

/** Flags for tests and embedders, from the same schema. */
export function parseFlags(env: Readonly<Record<string, string | undefined>> = {}): Flags {
  return parseConfig(env).flags;
}
