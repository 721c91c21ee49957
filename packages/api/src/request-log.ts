import { randomUUID } from "node:crypto";
import type { Logger } from "@mam/core";
import type { Context, MiddlewareHandler } from "hono";
import { requestId } from "hono/request-id";
import type { AppEnv } from "./context.ts";
import type { Principal } from "./tokens.ts";

const SANE_REQUEST_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/**
 * Hono's request id: the caller's `X-Request-Id` when it is a sane one, a UUID
 * otherwise. The incoming header is judged by our rule, not Hono's (which keeps a
 * leading `-` or a `=`, and refuses the `.` and `:` of trace ids), so Hono is given
 * no header name and `requestLog` sets the answer's header.
 */
export function saneRequestId(): MiddlewareHandler<AppEnv> {
  return requestId({
    headerName: "",
    generator: (c: Context) => {
      const given = c.req.header("x-request-id");
      return given !== undefined && SANE_REQUEST_ID.test(given) ? given : randomUUID();
    },
  });
}

/**
 * Every answer says which request it was (`X-Request-Id`, set before the handler
 * builds its answer, so Hono writes it with the rest), and every request is one JSON
 * line: its id, method, path, status, duration and who called. A client that went
 * away mid-request is `info` with `client_aborted`: not the service's failure.
 */
export function requestLog(logger: Logger): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const started = performance.now();
    const id = c.get("requestId");
    c.header("X-Request-Id", id);
    await next();
    const status = c.res.status;
    const aborted = c.get("clientAborted") === true;
    logger.log(status >= 500 ? "error" : status >= 400 && !aborted ? "warn" : "info", "request", {
      request_id: id,
      method: c.req.method,
      path: c.req.path,
      status,
      ...(aborted ? { client_aborted: true, detail: "the client closed the connection before its request was complete" } : {}),
      duration_ms: Math.round((performance.now() - started) * 1000) / 1000,
      actor: actorLabel(c.get("principal")),
    });
  };
}

function actorLabel(principal: Principal | undefined): string {
  if (principal === undefined) return "anonymous";
  if (principal.kind === "agent") return `agent:${principal.jobId}/${principal.attemptId}`;
  return `operator:${principal.tokenId}`;
}
