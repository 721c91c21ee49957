import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { basename, dirname, resolve } from "node:path";
import { parseArgs } from "node:util";
import type { Scope } from "@mam/api";
import {
  type AgentEvent,
  type Config,
  EVENT_ACTIONS,
  isMamError,
  MamError,
  type MigrationResult,
  parseConfig,
  parseSideEffects,
  REPORT_NAME,
  STAGED_REPORT_NAME,
  systemClock,
} from "@mam/core";
import { type AgentEnvironment, launchLines, writeEnvFile } from "./agent-env.ts";
import type { AlreadyCompletedAnswer, Backend } from "./backend.ts";
import { embeddedBackend, namedDataDir } from "./data-dir-mode.ts";
import { EXIT_CODES, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE } from "./exit-codes.ts";
import { WATCH_HERDR_OPTIONS, WATCH_HERDR_SUMMARY, WATCH_HERDR_USAGE, watchHerdr } from "./herdr/command.ts";
import { httpBackend } from "./http-backend.ts";
import type { CliIo } from "./io.ts";

type Options = NonNullable<Parameters<typeof parseArgs>[0]>["options"];

interface Command {
  readonly summary: string;
  readonly usage: string;
  /** `both`: `--api` or `--data-dir`, one backend each; `embedded`: works on a data dir's own files only. */
  readonly modes: "both" | "embedded";
  readonly options: Options;
  run(values: Record<string, unknown>, ctx: Ctx): Promise<number>;
}

interface Ctx {
  readonly io: CliIo;
  readonly config: Config;
  /** The data dir named (`--data-dir`, MAM_DATA_DIR, or an existing ./.mam). */
  readonly dataDir: string | undefined;
  /** The mode's backend, made on first use. */
  backend(): Backend;
  /** One JSON document on stdout with `--json`; the human line otherwise. */
  out(human: string, doc: unknown): void;
  /** A diagnostic on stderr, in both forms. */
  say(line: string): void;
}

const COMMON = {
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
  "data-dir": { type: "string" },
} as const satisfies Options;

const BOTH_MODES = {
  ...COMMON,
  api: { type: "string" },
  token: { type: "string" },
} as const satisfies Options;

const EXIT_TEXT = `Exit codes: 0 done; 1 bad input or a refusal (nothing finalized, committed or published);
2 the service (--api) or, with --data-dir, the broker could not be reached (what was committed stays; the
notification stays owed).`;

const MODES_TEXT = `Modes: --api URL (or MAM_API_URL) calls the service, with --token TOKEN (or MAM_TOKEN);
--data-dir DIR (or MAM_DATA_DIR, or ./.mam where mam serve made it) works on an embedded
store directly. The CLI never creates a data dir. Both modes print the same --json shape:
the API's answer.`;

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const strs = (v: unknown): string[] => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);

/** `mam events`' page without --limit, and the largest `GET /v1/events` serves. */
const FEED_PAGE = 100;
const FEED_PAGE_MAX = 1000;

function positiveInt(name: string, v: unknown): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new MamError("input.invalid", `--${name} must be a positive integer, not ${JSON.stringify(v)}`);
  return n;
}

/** `--ttl`: whole seconds, or a number with a unit (`s`, `m`, `h`, `d`): `8h` is 28800. */
function durationSeconds(name: string, v: unknown): number | undefined {
  if (v === undefined) return undefined;
  const m = /^(\d{1,9})([smhd]?)$/.exec(String(v).trim());
  const n = m === null ? Number.NaN : Number(m[1]) * { "": 1, s: 1, m: 60, h: 3600, d: 86_400 }[m[2] as "" | "s" | "m" | "h" | "d"];
  if (!Number.isInteger(n) || n < 1) {
    throw new MamError("input.invalid", `--${name} must be seconds or a duration such as 30m, 8h or 7d, not ${JSON.stringify(v)}`);
  }
  return n;
}

/**
 * The service's answer to a re-sent completion (or its finalize): the job is already
 * completed by this agent's attempt on these bytes, and nothing was written. Done: exit 0.
 */
function alreadyCompleted(ctx: Ctx, answer: AlreadyCompletedAnswer): number {
  const r = answer.record;
  ctx.out(`job ${r.job_id} is already completed (seq ${r.transition_seq}) by this attempt, on this report; nothing was sent again`, answer);
  return EXIT_OK;
}

function required(name: string, v: unknown): string {
  const s = str(v);
  if (s === undefined || s === "") throw new MamError("input.invalid", `--${name} is required`);
  return s;
}

