import { defineOpenAPIRoute, type OpenAPIHono, type OpenAPIRoute } from "@hono/zod-openapi";
import { type Actor, HOOK_BODY_MAX_BYTES, type JobRecord, MamError } from "@mam/core";
import type { Context, MiddlewareHandler } from "hono";
import { bearerAuth, requireAccess } from "../access.ts";
import { hookBody, jsonBody, reportBody } from "../body.ts";
import type { AppEnv, Services } from "../context.ts";
import type { MamRoute } from "../openapi.ts";
import { isReadToken } from "../rate-limit.ts";
import type { Principal } from "../tokens.ts";

export type MamApp = OpenAPIHono<AppEnv>;

/**
 * A route as one value: its declaration (`defineRoute`) and its handler, which
 * reads the app's services from its context (`c.var.services`) — zod-openapi's
 * `defineOpenAPIRoute`, over this app's context.
 */
export function withHandler<R extends MamRoute>(route: R, handler: OpenAPIRoute<R, AppEnv>["handler"]): OpenAPIRoute<R, AppEnv> {
  return defineOpenAPIRoute<R, AppEnv>({ route, handler });
}

/**
 * Registers the routes (`app.openapiRoutes`), each with the middleware its
 * declaration implies, before the route's own validators and handler: for a
 * protected route the bearer token (401), the path and the token's access to it
 * (400, 403); for a body, its limit (413) — Hono's `bodyLimit` and the depth check
 * on a JSON body, the streaming limit on a report.
 */
export function registerRoutes(
  app: MamApp,
  services: Services,
  routes: readonly { readonly route: MamRoute; readonly handler: unknown }[],
): void {
  app.openapiRoutes(routes.map(({ route, handler }) => ({ route: withMiddleware(route, services), handler })));
}

function withMiddleware<R extends MamRoute>(route: R, services: Services): R {
  const access = route["x-mam-access"];
  const middleware: MiddlewareHandler<AppEnv>[] = [];
  if (access.kind === "protected") {
    middleware.push(bearerAuth(services), limitReadTokens(services), requireAccess(access, route.request?.params, services));
  }
  const body = route.request?.body?.content;
  if (route["x-mam-body"] === "scanned") middleware.push(hookBody<AppEnv>(HOOK_BODY_MAX_BYTES));
  else if (body?.["application/json"] !== undefined) middleware.push(...jsonBody(services.settings.jsonBodyLimit));
  // Where the store has no upload address of its own, declared uploads come through the report route.
  // (Asked per request: building the routes, and so the document, touches no store.)
  else if (body !== undefined) {
    const uploadsHere = reportBody<AppEnv>(services.settings.reportBodyLimit, services.settings.reportUploadLimit);
    const bodiesOnly = reportBody<AppEnv>(services.settings.reportBodyLimit);
    middleware.push((c, next) => (services.deps.reports.uploadUrl === undefined ? uploadsHere : bodiesOnly)(c, next));
  }
  const own = route.middleware === undefined ? [] : [route.middleware].flat();
  return { ...route, middleware: [...middleware, ...own] };
}

/** A job record as the answer, with its `ETag` (the record's `transition_seq`). */
export function recordAnswer<S extends 200 | 201>(c: Context<AppEnv>, record: JobRecord, status: S, headers: Record<string, string> = {}) {
  return c.json(record, status, { etag: `"${record.transition_seq}"`, ...headers });
}

/** Who a protected route's caller is, as core records it. */
export function actorOf(principal: Principal): Actor {
  if (principal.kind === "agent")
    return { kind: "agent", jobId: principal.jobId, attemptId: principal.attemptId, tokenId: principal.tokenId };
  return { kind: "operator", id: principal.tokenId };
}

/** Core names fields relative to the request body (`fields.role`); the API names them from the request (`body.fields.role`). */
export async function withBodyPaths<T>(fn: () => Promise<T>): Promise<T> {
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

/** After `bearerAuth`: a read token past its rate is `429 rate.limited` (with Retry-After), before the route reads anything. */
function limitReadTokens({ readRates, settings, deps }: Pick<Services, "readRates" | "settings" | "deps">): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const principal = c.var.principal;
    if (principal !== undefined && isReadToken(principal) && !readRates.take(principal.tokenId, deps.clock.now().getTime())) {
      throw new MamError(
        "rate.limited",
        `this read token made more than ${settings.readTokenRatePerMinute} requests a minute (MAM_READ_TOKEN_RATE_PER_MINUTE, counted per service process); slow down — a dashboard polls every 10 s`,
        { details: { per_minute: settings.readTokenRatePerMinute } },
      );
    }
    await next();
  };
}
