/**
 * Tokens and report bodies never reach a log line. A full flow through the API — an
 * operator registers and dispatches a job (which mints an agent token), the agent
 * claims it, uploads a report with a body found nowhere else, finalizes and
 * publishes `completed`; the operator verifies and sweeps; a forged and a garbage
 * token are refused; a store failure ends one request in an unexpected error —
 * with every line the app writes kept (AppOptions.log), then the same flow through
 * `mam serve` (startService's log). No line may hold the operator token, the agent
 * token, the refused tokens, the signing key, the MQTT password, the report body or
 * an Authorization header; every line is one JSON document with a level and a msg.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { createApp, createTokenService, SCOPES } from "@mam/api";
import { type RunningService, startService } from "@mam/cli";
import { type Deps, type JobStore, LOG_LEVELS, parseConfig, parseFlags, randomIds, systemClock } from "@mam/core";
import type { Credentials } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import { localPorts } from "../support/local-backend.ts";
import { tempDir } from "../support/temp-dir.ts";

/** One request as the flow makes it; `send` is an in-process app or a listening service. */
interface Req {
  readonly token?: string;
  readonly json?: unknown;
  readonly body?: string;
  readonly headers?: Record<string, string>;
}
type Send = (path: string, init: RequestInit) => Promise<Response>;

// biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field
async function call(send: Send, method: string, path: string, req: Req = {}): Promise<{ status: number; body: any }> {
  const headers = new Headers(req.headers);
  if (req.token !== undefined) headers.set("authorization", `Bearer ${req.token}`);
  let body = req.body;
  if (req.json !== undefined) {
    body = JSON.stringify(req.json);
    headers.set("content-type", "application/json");
  }
  const res = await send(path, { method, headers, ...(body === undefined ? {} : { body }) });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return { status: res.status, body: parsed };
}

/** What the flow handed the service that no log line may repeat. */
interface Secrets {
  readonly [name: string]: string;
}

/**
 * The whole life of a job through `send`; returns the secrets it used and minted.
 * `failNext`, when given, makes the next store call throw (an unexpected error).
 */