/** `--finalize-report PATH` names the final report; it may still be staged as PATH.tmp. */
function reportDirOf(path: string): string {
  const abs = resolve(path);
  const name = basename(abs);
  if (name !== REPORT_NAME && name !== STAGED_REPORT_NAME) {
    throw new MamError("input.invalid", `the report must be named ${REPORT_NAME} (or staged as ${STAGED_REPORT_NAME}), not ${name}`);
  }
  return dirname(abs);
}

/**
 * Which backend a command runs on, from its flags and the environment. A flag that
 * the chosen mode would ignore is refused, saying why, rather than ignored.
 */
function chooseBackend(values: Record<string, unknown>, io: CliIo, config: Config, dataDir: string | undefined): Backend {
  const apiFlag = str(values.api);
  const dataDirFlag = str(values["data-dir"]);
  if (apiFlag !== undefined && dataDirFlag !== undefined) {
    throw new MamError(
      "input.invalid",
      "--api and --data-dir choose different modes: give one (--api calls the service, --data-dir works on its store)",
    );
  }
  // A --data-dir flag overrides MAM_API_URL; MAM_API_URL overrides MAM_DATA_DIR.
  const apiUrl = apiFlag ?? (dataDirFlag === undefined ? config.apiUrl : undefined);
  const tokenFlag = str(values.token);
  if (tokenFlag !== undefined && apiUrl === undefined) {
    throw new MamError(
      "input.invalid",
      dataDirFlag !== undefined
        ? "--token is sent to the service in API mode; with --data-dir the CLI works on the store directly and sends it nowhere"
        : "--token needs --api URL (or MAM_API_URL): without a service to call there is nowhere to send it",
    );
  }
  if (apiUrl !== undefined) {
    if (!URL.canParse(apiUrl))
      throw new MamError("input.invalid", `--api must be a URL such as http://127.0.0.1:8787, not ${JSON.stringify(apiUrl)}`);
    if (values["mqtt-url"] !== undefined) {
      throw new MamError("input.invalid", "--mqtt-url is for --data-dir mode: in API mode the service publishes, to its own broker");
    }
    return httpBackend({ baseUrl: apiUrl, token: tokenFlag ?? config.token, ...(io.fetch === undefined ? {} : { fetch: io.fetch }) });
  }
  return embeddedBackend({ config, dataDir, mqttUrl: str(values["mqtt-url"]) });
}

