import { createRoute, type RouteConfig } from "@hono/zod-openapi";
import { ERROR_TABLE, type ErrorCode } from "@mam/core";
import type { z } from "zod";
import type { Access } from "./access.ts";
import { EXAMPLE } from "./examples.ts";
import {
  HTTP_STATUS,
  PROBLEM_CONTENT_TYPE,
  type ProblemCode,
  problemBody,
  RETRY_AFTER_SECONDS,
  ROUTING_PROBLEMS,
  type RoutingCode,
} from "./problem.ts";
import { ProblemSchema } from "./wire.ts";

/**
 * One route, declared once: `@hono/zod-openapi`'s `createRoute` (path, query,
 * headers and body schemas; every response; security), plus who may call it
 * (`x-mam-access`, read by the app's access middleware and published in the
 * document). The problem responses every route can give follow from the
 * declaration: 400 when anything is validated, 401 and 403 when it is protected,
 * 413 and 415 for a JSON body, 503 when a store is behind it, 500 always; `problems`
 * adds the route's own (404, 409, 412...), each with an example.
 */
export type MamRoute = RouteConfig & {
  readonly "x-mam-access": Access;
  /** `scanned`: the body is read as it streams by core's hook scanner, never buffered (an agent hook's event). */
  readonly "x-mam-body"?: "scanned";
};

export function defineRoute<const R extends RouteConfig>(
  access: Access,
  config: R,
  problems: readonly (number | Problem)[] = [],
): R & { readonly "x-mam-access": Access } {
  const own = new Map<number, Problem>();
  for (const p of problems) {
    const example = typeof p === "number" ? defaultProblem(p) : p;
    own.set(example.status, example);
  }
  const request = config.request;
  // A protected route's path names a job (and an attempt), refused 400 when it is not
  // one; a public route's path names a file it looks up (404 when there is none).
  const validated = request?.query ?? request?.headers ?? request?.body ?? (access.kind === "protected" ? request?.params : undefined);
  const jsonBody = request?.body?.content["application/json"] !== undefined;
  const statuses = new Set<number>(own.keys());
  if (validated !== undefined) statuses.add(400);
  if (request?.body !== undefined) statuses.add(413);
  if (jsonBody) statuses.add(415);
  if (access.kind === "protected") {
    statuses.add(401);
    statuses.add(403);
    // A read token past its rate (MAM_READ_TOKEN_RATE_PER_MINUTE), on any protected route.
    statuses.add(429);
    statuses.add(503);
  }
  statuses.add(500);
  const responses: Record<string, unknown> = { ...config.responses };
  if (validated !== undefined && !own.has(400)) own.set(400, badRequest(request));
  for (const status of [...statuses].sort()) responses[String(status)] = problemResponse(own.get(status) ?? defaultProblem(status));
  return createRoute({
    ...config,
    responses,
    security: access.kind === "public" ? [] : [{ bearerAuth: [access.scope] }],
    "x-mam-access": access,
  } as R & { "x-mam-access": Access });
}

// ---- responses

export const REQUEST_ID_HEADER = {
  "X-Request-Id": {
    description: "The request id: the caller's own when it sent a sane one, otherwise a UUID. Quote it when reporting a problem.",
    schema: { type: "string", pattern: "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", example: EXAMPLE.requestId },
  },
} as const;

export const ETAG_HEADER = {
  ETag: {
    description: "The record's `transition_seq`, quoted: send it back as `If-Match` on a transition.",
    schema: { type: "string", pattern: '^"[0-9]+"$', example: '"2"' },
  },
} as const;

export const LOCATION_HEADER = {
  Location: {
    description: "Where the registered job is read.",
    schema: { type: "string", example: `/v1/jobs/${EXAMPLE.jobId}` },
  },
} as const;

