import { randomUUID } from "node:crypto";
import {
  type Actor,
  attemptReportLocation,
  type Deps,
  DispatchRequestSchema,
  evaluateJob,
  finalizeAttemptReport,
  getJob,
  type JobRecord,
  MamError,
  PublishEventRequestSchema,
  publishAgentEvent,
  RegisterJobSchema,
  recordDispatch,
  recoverNotifications,
  registerJob,
  releaseNotification,
  type SweepPolicy,
  stageAttemptReport,
  TransitionRequestSchema,
  transitionJob,
  verifyAttemptReport,
} from "@mam/core";
import { type Context, Hono } from "hono";
import type { BlankEnv } from "hono/types";
import { type Access, assertLatestAttempt, authorize, type PathParams, ROUTE_PERMISSIONS } from "./access.ts";
import { checkDeclaredLength, limitedChunks, readJsonBody, tooLarge, validate } from "./body.ts";
import { DASHBOARD_ASSETS, DASHBOARD_HTML } from "./dashboard.ts";
import { DOCS_HTML, readDocsAsset } from "./docs.ts";
import { buildOpenApi } from "./openapi.ts";
import { type ProblemCode, problemBody, problemFor, problemResponse } from "./problem.ts";
import { type OperationId, ROUTES, type RouteSpec, routeKey } from "./routes.ts";
import type { Principal, TokenService } from "./tokens.ts";
import {
  type DispatchResponse,
  EvaluationRequestSchema,
  type EventLog,
  type FinalizedBody,
  FinalizeRequestSchema,
  type GateResponse,
  type JobPage,
  ListEventsQuerySchema,
  ListJobsQuerySchema,
  NotificationReleaseRequestSchema,
  type NotificationReleaseResult,
  PathParamsSchema,
  type PublishEventResponse,
  RecoverySweepRequestSchema,
  type RecoverySweepResult,
  type StagedReport,
  type VerificationBody,
  VerificationQuerySchema,
} from "./wire.ts";

export const DEFAULT_JSON_BODY_LIMIT = 1024 * 1024;
export const DEFAULT_REPORT_BODY_LIMIT = 10 * 1024 * 1024;

export interface AppOptions {
  readonly deps: Deps;
  readonly tokens: TokenService;
  /** Bytes; 1 MiB by default. */
  readonly jsonBodyLimit?: number;
  /** Bytes; 10 MiB by default. */
  readonly reportBodyLimit?: number;
  /** One JSON line per request (and per unexpected error); console.log by default. */
  readonly log?: (line: string) => void;
  /** The recovery sweep's retry and quarantine policy (MAM_SWEEP_*); core's defaults when absent. */
  readonly sweep?: SweepPolicy;
}

export type AppEnv = BlankEnv;

/** What a handler gets: the request, its validated path parameters, who is calling, and the request's id. */
interface Call {
  readonly c: Context<AppEnv>;
  readonly params: PathParams;
  readonly principal: Principal | undefined;
  readonly requestId: string;
}

/**
 * What `served` keeps of one request, in a plain object rather than Hono's
 * `c.set()`/`c.get()`: those are closures made anew with every Context, and the
 * first call of each was a measurable share of a cheap read (bench/http.ts).
 */
interface RequestState {
  readonly requestId: string;
  principal: Principal | undefined;
}
type Handler = (call: Call) => Promise<Response> | Response;

const SANE_REQUEST_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/**
 * The HTTP API over a ports bundle (DESIGN.md, "HTTP API"). Handlers are thin:
 * parse and validate, authorize, call the one core function, shape the response.
 * The same app runs under @hono/node-server (`mam serve`) and hono/aws-lambda.
 */