const COMMANDS: Record<string, Command> = {
  "publish-event": {
    summary: "report an event for a job: finalize first (optional), commit, publish, settle",
    usage: `mam publish-event --job ID --event completed|error|progress|started [--attempt N]
    [--finalize-report PATH] [--side-effect kind=reference ...]
    [--data-dir DIR] [--mqtt-url URL] | [--api URL --token TOKEN] [--json]

With --finalize-report PATH (PATH is report-final.md, possibly still staged as
report-final.md.tmp) the report is finalized before anything is committed: where it
lies with --data-dir, on the service (uploaded first) with --api; every --side-effect
must be kind=reference. The transition is committed with its notification intent,
the attempt is recorded in the job's event log, and the intent is published and
settled. With --data-dir the command publishes itself, and a publish that fails
after the commit exits 2, naming the error. With --api the service publishes (its
relay or stream publisher) and the command exits 2 only when the service cannot be
reached; --json then carries no "published" unless the service published inline.

A completion sent again by the agent whose attempt completed the job, with the
report that completion pinned, is told it is done (exit 0, {already_completed: true,
record}); nothing is written. Anything else on a finished job is refused (exit 1).

--json prints the API's answer: {record, published, finalized?, publish_error?, warnings?}
(or {already_completed: true, record}).`,
    modes: "both",
    options: {
      job: { type: "string" },
      event: { type: "string" },
      attempt: { type: "string" },
      "finalize-report": { type: "string" },
      "side-effect": { type: "string", multiple: true },
      "mqtt-url": { type: "string" },
    },
    async run(v, ctx) {
      const jobId = required("job", v.job);
      const event = required("event", v.event);
      if (!Object.hasOwn(EVENT_ACTIONS, event)) {
        throw new MamError("input.invalid", `--event must be one of ${Object.keys(EVENT_ACTIONS).join(", ")}, not ${event}`);
      }
      const attemptId = positiveInt("attempt", v.attempt);
      // Bad input is refused before anything is read, finalized or published (B-14).
      const sideEffects = parseSideEffects(strs(v["side-effect"]));
      const reportPath = str(v["finalize-report"]);
      const reportDir = reportPath === undefined ? undefined : reportDirOf(reportPath);
      if (reportDir !== undefined && attemptId === undefined) throw new MamError("input.invalid", "--finalize-report needs --attempt");
      if (reportDir === undefined && sideEffects.length > 0)
        throw new MamError("input.invalid", "--side-effect goes with --finalize-report");

      const answer = await ctx.backend().publishEvent(jobId, {
        event: event as AgentEvent,
        attemptId,
        ...(reportDir !== undefined && attemptId !== undefined ? { finalize: { reportDir, attemptId, sideEffects } } : {}),
      });
      const seq = answer.record.transition_seq;
      if ("already_completed" in answer) return alreadyCompleted(ctx, answer);
      for (const w of answer.warnings ?? []) ctx.say(`warning: ${w}`);
      if (answer.published === false) {
        ctx.say(`${event} committed (seq ${seq}) but not published: ${answer.publish_error?.message ?? "the service did not say why"}`);
        ctx.say("the notification stays owed; the recovery sweep will send it");
        ctx.out("", answer);
        // In --data-dir mode this command is the one that publishes: a broker it could
        // not reach is its failure (B-40). In API mode the service took the commit and
        // owes the notification; only a service that cannot be reached exits 2.
        return ctx.backend().mode === "embedded" ? EXIT_UNREACHABLE : EXIT_OK;
      }
      const finalized = answer.finalized === undefined ? "" : `finalized ${answer.finalized.manifest.report_location}; `;
      // No `published`: the service publishes every commit on another path (its relay or stream publisher).
      const outcome = answer.published === true ? "published" : "the service publishes it";
      ctx.out(`${finalized}${event} committed (seq ${seq}); ${outcome}`, answer);
      return EXIT_OK;
    },
  },
  dispatch: {
    summary: "record a dispatch, generate its session id and hand the agent its environment (token, job, attempt, session)",
    usage: `mam dispatch --job ID --attempt N (--env-out PATH | --json) [--generation G] [--pane ID --terminal ID]
    [--workspace-revision REV] [--deadline SECONDS] [--agent-api URL] [--api URL --token TOKEN | --data-dir DIR]

Records attempt N of job ID (greater than its latest), with a session id mam
generates, and mints the agent's token (bound to this job and attempt; a newer
dispatch retires it). The agent's environment — MAM_API_URL, MAM_TOKEN, MAM_JOB,
MAM_ATTEMPT, MAM_SESSION — goes to --env-out PATH, written 0600 (export lines:
\`. PATH\` in a shell), or with --json to stdout; never on a command line. Then
start the agent with it:

  . PATH && claude --session-id "$MAM_SESSION"     (Claude Code: its hooks name that session)
  . PATH && codex                                   (Codex: its first event binds its thread)

--pane and --terminal are the herdr pane and terminal the agent runs in (mam watch
herdr maps a pane to its dispatch by both); --generation is the pane's process
generation (0 by default). --agent-api is the URL the agent calls (default: --api,
or http://127.0.0.1:MAM_PORT in data-dir mode). See docs/agents.md.

--json prints {dispatch, expires_at, env, env_file?, launch}.`,
    modes: "both",
    options: {
      job: { type: "string" },
      attempt: { type: "string" },
      generation: { type: "string" },
      pane: { type: "string" },
      terminal: { type: "string" },
      "workspace-revision": { type: "string" },
      deadline: { type: "string" },
      "env-out": { type: "string" },
      "agent-api": { type: "string" },
    },
    async run(v, ctx) {
      const jobId = required("job", v.job);
      const attemptId = positiveInt("attempt", required("attempt", v.attempt)) as number;
      const envOut = str(v["env-out"]);
      if (envOut === undefined && v.json !== true) {
        throw new MamError("input.invalid", "say where the agent's environment goes: --env-out PATH (written 0600) or --json (stdout)");
      }
      const generation = v.generation === undefined ? 0 : Number(v.generation);
      if (!Number.isInteger(generation) || generation < 0)
        throw new MamError("input.invalid", "--generation must be a non-negative integer");
      const deadline = positiveInt("deadline", v.deadline);
      const backend = ctx.backend();
      const agentApi =
        str(v["agent-api"]) ??
        (backend.mode === "api" ? (str(v.api) ?? ctx.config.apiUrl) : undefined) ??
        `http://127.0.0.1:${ctx.config.port}`;
      if (!URL.canParse(agentApi)) throw new MamError("input.invalid", `--agent-api must be a URL, not ${JSON.stringify(agentApi)}`);
      const session = randomUUID();
      const answer = await backend.dispatch(jobId, {
        attempt_id: attemptId,
        agent_session_uuid: session,
        pane_process_generation: generation,
        ...(str(v.pane) === undefined ? {} : { pane_id: str(v.pane) as string }),
        ...(str(v.terminal) === undefined ? {} : { terminal_id: str(v.terminal) as string }),
        ...(str(v["workspace-revision"]) === undefined ? {} : { anchor: { workspace_revision: str(v["workspace-revision"]) as string } }),
        ...(deadline === undefined ? {} : { deadline_seconds: deadline }),
      });
      const env: AgentEnvironment = {
        MAM_API_URL: agentApi,
        MAM_TOKEN: answer.agent_token,
        MAM_JOB: jobId,
        MAM_ATTEMPT: String(attemptId),
        MAM_SESSION: session,
      };
      if (envOut !== undefined) await writeEnvFile(envOut, env);
      const launch = launchLines(envOut);
      ctx.out(
        `dispatched attempt ${attemptId} of job ${jobId} (session ${session}); the agent's environment is in ${envOut} (0600)\nstart Claude Code with: ${launch["claude-code"]}\nor Codex with: ${launch.codex}`,
        {
          dispatch: answer.dispatch,
          expires_at: answer.expires_at,
          env,
          ...(envOut === undefined ? {} : { env_file: resolve(envOut) }),
          launch,
        },
      );
      return EXIT_OK;
    },
  },
  finalize: {
    summary: "finalize a report: promote the staged report and write its manifest",
    usage: `mam finalize --job ID --attempt N --report PATH [--side-effect kind=reference ...] [--json]
    [--api URL --token TOKEN]

PATH is report-final.md (possibly still staged as report-final.md.tmp). Without
--api the report is finalized where it lies (no data dir is read); with --api it is
uploaded to the service and finalized there.

--json prints the API's answer: {manifest, manifest_sha256} (or, for the report of
this agent's attempt that already completed the job, {already_completed: true, record}).`,
    modes: "both",
    options: {
      job: { type: "string" },
      attempt: { type: "string" },
      report: { type: "string" },
      "side-effect": { type: "string", multiple: true },
    },
    async run(v, ctx) {
      const jobId = required("job", v.job);
      const attemptId = positiveInt("attempt", required("attempt", v.attempt)) as number;
      const sideEffects = parseSideEffects(strs(v["side-effect"]));
      const reportDir = reportDirOf(required("report", v.report));
      const answer = await ctx.backend().finalize(jobId, { reportDir, attemptId, sideEffects });
      if ("already_completed" in answer) return alreadyCompleted(ctx, answer);
      ctx.out(`finalized ${answer.manifest.report_location} (sha256 ${answer.manifest.sha256})`, answer);
      return EXIT_OK;
    },
  },
  verify: {
    summary: "verify a finalized report against its manifest, re-deriving the hash",
    usage: `mam verify --job ID --attempt N [--expected-artifacts kind,kind] --data-dir DIR [--json]
mam verify --job ID --attempt N [--expected-artifacts kind,kind] --api URL --token TOKEN [--json]
mam verify --job ID --report-dir DIR [--attempt N] [--expected-artifacts kind,kind] [--json]

With --data-dir (a data dir mam serve made, read only) or --api, the service's copy
of attempt N is verified — the store's, read directly, or the service's, over the
API — and, once the job completed on that attempt, the copy its completion pinned,
against the job's expected artifacts unless --expected-artifacts names others. Both
print the same answer.

With --report-dir DIR, a report directory is verified in place (the agent's own
tree: no data dir is read, no service called); there is no job record there, so no
completion to compare with and only the artifacts --expected-artifacts names.
--report-dir takes neither --data-dir nor --api.

Exits 0 when the manifest verifies, 1 with the reason when it does not.

--json prints the API's answer: {ok, reason, manifest, manifest_sha256?,
matches_completion?, pinned?} (with --report-dir: {ok, reason, manifest, manifest_sha256?}).`,
    modes: "both",
    options: {
      job: { type: "string" },
      attempt: { type: "string" },
      "report-dir": { type: "string" },
      "expected-artifacts": { type: "string" },
    },
    async run(v, ctx) {
      const jobId = required("job", v.job);
      const attemptId = positiveInt("attempt", v.attempt);
      const reportDir = str(v["report-dir"]);
      const listed = (str(v["expected-artifacts"]) ?? "")
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
      let answer: Awaited<ReturnType<Backend["verify"]>>;
      if (reportDir !== undefined) {
        // An explicit --report-dir chooses it over MAM_DATA_DIR and MAM_API_URL; beside a mode flag it is refused.
        if (str(v["data-dir"]) !== undefined || str(v.api) !== undefined) {
          throw new MamError(
            "input.invalid",
            "--report-dir verifies a report directory in place; --data-dir (or --api) verifies the service's copy of an attempt: give one",
          );
        }
        const { verifyReportDir } = await import("./embedded-backend.ts");
        answer = await verifyReportDir(jobId, { reportDir: resolve(reportDir), attemptId, expectedArtifacts: listed });
      } else {
        if (ctx.backend().mode === "embedded" && ctx.dataDir === undefined) {
          throw new MamError(
            "input.invalid",
            "which report? --data-dir DIR (or --api URL) verifies the service's copy of attempt N; --report-dir DIR verifies a report directory in place",
          );
        }
        if (attemptId === undefined) {
          throw new MamError(
            "input.invalid",
            "--attempt is required with --data-dir or --api: the service's copy of that attempt is verified (--report-dir verifies a directory in place)",
          );
        }
        answer = await ctx.backend().verify(jobId, { attemptId, expectedArtifacts: listed.length === 0 ? undefined : listed });
      }
      ctx.out(answer.ok ? `ok: ${answer.reason}` : `refused: ${answer.reason}`, answer);
      return answer.ok ? EXIT_OK : EXIT_REFUSED;
    },
  },
  events: {
    summary: "print the change feed (every committed change), and with --follow keep printing it",
    usage: `mam events [--follow] [--after CURSOR] [--limit N] [--interval MS] [--json]
    [--data-dir DIR] | [--api URL --token TOKEN]

Prints the change feed from the beginning (or after CURSOR, a row's or a page's
cursor), one line per committed change: when, what, which job, the intent it
carries, by whom. Without --follow it prints what is there and exits 0. With
--follow it keeps printing rows as they commit (reading again every --interval ms,
1000 by default, at once while pages are full) until interrupted (SIGINT or
SIGTERM: exit 0); it says on stderr which --after resumes where it stopped.
--limit N prints at most N rows, then exits 0 (with --follow too), saying on stderr
which --after resumes after them.

--json prints one JSON object per line: the feed's row
{cursor, at, job_id, kind, actor, intent_id?, data?}. Exit 2 when the service (or
the store) cannot be reached, with the --after that resumes.`,
    modes: "both",
    options: {
      follow: { type: "boolean" },
      after: { type: "string" },
      limit: { type: "string" },
      interval: { type: "string" },
    },
    async run(v, ctx) {
      // --limit counts the rows printed, over as many pages as it takes; without it, every row.
      const limit = positiveInt("limit", v.limit);
      const interval = positiveInt("interval", v.interval) ?? 1000;
      const follow = v.follow === true;
      const json = v.json === true;
      let after = str(v.after);
      const stop = stopSignal(ctx.io);
      let printed = 0;
      try {
        for (;;) {
          const pageSize = limit === undefined ? FEED_PAGE : Math.min(limit - printed, FEED_PAGE_MAX);
          let page: Awaited<ReturnType<Backend["listChanges"]>>;
          try {
            page = await ctx.backend().listChanges({ after, limit: pageSize });
          } catch (e) {
            if (after !== undefined && isMamError(e) && EXIT_CODES[e.code] === EXIT_UNREACHABLE) ctx.say(`resume with --after ${after}`);
            throw e;
          }
          for (const row of page.items) ctx.io.stdout(`${json ? JSON.stringify(row) : changeLine(row)}\n`);
          printed += page.items.length;
          after = page.cursor;
          if (limit !== undefined && printed >= limit) break;
          if (page.items.length === pageSize) continue;
          if (!follow || stop.signal.aborted) break;
          await stop.wait(interval);
          if (stop.signal.aborted) break;
        }
      } finally {
        stop.dispose();
      }
      if (limit !== undefined && printed >= limit) ctx.say(`printed --limit ${limit} rows; resume with --after ${after}`);
      else if (follow) ctx.say(`stopped; resume with --after ${after}`);
      return EXIT_OK;
    },
  },
  "watch herdr": {
    summary: WATCH_HERDR_SUMMARY,
    usage: WATCH_HERDR_USAGE,
    modes: "embedded",
    options: WATCH_HERDR_OPTIONS,
    run: (v, ctx) => watchHerdr(v, ctx),
  },
  "token create": {
    summary: "mint an operator token with narrower scopes, signed with the data dir's key",
    usage: `mam token create --scope read[,write,gate,ops,observe] [--ttl DURATION] [--name NAME] [--data-dir DIR] [--json]

Reads the signing key from <data dir>/credentials.json (written by mam serve on
first start), or MAM_TOKEN_SIGNING_KEY, and prints a new operator token with just
those scopes. It signs locally: there is no API mode. --ttl is seconds (3600) or a
duration (90s, 30m, 8h, 7d); without it the token does not expire.

--name NAME says who the token is for (1-64 letters, digits, '.', '_', '-'). A
subscriber logs in to the embedded MQTT broker with a read token that has a name
(the token as the password) to keep a persistent session (clean: false); the
session belongs to the name, so a renewed token of the same name keeps it.

--json prints {token, scopes, ttl_seconds?, name?}.`,
    modes: "embedded",
    options: { scope: { type: "string" }, ttl: { type: "string" }, name: { type: "string" } },
    async run(v, ctx) {
      const scopes = required("scope", v.scope)
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
      const ttl = durationSeconds("ttl", v.ttl);
      const { createTokenService, SCOPES, ScopeSchema } = await import("@mam/api");
      const bad = scopes.filter((s) => !ScopeSchema.safeParse(s).success);
      if (bad.length > 0) throw new MamError("input.invalid", `unknown scope ${bad.join(", ")}: scopes are ${SCOPES.join(", ")}`);
      const creds = ctx.dataDir === undefined ? undefined : await (await import("@mam/local")).readCredentials(ctx.dataDir);
      const key = ctx.config.tokenSigningKey ?? creds?.signing_key;
      if (!key) {
        throw new MamError(
          "input.invalid",
          ctx.dataDir === undefined
            ? "no signing key: give --data-dir DIR (or MAM_DATA_DIR) of a service that has started once, or set MAM_TOKEN_SIGNING_KEY"
            : `no signing key: ${ctx.dataDir}/credentials.json does not exist (run mam serve once) and MAM_TOKEN_SIGNING_KEY is unset`,
        );
      }
      const name = v.name === undefined ? undefined : String(v.name);
      const token = createTokenService({ signingKey: key, clock: systemClock }).mintOperator(scopes as Scope[], {
        ...(ttl === undefined ? {} : { ttlSeconds: ttl }),
        ...(name === undefined ? {} : { name }),
      });
      ctx.out(token, { token, scopes, ...(ttl === undefined ? {} : { ttl_seconds: ttl }), ...(name === undefined ? {} : { name }) });
      return EXIT_OK;
    },
  },
  migrate: {
    summary: "bring a store to this mam's schema version (the data dir's database, or a DynamoDB table)",
    usage: `mam migrate [--data-dir DIR] [--json]
       mam migrate --table NAME [--region REGION] [--endpoint URL] [--json]

Runs the storage's upgrade steps, in order, each recorded only once it completed:
a run that was interrupted resumes where it stopped, and a second run does nothing.
mam serve does this for its data dir at every start; the Lambda functions run a
table's cheap steps themselves and refuse to start behind any other, naming this
command. A store newer than this mam is refused (exit 1), naming both versions.

--data-dir DIR (or MAM_DATA_DIR): the embedded job database, <dir>/mam.db.
--table NAME: the DynamoDB job table, with the credentials of the AWS SDK's default
chain; --region (else AWS_REGION), --endpoint (else MAM_DYNAMODB_ENDPOINT, for
DynamoDB Local).

--json prints {store, from, to, applied: [{version, describe}]}.`,
    modes: "embedded",
    options: { table: { type: "string" }, region: { type: "string" }, endpoint: { type: "string" } },
    async run(v, ctx) {
      const table = str(v.table);
      let store: string;
      let result: MigrationResult;
      if (table !== undefined) {
        const region = str(v.region) ?? ctx.io.env.AWS_REGION;
        if (region === undefined || region === "") throw new MamError("input.invalid", "mam migrate --table needs --region or AWS_REGION");
        const endpoint = str(v.endpoint) ?? ctx.config.aws.dynamodbEndpoint;
        const [{ DynamoDBClient }, { migrateJobTable }] = await Promise.all([
          import("@aws-sdk/client-dynamodb"),
          import("@mam/aws/table-migrations"),
        ]);
        const client = new DynamoDBClient({ region, ...(endpoint === undefined ? {} : { endpoint }) });
        try {
          result = await migrateJobTable({ client, tableName: table }, { run: "all" });
        } finally {
          client.destroy();
        }
        store = `table ${table}`;
      } else {
        const dir = ctx.dataDir ?? resolve(ctx.config.dataDir);
        const { dataDirPaths, migrateDataDir } = await import("@mam/local");
        // The CLI never creates a data dir (mam serve does): nothing there, nothing to upgrade.
        if (!existsSync(dataDirPaths(dir).database)) {
          throw new MamError(
            "input.invalid",
            `no job database at ${dataDirPaths(dir).database}: give --data-dir DIR (or MAM_DATA_DIR) of a service that has started once`,
          );
        }
        result = migrateDataDir(dir);
        store = dataDirPaths(dir).database;
      }
      const steps = result.applied.map((s) => `  ${s.version}: ${s.describe}`).join("\n");
      ctx.out(
        result.applied.length === 0
          ? `${store}: at schema version ${result.to}, nothing to do`
          : `${store}: schema version ${result.from} -> ${result.to}\n${steps}`,
        { store, from: result.from, to: result.to, applied: result.applied },
      );
      return EXIT_OK;
    },
  },
};

