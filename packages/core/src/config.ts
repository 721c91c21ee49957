import * as z from "zod";
import { allowedBackends } from "./allowlist.ts";
import { MamError } from "./errors.ts";
import { enabledRules, QUIESCENCE_RULE_NAMES } from "./quiescence-rules.ts";

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

/** What docs/configuration.md says of a variable, kept with its schema (`setting`). */
export interface SettingDoc {
  /** Which part of mam reads it (`API`, `mam serve`, `Lambda`, `core (API, CLI)`, …). */
  readonly usedBy: string;
  /** What it does, in the documentation's words (Markdown). */
  readonly meaning: string;
  /** The default as the documentation shows it, where the schema's own value is not the whole story (`(generated)`). */
  readonly shownDefault?: string;
}

/**
 * One configuration variable as one entry: its schema (with its default) and its
 * documentation, so adding a variable is one edit here and docs/configuration.md is
 * generated from the schema (`npm run docs:config`; tests/unit/configuration-doc.test.ts
 * fails when the committed page differs).
 */
function setting<T extends z.ZodType>(schema: T, usedBy: string, meaning: string, shownDefault?: string): T {
  return schema.meta({ description: meaning, usedBy, ...(shownDefault === undefined ? {} : { shownDefault }) });
}

/** A variable's documentation, as its entry in `EnvSchema` gives it (zod's metadata, `setting`). */
export function settingDoc(name: keyof typeof EnvSchema.shape): SettingDoc {
  const meta = EnvSchema.shape[name].meta();
  if (typeof meta?.description !== "string" || typeof meta.usedBy !== "string") {
    throw new MamError("internal", `the configuration variable ${name} has no documentation in its entry`);
  }
  return {
    usedBy: meta.usedBy,
    meaning: meta.description,
    ...(typeof meta.shownDefault === "string" ? { shownDefault: meta.shownDefault } : {}),
  };
}

/**
 * Every environment variable mam reads, parsed once at start-up into a typed
 * config that is passed in; nothing reads `process.env` deeper in. Any value this
 * schema does not accept is a start-up error naming the variable.
 */
