import { readdirSync } from "node:fs";
import { type Access, assertLatestAttempt, authorize, type Principal, ROUTE_PERMISSIONS, ROUTES } from "@mam/api";
import { describe, expect, it } from "vitest";

const operator = (...scopes: ("read" | "write" | "gate" | "ops")[]): Principal => ({ kind: "operator", tokenId: "op", scopes });
const agent: Principal & { kind: "agent" } = {
  kind: "agent",
  tokenId: "ag",
  jobId: "job-1",
  attemptId: 2,
  expiresAt: "2026-11-21T00:00:00Z",
};

describe("route permissions (DESIGN.md, HTTP API)", () => {
  it("are exactly the design's table", () => {
    // operator scope / agent binding: `job` = its job, `attempt` = its job and attempt, `self` = its own job's part (no job in the path), absent = operator only.
    expect(ROUTE_PERMISSIONS).toEqual({
      "POST /v1/jobs": { kind: "protected", scope: "write" },
      "GET /v1/jobs": { kind: "protected", scope: "read" },
      "GET /v1/job-counts": { kind: "protected", scope: "read" },
      "GET /v1/jobs/{job_id}": { kind: "protected", scope: "read", agent: "job" },
      "POST /v1/jobs/{job_id}/transitions": { kind: "protected", scope: "write", agent: "job" },
      "POST /v1/jobs/{job_id}/dispatches": { kind: "protected", scope: "write" },
      "GET /v1/jobs/{job_id}/dispatches/{attempt}": { kind: "protected", scope: "read", agent: "attempt" },
      "PUT /v1/jobs/{job_id}/attempts/{attempt}/report": { kind: "protected", scope: "write", agent: "attempt" },
      "GET /v1/jobs/{job_id}/attempts/{attempt}/report": { kind: "protected", scope: "read", agent: "attempt" },
      "POST /v1/jobs/{job_id}/attempts/{attempt}/report/upload": { kind: "protected", scope: "write", agent: "attempt" },
      "POST /v1/jobs/{job_id}/attempts/{attempt}/finalize": { kind: "protected", scope: "write", agent: "attempt" },
      "GET /v1/jobs/{job_id}/attempts/{attempt}/verification": { kind: "protected", scope: "read" },
      "POST /v1/jobs/{job_id}/evaluations": { kind: "protected", scope: "gate" },
      "POST /v1/jobs/{job_id}/events": { kind: "protected", scope: "write", agent: "job" },
      "GET /v1/jobs/{job_id}/events": { kind: "protected", scope: "read", agent: "job" },
      "GET /v1/events": { kind: "protected", scope: "read", agent: "self" },
      "GET /v1/events/stream": { kind: "protected", scope: "read", agent: "self" },
      "POST /v1/recovery-sweeps": { kind: "protected", scope: "ops" },
      "POST /v1/jobs/{job_id}/notification-release": { kind: "protected", scope: "ops" },
      "POST /v1/jobs/{job_id}/observations": { kind: "protected", scope: "observe", agent: "job" },
      "POST /v1/hooks/{agent}": { kind: "protected", scope: "observe", agent: "self", agentOnly: true },
      "POST /v1/jobs/{job_id}/notification-sends": { kind: "protected", scope: "ops" },
      "GET /v1/token": { kind: "protected", scope: "read", agent: "self", anyScope: true },
      "GET /v1/jobs/{job_id}/gate": { kind: "protected", scope: "read" },
      "GET /openapi.json": { kind: "public" },
      "GET /docs": { kind: "public" },
      "GET /docs/assets/{file}": { kind: "public" },
      "GET /assets/{file}": { kind: "public" },
      "GET /healthz": { kind: "public" },
      "GET /": { kind: "public" },
    });
  });

  it("name every route the app serves, and only those", () => {
    expect(ROUTES.map(({ route }) => `${route.method.toUpperCase()} ${route.path}`).sort()).toEqual(Object.keys(ROUTE_PERMISSIONS).sort());
    expect(new Set(ROUTES.map(({ route }) => route.operationId)).size).toBe(ROUTES.length);
  });

  it("are listed, every one a route module declares (a route left out of ROUTES would not be served)", async () => {
    const dir = new URL("../../packages/api/src/routes/", import.meta.url);
    const declared: unknown[] = [];
    for (const file of readdirSync(dir).filter((f) => f.endsWith(".ts"))) {
      const exported: Record<string, unknown> = await import(new URL(file, dir).href);
      declared.push(...Object.values(exported).filter(isRouteValue));
    }
    const listed = new Set<unknown>(ROUTES);
    expect(declared.filter((r) => !listed.has(r)).map((r) => (r as (typeof ROUTES)[number]).route.operationId)).toEqual([]);
    expect(declared.length).toBe(ROUTES.length);
  });
});

describe("authorize", () => {
  const read: Access = ROUTE_PERMISSIONS["GET /v1/jobs/{job_id}"];
  const stage: Access = ROUTE_PERMISSIONS["PUT /v1/jobs/{job_id}/attempts/{attempt}/report"];
  const gate: Access = ROUTE_PERMISSIONS["POST /v1/jobs/{job_id}/evaluations"];

  it("lets an operator through with the route's scope, and refuses naming the scope without it", () => {
    expect(() => authorize(operator("read"), read, { jobId: "x" })).not.toThrow();
    expect(() => authorize(operator("read", "write", "ops"), gate, { jobId: "x" })).toThrow(
      expect.objectContaining({ code: "auth.forbidden", details: { required_scope: "gate" } }),
    );
  });

  it("binds an agent to its job, and on attempt routes to its attempt", () => {
    expect(() => authorize(agent, read, { jobId: "job-1" })).not.toThrow();
    expect(() => authorize(agent, stage, { jobId: "job-1", attempt: 2 })).not.toThrow();
    expect(() => authorize(agent, read, { jobId: "job-2" })).toThrow(/bound to job job-1, not job-2/);
    expect(() => authorize(agent, stage, { jobId: "job-1", attempt: 1 })).toThrow(/bound to attempt 2, not 1/);
    expect(() => authorize(agent, gate, { jobId: "job-1" })).toThrow(/operator-only/);
  });

  it("lets anyone through a public route", () => {
    expect(() => authorize(agent, ROUTE_PERMISSIONS["GET /healthz"], {})).not.toThrow();
    expect(() => authorize(operator("read"), ROUTE_PERMISSIONS["GET /docs"], {})).not.toThrow();
  });

  it("retires an agent token once a newer attempt is dispatched", () => {
    expect(() => assertLatestAttempt(agent, 2)).not.toThrow();
    expect(() => assertLatestAttempt(agent, 3)).toThrow(/superseded by attempt 3/);
    expect(() => assertLatestAttempt(agent, undefined)).toThrow(expect.objectContaining({ code: "auth.forbidden" }));
  });
});

/** A route value: a declaration (`x-mam-access`) with its handler. */
function isRouteValue(x: unknown): boolean {
  if (typeof x !== "object" || x === null || !("route" in x) || !("handler" in x)) return false;
  return typeof x.handler === "function" && typeof x.route === "object" && x.route !== null && "x-mam-access" in x.route;
}