export function createApp(opts: AppOptions): Hono<AppEnv> {
  const { deps, tokens } = opts;
  const jsonLimit = opts.jsonBodyLimit ?? DEFAULT_JSON_BODY_LIMIT;
  const reportLimit = opts.reportBodyLimit ?? DEFAULT_REPORT_BODY_LIMIT;
  const log = opts.log ?? ((line: string) => console.log(line));
  let openApi: string | undefined;

  const app = new Hono<AppEnv>();

  /** A thrown error as its problem answer; one more log line when it was not a MamError. */
  const problemOf = (err: unknown, c: Context<AppEnv>, requestId: string): Response => {
    const { problem, unexpected } = problemFor(err, { requestId, instance: c.req.path });
    if (unexpected) {
      log(
        JSON.stringify({
          level: "error",
          msg: "unexpected error",
          request_id: requestId,
          method: c.req.method,
          path: c.req.path,
          error: err instanceof Error ? { name: err.name, message: err.message, stack: err.stack } : String(err),
        }),
      );
    }
    return problemResponse(problem);
  };

  /**
   * Around every route and the not-found answer: the request id, the answer or the
   * problem any error becomes, and the one log line per request. A wrapper rather
   * than `app.use()` middleware: a route with one handler skips Hono's middleware
   * chain, a measurable share of a request (bench/http.ts).
   */
  const served =
    (work: (c: Context<AppEnv>, state: RequestState) => Promise<Response> | Response) =>
    async (c: Context<AppEnv>): Promise<Response> => {
      const started = performance.now();
      const incoming = c.req.header("x-request-id");
      const requestId = incoming !== undefined && SANE_REQUEST_ID.test(incoming) ? incoming : randomUUID();
      const state: RequestState = { requestId, principal: undefined };
      let res: Response;
      let aborted = false;
      try {
        res = await work(c, state);
      } catch (err) {
        // A client that went away mid-request is not the service's failure: no 5xx,
        // no stack, one line saying so. Nobody reads the answer.
        aborted = clientAborted(c.req.raw, err);
        res = aborted ? new Response(null, { status: CLIENT_CLOSED_REQUEST }) : problemOf(err, c, requestId);
      }
      const status = res.status;
      log(
        JSON.stringify({
          level: status >= 500 ? "error" : status >= 400 && !aborted ? "warn" : "info",
          msg: "request",
          request_id: requestId,
          method: c.req.method,
          path: c.req.path,
          status,
          ...(aborted ? { client_aborted: true, detail: "the client closed the connection before its request was complete" } : {}),
          duration_ms: Math.round((performance.now() - started) * 1000) / 1000,
          actor: actorLabel(state.principal),
        }),
      );
      return res;
    };

  // Only what escapes `served` (nothing should) reaches Hono's own error handler.
  app.onError((err, c) => problemOf(err, c, randomUUID()));

  app.notFound(
    served((c, { requestId }) => {
      const allowed = ROUTES.filter((r) => pathPattern(r.path).test(c.req.path)).map((r) => r.method.toUpperCase());
      const code: ProblemCode = allowed.length > 0 ? "route.methodNotAllowed" : "route.notFound";
      const detail =
        allowed.length > 0
          ? `${c.req.method} is not served on ${c.req.path}; try ${allowed.join(", ")}`
          : `no route ${c.req.method} ${c.req.path}`;
      const problem = problemBody(code, detail, { requestId, instance: c.req.path });
      return problemResponse(problem, allowed.length > 0 ? { allow: allowed.join(", ") } : {});
    }),
  );

  const handlers = routeHandlers({
    deps,
    tokens,
    jsonLimit,
    reportLimit,
    log,
    ...(opts.sweep === undefined ? {} : { sweep: opts.sweep }),
    openApi: () => {
      openApi ??= JSON.stringify(buildOpenApi({ jsonBodyLimit: jsonLimit, reportBodyLimit: reportLimit }));
      return openApi;
    },
  });

  for (const spec of ROUTES as readonly RouteSpec[]) {
    const access: Access = ROUTE_PERMISSIONS[routeKey(spec)];
    const handler = handlers[spec.operationId as OperationId];
    app.on(
      spec.method.toUpperCase(),
      honoPath(spec.path),
      served((c, state) => {
        // 401 first (who are you), then 400 on the path (before any store is asked),
        // then 403 (may you), and for an agent, whether its attempt is still current.
        // Not an async function: the handler's own promise is passed on as it is, one
        // promise fewer per request (bench/http.ts); `served` catches what throws here.
        const principal = access.kind === "protected" ? authenticate(c.req.header("authorization"), tokens) : undefined;
        state.principal = principal;
        const { requestId } = state;
        const params = pathParams(c, spec);
        if (principal === undefined) return handler({ c, params, principal, requestId });
        authorize(principal, access, params);
        if (principal.kind !== "agent") return handler({ c, params, principal, requestId });
        return deps.jobs.get(principal.jobId).then((job) => {
          assertLatestAttempt(principal, job?.latest_attempt);
          return handler({ c, params, principal, requestId });
        });
      }),
    );
  }
  return app;
}