/** A JSON answer: its schema, an example, and the headers it carries besides `X-Request-Id`. */
export function jsonAnswer<S extends z.ZodType, const H extends object = Record<never, never>>(
  description: string,
  schema: S,
  example: unknown,
  headers?: H,
): { description: string; headers: typeof REQUEST_ID_HEADER & H; content: { "application/json": { schema: S; example: unknown } } } {
  return { description, headers: { ...REQUEST_ID_HEADER, ...(headers as H) }, content: { "application/json": { schema, example } } };
}

/** A JSON request body: its schema and named examples. */
export function jsonRequest<S extends z.ZodType>(
  schema: S,
  examples: Record<string, { summary: string; value: unknown }>,
  opts: { required?: boolean; description?: string } = {},
) {
  return {
    required: opts.required ?? true,
    description:
      opts.description ??
      "JSON, at most the configured body limit (`MAM_JSON_BODY_LIMIT`, 1 MiB by default) and 64 levels deep; unknown fields are refused.",
    content: { "application/json": { schema, examples } },
  };
}

// ---- problems

export type Problem = ReturnType<typeof problemBody>;

const EXAMPLE_DETAIL: Partial<Record<ProblemCode, string>> = {
  "input.invalid": "invalid body: body.fields.progress: free-form progress: more than 8192 bytes of JSON",
  "input.tooLarge": "the JSON body is larger than the limit of 1048576 bytes",
  "input.unsupportedMediaType": 'this route takes application/json, not "text/plain"',
  "auth.missing": "send Authorization: Bearer <token>",
  "auth.forbidden": "this operator token lacks the write scope (it has read)",
  "job.notFound": `no job ${EXAMPLE.jobId}`,
  "job.preconditionFailed": `If-Match "1" does not match job ${EXAMPLE.jobId}'s transition_seq 2`,
  "job.transitionConflict": `stale transition_seq: you expected 1, but job ${EXAMPLE.jobId} is at 2 (status running); re-read it and decide again`,
  "store.unavailable": "the job store could not be reached; try again",
  "stream.tooMany":
    "this agent's job and attempt already hold 4 open streams, the bound per agent attempt (MAM_FEED_STREAMS_PER_AGENT); close one first",
  "rate.limited":
    "this read token made more than 600 requests a minute (MAM_READ_TOKEN_RATE_PER_MINUTE, counted per service process); slow down — a dashboard polls every 10 s",
  "store.insufficientSpace":
    "the store's disk has 52428800 bytes free; 41943040 more would leave less than the floor of 67108864 bytes kept for the service's own records (MAM_DISK_FLOOR_BYTES); nothing was written; retry once space is freed",
  "quota.events": `job ${EXAMPLE.jobId} has taken its quota of 10000 agent events (MAM_QUOTA_JOB_EVENTS); nothing was written`,
  "report.uploadInFlight": `an upload of attempt 1 of job ${EXAMPLE.jobId} is in flight by agent, since 2026-07-01T12:00:00.000Z, until it ends or at the latest 2026-07-01T12:15:00.000Z; nothing was written; try again then`,
  "report.finalizeInProgress": `a finalize of attempt 1 of job ${EXAMPLE.jobId} is in progress by agent, since 2026-07-01T12:00:00.000Z, until it ends or at the latest 2026-07-01T12:05:00.000Z; nothing was written; try again then`,
  "route.notFound": `no asset "${EXAMPLE.file}.map"`,
  internal: "an unexpected error occurred; quote the request id when reporting it",
};

const STATUS_EXAMPLE_CODE: Record<number, ProblemCode> = {
  400: "input.invalid",
  401: "auth.missing",
  403: "auth.forbidden",
  404: "job.notFound",
  405: "route.methodNotAllowed",
  409: "job.transitionConflict",
  412: "job.preconditionFailed",
  413: "input.tooLarge",
  415: "input.unsupportedMediaType",
  429: "rate.limited",
  500: "internal",
  503: "store.unavailable",
  507: "store.insufficientSpace",
};

