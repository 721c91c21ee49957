import { MamError } from "@mam/core";
import type { Context, MiddlewareHandler } from "hono";
import type { z } from "zod";
import type { AppEnv, Services } from "./context.ts";
import type { Principal, Scope } from "./tokens.ts";
import { invalidInput } from "./validation.ts";

/**
 * Who may call a route, declared with the route (`defineRoute`): public, or an
 * operator scope and, if an agent may call it too, what the agent's token must be
 * bound to:
 * - `job`: the path's job is the token's job;
 * - `attempt`: that, and the path's attempt is the token's attempt;
 * - `self`: the path names no job; the handler confines the agent to its own (the change feed).
 * On top of the binding, an agent's attempt must still be the job's latest
 * dispatch (a newer dispatch retires it). Which transitions and which fields an
 * agent may use is the engine's table (core's TRANSITIONS and FIELD_WRITERS), not this.
 */
export type AgentBinding = "job" | "attempt" | "self";

export type Access =
  | { readonly kind: "public" }
  | {
      readonly kind: "protected";
      readonly scope: Scope;
      readonly agent?: AgentBinding;
      /** Only an agent's token: what the route records is the token's own job and attempt (an agent hook). */
      readonly agentOnly?: true;
      /** Any valid token, whatever its scopes (`GET /v1/token`: what the token may do). */
      readonly anyScope?: true;
    };

export const anyone = { kind: "public" } as const satisfies Access;
export const operator = (scope: Scope) => ({ kind: "protected", scope }) as const satisfies Access;
export const operatorOrAgent = (scope: Scope, agent: AgentBinding) => ({ kind: "protected", scope, agent }) as const satisfies Access;
/** Any valid token: an operator's of any scopes, an agent's (of its latest attempt). */
export const anyToken = { kind: "protected", scope: "read", agent: "self", anyScope: true } as const satisfies Access;
/** An agent hook's route: the agent token names the job and attempt, so the path names neither and no operator token fits. */
export const agentOnly = { kind: "protected", scope: "observe", agent: "self", agentOnly: true } as const satisfies Access;

export interface PathParams {
  readonly jobId?: string;
  readonly attempt?: number;
}

/**
 * The bearer token's principal (401 without one, or with one that does not verify),
 * set on the context for the access check, the handler and the request log.
 */
export function bearerAuth({ tokens }: Pick<Services, "tokens">): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const header = c.req.header("authorization");
    if (header === undefined || header.trim() === "") throw new MamError("auth.missing", "send Authorization: Bearer <token>");
    const m = /^Bearer +([^\s]+)\s*$/i.exec(header);
    if (!m) throw new MamError("auth.invalid", "the Authorization header is not a Bearer token");
    c.set("principal", tokens.verify(m[1]!));
    await next();
  };
}

/**
 * The caller of a protected route: `bearerAuth` set it before the route's own
 * middleware and handler run, so its absence is the app's fault (a 500), never
 * the caller's.
 */
export function principalOf(c: Context<AppEnv>): Principal {
  const principal = c.var.principal;
  if (principal === undefined) throw new MamError("internal", `${c.req.method} ${c.req.path} ran without bearerAuth`);
  return principal;
}

/**
 * After `bearerAuth`: the path is validated with the route's own schema (400 before
 * any store is asked), then the principal is authorized for it (403), and an
 * agent's attempt must still be the job's latest dispatch (the one store read).
 */
export function requireAccess(
  access: Access & { kind: "protected" },
  params: z.ZodType | undefined,
  { deps }: Pick<Services, "deps">,
): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const principal = principalOf(c);
    let path: PathParams = {};
    if (params !== undefined) {
      const parsed = params.safeParse(c.req.param());
      if (!parsed.success) throw invalidInput(parsed.error, "param");
      const { job_id, attempt } = parsed.data as { job_id?: string; attempt?: number };
      path = { ...(job_id === undefined ? {} : { jobId: job_id }), ...(attempt === undefined ? {} : { attempt }) };
    }
    authorize(principal, access, path);
    if (principal.kind === "agent") assertLatestAttempt(principal, (await deps.jobs.get(principal.jobId))?.latest_attempt);
    await next();
  };
}

/**
 * Decide, without the store, whether `principal` may call a route with these path
 * parameters. Throws `auth.forbidden` (403) with the reason; returns otherwise.
 */
export function authorize(principal: Principal, access: Access, params: PathParams): void {
  if (access.kind === "public") return;
  if (principal.kind === "operator") {
    if (access.agentOnly === true) {
      throw new MamError(
        "auth.forbidden",
        "only an agent's token posts hook events: the token names the job and attempt the event is of (mam dispatch gives it as MAM_TOKEN)",
      );
    }
    if (access.anyScope === true) return;
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
  if (access.agent === "self") return;
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