interface HandlerDeps {
  readonly deps: Deps;
  readonly tokens: TokenService;
  readonly jsonLimit: number;
  readonly reportLimit: number;
  readonly log: (line: string) => void;
  readonly sweep?: SweepPolicy;
  readonly openApi: () => string;
}

function routeHandlers({ deps, tokens, jsonLimit, reportLimit, log, sweep, openApi }: HandlerDeps): Record<OperationId, Handler> {
  const json = async <S extends Parameters<typeof validate>[0]>(c: Context<AppEnv>, schema: S, optional = false) => {
    const value = await readJsonBody(c.req.raw, jsonLimit, { optional });
    // `undefined` only when an optional body is absent altogether: the empty object.
    return validate(schema, value === undefined ? {} : value, "body");
  };
  const query = <S extends Parameters<typeof validate>[0]>(c: Context<AppEnv>, schema: S) =>
    // An empty parameter (`?status=`) means absent, as a form sends it.
    validate(schema, Object.fromEntries(Object.entries(c.req.query()).filter(([, v]) => v !== "")), "query");

  return {
    async registerJob({ c, requestId }) {
      const body = await json(c, RegisterJobSchema);
      const record = await registerJob(deps, body);
      return recordResponse(requestId, record, 201, { location: `/v1/jobs/${record.job_id}` });
    },

    async listJobs({ c, requestId }) {
      const q = await query(c, ListJobsQuerySchema);
      const cursor = q.cursor === undefined ? {} : { cursor: q.cursor };
      const page =
        q.owed === "quarantined"
          ? await deps.jobs.listQuarantined({ limit: q.limit, ...cursor })
          : await deps.jobs.list({ limit: q.limit, ...(q.status === undefined ? {} : { status: q.status }), ...cursor });
      const body: JobPage = { items: [...page.items], ...(page.cursor === undefined ? {} : { next_cursor: page.cursor }) };
      return jsonAnswer(requestId, body, 200);
    },

    async getJob({ params, requestId }) {
      return recordResponse(requestId, await getJob(deps, params.jobId!), 200);
    },

    async transitionJob({ c, params, principal, requestId }) {
      const jobId = params.jobId!;
      const body = await json(c, TransitionRequestSchema);
      let expectedSeq = body.expected_seq;
      const ifMatch = c.req.header("if-match");
      if (ifMatch !== undefined) {
        const current = await getJob(deps, jobId);
        const tags = parseIfMatch(ifMatch);
        if (tags !== "*" && !tags.includes(current.transition_seq)) {
          throw new MamError(
            "job.preconditionFailed",
            `If-Match ${ifMatch} does not match job ${jobId}'s transition_seq ${current.transition_seq}`,
            { details: { current } },
          );
        }
        // A client that states its seq in If-Match need not repeat it in the body:
        // the compare-and-swap then runs on that seq, so a writer landing between
        // this read and the write still loses with a 409.
        if (expectedSeq === undefined && tags !== "*" && tags.length === 1) expectedSeq = tags[0];
      }
      const record = await withBodyPaths(() =>
        transitionJob(
          deps,
          jobId,
          { action: body.action, expectedSeq, fields: body.fields, notify: body.notify, reason: body.reason },
          actorOf(principal),
        ),
      );
      return recordResponse(requestId, record, 200);
    },

    async recordDispatch({ c, params, requestId }) {
      const jobId = params.jobId!;
      const body = await json(c, DispatchRequestSchema);
      const dispatch = await withCurrentRecord(deps, jobId, () => recordDispatch(deps, jobId, body));
      const minted = tokens.mintAgent(jobId, dispatch.attempt_id);
      const res: DispatchResponse = { dispatch, agent_token: minted.token, expires_at: minted.expiresAt };
      return jsonAnswer(requestId, res, 201);
    },

    async stageReport({ c, params, requestId }) {
      checkDeclaredLength(c.req.header("content-length"), reportLimit, "report");
      let exceeded = false;
      const stream = limitedChunks(c.req.raw.body, reportLimit, "report", () => {
        exceeded = true;
      });
      let staged: { sha256: string; bytes: number };
      try {
        staged = await stageAttemptReport(deps, params.jobId!, params.attempt!, c.req.raw.body === null ? new Uint8Array() : stream);
      } catch (e) {
        // The store may wrap the stream's error in its own; the limit is still the cause.
        if (exceeded) throw tooLarge(reportLimit, "report");
        throw e;
      } finally {
        await stream.return(undefined);
      }
      const body: StagedReport = { sha256: staged.sha256, bytes: staged.bytes };
      return jsonAnswer(requestId, body, 201);
    },

    async finalizeReport({ c, params, requestId }) {
      const body = await json(c, FinalizeRequestSchema);
      const f = await finalizeAttemptReport(deps, params.jobId!, params.attempt!, body.side_effects);
      const res: FinalizedBody = { manifest: f.manifest, manifest_sha256: f.manifestSha256 };
      return jsonAnswer(requestId, res, 200);
    },

    async verifyReport({ c, params, requestId }) {
      const q = await query(c, VerificationQuerySchema);
      const v = await verifyAttemptReport(deps, params.jobId!, params.attempt!, q.expected_artifacts);
      const res: VerificationBody = {
        ok: v.ok,
        reason: v.reason,
        manifest: v.manifest ?? null,
        ...(v.ok ? { manifest_sha256: v.manifestSha256 } : {}),
        ...(v.pinned === undefined ? {} : { pinned: v.pinned }),
      };
      return jsonAnswer(requestId, res, 200);
    },

    async evaluateJob({ c, params, requestId }) {
      const body = await json(c, EvaluationRequestSchema);
      const r = await evaluateJob(deps, params.jobId!, body.scenario);
      const res: GateResponse = {
        committed: r.committed,
        reason: r.reason,
        decision: r.decision,
        ...(r.record === undefined ? {} : { record: r.record }),
      };
      return jsonAnswer(requestId, res, 200);
    },

    async publishEvent({ c, params, principal, requestId }) {
      const jobId = params.jobId!;
      const body = await json(c, PublishEventRequestSchema);
      const fin = body.finalize;
      if (fin !== undefined) {
        if (principal?.kind === "agent" && fin.attempt_id !== principal.attemptId) {
          throw new MamError("auth.forbidden", `this agent token is bound to attempt ${principal.attemptId}, not ${fin.attempt_id}`);
        }
        // The service finalizes only where it keeps reports: under a recorded dispatch.
        if (!(await deps.jobs.getDispatch(jobId, fin.attempt_id))) {
          await getJob(deps, jobId);
          throw new MamError("dispatch.notFound", `job ${jobId} has no recorded dispatch for attempt ${fin.attempt_id}`, {
            issues: [{ path: "body.finalize.attempt_id", message: "not a recorded dispatch of this job" }],
          });
        }
      }
      const r = await withBodyPaths(() =>
        publishAgentEvent(
          deps,
          jobId,
          {
            event: body.event,
            expectedSeq: body.expected_seq,
            finalize:
              fin === undefined
                ? undefined
                : { location: attemptReportLocation(jobId, fin.attempt_id), attemptId: fin.attempt_id, sideEffects: fin.side_effects },
            data: body.data,
          },
          actorOf(principal),
        ),
      );
      // A publish that fails after the commit is not an error of this request: the
      // transition and its intent are committed, and the intent stays owed until the
      // recovery sweep (or the change relay) delivers it. Answering 5xx would invite
      // the agent to retry a transition that already happened, so the answer is a 200
      // that says so (`published: false` and why). `nothing_owed` means a peer (the
      // change relay) already sent and settled it: published.
      const res: PublishEventResponse = {
        record: r.record,
        published: r.flush.outcome !== "failed",
        ...(r.finalized === undefined
          ? {}
          : { finalized: { manifest: r.finalized.manifest, manifest_sha256: r.finalized.manifestSha256 } }),
        ...(r.flush.outcome === "failed" ? { publish_error: { code: r.flush.error.code, message: r.flush.error.message } } : {}),
        ...(r.warnings.length > 0 ? { warnings: [...r.warnings] } : {}),
      };
      return jsonAnswer(requestId, res, 200);
    },

    async listEvents({ c, params, requestId }) {
      const jobId = params.jobId!;
      const q = await query(c, ListEventsQuerySchema);
      await getJob(deps, jobId);
      const page = await deps.jobs.listEvents(jobId, { limit: q.limit, ...(q.cursor === undefined ? {} : { cursor: q.cursor }) });
      const body: EventLog = { items: [...page.items], ...(page.cursor === undefined ? {} : { next_cursor: page.cursor }) };
      return jsonAnswer(requestId, body, 200);
    },

    async runRecoverySweep({ c, requestId }) {
      await json(c, RecoverySweepRequestSchema, true);
      const r = await recoverNotifications(deps, {
        ...(sweep === undefined ? {} : { policy: sweep }),
        log: (entry) => log(JSON.stringify({ msg: entry.event, request_id: requestId, ...entry })),
      });
      const body: RecoverySweepResult = {
        owed: r.owed,
        sent: r.sent,
        failed: r.failed,
        quarantined: r.quarantined,
        not_tried: r.not_tried,
        results: [...r.results],
      };
      return jsonAnswer(requestId, body, 200);
    },

    async releaseNotification({ c, params, requestId }) {
      const body = await json(c, NotificationReleaseRequestSchema, true);
      const r = await releaseNotification(deps, params.jobId!, body.intent_id === undefined ? {} : { intentId: body.intent_id });
      const answer: NotificationReleaseResult = { released: r.released, reason: r.reason, record: r.record };
      return jsonAnswer(requestId, answer, 200);
    },

    getOpenApi({ requestId }) {
      return answer(requestId, openApi(), 200, { "content-type": "application/json; charset=utf-8", "cache-control": "no-cache" });
    },

    getDocs({ requestId }) {
      return answer(requestId, DOCS_HTML, 200, { ...HTML_HEADERS, "content-security-policy": DOCS_CSP });
    },

    async getDocsAsset({ c, requestId }) {
      const name = c.req.param("file") ?? "";
      const asset = await readDocsAsset(name);
      if (asset === undefined) {
        const problem = problemBody("route.notFound", `no docs asset ${JSON.stringify(name).slice(0, 80)} in this deployment`, {
          requestId,
          instance: c.req.path,
        });
        return problemResponse(problem);
      }
      return answer(requestId, asset.body, 200, {
        "content-type": asset.contentType,
        "cache-control": "public, max-age=86400",
        "x-content-type-options": "nosniff",
      });
    },

    getHealth({ requestId }) {
      return jsonAnswer(requestId, { ok: true as const }, 200);
    },

    getDashboard({ requestId }) {
      return answer(requestId, DASHBOARD_HTML, 200, { ...HTML_HEADERS, "content-security-policy": DASHBOARD_CSP });
    },

    getAsset({ c, requestId }) {
      const name = c.req.param("file") ?? "";
      const asset = Object.hasOwn(DASHBOARD_ASSETS, name) ? DASHBOARD_ASSETS[name] : undefined;
      if (asset === undefined) {
        const problem = problemBody("route.notFound", `no asset ${JSON.stringify(name).slice(0, 80)}`, { requestId, instance: c.req.path });
        return problemResponse(problem);
      }
      return answer(requestId, asset.body, 200, {
        "content-type": asset.contentType,
        "cache-control": "no-cache",
        "x-content-type-options": "nosniff",
      });
    },
  };
}