type ChangeRowAnswer = Awaited<ReturnType<Backend["listChanges"]>>["items"][number];

/** One feed row as a line: when, what, which job, the intent, the data, by whom. */
function changeLine(row: ChangeRowAnswer): string {
  const data = Object.entries(row.data ?? {})
    .map(([k, x]) => `${k}=${String(x)}`)
    .join(" ");
  const by = row.actor.token_id === undefined ? row.actor.type : `${row.actor.type} ${row.actor.token_id}`;
  return [row.at, row.kind, row.job_id, row.intent_id === undefined ? "" : `intent ${row.intent_id}`, data, `(by ${by})`]
    .filter((p) => p !== "")
    .join("  ");
}

/** Interrupting `--follow`: the io's own signal (tests), else SIGINT and SIGTERM. */
function stopSignal(io: CliIo): { signal: AbortSignal; wait(ms: number): Promise<void>; dispose(): void } {
  const controller = new AbortController();
  const signal = io.signal ?? controller.signal;
  const onSignal = () => controller.abort();
  if (io.signal === undefined) {
    process.once("SIGINT", onSignal);
    process.once("SIGTERM", onSignal);
  }
  return {
    signal,
    wait: (ms) =>
      new Promise<void>((resolveWait) => {
        const timer = setTimeout(done, ms);
        function done() {
          clearTimeout(timer);
          signal.removeEventListener("abort", done);
          resolveWait();
        }
        signal.addEventListener("abort", done, { once: true });
      }),
    dispose() {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
    },
  };
}

