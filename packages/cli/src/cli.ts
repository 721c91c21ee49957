import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { basename, dirname, resolve } from "node:path";
import { parseArgs } from "node:util";
import {
  type AgentEvent,
  type Config,
  type Deps,
  ERROR_TABLE,
  type ErrorCode,
  EVENT_ACTIONS,
  finalizeReport,
  isMamError,
  MamError,
  OPERATOR,
  parseConfig,
  parseSideEffects,
  publishAgentEvent,
  REPORT_NAME,
  randomIds,
  STAGED_REPORT_NAME,
  systemClock,
  verifyManifest,
} from "@mam/core";
import { MqttPublisher, openDataDir, readCredentials } from "@mam/local";

export interface CliIo {
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly stdout: (s: string) => void;
  readonly stderr: (s: string) => void;
}

interface Command {
  readonly summary: string;
  readonly usage: string;
  readonly options: NonNullable<Parameters<typeof parseArgs>[0]>["options"];
  run(values: Record<string, unknown>, ctx: Ctx): Promise<number>;
}

interface Ctx {
  readonly io: CliIo;
  readonly config: Config;
  readonly json: boolean;
  out(human: string, doc: unknown): void;
}

const COMMON = {
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
  "data-dir": { type: "string" },
  api: { type: "string" },
  token: { type: "string" },
} as const;

const EXIT_CODES = `Exit codes: 0 done; 1 bad input or a refusal (nothing finalized, committed or published);
2 the broker or the service could not be reached (what was committed stays; the notification stays owed).`;

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const strs = (v: unknown): string[] => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);

function positiveInt(name: string, v: unknown): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new MamError("input.invalid", `--${name} must be a positive integer, not ${JSON.stringify(v)}`);
  return n;
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

/** Embedded mode: the stores under the data dir, and the broker the service publishes to. */
async function embedded(values: Record<string, unknown>, ctx: Ctx): Promise<Deps & { close(): Promise<void> }> {
  const dir = resolve(str(values["data-dir"]) ?? ctx.config.dataDir);
  const creds = await readCredentials(dir);
  const flagUrl = str(values["mqtt-url"]);
  const url = flagUrl ?? ctx.config.mqttUrl ?? `mqtt://127.0.0.1:${ctx.config.mqttPort}`;
  // On MAM_MQTT_URL's external broker, the service's login from the environment;
  // otherwise the embedded broker's, from the data dir. Never the service's client
  // id: a second connection with it would close the service's own.
  const external = flagUrl === undefined && ctx.config.mqttUrl !== undefined;
  const login = external
    ? { username: ctx.config.mqttUsername, password: ctx.config.mqttPassword }
    : { username: creds?.mqtt.username, password: creds?.mqtt.password };
  const store = openDataDir(dir);
  const publisher = new MqttPublisher({
    url,
    publishTimeoutMs: ctx.config.publishTimeoutMs,
    ...(login.username === undefined || login.password === undefined ? {} : { username: login.username, password: login.password }),
  });
  return {
    jobs: store.jobs,
    reports: store.reports,
    publisher,
    clock: systemClock,
    ids: randomIds,
    flags: ctx.config.flags,
    async close() {
      await publisher.close();
      store.close();
    },
  };
}