// ---- helpers

function authenticate(header: string | undefined, tokens: TokenService): Principal {
  if (header === undefined || header.trim() === "") throw new MamError("auth.missing", "send Authorization: Bearer <token>");
  const m = /^Bearer +([^\s]+)\s*$/i.exec(header);
  if (!m) throw new MamError("auth.invalid", "the Authorization header is not a Bearer token");
  return tokens.verify(m[1]!);
}

function actorOf(principal: Principal | undefined): Actor {
  if (principal?.kind === "agent") return { kind: "agent", jobId: principal.jobId, attemptId: principal.attemptId };
  return principal === undefined ? { kind: "operator" } : { kind: "operator", id: principal.tokenId };
}

function actorLabel(principal: Principal | undefined): string {
  if (principal === undefined) return "anonymous";
  if (principal.kind === "agent") return `agent:${principal.jobId}/${principal.attemptId}`;
  return `operator:${principal.tokenId}`;
}

function pathParams(c: Context<AppEnv>, spec: RouteSpec): PathParams {
  const raw: Record<string, string> = {};
  for (const name of spec.params) if (name !== "file") raw[name] = c.req.param(name) ?? "";
  if (Object.keys(raw).length === 0) return {};
  const p = validate(PathParamsSchema, raw, "path");
  return { ...(p.job_id === undefined ? {} : { jobId: p.job_id }), ...(p.attempt === undefined ? {} : { attempt: p.attempt }) };
}