/** Command groups (`mam token ...`): the first word of a two-word command. */
const GROUPS = new Set(Object.keys(COMMANDS).flatMap((n) => (n.includes(" ") ? [n.split(" ")[0]!] : [])));

const SERVE_SUMMARY = "run the service on the embedded default (what npm start runs)";
const HOOK_SUMMARY = "an agent's hook (claude-code, codex): post the event to mam; prints only a Stop nudge, always exits 0";

function helpText(): string {
  const lines = Object.entries(COMMANDS).map(([n, c]) => `  ${n.padEnd(15)} ${c.summary}`);
  return `mam — decides, on evidence it checks itself, whether a delegated job is finished.

Usage: mam <command> [options]    (mam <command> --help for one command)

Commands:
${lines.join("\n")}
  ${"serve".padEnd(15)} ${SERVE_SUMMARY}
  ${"hook".padEnd(15)} ${HOOK_SUMMARY}

${MODES_TEXT}

${EXIT_TEXT}
`;
}

function commandHelp(name: string, command: Command): string {
  const modes = command.modes === "both" ? `\n\n${MODES_TEXT}` : "";
  return `mam ${name} — ${command.summary}\n\nUsage: ${command.usage}${modes}\n\n${EXIT_TEXT}\n`;
}

function groupHelp(group: string): string {
  const lines = Object.entries(COMMANDS)
    .filter(([n]) => n.startsWith(`${group} `))
    .map(([n, c]) => `  ${n.padEnd(15)} ${c.summary}`);
  return `Usage: mam ${group} <command> [options]    (mam ${group} <command> --help for one command)\n\nCommands:\n${lines.join("\n")}\n`;
}