/** API mode: one JSON call; a problem+json answer becomes the MamError it stands for. */
async function api(
  ctx: Ctx,
  values: Record<string, unknown>,
  method: string,
  path: string,
  body?: unknown,
  raw?: Uint8Array,
): Promise<unknown> {
  const base = str(values.api) ?? ctx.config.apiUrl;
  const token = str(values.token) ?? ctx.config.token;
  if (!base) throw new MamError("input.invalid", "--api URL (or MAM_API_URL) is required in API mode");
  const headers: Record<string, string> = {};
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  if (raw !== undefined) headers["content-type"] = "text/markdown";
  let res: Response;
  try {
    res = await fetch(new URL(path, base), {
      method,
      headers,
      ...(raw !== undefined ? { body: raw } : body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
  } catch (e) {
    throw new MamError("service.unreachable", `the mam service at ${base} could not be reached: ${(e as Error).message}`, { cause: e });
  }
  const text = await res.text();
  const doc = text ? (JSON.parse(text) as Record<string, unknown>) : {};
  if (!res.ok) {
    const code = (typeof doc.code === "string" && doc.code in ERROR_TABLE ? doc.code : "internal") as ErrorCode;
    throw new MamError(code, `${res.status} ${String(doc.detail ?? doc.title ?? res.statusText)}`);
  }
  return doc;
}

const apiMode = (values: Record<string, unknown>, ctx: Ctx): boolean =>
  str(values.api) !== undefined || (ctx.config.apiUrl !== undefined && values["data-dir"] === undefined);

const COMMANDS: Record<string, Command> = {
  "publish-event": {
    summary: "report an event for a job: finalize first (optional), commit, publish, settle",
    usage: `mam publish-event --job ID --event completed|error|progress|started [--attempt N]
    [--finalize-report PATH] [--side-effect kind=reference ...]
    [--data-dir DIR] [--mqtt-url URL] | [--api URL --token TOKEN] [--json]

With --finalize-report PATH (PATH is report-final.md, possibly still staged as
report-final.md.tmp) the report is finalized where it lies before anything is
committed; every --side-effect must be kind=reference. The transition is committed
with its notification intent, the attempt is recorded in the job's event log, and
the intent is published and settled.`,
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
      if (!(event in EVENT_ACTIONS))
        throw new MamError("input.invalid", `--event must be one of ${Object.keys(EVENT_ACTIONS).join(", ")}, not ${event}`);
      const attemptId = positiveInt("attempt", v.attempt);
      // Bad input is refused before anything is read, finalized or published (B-14).
      const sideEffects = parseSideEffects(strs(v["side-effect"]));
      const reportPath = str(v["finalize-report"]);
      const location = reportPath === undefined ? undefined : reportDirOf(reportPath);
      if (location !== undefined && attemptId === undefined) throw new MamError("input.invalid", "--finalize-report needs --attempt");

      if (apiMode(v, ctx)) {
        if (location !== undefined && attemptId !== undefined) {
          const staged = resolve(location, STAGED_REPORT_NAME);
          const body = await readFile(existsSync(staged) ? staged : resolve(location, REPORT_NAME));
          await api(ctx, v, "PUT", `/v1/jobs/${encodeURIComponent(jobId)}/attempts/${attemptId}/report`, undefined, body);
        }
        const doc = (await api(ctx, v, "POST", `/v1/jobs/${encodeURIComponent(jobId)}/events`, {
          event,
          ...(location !== undefined && attemptId !== undefined ? { finalize: { attempt_id: attemptId, side_effects: sideEffects } } : {}),
        })) as { published?: boolean; error?: string };
        ctx.out(doc.published ? `${event} committed and published` : `${event} committed; publish failed: ${doc.error ?? "unknown"}`, doc);
        return doc.published ? 0 : 2;
      }

      const deps = await embedded(v, ctx);
      try {
        const result = await publishAgentEvent(
          deps,
          jobId,
          {
            event: event as AgentEvent,
            attemptId,
            ...(location !== undefined && attemptId !== undefined ? { finalize: { location, attemptId, sideEffects } } : {}),
          },
          OPERATOR,
        );
        const doc = {
          job_id: jobId,
          status: result.record.status,
          transition_seq: result.record.transition_seq,
          finalized: result.finalized?.manifest ?? null,
          published: result.flush.outcome !== "failed",
          ...(result.flush.outcome === "failed" ? { error: result.flush.error.message } : {}),
        };
        if (result.flush.outcome === "failed") {
          ctx.io.stderr(`mam: ${event} committed (seq ${result.record.transition_seq}) but not published: ${result.flush.error.message}\n`);
          ctx.io.stderr("mam: the notification stays owed; the recovery sweep will send it\n");
          ctx.out("", doc);
          return 2;
        }
        ctx.out(`${event} committed (seq ${result.record.transition_seq}) and published`, doc);
        return 0;
      } finally {
        await deps.close();
      }
    },
  },
  finalize: {
    summary: "finalize a report where it lies: promote the staged report and write its manifest",
    usage: `mam finalize --job ID --attempt N --report PATH [--side-effect kind=reference ...] [--json]
    [--api URL --token TOKEN]

PATH is report-final.md (possibly still staged as report-final.md.tmp). In API mode
the report is uploaded to the service and finalized there.`,
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
      const location = reportDirOf(required("report", v.report));
      if (apiMode(v, ctx)) {
        const staged = resolve(location, STAGED_REPORT_NAME);
        const body = await readFile(existsSync(staged) ? staged : resolve(location, REPORT_NAME));
        await api(ctx, v, "PUT", `/v1/jobs/${encodeURIComponent(jobId)}/attempts/${attemptId}/report`, undefined, body);
        const doc = await api(ctx, v, "POST", `/v1/jobs/${encodeURIComponent(jobId)}/attempts/${attemptId}/finalize`, {
          side_effects: sideEffects,
        });
        ctx.out("finalized on the service", doc);
        return 0;
      }
      const { FileReportStore } = await import("@mam/local");
      const reports = new FileReportStore(location);
      const { manifest } = await finalizeReport(reports, systemClock, { location, jobId, attemptId, sideEffects });
      ctx.out(`finalized ${manifest.report_location} (sha256 ${manifest.sha256})`, manifest);
      return 0;
    },
  },
  verify: {
    summary: "verify a finalized report against its manifest, re-deriving the hash",
    usage: `mam verify --job ID --report-dir DIR [--attempt N] [--expected-artifacts kind,kind] [--json]
    [--api URL --token TOKEN]   (API mode: --attempt is required; DIR is not used)

Exits 0 when the manifest verifies, 1 with the reason when it does not.`,
    options: {
      job: { type: "string" },
      attempt: { type: "string" },
      "report-dir": { type: "string" },
      "expected-artifacts": { type: "string" },
    },
    async run(v, ctx) {
      const jobId = required("job", v.job);
      const attemptId = positiveInt("attempt", v.attempt);
      const expected = (str(v["expected-artifacts"]) ?? "")
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
      let verdict: { ok: boolean; reason: string };
      if (apiMode(v, ctx)) {
        if (attemptId === undefined) throw new MamError("input.invalid", "--attempt is required in API mode");
        const q = expected.length ? `?expected_artifacts=${encodeURIComponent(expected.join(","))}` : "";
        verdict = (await api(
          ctx,
          v,
          "GET",
          `/v1/jobs/${encodeURIComponent(jobId)}/attempts/${attemptId}/verification${q}`,
        )) as typeof verdict;
      } else {
        const location = resolve(required("report-dir", v["report-dir"]));
        const { FileReportStore } = await import("@mam/local");
        verdict = await verifyManifest(new FileReportStore(location), { location, jobId, attemptId, expectedArtifacts: expected });
      }
      ctx.out(verdict.ok ? `ok: ${verdict.reason}` : `refused: ${verdict.reason}`, verdict);
      return verdict.ok ? 0 : 1;
    },
  },
  "token create": {
    summary: "mint an operator token with narrower scopes, signed with the data dir's key",
    usage: `mam token create --scope read[,write,gate,ops] [--ttl SECONDS] [--data-dir DIR] [--json]

Reads the signing key from <data dir>/credentials.json (written by mam serve on
first start) and prints a new operator token with just those scopes.`,
    options: { scope: { type: "string" }, ttl: { type: "string" } },
    async run(v, ctx) {
      const dir = resolve(str(v["data-dir"]) ?? ctx.config.dataDir);
      const creds = await readCredentials(dir);
      const key = ctx.config.tokenSigningKey ?? creds?.signing_key;
      if (!key)
        throw new MamError(
          "input.invalid",
          `no signing key: ${dir}/credentials.json does not exist (run mam serve once) and MAM_TOKEN_SIGNING_KEY is unset`,
        );
      const scopes = required("scope", v.scope)
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
      const ttl = positiveInt("ttl", v.ttl);
      const { createTokenService, ScopeSchema } = await import("@mam/api");
      const bad = scopes.filter((s) => !ScopeSchema.safeParse(s).success);
      if (bad.length > 0) throw new MamError("input.invalid", `unknown scope ${bad.join(", ")}: scopes are read, write, gate, ops`);
      const token = createTokenService({ signingKey: key, clock: systemClock }).mintOperator(
        scopes as ("read" | "write" | "gate" | "ops")[],
        ttl === undefined ? {} : { ttlSeconds: ttl },
      );
      ctx.out(token, { token, scopes, ...(ttl === undefined ? {} : { ttl_seconds: ttl }) });
      return 0;
    },
  },
};

function helpText(): string {
  const lines = Object.entries(COMMANDS).map(([n, c]) => `  ${n.padEnd(15)} ${c.summary}`);
  return `mam — decides, on evidence it checks itself, whether a delegated job is finished.

Usage: mam <command> [options]    (mam <command> --help for one command)

Commands:
${lines.join("\n")}
  ${"serve".padEnd(15)} run the service on the embedded default (npm start)

Modes: --data-dir DIR works on an embedded store directly; --api URL with --token
(or MAM_API_URL / MAM_TOKEN) calls the HTTPS API.

${EXIT_CODES}
`;
}

/** Run one `mam` invocation; returns its exit code. Never throws. */
export async function runCli(argv: readonly string[], io: CliIo): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    io.stdout(helpText());
    return name === undefined ? 1 : 0;
  }
  if (name === "serve") {
    const { serveCommand } = await import("./serve.ts");
    return serveCommand(rest, io);
  }
  const key = name === "token" && rest[0] === "create" ? "token create" : name;
  if (key === "token create") rest.shift();
  const command = COMMANDS[key];
  if (!command) {
    io.stderr(`mam: unknown command ${JSON.stringify(name)}\n\n${helpText()}`);
    return 1;
  }
  let values: Record<string, unknown>;
  try {
    values = parseArgs({ args: [...rest], options: { ...COMMON, ...command.options }, strict: true, allowPositionals: false }).values;
  } catch (e) {
    io.stderr(`mam ${name}: ${(e as Error).message}\n\nUsage: ${command.usage}\n`);
    return 1;
  }
  if (values.help) {
    io.stdout(`${command.summary}\n\nUsage: ${command.usage}\n\n${EXIT_CODES}\n`);
    return 0;
  }
  const json = values.json === true;
  try {
    const config = parseConfig(io.env);
    const ctx: Ctx = {
      io,
      config,
      json,
      out(human, doc) {
        if (json) io.stdout(`${JSON.stringify(doc)}\n`);
        else if (human) io.stdout(`${human}\n`);
      },
    };
    return await command.run(values, ctx);
  } catch (e) {
    if (isMamError(e)) {
      io.stderr(`mam ${name}: ${e.message}\n`);
      for (const i of e.issues) io.stderr(`  ${i.path}: ${i.message}\n`);
      if (json) io.stdout(`${JSON.stringify({ error: { code: e.code, message: e.message } })}\n`);
      return e.exitCode;
    }
    io.stderr(`mam ${name}: unexpected error: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  }
}