export const EnvSchema = z.object({
  MAM_AUTO_COMPLETE: setting(bit("MAM_AUTO_COMPLETE", "0"), "gate", "`1` lets the gate complete jobs on evidence. Off by default (B-18)."),
  MAM_AUTO_COMPLETE_BACKENDS: setting(
    list,
    "gate",
    "Comma list that narrows the evidence-backed allowlist (`claude`, `claude-code`, `codex`, `grok`); names without recorded evidence are dropped, never added (B-20).",
    "(all evidence-backed)",
  ),
  MAM_AUTO_COMPLETE_SOURCES: setting(
    list.superRefine((names, ctx) => {
      for (const name of names ?? []) {
        if (!QUIESCENCE_RULE_NAMES.includes(name)) {
          ctx.addIssue({
            code: "custom",
            message: `MAM_AUTO_COMPLETE_SOURCES names ${JSON.stringify(name)}, which is no rule of the policy (rules: ${QUIESCENCE_RULE_NAMES.join(", ")})`,
          });
        }
      }
    }),
    "gate",
    "Comma list of the policy's quiescence rules the gate may apply to evidence mam recorded (`watcher.pane_status`, `agent.claude-code.stop`; docs/decisions.md lists what each proves). Unset: every rule backed by recorded observations, no rule backed only by an agent's documentation. Set: only the rules it names; a documented rule is on only when named. An unknown name is a start-up error. Never adds a backend (B-19, B-20).",
    "(the observed rules)",
  ),
  MAM_ENGINE_CAS: setting(
    bit("MAM_ENGINE_CAS", "1"),
    "engine, gate",
    "`0` is the operations rollback switch: explicit transitions no longer need a matching `expected_seq` (last writer wins among the changes the status allows; terminal records stay immutable) and auto-completion is refused (B-31).",
  ),
  MAM_HOST: setting(z.string().min(1).default("127.0.0.1"), "`mam serve`", "Address the API binds to. Loopback unless told otherwise."),
  MAM_PORT: setting(int("MAM_PORT", 8787, 0, 65535), "`mam serve`", "API port (`0` picks a free one)."),
  MAM_DATA_DIR: setting(
    z.string().min(1).default(".mam"),
    "`mam serve`, CLI",
    "SQLite database `mam.db`, reports under `reports/`, `credentials.json`. `mam serve` makes it 0700 (files 0600, directories 0700) and refuses, exit 1, one of another user or one it cannot make 0700.",
  ),
  MAM_MQTT_URL: setting(
    z
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
    "`mam serve`, CLI",
    "An external MQTT broker (`mqtt://`, `mqtts://`, `ws://`, `wss://`; no credentials in it); unset, `mam serve` runs an embedded one. Requires `MAM_MQTT_USERNAME` and `MAM_MQTT_PASSWORD`.",
    "(embedded broker)",
  ),
  MAM_MQTT_PORT: setting(int("MAM_MQTT_PORT", 1883, 0, 65535), "`mam serve`", "Port of the embedded broker (`0` picks a free one)."),
  MAM_MQTT_USERNAME: setting(
    z.string().min(1).optional(),
    "`mam serve`, CLI",
    "The service's login on the external broker; it never connects to one anonymously: `MAM_MQTT_URL` without both is `config.invalid` naming them. The embedded broker uses the login in `credentials.json`.",
  ),
  MAM_MQTT_PASSWORD: setting(
    z.string().min(1).optional(),
    "`mam serve`, CLI",
    "The service's login on the external broker; it never connects to one anonymously: `MAM_MQTT_URL` without both is `config.invalid` naming them. The embedded broker uses the login in `credentials.json`.",
  ),
  MAM_MQTT_CLIENT_ID: setting(
    z
      .string()
      .regex(
        /^[A-Za-z0-9_-]{1,23}$/,
        "MAM_MQTT_CLIENT_ID must be 1 to 23 letters, digits, '-' or '_' (what every MQTT 3.1.1 broker accepts)",
      )
      .default("mam-service"),
    "`mam serve`",
    "Client id of the service's publisher, on either broker (1-23 of `A-Z a-z 0-9 - _`); the embedded broker refuses it to any connection without the service's login. One id per running service.",
  ),
  MAM_MQTT_MAX_PACKET_BYTES: setting(
    int("MAM_MQTT_MAX_PACKET_BYTES", 64 * 1024, 1024, 16 * 1024 * 1024),
    "`mam serve`",
    "Largest MQTT packet (fixed header included) the embedded broker takes, 1024 to 16777216; a larger one closes its connection once its header arrives. Notifications are a few hundred bytes.",
  ),
  MAM_MQTT_MAX_SESSIONS_PER_NAME: setting(
    int("MAM_MQTT_MAX_SESSIONS_PER_NAME", 16, 1, 10_000),
    "`mam serve`",
    "The most persistent sessions (`clean: false`) one token name may own on the embedded broker; the next is refused (CONNACK 5, logged with its reason). The owner frees one by connecting `clean: true` with its client id.",
  ),
  MAM_MQTT_MAX_SESSIONS: setting(
    int("MAM_MQTT_MAX_SESSIONS", 1000, 1, 1_000_000),
    "`mam serve`",
    "The most persistent sessions the embedded broker keeps in all; the next is refused (CONNACK 3).",
  ),
  MAM_MQTT_MAX_QUEUED_BYTES_PER_SESSION: setting(
    int("MAM_MQTT_MAX_QUEUED_BYTES_PER_SESSION", 4 * 1024 * 1024, 64 * 1024, 1024 * 1024 * 1024),
    "`mam serve`",
    "The most bytes (topics and payloads) queued unacknowledged for one persistent session; beyond it (or beyond 10,000 messages) nothing more is queued for it until it drains: it catches up from the feed.",
  ),
  MAM_MQTT_MAX_INFLIGHT_INBOUND: setting(
    int("MAM_MQTT_MAX_INFLIGHT_INBOUND", 32, 1, 65_535),
    "`mam serve`",
    "QoS 2 publishes one client may have awaiting their PUBREL on the embedded broker (only the service's login may publish at all).",
  ),
  MAM_MQTT_MAX_OUTGOING_BYTES: setting(
    int("MAM_MQTT_MAX_OUTGOING_BYTES", 256 * 1024, 16 * 1024, 256 * 1024 * 1024),
    "`mam serve`",
    "Bytes the embedded broker has written to a client that it has not read, beyond which the client is dropped (a logged-in subscriber has room for its whole queue besides). Writes never wait for a client to read, so no subscriber can hold the service's publishes.",
  ),
  // Accepted as a bearer with every scope: as hard to guess as the signing key behind the other tokens.
  MAM_OPERATOR_TOKEN: setting(
    z
      .string()
      .min(32, "MAM_OPERATOR_TOKEN must be at least 32 characters (it is accepted as an operator token with every scope)")
      .optional(),
    "`mam serve`",
    "Use this operator token (every scope) instead of generating one into `credentials.json`; at least 32 characters (shorter is `config.invalid`, exit 1).",
    "(generated)",
  ),
  MAM_TOKEN_SIGNING_KEY: setting(
    z.string().min(32, "MAM_TOKEN_SIGNING_KEY must be at least 32 characters").optional(),
    "API",
    "HMAC-SHA-256 key for tokens, at least 32 characters.",
    "(generated locally; SSM on AWS)",
  ),
  MAM_TOKEN_SIGNING_KEY_PARAMETER: setting(
    z.string().min(1).optional(),
    "Lambda",
    "Name of the SSM SecureString parameter holding the signing key, read at cold start.",
  ),
  MAM_AGENT_TOKEN_TTL_SECONDS: setting(
    int("MAM_AGENT_TOKEN_TTL_SECONDS", 86_400, 60, 30 * 86_400),
    "API",
    "Lifetime of agent tokens minted at dispatch.",
  ),
  MAM_JSON_BODY_LIMIT: setting(
    int("MAM_JSON_BODY_LIMIT", 1024 * 1024, 1024, 64 * 1024 * 1024),
    "API",
    "Largest JSON body (bytes); larger is 413 before it is buffered. At most 4194304 on AWS (a start-up error above it: a Lambda event is 6 MB, a body base64-encoded in it).",
  ),
  MAM_REPORT_BODY_LIMIT: setting(
    int("MAM_REPORT_BODY_LIMIT", 10 * 1024 * 1024, 1024, 1024 * 1024 * 1024),
    "API",
    "Largest report body through `PUT .../report` (bytes); larger is 413 naming the limit and the upload route. At most 4194304 on AWS (a start-up error above it).",
    "`10485760` (`4194304` on AWS)",
  ),
  // One PUT: S3 takes at most 5 GiB in a single (presigned) PUT.
  MAM_REPORT_UPLOAD_LIMIT: setting(
    int("MAM_REPORT_UPLOAD_LIMIT", 256 * 1024 * 1024, 1024, 5 * 1024 * 1024 * 1024),
    "API",
    "Largest report an upload may declare (`POST .../report/upload`), 1024 to 5 GiB (one S3 PUT). On AWS a presigned S3 PUT; under `mam serve` the report route takes up to the declared size.",
  ),
  MAM_REPORT_UPLOAD_TTL_SECONDS: setting(
    int("MAM_REPORT_UPLOAD_TTL_SECONDS", 900, 60, 3600),
    "API, core",
    "How long an upload address is good (60 to 3600): the presigned URL's expiry on AWS. Also how long an upload holds its attempt (`upload_in_flight`): a declaration until its bytes are staged or finalized, a report PUT until it is staged; a second one meanwhile is `409 report.uploadInFlight`.",
  ),
  // What one job's agents may send (issue 17). The byte defaults hold several report
  // cycles at the largest upload (MAM_REPORT_UPLOAD_LIMIT, 256 MiB) and its re-send.
  MAM_QUOTA_JOB_EVENTS: setting(
    int("MAM_QUOTA_JOB_EVENTS", 10_000, 1, 10_000_000),
    "core (API, CLI)",
    "Events a job's agents may publish (`POST .../events`), 1 to 10,000,000; past it `429 quota.events` naming it, nothing written. Operators and the service's own lines are never counted.",
  ),
  MAM_QUOTA_ATTEMPT_BYTES: setting(
    int("MAM_QUOTA_ATTEMPT_BYTES", 1024 * 1024 * 1024, 1024 * 1024, 2 ** 40),
    "core (API, CLI)",
    "Bytes one attempt's agent may send: event `data` (its JSON), report bodies (`PUT .../report`: its Content-Length, else the route's body limit, reserved before a byte is stored) and upload declarations (`bytes`), 1 MiB to 1 TiB; past it `413 quota.bytes` naming it. Keep it above `MAM_REPORT_BODY_LIMIT`: a body without Content-Length reserves that limit.",
  ),
  MAM_QUOTA_JOB_BYTES: setting(
    int("MAM_QUOTA_JOB_BYTES", 4 * 1024 * 1024 * 1024, 1024 * 1024, 2 ** 42),
    "core (API, CLI)",
    "The same over every attempt of a job, 1 MiB to 4 TiB; past it `413 quota.bytes` naming it.",
  ),
  // The free space agents' writes must leave on the data dir's disk, for the service's own records (issue 17).
  MAM_DISK_FLOOR_BYTES: setting(
    int("MAM_DISK_FLOOR_BYTES", 64 * 1024 * 1024, 0, 2 ** 50),
    "core (`mam serve`, CLI)",
    "Free bytes an agent's write must leave on the data dir's disk (statfs `bavail * bsize`, read on each agent write), 0 (no floor) to 1 PiB; an agent's event (`POST .../events`), report body (`PUT .../report`: its Content-Length, else the body limit), upload declaration (its `bytes`) or finalize (`POST .../finalize`) that would leave less is `507 store.insufficientSpace` naming the free bytes, the floor and this variable, nothing written. Operators' writes and the service's own records (log lines, bookkeeping, feed rows, settles) are never refused by it; they use the room below it until the disk is really full (503). Not used on AWS (DynamoDB and S3 have no disk to starve).",
  ),
  MAM_OBSERVATION_SKEW_SECONDS: setting(
    int("MAM_OBSERVATION_SKEW_SECONDS", 5, 0, 300),
    "core (API)",
    "How far an observation's `observed_at` may lie after the moment mam received it (its sender's clock running ahead), 0 to 300; later is `400` naming `observed_at`, nothing written. Also how far a posted scenario's times may lie after mam's clock.",
  ),
  MAM_READ_TOKEN_RATE_PER_MINUTE: setting(
    int("MAM_READ_TOKEN_RATE_PER_MINUTE", 600, 0, 1_000_000),
    "API",
    "The requests a read token (an operator token whose only scope is `read`: a dashboard's) may make per minute, counted per process in memory (on AWS per function instance: with the function's reserved concurrency, the most it can make is this times the instances); past it `429 rate.limited` with Retry-After. Bursts of a sixth of it (10 s worth) are allowed. 0: no limit. Tokens with any other scope are not limited.",
  ),
  MAM_NUDGE_MAX: setting(
    int("MAM_NUDGE_MAX", 1, 1, 7),
    "core (API)",
    "The most Stop nudges one attempt is answered with (a job's `nudge_on_stop`: a Claude Code `Stop` with no finalized report is sent back to work with `decision: block`), 1 to 7 (Claude Code gives up after 8 consecutive blocks). Each is counted in its Stop observation's own conditional write. See docs/agents.md.",
  ),
  MAM_STALE_AFTER_SECONDS: setting(
    int("MAM_STALE_AFTER_SECONDS", 1800, 60, 30 * 86_400),
    "core (API, CLI), sweep",
    "A running job with no activity (a transition, a dispatch, a report write, an observation, a `working` sighted again) for this long is marked stale by the sweep, once: a feed row `job.stale` and one `stale` notification; the next activity clears the mark. 60 to 2592000. Listed by `GET /v1/jobs?stale=true`.",
  ),
  MAM_DEADLINE_SECONDS: setting(
    int("MAM_DEADLINE_SECONDS", 0, 0, 30 * 86_400),
    "core (API, CLI), sweep",
    "The start-to-close deadline of a dispatch that names none (`deadline_seconds`), in seconds from the dispatch; 0: none. A running job past its attempt's deadline is marked overdue by the sweep, once: a feed row `job.overdue` and one `overdue` notification; the next dispatch clears it. Listed by `GET /v1/jobs?overdue=true`.",
  ),
  // How long a finalize in progress holds its attempt at most (issue 17): a process that
  // crashed mid-finalize wedges the attempt for no longer than this.
  MAM_FINALIZE_LEASE_SECONDS: setting(
    int("MAM_FINALIZE_LEASE_SECONDS", 300, 10, 3600),
    "core (API, CLI)",
    "How long a finalize in progress holds its attempt at most (10 to 3600; `finalize_in_progress`): it is released when the finalize returns or throws, so this bounds only a process that died mid-finalize. A second finalize of the attempt meanwhile, anyone's, is `409 report.finalizeInProgress` (CLI exit 1: a refusal, nothing written) naming it.",
  ),
  MAM_SWEEP_INTERVAL_SECONDS: setting(
    int("MAM_SWEEP_INTERVAL_SECONDS", 30, 1, 86_400),
    "`mam serve`",
    "How often the recovery sweep re-sends owed notifications.",
  ),
  MAM_SWEEP_MAX_FAILURES: setting(
    int("MAM_SWEEP_MAX_FAILURES", 5, 1, 100),
    "sweep",
    "The sweep quarantines an owed notification at its N-th failure of its own (refused, too large, a record that cannot be flushed); an unreachable broker or store never counts. 1..100.",
  ),
  MAM_SWEEP_BACKOFF_SECONDS: setting(
    int("MAM_SWEEP_BACKOFF_SECONDS", 60, 1, 86_400),
    "sweep",
    "Wait before a failed notification is tried again: this, then doubled after each failure, at most 64 times this.",
  ),
  MAM_SWEEP_GRACE_SECONDS: setting(
    int("MAM_SWEEP_GRACE_SECONDS", 5, 0, 3_600),
    "sweep",
    "The sweep (the timer, the AWS schedule, `POST /v1/recovery-sweeps`) takes only intents due at least this long ago: fresh ones belong to the one path that publishes each commit. 0..3600. See docs/notifications.md.",
  ),
  MAM_SWEEP_BUDGET_SECONDS: setting(
    int("MAM_SWEEP_BUDGET_SECONDS", 20, 1, 86_400),
    "sweep",
    "Each sweep pass's time budget (the timer's, the scheduled function's and `POST /v1/recovery-sweeps`'): intents not tried by then are `not_tried` and wait for the next pass. A publish that fails as unreachable (a congested or absent broker) defers its intent alone, uncounted, and the pass goes on. 1..86400.",
  ),
  MAM_SWEEP_EVALUATIONS: setting(
    int("MAM_SWEEP_EVALUATIONS", 25, 0, 1_000),
    "sweep",
    "Each sweep pass, after its owed notifications, evaluates at most this many due candidates (jobs whose recorded evidence may now complete them), oldest due first; the rest wait for the next pass. 0: no scheduled evaluation. 0..1000. See docs/decisions.md, scheduled evaluation.",
  ),
  MAM_SWEEP_EVALUATION_MIB: setting(
    int("MAM_SWEEP_EVALUATION_MIB", 64, 1, 4_096),
    "sweep",
    "Each sweep pass stops evaluating candidates once the gate has hashed this many MiB of reports in it (the one it started is finished). 1..4096.",
  ),
  MAM_PUBLISH_TIMEOUT_MS: setting(
    int("MAM_PUBLISH_TIMEOUT_MS", 5000, 100, 120_000),
    "publishers",
    "Bound on waiting for a broker to take a message (its QoS 2 PUBCOMP; on the embedded broker, its queue write and delivery). The embedded broker drops a subscriber whose socket stays full for the smaller of 2 s and half of this.",
  ),
  MAM_FEED_MAX_STREAMS: setting(
    int("MAM_FEED_MAX_STREAMS", 64, 1, 10_000),
    "`mam serve`",
    'Open `GET /v1/events/stream` streams per process. Past it the answer is "now": the rows available, a `retry:` line, and the stream ends (an EventSource reconnects with `Last-Event-ID` after `retry:`).',
  ),
  MAM_FEED_STREAMS_PER_AGENT: setting(
    int("MAM_FEED_STREAMS_PER_AGENT", 4, 1, 10_000),
    "`mam serve`",
    "Open streams per agent token's (job, attempt). Past it: 429 `stream.tooMany` (with `Retry-After`) naming the bound; nothing is opened.",
  ),
  MAM_FEED_STREAMS_PER_OPERATOR: setting(
    int("MAM_FEED_STREAMS_PER_OPERATOR", 16, 1, 10_000),
    "`mam serve`",
    "Open streams per operator token (its id; `MAM_OPERATOR_TOKEN` by that name). Past it: 429 `stream.tooMany`.",
  ),
  MAM_FEED_OPERATOR_RESERVE: setting(
    int("MAM_FEED_OPERATOR_RESERVE", 16, 0, 10_000),
    "`mam serve`",
    "Of `MAM_FEED_MAX_STREAMS`, slots only operator tokens may take: agents together hold at most the rest (48 by default), so an operator can always watch.",
  ),
  MAM_FEED_WRITE_TIMEOUT_MS: setting(
    int("MAM_FEED_WRITE_TIMEOUT_MS", 10_000, 100, 600_000),
    "`mam serve`",
    "A stream write that does not complete within this (a reader that stopped reading, a body nobody reads) closes the stream and its connection and frees its slot; logged `stream closed`, `reason: write stalled`.",
  ),
  MAM_FEED_POLL_MS: setting(
    int("MAM_FEED_POLL_MS", 1000, 50, 60_000),
    "`mam serve`",
    "How often an open feed stream (`GET /v1/events/stream`) reads rows no signal announced: another process's commits on the same data dir (`mam publish-event --data-dir`). This process's own commits wake it at once.",
  ),
  MAM_HTTP_HEADERS_TIMEOUT_MS: setting(
    int("MAM_HTTP_HEADERS_TIMEOUT_MS", 10_000, 100, 600_000),
    "`mam serve`",
    "Node's `headersTimeout`: a connection that has not sent a complete request head within this is closed (408). Node checks it every tenth of it (`connectionsCheckingInterval`), so an idle socket is closed within 1.1 times it.",
  ),
  MAM_HTTP_REQUEST_TIMEOUT_MS: setting(
    int("MAM_HTTP_REQUEST_TIMEOUT_MS", 300_000, 0, 24 * 3_600_000),
    "`mam serve`",
    "Node's `requestTimeout`: the longest a request (head and body) may take to arrive; `0` none. Raise it for slow uploads of large reports.",
  ),
  MAM_HTTP_KEEP_ALIVE_TIMEOUT_MS: setting(
    int("MAM_HTTP_KEEP_ALIVE_TIMEOUT_MS", 5_000, 100, 600_000),
    "`mam serve`",
    "Node's `keepAliveTimeout`: an idle kept-alive connection is closed after this.",
  ),
  MAM_HTTP_MAX_CONNECTIONS: setting(
    int("MAM_HTTP_MAX_CONNECTIONS", 0, 0, 1_000_000),
    "`mam serve`",
    "Node's `server.maxConnections`: past it a new connection is closed as it is accepted. Unset (`0`): the soft `RLIMIT_NOFILE` read from `/proc/self/limits` (1024 assumed where it cannot be read) less `MAM_FD_RESERVE`, at least 16.",
    "`0` (the soft open-file limit − reserve)",
  ),
  MAM_FD_RESERVE: setting(
    int("MAM_FD_RESERVE", 128, 16, 100_000),
    "`mam serve`",
    "File descriptors kept back from connections for the database, report files and the embedded broker, so a socket flood never makes a write fail with `EMFILE`.",
  ),
  MAM_STOP_GRACE_SECONDS: setting(
    int("MAM_STOP_GRACE_SECONDS", 10, 0, 600),
    "`mam serve`",
    "On SIGINT/SIGTERM, streams end at once; requests in flight get this long, then every connection still open is closed (a reader that never reads included). Keep it below the supervisor's kill timeout.",
  ),
  MAM_TABLE_NAME: setting(z.string().min(3).optional(), "Lambda", "DynamoDB table."),
  MAM_BUCKET_NAME: setting(z.string().min(3).optional(), "Lambda", "S3 bucket for reports and manifests."),
  MAM_IOT_ENDPOINT: setting(z.string().min(1).optional(), "Lambda", "IoT Core data endpoint (configuration: no `iot:DescribeEndpoint`)."),
  MAM_DYNAMODB_ENDPOINT: setting(
    z.string().url().optional(),
    "Lambda, tests",
    "Point the DynamoDB client at a local peer (DynamoDB Local, dynalite).",
  ),
  MAM_S3_ENDPOINT: setting(z.string().url().optional(), "Lambda, tests", "Point the S3 client at a local peer (s3rver)."),
  MAM_FEED_FAILURE_QUEUE_URL: setting(
    z.string().url("MAM_FEED_FAILURE_QUEUE_URL must be the SQS queue's URL").optional(),
    "sweep (Lambda)",
    "The feed writer's on-failure SQS queue: each sweep redrives the stream ranges it names into the change feed (docs/adapters.md). Unset: no redrive.",
  ),
  MAM_SQS_ENDPOINT: setting(z.string().url().optional(), "Lambda, tests", "Point the sweep's SQS client at a local stand-in."),
  AWS_REGION: setting(z.string().min(1).optional(), "Lambda", "Region of the AWS clients."),
  MAM_API_URL: setting(
    z.string().url("MAM_API_URL must be a URL such as http://127.0.0.1:8787").optional(),
    "CLI",
    "The service `mam` calls in API mode (the same as `--api URL`).",
  ),
  MAM_TOKEN: setting(z.string().min(1).optional(), "CLI", "The token `mam` sends in API mode (the same as `--token TOKEN`)."),
  MAM_HOOK_LOG: setting(
    z.string().min(1).optional(),
    "CLI (`mam hook`)",
    "Where `mam hook claude-code` and `mam hook codex` write a line when an event could not be delivered (service unreachable, malformed input, a refusal): a file made 0600, never holding the token or the event. Default `~/.local/state/mam/hook.log`.",
  ),
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
  /** The policy's quiescence rules the gate applies to recorded evidence (MAM_AUTO_COMPLETE_SOURCES; quiescence-rules.ts). */
  readonly quiescenceRules: readonly string[];
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
  /** How far a sender's `observed_at` may lie after mam received it, in seconds (MAM_OBSERVATION_SKEW_SECONDS). */
  readonly observationSkewSeconds: number;
  /** When a running job is stale (MAM_STALE_AFTER_SECONDS) and the deadline of a dispatch that names none (MAM_DEADLINE_SECONDS; 0: none). */
  readonly attention: { readonly staleAfterSeconds: number; readonly deadlineSeconds: number };
  /** The most Stop nudges an attempt gets (MAM_NUDGE_MAX). */
  readonly nudgeMax: number;
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

/**
 * The configuration as every root receives it: what `parseConfig` builds from the
 * variables, so a field is declared once, where it is mapped from its variable
 * (its documentation is the variable's entry in `EnvSchema`).
 */
export type Config = ReturnType<typeof configOf>;

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
  return configOf(r.data, cleaned, profile);
}

type Parsed = z.output<typeof EnvSchema>;

/** The variables, parsed, as the typed configuration (its type is `Config`). */
function configOf(e: Parsed, cleaned: Readonly<Record<string, string | undefined>>, profile: ConfigProfile) {
  const flags: Flags = {
    autoComplete: e.MAM_AUTO_COMPLETE,
    engineCas: e.MAM_ENGINE_CAS,
    allowedBackends: allowedBackends(e.MAM_AUTO_COMPLETE_BACKENDS),
    quiescenceRules: enabledRules(e.MAM_AUTO_COMPLETE_SOURCES),
    quotas: { jobEvents: e.MAM_QUOTA_JOB_EVENTS, attemptBytes: e.MAM_QUOTA_ATTEMPT_BYTES, jobBytes: e.MAM_QUOTA_JOB_BYTES },
    diskFloorBytes: e.MAM_DISK_FLOOR_BYTES,
    leases: { uploadSeconds: e.MAM_REPORT_UPLOAD_TTL_SECONDS, finalizeSeconds: e.MAM_FINALIZE_LEASE_SECONDS },
    observationSkewSeconds: e.MAM_OBSERVATION_SKEW_SECONDS,
    attention: { staleAfterSeconds: e.MAM_STALE_AFTER_SECONDS, deadlineSeconds: e.MAM_DEADLINE_SECONDS },
    nudgeMax: e.MAM_NUDGE_MAX,
  };
  const sweep: SweepPolicy = { maxFailures: e.MAM_SWEEP_MAX_FAILURES, backoffMs: e.MAM_SWEEP_BACKOFF_SECONDS * 1000 };
  return deepFreeze({
    flags,
    host: e.MAM_HOST,
    port: e.MAM_PORT,
    dataDir: e.MAM_DATA_DIR,
    mqttUrl: e.MAM_MQTT_URL,
    mqttPort: e.MAM_MQTT_PORT,
    /** The service's credentials on an external broker (required with MAM_MQTT_URL). */
    mqttUsername: e.MAM_MQTT_USERNAME,
    mqttPassword: e.MAM_MQTT_PASSWORD,
    /** The service publisher's client id, on either broker; the embedded one reserves it. */
    mqttClientId: e.MAM_MQTT_CLIENT_ID,
    /** The embedded broker's largest packet, fixed header included. */
    mqttMaxPacketBytes: e.MAM_MQTT_MAX_PACKET_BYTES,
    /** The embedded broker's bounds on persistent sessions (which need a login), on their queues, and on a client's QoS 2 state. */
    mqttSessions: {
      /** The most persistent sessions one token name may own. */
      maxPerName: e.MAM_MQTT_MAX_SESSIONS_PER_NAME,
      /** The most persistent sessions in all. */
      max: e.MAM_MQTT_MAX_SESSIONS,
      /** The most bytes (topics and payloads) queued unacknowledged for one session. */
      maxQueuedBytes: e.MAM_MQTT_MAX_QUEUED_BYTES_PER_SESSION,
      /** QoS 2 publishes one client may have awaiting their PUBREL. */
      maxInflightInbound: e.MAM_MQTT_MAX_INFLIGHT_INBOUND,
      /** Bytes written to a client and not yet read by it, beyond which it is dropped (a logged-in one has room for its queue besides). */
      maxOutgoingBytes: e.MAM_MQTT_MAX_OUTGOING_BYTES,
    },
    operatorToken: e.MAM_OPERATOR_TOKEN,
    tokenSigningKey: e.MAM_TOKEN_SIGNING_KEY,
    tokenSigningKeyParameter: e.MAM_TOKEN_SIGNING_KEY_PARAMETER,
    agentTokenTtlSeconds: e.MAM_AGENT_TOKEN_TTL_SECONDS,
    jsonBodyLimit: bodyLimit("MAM_JSON_BODY_LIMIT", e.MAM_JSON_BODY_LIMIT, cleaned, profile.jsonBodyLimit),
    reportBodyLimit: bodyLimit("MAM_REPORT_BODY_LIMIT", e.MAM_REPORT_BODY_LIMIT, cleaned, profile.reportBodyLimit),
    /** The largest report an upload may declare (`POST .../report/upload`): what goes around the API's body limit. */
    reportUploadLimit: e.MAM_REPORT_UPLOAD_LIMIT,
    /** How long an issued upload URL stays good. */
    reportUploadTtlSeconds: e.MAM_REPORT_UPLOAD_TTL_SECONDS,
    sweepIntervalSeconds: e.MAM_SWEEP_INTERVAL_SECONDS,
    /** When an owed intent that keeps failing is retried, and when it is quarantined. */
    sweep,
    /**
     * The sweep takes only intents due at least this long ago (created, or their
     * `retry_at` after a failure), so it never races the path that publishes each
     * commit (the change relay, the stream publisher).
     */
    sweepGraceSeconds: e.MAM_SWEEP_GRACE_SECONDS,
    /** Each sweep pass's time budget: what is not tried by then waits for the next pass. */
    sweepBudgetSeconds: e.MAM_SWEEP_BUDGET_SECONDS,
    /** Each sweep pass's budget for evaluating due candidates, after its notifications. */
    sweepEvaluation: { evaluations: e.MAM_SWEEP_EVALUATIONS, bytes: e.MAM_SWEEP_EVALUATION_MIB * 1024 * 1024 },
    publishTimeoutMs: e.MAM_PUBLISH_TIMEOUT_MS,
    readTokenRatePerMinute: e.MAM_READ_TOKEN_RATE_PER_MINUTE,
    /** The change feed's stream: its bounds on open streams, in all and per principal, and on a write. */
    feedStreams: {
      maxStreams: e.MAM_FEED_MAX_STREAMS,
      /** Per agent token's (job, attempt). */
      perAgent: e.MAM_FEED_STREAMS_PER_AGENT,
      /** Per operator token (its id, or MAM_OPERATOR_TOKEN's name). */
      perOperator: e.MAM_FEED_STREAMS_PER_OPERATOR,
      /** Of `maxStreams`, this many only operator tokens may take. */
      operatorReserve: e.MAM_FEED_OPERATOR_RESERVE,
      /** A stream whose write does not complete within this is closed (a reader that stopped reading). */
      writeTimeoutMs: e.MAM_FEED_WRITE_TIMEOUT_MS,
      /** How often an open stream reads rows no commit of this process announced. */
      pollMs: e.MAM_FEED_POLL_MS,
    },
    /** `mam serve`'s HTTP server: Node's timeouts and a cap on open connections. */
    http: {
      headersTimeoutMs: e.MAM_HTTP_HEADERS_TIMEOUT_MS,
      requestTimeoutMs: e.MAM_HTTP_REQUEST_TIMEOUT_MS,
      keepAliveTimeoutMs: e.MAM_HTTP_KEEP_ALIVE_TIMEOUT_MS,
      /** 0: the soft open-file limit less `fdReserve`. */
      maxConnections: e.MAM_HTTP_MAX_CONNECTIONS,
      /** File descriptors kept back from connections for the store, reports and the broker. */
      fdReserve: e.MAM_FD_RESERVE,
    },
    /** How long `mam serve` waits for open connections on stop before it closes them. */
    stopGraceSeconds: e.MAM_STOP_GRACE_SECONDS,
    /** CLI API mode. */
    apiUrl: e.MAM_API_URL,
    token: e.MAM_TOKEN,
    aws: {
      tableName: e.MAM_TABLE_NAME,
      bucketName: e.MAM_BUCKET_NAME,
      iotEndpoint: e.MAM_IOT_ENDPOINT,
      dynamodbEndpoint: e.MAM_DYNAMODB_ENDPOINT,
      s3Endpoint: e.MAM_S3_ENDPOINT,
      /** The feed writer's on-failure queue, which the sweep redrives (absent: no redrive). */
      feedFailureQueueUrl: e.MAM_FEED_FAILURE_QUEUE_URL,
      sqsEndpoint: e.MAM_SQS_ENDPOINT,
      region: e.AWS_REGION,
    },
  });
}

/** The configuration is read-only all the way down (its type says so, and so does the value). */
function deepFreeze<T extends object>(value: T): DeepReadonly<T> {
  for (const v of Object.values(value)) if (typeof v === "object" && v !== null && !Object.isFrozen(v)) deepFreeze(v);
  return Object.freeze(value) as DeepReadonly<T>;
}

type DeepReadonly<T> = T extends readonly (infer U)[]
  ? readonly DeepReadonly<U>[]
  : T extends object
    ? { readonly [K in keyof T]: DeepReadonly<T[K]> }
    : T;

let defaultsParsed: Config | undefined;

/**
 * The configuration of an empty environment: every variable's schema default, parsed
 * once (for an embedder that leaves a setting out: the API's settings, its feed's).
 */
export function defaultConfig(): Config {
  defaultsParsed ??= parseConfig({});
  return defaultsParsed;
}

/** Values given over defaults: a key given as `undefined` keeps its default (what `exactOptionalPropertyTypes` keeps apart). */
export function withDefaults<T extends object>(defaults: T, given: { readonly [K in keyof T]?: T[K] | undefined }): T {
  const defined = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined));
  return { ...defaults, ...defined };
}

/** Flags for tests and embedders, from the same schema. */
export function parseFlags(env: Readonly<Record<string, string | undefined>> = {}): Flags {
  return parseConfig(env).flags;
}