function recordResponse(requestId: string, record: JobRecord, status: 200 | 201, headers: Record<string, string> = {}): Response {
  return answer(requestId, recordJson(record), status, { "content-type": JSON_TYPE, etag: `"${record.transition_seq}"`, ...headers });
}

/**
 * A record's JSON, written once per frozen record object: a store that hands out the
 * same frozen object while the record is unchanged (the SQLite store's cache) is not
 * serialized again on every read. A record that is not frozen could change after it
 * was written, so it is written afresh each time.
 */
const RECORD_JSON = new WeakMap<JobRecord, string>();
function recordJson(record: JobRecord): string {
  let json = RECORD_JSON.get(record);
  if (json === undefined) {
    json = JSON.stringify(record);
    if (Object.isFrozen(record)) RECORD_JSON.set(record, json);
  }
  return json;
}

const JSON_TYPE = "application/json";
const HTML = "text/html; charset=UTF-8";

/**
 * Every HTML answer: not to be sniffed as anything else, framed by nobody, and no
 * Referer leaving the page. Each page's CSP allows scripts from the app alone, none
 * inline (`script-src 'self'`). Swagger UI styles its elements from script, so the
 * docs page allows inline styles; the dashboard does not.
 */
const HTML_HEADERS = {
  "content-type": HTML,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  "cache-control": "no-cache",
} as const;
const DASHBOARD_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
const DOCS_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; font-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/** What nginx logs for a client that closed its connection before the answer: not a status anybody receives. */
const CLIENT_CLOSED_REQUEST = 499;