async function fullFlow(send: Send, operator: string, signingKey: string, failNext?: () => void): Promise<Secrets> {
  const jobId = `job-${randomUUID().slice(0, 12)}`;
  const marker = `report-body-${randomBytes(12).toString("hex")}`;
  const report = `# Report\n\nAll tests pass. ${marker}\n`;
  const expect2xx = (what: string, res: { status: number; body: unknown }) =>
    expect(res.status, `${what}: ${JSON.stringify(res.body)}`).toBeLessThan(300);

  expect2xx(
    "register",
    await call(send, "POST", "/v1/jobs", {
      token: operator,
      json: { job_id: jobId, prompt: "fix the bug", agent: "codex", expected_artifacts: ["commit"] },
    }),
  );
  const dispatched = await call(send, "POST", `/v1/jobs/${jobId}/dispatches`, {
    token: operator,
    json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
  });
  expect2xx("dispatch", dispatched);
  const agent: string = dispatched.body.agent_token;
  expect(agent).toMatch(/\./);
  expect2xx(
    "claim",
    await call(send, "POST", `/v1/jobs/${jobId}/transitions`, { token: agent, json: { action: "claim", expected_seq: 0 } }),
  );
  expect2xx(
    "report",
    await call(send, "PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
      token: agent,
      body: report,
      headers: { "content-type": "text/markdown" },
    }),
  );
  const sideEffects = [{ kind: "commit", reference: "abc123" }];
  expect2xx(
    "finalize",
    await call(send, "POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { token: agent, json: { side_effects: sideEffects } }),
  );
  expect2xx(
    "publish",
    await call(send, "POST", `/v1/jobs/${jobId}/events`, {
      token: agent,
      json: { event: "completed", expected_seq: 1, finalize: { attempt_id: 1, side_effects: sideEffects }, data: { note: "done" } },
    }),
  );
  const verified = await call(send, "GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: operator });
  expect2xx("verify", verified);
  expect(verified.body.ok).toBe(true);
  expect2xx("events", await call(send, "GET", `/v1/jobs/${jobId}/events`, { token: agent }));
  expect2xx("feed", await call(send, "GET", "/v1/events", { token: operator }));
  expect2xx("sweep", await call(send, "POST", "/v1/recovery-sweeps", { token: operator, json: {} }));

  // Refused: a token signed with another key, and one that is not a token at all.
  const forged = createTokenService({ signingKey: randomBytes(32).toString("base64url"), clock: systemClock }).mintOperator(SCOPES);
  expect((await call(send, "GET", `/v1/jobs/${jobId}`, { token: forged })).status).toBe(401);
  const garbage = `not-a-token-${randomBytes(12).toString("hex")}`;
  expect((await call(send, "GET", `/v1/jobs/${jobId}`, { token: garbage })).status).toBe(401);
  // The agent's token on another job's route: refused, and still not logged.
  expect((await call(send, "GET", "/v1/jobs/someone-elses-job", { token: agent })).status).toBe(403);

  if (failNext !== undefined) {
    failNext();
    const failed = await call(send, "GET", `/v1/jobs/${jobId}`, { token: operator });
    expect(failed.status, JSON.stringify(failed.body)).toBe(500);
  }
  return { operator, agent, forged, garbage, signingKey, report, marker };
}

/** Every line is one JSON document with a level and a msg (a Logger's), and none holds a secret. */
function expectNoSecrets(lines: readonly string[], secrets: Secrets): void {
  expect(lines.length).toBeGreaterThan(10);
  for (const line of lines) {
    const entry = JSON.parse(line) as { level?: unknown; msg?: unknown };
    expect(LOG_LEVELS, line).toContain(entry.level);
    expect(typeof entry.msg, line).toBe("string");
    expect(line.toLowerCase(), "an Authorization header in a log line").not.toContain("bearer");
    expect(line.toLowerCase(), "an Authorization header in a log line").not.toContain("authorization");
    for (const [name, secret] of Object.entries(secrets)) {
      // The secret itself, as JSON writes it inside a string (a report's newlines
      // escaped), and a token's signature alone (a line that kept only part of it).
      const signature = /^[\w-]+\.[\w-]+\.([\w-]{20,})$/.exec(secret)?.[1];
      for (const form of new Set([secret, JSON.stringify(secret).slice(1, -1), ...(signature === undefined ? [] : [signature])])) {
        expect(line.includes(form), `the ${name} in a log line: ${line}`).toBe(false);
      }
    }
  }
}

describe("no token, key or report body in a log line", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  it("through the API (createApp over SQLite, files and the embedded broker), an unexpected error included", async () => {
    const ports = await localPorts({ publisher: "working" });
    cleanup.push(() => ports.close());
    // A pass-through over the real store whose next call throws once told to: the 500 path.
    let failing = false;
    const jobs = new Proxy(ports.jobs, {
      get(target, prop) {
        const value: unknown = Reflect.get(target, prop, target);
        if (typeof value !== "function") return value;
        return (...args: unknown[]) => {
          if (failing) {
            failing = false;
            throw new Error("disk on fire");
          }
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    }) as JobStore;
    const clock = new TestClock("2026-11-20T10:10:00.000Z");
    const deps: Deps = { jobs, reports: ports.reports, publisher: ports.publisher, clock, ids: randomIds, flags: parseFlags({}) };
    const signingKey = randomBytes(32).toString("base64url");
    const tokens = createTokenService({ signingKey, clock });
    const lines: string[] = [];
    const app = createApp({ deps, tokens, log: (l) => lines.push(l), feed: { streaming: false } });

    const secrets = await fullFlow(
      async (p, init) => app.request(p, init),
      tokens.mintOperator(SCOPES),
      signingKey,
      () => {
        failing = true;
      },
    );
    const entries = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(entries.find((e) => e.msg === "unexpected error")).toMatchObject({ level: "error", error: { message: "disk on fire" } });
    expect(entries.filter((e) => e.msg === "request" && e.status === 401)).toHaveLength(2);
    expectNoSecrets(lines, secrets);
  });

  it("through mam serve (startService's log), its credentials included", async () => {
    const dir = await tempDir("log-secrets");
    cleanup.push(() => dir.remove());
    const lines: string[] = [];
    const service: RunningService = await startService(
      parseConfig({ MAM_DATA_DIR: path.join(dir.dir, "data"), MAM_PORT: "0", MAM_MQTT_PORT: "0" }),
      (l) => lines.push(l),
    );
    cleanup.push(() => service.stop());
    const credentials = JSON.parse(await readFile(service.credentialsPath, "utf8")) as Credentials;

    const secrets = await fullFlow((p, init) => fetch(new URL(p, service.url), init), service.operatorToken, credentials.signing_key);
    await service.relayed();
    const relayed = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((e) => e.msg === "relay");
    expect(relayed.length).toBeGreaterThan(0);
    expectNoSecrets(lines, { ...secrets, mqttPassword: credentials.mqtt.password });
  });
});
