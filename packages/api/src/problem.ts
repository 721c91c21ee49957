import { ERROR_TABLE, type ErrorCode, type FieldIssue, MamError, problemType } from "@mam/core";
import type { Context } from "hono";

export const PROBLEM_CONTENT_TYPE = "application/problem+json";

/**
 * Each of core's error codes, mapped once to its HTTP status. `satisfies` keeps the
 * map total: a code added to core without a status here does not compile.
 */
export const HTTP_STATUS = {
  "input.invalid": 400,
  "input.jobId": 400,
  "input.sideEffect": 400,
  "input.tooLarge": 413,
  "input.unsupportedMediaType": 415,
  "job.notFound": 404,
  "job.exists": 409,
  "job.transitionConflict": 409,
  "job.transitionRefused": 409,
  "job.evidenceConflict": 409,
  "job.evidenceMissing": 409,
  "job.preconditionFailed": 412,
  "job.fieldNotAllowed": 403,
  "job.actionForbidden": 403,
  "bookkeeping.fieldRefused": 400,
  "dispatch.exists": 409,
  "dispatch.outOfOrder": 409,
  "dispatch.notFound": 404,
  "observation.mismatch": 409,
  "report.notFound": 404,
  "report.frozen": 409,
  "report.notLatest": 409,
  "report.changed": 409,
  "report.location": 400,
  "report.mismatch": 409,
  "quota.bytes": 413,
  "quota.events": 429,
  "quota.observations": 429,
  "report.uploadInFlight": 409,
  "report.finalizeInProgress": 409,
  "auth.missing": 401,
  "auth.invalid": 401,
  "auth.forbidden": 403,
  "publish.unreachable": 503,
  "publish.refused": 502,
  "publish.tooLarge": 500,
  "store.unavailable": 503,
  "store.unsupported": 500,
  "store.insufficientSpace": 507,
  "service.unreachable": 503,
  "stream.tooMany": 429,
  "rate.limited": 429,
  "config.invalid": 500,
  "store.version": 500,
  internal: 500,
} as const satisfies Record<ErrorCode, number>;

/** What a client should wait before retrying a 503 (a retryable code: the store or the broker could not be reached). */
export const RETRY_AFTER_SECONDS = 5;

/**
 * Problems the HTTP layer raises that have no domain meaning, so core's closed
 * table has no code for them: an unknown path, a known path with another method.
 */
export const ROUTING_PROBLEMS = {
  "route.notFound": { status: 404, title: "No such route" },
  "route.methodNotAllowed": { status: 405, title: "Method not allowed on this route" },
} as const;
export type RoutingCode = keyof typeof ROUTING_PROBLEMS;
export type ProblemCode = ErrorCode | RoutingCode;

/** Thrown by a route for a routing problem (an asset it does not have); answered as its problem. */
export class RoutingProblem extends Error {
  override readonly name = "RoutingProblem";
  constructor(
    readonly code: RoutingCode,
    message: string,
  ) {
    super(message);
  }
}

/** RFC 9457 problem details, with our extension members. */
export interface Problem {
  readonly type: string;
  readonly title: string;
  readonly status: number;
  readonly detail: string;
  readonly code: ProblemCode;
  readonly instance?: string;
  readonly request_id: string;
  readonly errors?: readonly FieldIssue[];
  readonly [extension: string]: unknown;
}

const GENERIC_INTERNAL_DETAIL = "an unexpected error occurred; quote the request id when reporting it";

export function statusOf(code: ProblemCode): number {
  return code in ROUTING_PROBLEMS ? ROUTING_PROBLEMS[code as RoutingCode].status : HTTP_STATUS[code as ErrorCode];
}

export function titleOf(code: ProblemCode): string {
  return code in ROUTING_PROBLEMS ? ROUTING_PROBLEMS[code as RoutingCode].title : ERROR_TABLE[code as ErrorCode].title;
}

export function problemBody(
  code: ProblemCode,
  detail: string,
  ctx: { requestId: string; instance?: string },
  extra: { issues?: readonly FieldIssue[]; details?: Readonly<Record<string, unknown>> } = {},
): Problem {
  return {
    // Extension members first, so they can never shadow a standard member.
    ...(extra.details ?? {}),
    type: code in ROUTING_PROBLEMS ? `https://mam.dev/problems/${code}` : problemType(code as ErrorCode),
    title: titleOf(code),
    status: statusOf(code),
    detail,
    code,
    ...(ctx.instance === undefined ? {} : { instance: ctx.instance }),
    request_id: ctx.requestId,
    ...(extra.issues !== undefined && extra.issues.length > 0 ? { errors: extra.issues } : {}),
  };
}

/**
 * Any thrown value as a problem. A MamError is mapped through HTTP_STATUS (its
 * issues become `errors`, its details extension members such as `current`); a
 * RoutingProblem to its own; anything else is a 500 with a generic detail, and
 * `unexpected` is true so the caller logs it.
 */
export function problemFor(err: unknown, ctx: { requestId: string; instance?: string }): { problem: Problem; unexpected: boolean } {
  if (err instanceof RoutingProblem) return { problem: problemBody(err.code, err.message, ctx), unexpected: false };
  if (err instanceof MamError && err.code !== "internal") {
    return { problem: problemBody(err.code, err.message, ctx, { issues: err.issues, details: err.details }), unexpected: false };
  }
  return { problem: problemBody("internal", GENERIC_INTERNAL_DETAIL, ctx), unexpected: true };
}

/**
 * The problem as the answer: its status, its content type, the request id (set
 * on the context by the request-id middleware) and the headers its code calls for:
 * a Bearer challenge on 401 and a scope one on a scope refusal, `Retry-After` on 503, 507 and 429.
 */
export function problemResponse(c: Context, problem: Problem, headers: Record<string, string> = {}): Response {
  const h: Record<string, string> = { "content-type": PROBLEM_CONTENT_TYPE, "cache-control": "no-store", ...headers };
  if (problem.code === "auth.missing") h["www-authenticate"] = 'Bearer realm="mam"';
  if (problem.code === "auth.invalid") {
    h["www-authenticate"] = `Bearer realm="mam", error="invalid_token", error_description="${quoteSafe(problem.detail)}"`;
  }
  if (problem.code === "auth.forbidden" && typeof problem.required_scope === "string") {
    h["www-authenticate"] = `Bearer realm="mam", error="insufficient_scope", scope="${problem.required_scope}"`;
  }
  if (problem.status === 503 || problem.status === 507 || problem.status === 429) h["retry-after"] = String(retryAfterSeconds(problem));
  return c.body(JSON.stringify(problem), problem.status as 400, h);
}

/** A read token past its rate refills one request every 60 / per_minute s: below 12 a minute, longer than the usual 5 s. */
function retryAfterSeconds(problem: Problem): number {
  const perMinute = problem.code === "rate.limited" ? problem.per_minute : undefined;
  return typeof perMinute === "number" && perMinute > 0 ? Math.max(RETRY_AFTER_SECONDS, Math.ceil(60 / perMinute)) : RETRY_AFTER_SECONDS;
}

function quoteSafe(s: string): string {
  return s.replace(/[^\x20-\x7e]/g, "?").replace(/["\\]/g, "'");
}