/** With `--json`, a usage error is a JSON document on stdout too, as every other failure is. */
function usageError(io: CliIo, args: readonly string[], message: string): void {
  if (args.includes("--json")) io.stdout(`${JSON.stringify({ error: { code: "input.invalid", message } })}\n`);
}

const wantsHelp = (args: readonly string[]): boolean => args.some((a) => a === "--help" || a === "-h");

/** `mam serve`, loaded on demand; a refusal to load it (the agent install has no service) is answered as any refusal is. */
async function serve(args: readonly string[], io: CliIo): Promise<number> {
  let serveCommand: typeof import("./serve.ts").serveCommand;
  try {
    ({ serveCommand } = await import("./serve.ts"));
  } catch (e) {
    if (!isMamError(e)) throw e;
    io.stderr(`mam serve: ${e.message}\n`);
    return EXIT_CODES[e.code];
  }
  return serveCommand(args, io);
}

/** Run one `mam` invocation; returns its exit code. Never throws. */
export async function runCli(argv: readonly string[], io: CliIo): Promise<number> {
  let [name, ...rest] = argv;
  if (name === "help") {
    // `mam help <command>` is `mam <command> --help`.
    if (rest.length === 0) {
      io.stdout(helpText());
      return EXIT_OK;
    }
    [name, ...rest] = [...rest, "--help"];
  }
  if (name === undefined || name === "--help" || name === "-h") {
    io.stdout(helpText());
    return name === undefined ? EXIT_REFUSED : EXIT_OK;
  }
  if (name === "serve") return serve(rest, io);
  // An agent's hook: never a usage error, a stack trace or anything on stdout but a nudge (hook.ts).
  if (name === "hook") {
    const { hookCommand } = await import("./hook.ts");
    return hookCommand(rest, io);
  }
  let key = name;
  if (GROUPS.has(name)) {
    const sub = rest[0];
    if (sub === undefined || sub.startsWith("-") || !Object.hasOwn(COMMANDS, `${name} ${sub}`)) {
      if (sub !== undefined && wantsHelp(rest.slice(0, 1))) {
        io.stdout(groupHelp(name));
        return EXIT_OK;
      }
      io.stderr(
        `mam ${name}: ${sub === undefined ? "which command?" : `unknown command ${JSON.stringify(`${name} ${sub}`)}`}\n\n${groupHelp(name)}`,
      );
      return EXIT_REFUSED;
    }
    key = `${name} ${sub}`;
    rest.shift();
  }
  const command = Object.hasOwn(COMMANDS, key) ? COMMANDS[key] : undefined;
  if (command === undefined) {
    io.stderr(`mam: unknown command ${JSON.stringify(name)}\n\n${helpText()}`);
    usageError(io, rest, `unknown command ${JSON.stringify(name)}`);
    return EXIT_REFUSED;
  }
  if (wantsHelp(rest)) {
    io.stdout(commandHelp(key, command));
    return EXIT_OK;
  }
  let values: Record<string, unknown>;
  try {
    const common = command.modes === "both" ? BOTH_MODES : COMMON;
    values = parseArgs({ args: [...rest], options: { ...common, ...command.options }, strict: true, allowPositionals: false }).values;
  } catch (e) {
    const why = (e as Error).message;
    const hint = command.modes === "embedded" && /'--(api|token)'/.test(why) ? ` (mam ${key} has no API mode)` : "";
    io.stderr(`mam ${key}: ${why}${hint}\n\nUsage: ${command.usage}\n`);
    usageError(io, rest, `${why}${hint}`);
    return EXIT_REFUSED;
  }
  const json = values.json === true;
  let backend: Backend | undefined;
  try {
    const config = parseConfig(io.env);
    const dataDir = namedDataDir(str(values["data-dir"]), io.env, config);
    const ctx: Ctx = {
      io,
      config,
      dataDir,
      backend() {
        backend ??= chooseBackend(values, io, config, dataDir);
        return backend;
      },
      out(human, doc) {
        if (json) io.stdout(`${JSON.stringify(doc)}\n`);
        else if (human) io.stdout(`${human}\n`);
      },
      say(line) {
        io.stderr(`mam ${key}: ${line}\n`);
      },
    };
    // Mode flags are checked before the command reads anything.
    if (command.modes === "both") ctx.backend();
    return await command.run(values, ctx);
  } catch (e) {
    if (isMamError(e)) {
      io.stderr(`mam ${key}: ${e.message}\n`);
      for (const i of e.issues) io.stderr(`  ${i.path}: ${i.message}\n`);
      if (json) {
        const issues = e.issues.length > 0 ? { issues: e.issues } : {};
        io.stdout(`${JSON.stringify({ error: { code: e.code, message: e.message, ...issues } })}\n`);
      }
      return EXIT_CODES[e.code];
    }
    io.stderr(`mam ${key}: unexpected error: ${e instanceof Error ? e.message : String(e)}\n`);
    return EXIT_REFUSED;
  } finally {
    await backend?.close();
  }
}
