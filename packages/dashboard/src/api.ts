import type { components, paths } from "@mam/client/schema";
import createClient, { type Client } from "openapi-fetch";

/** The API's named schemas, as the service sends them. */
export type Schemas = components["schemas"];
export type JobRecord = Schemas["JobRecord"];
export type ChangeRow = Schemas["ChangeRow"];
export type TokenInfo = Schemas["TokenInfo"];
export type GateDryRun = Schemas["GateDryRun"];
export type Verification = Schemas["Verification"];
export type Status = JobRecord["status"];
export type Scope = "read" | "write" | "gate" | "ops" | "observe";

export const STATUSES: readonly Status[] = ["pending", "running", "completed", "error", "cancelled"];

/** A refusal or failure of the API, as the person at the page should read it. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    detail: string,
    readonly retryAfterSeconds?: number,
  ) {
    super(detail);
  }
}

/** The problem+json answer's detail, else its title, else the status line. */
async function errorOf(response: Response): Promise<ApiError> {
  let code = "http.error";
  let detail = `${response.status} ${response.statusText}`;
  try {
    const problem = (await response.clone().json()) as { code?: unknown; detail?: unknown; title?: unknown };
    if (typeof problem.code === "string") code = problem.code;
    if (typeof problem.detail === "string") detail = problem.detail;
    else if (typeof problem.title === "string") detail = problem.title;
  } catch {
    // not JSON: the status line says it
  }
  const retry = Number(response.headers.get("retry-after"));
  return new ApiError(response.status, code, detail, Number.isFinite(retry) && retry > 0 ? retry : undefined);
}

/**
 * The typed client (openapi-fetch over the types generated from the served document),
 * with the token in the `Authorization` header on every request: never in a URL or a
 * cookie. A non-2xx answer rejects with an ApiError naming the problem's detail; an
 * unreachable service with status 0. A 401 (the token expired or was revoked while the
 * page was open: the feed's stream, opened before, does not end for it) also calls
 * `onUnauthorized`, so the page returns to sign-in at the first refused read.
 */
export function apiOf(token: string, onUnauthorized: () => void = () => undefined): Client<paths> {
  const client = createClient<paths>({ baseUrl: new URL(".", location.href).href.replace(/\/$/, "") });
  client.use({
    onRequest({ request }) {
      request.headers.set("authorization", `Bearer ${token}`);
      return request;
    },
    async onResponse({ response }) {
      if (response.status === 401) onUnauthorized();
      if (!response.ok) throw await errorOf(response);
      return undefined;
    },
    onError({ error }) {
      if (error instanceof ApiError) return error;
      return new ApiError(
        0,
        "service.unreachable",
        `the service could not be reached (${error instanceof Error ? error.message : String(error)})`,
      );
    },
  });
  return client;
}

export type Api = Client<paths>;

/** The body of a call's 2xx answer. */
export async function ok<D>(call: Promise<{ data?: D; response: Response }>): Promise<D> {
  const { data, response } = await call;
  if (data === undefined) throw new ApiError(response.status, "http.empty", `the service answered ${response.status} with no body`);
  return data;
}

/** A raw request with the token (the report text and the feed stream, which are not JSON). */
export async function fetchWithToken(token: string, path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.set("authorization", `Bearer ${token}`);
  let response: Response;
  try {
    response = await fetch(new URL(path, location.href), { ...init, headers });
  } catch (e) {
    if (e instanceof DOMException && e.name === "AbortError") throw e;
    throw new ApiError(0, "service.unreachable", `the service could not be reached (${e instanceof Error ? e.message : String(e)})`);
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

/**
 * How long to wait before reading again after `e`: the service's Retry-After, else
 * 2 s; undefined where reading again cannot help (401, 403, 404).
 */
export function retryWaitMs(e: unknown): number | undefined {
  if (e instanceof ApiError && (e.status === 401 || e.status === 403 || e.status === 404)) return undefined;
  return e instanceof ApiError && e.retryAfterSeconds !== undefined ? e.retryAfterSeconds * 1000 : 2000;
}

/** What a token may do, from `GET /v1/token`'s scopes. */
export function can(info: TokenInfo | undefined, scope: Scope): boolean {
  return info !== undefined && info.kind === "operator" && info.scopes.includes(scope);
}
