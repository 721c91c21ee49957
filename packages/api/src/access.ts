import { MamError } from "@mam/core";
import type { Principal, Scope } from "./tokens.ts";

/**
 * Who may call which route, as data (DESIGN.md, "HTTP API"). A protected route
 * names the operator scope it needs and, if an agent may call it too, what the
 * agent's token must be bound to:
 * - `job`: the path's job is the token's job;
 * - `attempt`: that, and the path's attempt is the token's attempt.
 * On top of the binding, an agent's attempt must still be the job's latest
 * dispatch (checked against the store by the app: a newer dispatch retires it).
 * Which transitions and which fields an agent may use is the engine's table
 * (core's TRANSITIONS and FIELD_WRITERS), not this one.
 */
export type AgentBinding = "job" | "attempt";

export type Access = { readonly kind: "public" } | { readonly kind: "protected"; readonly scope: Scope; readonly agent?: AgentBinding };

const pub = { kind: "public" } as const;
const op = (scope: Scope) => ({ kind: "protected", scope }) as const;
const opOrAgent = (scope: Scope, agent: AgentBinding) => ({ kind: "protected", scope, agent }) as const;

/** `METHOD path` (OpenAPI path syntax) -> access. Every route the app serves is here, and only those. */
export const ROUTE_PERMISSIONS = {
  "POST /v1/jobs": op("write"),
  "GET /v1/jobs": op("read"),
  "GET /v1/jobs/{job_id}": opOrAgent("read", "job"),
  "POST /v1/jobs/{job_id}/transitions": opOrAgent("write", "job"),
  "POST /v1/jobs/{job_id}/dispatches": op("write"),
  "PUT /v1/jobs/{job_id}/attempts/{attempt}/report": opOrAgent("write", "attempt"),
  "POST /v1/jobs/{job_id}/attempts/{attempt}/finalize": opOrAgent("write", "attempt"),
  "GET /v1/jobs/{job_id}/attempts/{attempt}/verification": op("read"),
  "POST /v1/jobs/{job_id}/evaluations": op("gate"),
  "POST /v1/jobs/{job_id}/events": opOrAgent("write", "job"),
  "GET /v1/jobs/{job_id}/events": opOrAgent("read", "job"),
  "POST /v1/recovery-sweeps": op("ops"),
  "POST /v1/jobs/{job_id}/notification-release": op("ops"),
  "GET /openapi.json": pub,
  "GET /docs": pub,
  "GET /docs/assets/{file}": pub,
  "GET /assets/{file}": pub,
  "GET /healthz": pub,
  "GET /": pub,
} as const satisfies Record<string, Access>;

export type RouteKey = keyof typeof ROUTE_PERMISSIONS;

export interface PathParams {
  readonly jobId?: string;
  readonly attempt?: number;
}

/**
 * Decide, without the store, whether `principal` may call a route with these path
 * parameters. Throws `auth.forbidden` (403) with the reason; returns otherwise.
 * The superseded-attempt check needs the store and is the app's (`assertLatestAttempt`).
 */
export function authorize(principal: Principal, access: Access, params: PathParams): void {
  if (access.kind === "public") return;
  if (principal.kind === "operator") {
    if (!principal.scopes.includes(access.scope)) {
      throw new MamError("auth.forbidden", `this operator token lacks the ${access.scope} scope (it has ${principal.scopes.join(", ")})`, {
        details: { required_scope: access.scope },
      });
    }
    return;
  }
  if (access.agent === undefined) {
    throw new MamError("auth.forbidden", "an agent token may not call this route; it is operator-only");
  }
  if (params.jobId !== principal.jobId) {
    throw new MamError("auth.forbidden", `this agent token is bound to job ${principal.jobId}, not ${String(params.jobId)}`);
  }
  if (access.agent === "attempt" && params.attempt !== principal.attemptId) {
    throw new MamError("auth.forbidden", `this agent token is bound to attempt ${principal.attemptId}, not ${String(params.attempt)}`);
  }
}

/** The agent's attempt must still be the job's latest dispatch: a newer dispatch retires the older token. */
export function assertLatestAttempt(principal: Principal & { kind: "agent" }, latestAttempt: number | undefined): void {
  if (latestAttempt === undefined) {
    throw new MamError(
      "auth.forbidden",
      `job ${principal.jobId} has no recorded dispatch, so attempt ${principal.attemptId}'s token is void`,
    );
  }
  if (latestAttempt !== principal.attemptId) {
    throw new MamError(
      "auth.forbidden",
      `attempt ${principal.attemptId} was superseded by attempt ${latestAttempt} of job ${principal.jobId}; its token is retired`,
    );
  }
}
