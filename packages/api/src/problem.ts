import { ERROR_TABLE, type ErrorCode, type FieldIssue, MamError, problemType } from "@mam/core";

export const PROBLEM_CONTENT_TYPE = "application/problem+json";

/**
 * Problems the HTTP layer raises that have no domain meaning, so core's closed
 * table has no code for them (reported as a gap): an unknown path, a known path
 * with another method.
 */
export const ROUTING_PROBLEMS = {
  "route.notFound": { status: 404, title: "No such route" },
  "route.methodNotAllowed": { status: 405, title: "Method not allowed on this route" },
} as const;
export type RoutingCode = keyof typeof ROUTING_PROBLEMS;
export type ProblemCode = ErrorCode | RoutingCode;

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

function describe(code: ProblemCode): { status: number; title: string; type: string } {
  if (code in ROUTING_PROBLEMS) {
    const r = ROUTING_PROBLEMS[code as RoutingCode];
    return { status: r.status, title: r.title, type: `https://mam.dev/problems/${code}` };
  }
  const e = ERROR_TABLE[code as ErrorCode];
  return { status: e.status, title: e.title, type: problemType(code as ErrorCode) };
}

export function problemBody(
  code: ProblemCode,
  detail: string,
  ctx: { requestId: string; instance?: string },
  extra: { issues?: readonly FieldIssue[]; details?: Readonly<Record<string, unknown>> } = {},
): Problem {
  const d = describe(code);
  return {
    // Extension members first, so they can never shadow a standard member.
    ...(extra.details ?? {}),
    type: d.type,
    title: d.title,
    status: d.status,
    detail,
    code,
    ...(ctx.instance === undefined ? {} : { instance: ctx.instance }),
    request_id: ctx.requestId,
    ...(extra.issues !== undefined && extra.issues.length > 0 ? { errors: extra.issues } : {}),
  };
}

/** A `Response` with the problem, its status, its content type and the headers its code calls for. */
export function problemResponse(problem: Problem, headers: Record<string, string> = {}): Response {
  const h = new Headers({ "content-type": PROBLEM_CONTENT_TYPE, "cache-control": "no-store", ...headers });
  if (typeof problem.request_id === "string") h.set("x-request-id", problem.request_id);
  if (problem.code === "auth.missing") h.set("www-authenticate", 'Bearer realm="mam"');
  if (problem.code === "auth.invalid")
    h.set("www-authenticate", `Bearer realm="mam", error="invalid_token", error_description="${quoteSafe(problem.detail)}"`);
  if (problem.code === "auth.forbidden" && typeof problem.required_scope === "string") {
    h.set("www-authenticate", `Bearer realm="mam", error="insufficient_scope", scope="${problem.required_scope}"`);
  }
  return new Response(JSON.stringify(problem), { status: problem.status, headers: h });
}

/**
 * Any thrown value as a problem. A MamError is mapped through core's ERROR_TABLE
 * (its issues become `errors`, its details extension members such as `current`);
 * anything else is a 500 with a generic detail, and `unexpected` is true so the
 * caller logs it.
 */
export function problemFor(err: unknown, ctx: { requestId: string; instance?: string }): { problem: Problem; unexpected: boolean } {
  if (err instanceof MamError) {
    if (err.code === "internal") {
      return { problem: problemBody("internal", GENERIC_INTERNAL_DETAIL, ctx), unexpected: true };
    }
    return { problem: problemBody(err.code, err.message, ctx, { issues: err.issues, details: err.details }), unexpected: false };
  }
  return { problem: problemBody("internal", GENERIC_INTERNAL_DETAIL, ctx), unexpected: true };
}

function quoteSafe(s: string): string {
  return s.replace(/[^\x20-\x7e]/g, "?").replace(/["\\]/g, "'");
}