/**
 * The client went away mid-request: the runtime aborted the request's signal
 * (@hono/node-server does when the connection closes before the answer), or reading
 * its body failed with the HTTP server's own "aborted" reset. A MamError is a
 * refusal or a store's failure (a store's socket reset is wrapped in one), never this.
 */
function clientAborted(req: Request, err: unknown): boolean {
  if (req.signal.aborted) return true;
  if (err instanceof MamError) return false;
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if ((e as { code?: unknown }).code === "ECONNRESET" && e.message === "aborted") return true;
  }
  return false;
}

/**
 * Every answer but a problem (`problemResponse`) is built here, with the request id.
 * Its headers stay a plain object, which @hono/node-server writes as they are;
 * `c.header()`, or more than one header through `c.json()`, makes Hono build a
 * `Headers` object for the response instead, a measurable share of a request
 * (bench/http.ts).
 */
function answer(requestId: string, body: string | Uint8Array<ArrayBuffer>, status: number, headers: Record<string, string>): Response {
  return new Response(body, { status, headers: { ...headers, "x-request-id": requestId } });
}

function jsonAnswer(requestId: string, value: unknown, status: 200 | 201, headers: Record<string, string> = {}): Response {
  return answer(requestId, JSON.stringify(value), status, { "content-type": JSON_TYPE, ...headers });
}

/** `*`, or the seqs named by strong entity tags (`"3"`; bare digits tolerated). Weak tags never match. */
function parseIfMatch(header: string): "*" | number[] {
  if (header.trim() === "*") return "*";
  return header
    .split(",")
    .map((t) => t.trim())
    .map((t) => /^"(\d{1,15})"$/.exec(t)?.[1] ?? /^(\d{1,15})$/.exec(t)?.[1])
    .filter((t): t is string => t !== undefined)
    .map(Number);
}

/** Core names fields relative to the request body (`fields.role`); the API names them from the request (`body.fields.role`). */
async function withBodyPaths<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof MamError && e.issues.length > 0 && e.constructor === MamError && e.issues.some((i) => !i.path.startsWith("body"))) {
      throw new MamError(e.code, e.message, {
        issues: e.issues.map((i) => (i.path.startsWith("body") ? i : { path: `body.${i.path}`, message: i.message })),
        details: { ...e.details },
        cause: e,
      });
    }
    throw e;
  }
}

/**
 * Every 409 about the job's status carries the record it is about (`current`).
 * Core's recordDispatch refuses a terminal job with a bare `job.transitionRefused`
 * (reported as a core gap); read the record on that error path only and attach it.
 */
async function withCurrentRecord<T>(deps: Deps, jobId: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof MamError && e.code === "job.transitionRefused" && e.details.current === undefined) {
      const current = await deps.jobs.get(jobId);
      if (current !== undefined) throw new MamError(e.code, e.message, { issues: e.issues, details: { ...e.details, current }, cause: e });
    }
    throw e;
  }
}

const honoPath = (path: string): string => path.replace(/\{([a-z_]+)\}/g, ":$1");

const pathPattern = (path: string): RegExp =>
  new RegExp(`^${path.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\\?\{[a-z_]+\\?\}/g, "[^/]+")}$`);
