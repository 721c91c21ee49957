import { ERROR_TABLE, type ErrorCode, type FieldIssue, MamError } from "@mam/core";
import createClient, { type Client, type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema.ts";

export type { components, operations, paths } from "./schema.ts";

/** The API's named schemas, as the service sends them. */
export type Schemas = components["schemas"];

/**
 * The JSON body of an operation's 2xx answer, by path and method:
 * `Answer<"/v1/jobs/{job_id}/events", "post">`. Named by the route rather than by a
 * component's name, which the document may choose differently.
 */
export type Answer<P extends keyof paths, M extends "get" | "post" | "put"> = paths[P][M] extends { responses: infer R }
  ? JsonBody<R[200 & keyof R]> | JsonBody<R[201 & keyof R]>
  : never;
type JsonBody<Response> = Response extends { content: { "application/json": infer Body } } ? Body : never;

export type MamClient = Client<paths>;

export interface MamClientOptions {
  /** The service, e.g. `http://127.0.0.1:8787`. */
  readonly baseUrl: string;
  /** Sent as `Authorization: Bearer <token>` on every request. */
  readonly token?: string | undefined;
  /** A fetch of the caller's (an app's `app.request` in tests); the global one by default. */
  readonly fetch?: typeof fetch;
}

/**
 * A typed client for the mam API (openapi-fetch over the types generated from the
 * served document), with mam's conventions built in:
 *
 * - the bearer token on every request;
 * - every answer that is not a 2xx rejects with core's `MamError`, carrying the
 *   problem's code, detail and bad fields (`issues`), and in `details` its status,
 *   request id and, on a 409/412, the record as it now stands (`current`);
 * - a service that cannot be reached rejects with `service.unreachable`.
 *
 * So a call either resolves with its 2xx answer or rejects with a MamError; `ok()`
 * takes the answer's body out.
 */
export function createMamClient(options: MamClientOptions): MamClient {
  const client = createClient<paths>({
    baseUrl: options.baseUrl,
    ...(options.fetch === undefined ? {} : { fetch: options.fetch }),
  });
  client.use(mamConventions(options));
  return client;
}

function mamConventions(options: MamClientOptions): Middleware {
  return {
    onRequest({ request }) {
      if (options.token !== undefined) request.headers.set("authorization", `Bearer ${options.token}`);
      return request;
    },
    onError({ error }) {
      if (error instanceof MamError) return error;
      const why = error instanceof Error ? error.message : String(error);
      return new MamError("service.unreachable", `the mam service at ${options.baseUrl} could not be reached: ${why}`, { cause: error });
    },
    async onResponse({ response }) {
      if (!response.ok) throw await problemError(response);
      return undefined;
    },
  };
}

/** The body of a call's 2xx answer; an answer without one (none is declared so) is the service's fault. */
export async function ok<D>(call: Promise<{ data?: D; response: Response }>): Promise<D> {
  const { data, response } = await call;
  if (data === undefined) throw new MamError("internal", `the mam service answered ${response.status} with no body`);
  return data;
}

/** What the client reads of an `application/problem+json` answer (RFC 9457 and mam's members); any of it may be missing. */
interface Problem {
  readonly title?: unknown;
  readonly detail?: unknown;
  readonly code?: unknown;
  readonly request_id?: unknown;
  readonly errors?: unknown;
  readonly current?: unknown;
}

/**
 * A non-2xx answer as the MamError it stands for. A problem whose code is core's
 * keeps it; anything else (a routing problem, a proxy's HTML page) is named by its
 * status: 502-504 as a service that could not be reached, other 4xx as bad input.
 */
const isFieldIssue = (i: unknown): i is FieldIssue =>
  i !== null && typeof i === "object" && typeof (i as FieldIssue).path === "string" && typeof (i as FieldIssue).message === "string";

export async function problemError(response: Response): Promise<MamError> {
  const text = await response.text().catch(() => "");
  let problem: Problem = {};
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed !== null && typeof parsed === "object" && !Array.isArray(parsed)) problem = parsed as Problem;
  } catch {
    // not JSON: named by its status below
  }
  const known = typeof problem.code === "string" && Object.hasOwn(ERROR_TABLE, problem.code);
  const code: ErrorCode = known
    ? (problem.code as ErrorCode)
    : response.status >= 502 && response.status <= 504
      ? "service.unreachable"
      : response.status >= 400 && response.status < 500
        ? "input.invalid"
        : "internal";
  const detail =
    typeof problem.detail === "string" && problem.detail !== ""
      ? problem.detail
      : typeof problem.title === "string" && problem.title !== ""
        ? problem.title
        : `${response.status} ${response.statusText || "from the mam service"}`;
  const message = known || typeof problem.code !== "string" ? detail : `${detail} (${problem.code})`;
  const issues: FieldIssue[] = Array.isArray(problem.errors) ? problem.errors.filter(isFieldIssue) : [];
  return new MamError(code, message, {
    issues,
    details: {
      status: response.status,
      ...(typeof problem.code === "string" ? { problem_code: problem.code } : {}),
      ...(typeof problem.request_id === "string" ? { request_id: problem.request_id } : {}),
      ...(problem.current === undefined ? {} : { current: problem.current }),
    },
  });
}