/** An example problem: the code given, or the commonest code of the status. */
export function exampleProblem(
  code: ProblemCode,
  detail = EXAMPLE_DETAIL[code] ?? ERROR_TITLES[code],
  extra: Parameters<typeof problemBody>[3] = {},
): Problem {
  const issues =
    extra.issues ??
    (code === "input.invalid"
      ? [{ path: "body.fields.progress", message: "free-form progress: more than 8192 bytes of JSON" }]
      : code === "input.tooLarge"
        ? [{ path: "body", message: "at most 1048576 bytes" }]
        : undefined);
  const details =
    extra.details ??
    (code === "job.transitionConflict" || code === "job.preconditionFailed"
      ? { current: EXAMPLE.runningJob }
      : code === "auth.forbidden"
        ? { required_scope: "write" }
        : undefined);
  return problemBody(
    code,
    detail,
    { requestId: EXAMPLE.requestId, instance: `/v1/jobs/${EXAMPLE.jobId}` },
    { ...(issues === undefined ? {} : { issues }), ...(details === undefined ? {} : { details }) },
  );
}

/** A 400 of the kind the route's input gives: a bad field of its body, a bad job id in its path, a bad query parameter. */
function badRequest(request: RouteConfig["request"]): Problem {
  const bad = (code: "input.invalid" | "input.jobId", where: string, path: string, message: string) =>
    exampleProblem(code, `invalid ${where}: ${path}: ${message}`, { issues: [{ path, message }] });
  if (request?.body?.content["application/json"] !== undefined) return bad("input.invalid", "body", "body.colour", "unknown field");
  if (request?.params !== undefined) return bad("input.jobId", "path", "path.job_id", JOB_ID_MESSAGE);
  return bad("input.invalid", "query", "query.limit", "Too big: expected number to be <=200");
}

const JOB_ID_MESSAGE = "a job id is 1-64 letters, digits, '_' or '-', starting with a letter or digit";

function defaultProblem(status: number): Problem {
  const code = STATUS_EXAMPLE_CODE[status];
  if (code === undefined) throw new Error(`no example problem for status ${status}`);
  return exampleProblem(code);
}

const ERROR_TITLES: Record<ProblemCode, string> = {
  ...Object.fromEntries(Object.entries(ERROR_TABLE).map(([code, e]) => [code, e.title])),
  ...Object.fromEntries(Object.entries(ROUTING_PROBLEMS).map(([code, e]) => [code, e.title])),
} as Record<ProblemCode, string>;

/** Every code answered with `status`, by title: a problem response's description. */
function codesOf(status: number): string {
  const codes = [
    ...(Object.keys(HTTP_STATUS) as ErrorCode[]).filter((c) => HTTP_STATUS[c] === status),
    ...(Object.keys(ROUTING_PROBLEMS) as RoutingCode[]).filter((c) => ROUTING_PROBLEMS[c].status === status),
  ];
  return codes.map((c) => `\`${c}\`: ${ERROR_TITLES[c]}`).join("; ");
}

export function problemResponse(example: Problem) {
  const status = example.status;
  const headers: Record<string, unknown> = { ...REQUEST_ID_HEADER };
  if (status === 401 || status === 403) {
    headers["WWW-Authenticate"] = {
      description: "The Bearer challenge (RFC 6750): `invalid_token` on a bad token, `insufficient_scope` naming the scope a token lacks.",
      schema: { type: "string", example: 'Bearer realm="mam", error="insufficient_scope", scope="write"' },
    };
  }
  if (status === 503 || status === 507 || status === 429) {
    headers["Retry-After"] = {
      description:
        status === 429
          ? "Seconds to wait before trying again: a read token past its rate, until its next request can go (at least 5), or a token holding as many open streams as it may, or a quota."
          : status === 507
            ? "Seconds to wait before trying again: the store's disk is below the floor kept for the service's own records."
            : "Seconds to wait before trying again: the store or the broker could not be reached.",
      schema: { type: "integer", minimum: 1, example: RETRY_AFTER_SECONDS },
    };
  }
  return {
    description: codesOf(status) || "Problem",
    headers,
    content: { [PROBLEM_CONTENT_TYPE]: { schema: ProblemSchema, example } },
  };
}
