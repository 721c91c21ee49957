import { createHash, randomUUID } from "node:crypto";
import { createTokenService, ROUTE_PERMISSIONS, ROUTES, type RouteKey, SCOPES, type Scope } from "@mam/api";
import { afterEach, describe, expect, it } from "vitest";
import {
  CANDIDATE_DISPATCH,
  candidateScenario,
  type Harness,
  type HarnessOptions,
  lazyBytes,
  makeHarness,
  type PortsFactory,
  type Res,
} from "./harness.ts";

export type { ApiPorts, PortsFactory, PortsOptions } from "./harness.ts";

const PROBLEM = /^application\/problem\+json/;
/** A sweep's answer past its notifications when auto-completion is off and no running job is due for a look (issue 20). */
const QUIET_PARTS = {
  candidates: { due: 0, completed: 0, held: 0, kept: 0, failed: 0, not_tried: 0, bytes_hashed: 0, disabled: true, results: [] },
  attention: { due: 0, stale: 0, overdue: 0, rekeyed: 0, lost_race: 0, failed: 0, results: [] },
};
const REPORT = "# Report\n\nAll tests pass.\n";

/**
 * The HTTP API, end to end through `app.request()` (no server), over one family of
 * adapters. Each test builds its own ports through `factory`.
 */
export function apiRoutesSuite(name: string, factory: PortsFactory): void {
  describe(`HTTP API over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}) => makeHarness(factory, opts, cleanup);

    const newId = () => `job-${randomUUID().slice(0, 12)}`;

    async function register(h: Harness, over: Record<string, unknown> = {}): Promise<Record<string, unknown> & { job_id: string }> {
      const res = await h.call("POST", "/v1/jobs", {
        token: h.operator,
        json: { job_id: newId(), prompt: "fix the bug", agent: "codex", ...over },
      });
      expect(res.status, res.text).toBe(201);
      return res.body;
    }

    async function dispatch(h: Harness, jobId: string, attempt = 1, over: Record<string, unknown> = {}): Promise<string> {
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: attempt, agent_session_uuid: randomUUID(), pane_process_generation: 1, ...over },
      });
      expect(res.status, res.text).toBe(201);
      return res.body.agent_token;
    }

    async function transition(h: Harness, jobId: string, token: string, body: Record<string, unknown>): Promise<Res> {
      return h.call("POST", `/v1/jobs/${jobId}/transitions`, { token, json: body });
    }

    async function stage(h: Harness, jobId: string, attempt: number, token: string, text = REPORT): Promise<Res> {
      return h.call("PUT", `/v1/jobs/${jobId}/attempts/${attempt}/report`, {
        token,
        body: text,
        headers: { "content-type": "text/markdown" },
      });
    }

    function expectProblem(res: Res, status: number, code: string): void {
      expect(res.status, res.text).toBe(status);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.body).toMatchObject({ status, code, type: `https://mam.dev/problems/${code}` });
      expect(typeof res.body.title).toBe("string");
      expect(typeof res.body.detail).toBe("string");
      expect(res.body.request_id).toBe(res.headers.get("x-request-id"));
    }

    /** A concrete path for a route key, with its parameters filled in. */
    function concrete(key: RouteKey, jobId: string, attempt = 1): { method: string; path: string } {
      const [method, template] = key.split(" ") as [string, string];
      return {
        method,
        path: template
          .replace("{job_id}", jobId)
          .replace("{attempt}", String(attempt))
          .replace("{file}", "swagger-ui.css")
          .replace("{agent}", "claude-code"),
      };
    }

    /** A body that passes validation for each protected route, so only authorization decides. */
    function validRequest(key: RouteKey, attempt = 1): { json?: unknown; body?: string } {
      switch (key) {
        case "POST /v1/jobs":
          return { json: { prompt: "p", agent: "codex" } };
        case "POST /v1/jobs/{job_id}/transitions":
          return { json: { action: "progress", expected_seq: 1, fields: { progress: { step: 1 } } } };
        case "POST /v1/jobs/{job_id}/dispatches":
          return { json: { attempt_id: 7, agent_session_uuid: "s", pane_process_generation: 0 } };
        case "PUT /v1/jobs/{job_id}/attempts/{attempt}/report":
          return { body: REPORT };
        case "POST /v1/jobs/{job_id}/attempts/{attempt}/finalize":
          return { json: { side_effects: [] } };
        case "POST /v1/jobs/{job_id}/attempts/{attempt}/report/upload":
          return { json: { sha256: "0".repeat(64), bytes: 10 } };
        case "POST /v1/jobs/{job_id}/evaluations":
          return { json: { scenario: {} } };
        case "POST /v1/jobs/{job_id}/events":
          return { json: { event: "progress", finalize: { attempt_id: attempt, side_effects: [] } } };
        case "POST /v1/recovery-sweeps":
          return { json: {} };
        case "POST /v1/hooks/{agent}":
          return { json: { hook_event_name: "Notification", session_id: "s", notification_type: "auth_success" } };
        case "POST /v1/jobs/{job_id}/notification-release":
          return { json: {} };
        default:
          return {};
      }
    }

    const protectedKeys = (Object.keys(ROUTE_PERMISSIONS) as RouteKey[]).filter((k) => ROUTE_PERMISSIONS[k].kind === "protected");

    // ------------------------------------------------------------------ happy paths

    describe("routes", () => {
      it("GET /healthz is alive without a token", async () => {
        const h = await harness();
        const res = await h.call("GET", "/healthz");
        expect(res.status).toBe(200);
        expect(res.body).toEqual({ ok: true });
      });

      it("POST /v1/jobs registers a pending job (201, Location, ETag) and GET /v1/jobs/{id} reads it with its ETag", async () => {
        const h = await harness();
        const jobId = newId();
        const res = await h.call("POST", "/v1/jobs", {
          token: h.operator,
          json: {
            job_id: jobId,
            prompt: "fix it",
            agent: "claude-code",
            role: "Reviewer",
            expected_artifacts: ["commit"],
            auto_complete: true,
          },
        });
        expect(res.status).toBe(201);
        expect(res.body).toMatchObject({ job_id: jobId, status: "pending", transition_seq: 0, role: "Reviewer", auto_complete: true });
        expect(res.headers.get("location")).toBe(`/v1/jobs/${jobId}`);
        expect(res.headers.get("etag")).toBe('"0"');

        const got = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
        expect(got.status).toBe(200);
        expect(got.body).toEqual(res.body);
        expect(got.headers.get("etag")).toBe('"0"');
        expect(got.headers.get("content-type")).toMatch(/^application\/json/);
      });

      it("POST /v1/jobs without a job_id generates a lowercase UUID", async () => {
        const h = await harness();
        const res = await h.call("POST", "/v1/jobs", { token: h.operator, json: { prompt: "p", agent: "codex" } });
        expect(res.status).toBe(201);
        expect(res.body.job_id).toMatch(/^[0-9a-f-]{36}$/);
      });

      it("GET /v1/jobs lists newest first, paged by cursor, filtered by status", async () => {
        const h = await harness();
        const ids: string[] = [];
        for (let i = 0; i < 3; i++) {
          ids.push((await register(h)).job_id);
          h.clock.advance(1000);
        }
        await transition(h, ids[0]!, h.operator, { action: "claim", expected_seq: 0 });

        const first = await h.call("GET", "/v1/jobs?limit=2", { token: h.operator });
        expect(first.status).toBe(200);
        // ids[0] was updated last, by its claim.
        expect(first.body.items.map((j: { job_id: string }) => j.job_id)).toEqual([ids[0], ids[2]]);
        expect(typeof first.body.next_cursor).toBe("string");
        const second = await h.call("GET", `/v1/jobs?limit=2&cursor=${encodeURIComponent(first.body.next_cursor)}`, { token: h.operator });
        expect(second.body.items.map((j: { job_id: string }) => j.job_id)).toEqual([ids[1]]);
        expect(second.body.next_cursor).toBeUndefined();

        const running = await h.call("GET", "/v1/jobs?status=running&status=", { token: h.operator });
        expect(running.body.items.map((j: { job_id: string }) => j.job_id)).toEqual([ids[0]]);
        const all = await h.call("GET", "/v1/jobs?status=", { token: h.operator });
        expect(all.body.items).toHaveLength(3);
      });

      it("POST /v1/jobs/{id}/transitions commits a claim and answers the record with its new ETag", async () => {
        const h = await harness();
        const job = await register(h);
        const res = await transition(h, job.job_id, h.operator, { action: "claim", expected_seq: 0, fields: { agent_session: "sess-1" } });
        expect(res.status).toBe(200);
        expect(res.body).toMatchObject({ status: "running", transition_seq: 1, agent_session: "sess-1" });
        expect(res.headers.get("etag")).toBe('"1"');
      });

      it("POST /v1/jobs/{id}/dispatches records the dispatch and mints a 24 h agent token (201)", async () => {
        const h = await harness();
        const job = await register(h);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, {
          token: h.operator,
          json: { attempt_id: 1, agent_session_uuid: "uuid-1", pane_process_generation: 2, anchor: { workspace_revision: "abc123" } },
        });
        expect(res.status).toBe(201);
        expect(res.body.dispatch).toMatchObject({
          job_id: job.job_id,
          attempt_id: 1,
          agent_session_uuid: "uuid-1",
          pane_process_generation: 2,
          anchor: { started_at: "2026-11-20T10:10:00.000Z", workspace_revision: "abc123" },
        });
        expect(res.body.expires_at).toBe("2026-11-21T10:10:00.000Z");
        const principal = h.tokens.verify(res.body.agent_token);
        expect(principal).toMatchObject({ kind: "agent", jobId: job.job_id, attemptId: 1 });
      });

      it("issue 22: GET …/attempts/{n}/report reads the report as text (nosniff, CSP sandbox): staged, then finalized; past 1 MiB its first MiB and a notice, and where the store can, the whole by a presigned address", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const path = `/v1/jobs/${job.job_id}/attempts/1/report`;
        expect((await h.call("GET", path, { token: h.operator })).status).toBe(404);
        expect((await h.call("PUT", path, { token: agent, body: "# Report\n\n<script>alert(1)</script> é\n" })).status).toBe(201);
        const staged = await h.call("GET", path, { token: h.operator });
        expect(staged.status, staged.text).toBe(200);
        expect(staged.headers.get("content-type")).toBe("text/plain; charset=utf-8");
        expect(staged.headers.get("x-content-type-options")).toBe("nosniff");
        expect(staged.headers.get("content-security-policy")).toBe("sandbox");
        expect(staged.headers.get("x-mam-report")).toBe("staged");
        expect(staged.text).toBe("# Report\n\n<script>alert(1)</script> é\n");
        expect(
          (await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, { token: agent, json: { side_effects: [] } })).status,
        ).toBe(200);
        const finalized = await h.call("GET", path, { token: agent });
        expect(finalized.headers.get("x-mam-report")).toBe("finalized");
        expect((await h.call("GET", `/v1/jobs/${job.job_id}/attempts/2/report`, { token: h.operator })).status).toBe(404);

        // Past 1 MiB: its first MiB, cut at a character boundary, and a notice.
        const big = await register(h);
        const bigAgent = await dispatch(h, big.job_id);
        const text = `${"é".repeat(600_000)}TAIL`;
        expect((await h.call("PUT", `/v1/jobs/${big.job_id}/attempts/1/report`, { token: bigAgent, body: text })).status).toBe(201);
        const cut = await h.call("GET", `/v1/jobs/${big.job_id}/attempts/1/report`, { token: h.operator });
        expect(cut.status).toBe(200);
        const [head, notice] = cut.text.split("\n\n[mam: ");
        expect(head).toBe("é".repeat(524_288));
        expect(notice).toContain("longer than 1048576 bytes");
        expect(cut.text).not.toContain("TAIL");
        const link = cut.headers.get("link");
        // Which answer depends on the store alone: the file store has no address to hand out, S3 presigns one.
        expect(link !== null).toBe(h.deps.reports.downloadUrl !== undefined);
        if (link === null) expect(notice).toContain("only its first 1048576 bytes are served here");
        else {
          // S3: a presigned GET of the whole report, as an attachment.
          const url = /^<([^>]+)>; rel="alternate"$/.exec(link)?.[1] as string;
          expect(notice).toContain(url);
          const whole = await fetch(url);
          expect(whole.status).toBe(200);
          expect(await whole.text()).toBe(text);
          expect(whole.headers.get("content-disposition")).toBe('attachment; filename="report-final.md.tmp"'); // staged, not finalized: its own name
        }
      });

      it("issue 22: a read token past its rate (per process) is 429 rate.limited with Retry-After, writing and reading nothing; it refills with time; tokens with other scopes are not limited", async () => {
        // 12 a minute: bursts of 2, one more every 5 s.
        const h = await harness({ readTokenRatePerMinute: 12 });
        const reader = h.tokens.mintOperator(["read"], { name: "dashboard" });
        const other = h.tokens.mintOperator(["read"], { name: "another-tab" });
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
        expect((await h.call("GET", "/v1/events", { token: reader })).status).toBe(200);
        const calls = h.calls.length;
        const limited = await h.call("GET", "/v1/jobs", { token: reader });
        expect(limited.status).toBe(429);
        expect(limited.body).toMatchObject({ code: "rate.limited", per_minute: 12 });
        expect(limited.headers.get("retry-after")).toBe("5");
        expect(h.calls.length).toBe(calls); // refused before any store was asked
        // Another read token has its own bucket; a token with any other scope has none.
        expect((await h.call("GET", "/v1/jobs", { token: other })).status).toBe(200);
        for (let i = 0; i < 20; i++) expect((await h.call("GET", "/v1/jobs", { token: h.operator })).status).toBe(200);
        h.clock.advance(5_000);
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(429);
      });

      it("issue 22: a wall clock stepped back does not empty a read token's bucket (a step back of a minute was a minute of 429s)", async () => {
        const h = await harness({ readTokenRatePerMinute: 12 });
        const reader = h.tokens.mintOperator(["read"], { name: "dashboard" });
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
        h.clock.advance(-60_000); // NTP steps the clock back a minute
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200); // the burst's second request was still there
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(429);
        h.clock.advance(60_000); // back where it was: no refill for the minute it was behind
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(429);
        h.clock.advance(5_000);
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
      });

      it("issue 22: a read token's 429 says, in Retry-After, when its next request can go: a minute at one a minute (it said 5 s, then 429 again)", async () => {
        const h = await harness({ readTokenRatePerMinute: 1 });
        const reader = h.tokens.mintOperator(["read"], { name: "dashboard" });
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
        const limited = await h.call("GET", "/v1/jobs", { token: reader });
        expect(limited.status).toBe(429);
        expect(limited.headers.get("retry-after")).toBe("60");
        h.clock.advance(5_000);
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(429);
        h.clock.advance(55_000);
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
      });

      it("GET /v1/token names what the token that asks may do: an operator token's scopes, name and expiry; an agent token's job, attempt and expiry; never the token", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const reader = h.tokens.mintOperator(["read"], { ttlSeconds: 8 * 3600, name: "dashboard" });
        const res = await h.call("GET", "/v1/token", { token: reader });
        expect(res.status, res.text).toBe(200);
        expect(res.body).toEqual({
          kind: "operator",
          token_id: expect.any(String),
          scopes: ["read"],
          name: "dashboard",
          expires_at: "2026-11-20T18:10:00.000Z",
        });
        expect(res.text).not.toContain(reader);
        const own = await h.call("GET", "/v1/token", { token: agent });
        expect(own.body).toEqual({
          kind: "agent",
          token_id: expect.any(String),
          job_id: job.job_id,
          attempt_id: 1,
          expires_at: expect.any(String),
        });
        expect((await h.call("GET", "/v1/token", {})).status).toBe(401);
      });

      it("issue 22: GET /v1/job-counts answers the counts per status with a read token, and how current they are (exact on SQLite; eventual on DynamoDB, counted by the feed writer); an agent token is 403", async () => {
        const h = await harness();
        const first = await register(h);
        await register(h);
        expect((await transition(h, first.job_id, h.operator, { action: "claim", expected_seq: 0 })).status).toBe(200);
        const reader = h.tokens.mintOperator(["read"], { ttlSeconds: 3600, name: "dashboard" });
        const res = await h.call("GET", "/v1/job-counts", { token: reader });
        expect(res.status, res.text).toBe(200);
        if (res.body.consistency === "exact") {
          expect(res.body).toEqual({ counts: { pending: 1, running: 1, completed: 0, error: 0, cancelled: 0 }, consistency: "exact" });
        } else {
          // DynamoDB: counted from the stream by the feed writer, which no test peer here runs (dynalite keeps no stream).
          expect(res.body).toEqual({
            counts: { pending: expect.any(Number), running: expect.any(Number), completed: 0, error: 0, cancelled: 0 },
            consistency: "eventual",
          });
        }
        const agent = await dispatch(h, first.job_id);
        expect((await h.call("GET", "/v1/job-counts", { token: agent })).status).toBe(403);
        expect((await h.call("GET", "/v1/job-counts", {})).status).toBe(401);
      });

      it("GET /v1/jobs/{id}/dispatches/{n} reads the recorded dispatch, terminal_id included; an unrecorded attempt is a 404", async () => {
        const h = await harness();
        const job = await register(h);
        const posted = await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, {
          token: h.operator,
          json: { attempt_id: 1, agent_session_uuid: "uuid-1", pane_process_generation: 0, pane_id: "w1-p2", terminal_id: "term-9" },
        });
        expect(posted.status).toBe(201);
        const read = await h.call("GET", `/v1/jobs/${job.job_id}/dispatches/1`, { token: posted.body.agent_token });
        expect(read.status).toBe(200);
        expect(read.body).toEqual(posted.body.dispatch);
        expect(read.body).toMatchObject({ pane_id: "w1-p2", terminal_id: "term-9" });
        const missing = await h.call("GET", `/v1/jobs/${job.job_id}/dispatches/2`, { token: h.operator });
        expect(missing.status).toBe(404);
        expect(missing.body.type).toContain("dispatch");
      });

      it("an agent claims, stages, finalizes and publishes `completed`; the operator verifies; the event log shows it", async () => {
        const h = await harness();
        const job = await register(h, { expected_artifacts: ["commit"] });
        const agent = await dispatch(h, job.job_id);

        const claimed = await transition(h, job.job_id, agent, {
          action: "claim",
          expected_seq: 0,
          fields: { progress: { step: "start" } },
        });
        expect(claimed.status, claimed.text).toBe(200);

        const staged = await stage(h, job.job_id, 1, agent);
        expect(staged.status, staged.text).toBe(201);
        expect(staged.body).toEqual({
          sha256: (await import("node:crypto")).createHash("sha256").update(REPORT).digest("hex"),
          bytes: Buffer.byteLength(REPORT),
        });

        const fin = await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, {
          token: agent,
          json: { side_effects: [{ kind: "commit", reference: "abc123" }] },
        });
        expect(fin.status, fin.text).toBe(200);
        expect(fin.body.manifest).toMatchObject({
          job_id: job.job_id,
          attempt_id: 1,
          sha256: staged.body.sha256,
          bytes: staged.body.bytes,
        });
        expect(fin.body.manifest_sha256).toMatch(/^[0-9a-f]{64}$/);

        const verified = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/1/verification`, { token: h.operator });
        expect(verified.status).toBe(200);
        expect(verified.body).toMatchObject({ ok: true, manifest: fin.body.manifest, manifest_sha256: fin.body.manifest_sha256 });
        const missing = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/1/verification?expected_artifacts=commit,pr`, {
          token: h.operator,
        });
        expect(missing.body).toMatchObject({ ok: false, manifest: fin.body.manifest });
        expect(missing.body.reason).toContain("pr");
        const none = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/2/verification`, { token: h.operator });
        expect(none.body).toMatchObject({ ok: false, manifest: null });

        const published = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: {
            event: "completed",
            expected_seq: 1,
            finalize: { attempt_id: 1, side_effects: [{ kind: "commit", reference: "abc123" }] },
            data: { note: "done" },
          },
        });
        expect(published.status, published.text).toBe(200);
        expect(published.body.published).toBe(true);
        expect(published.body.record).toMatchObject({ status: "completed", transition_seq: 2 });
        expect(published.body.finalized.manifest).toMatchObject({ attempt_id: 1 });
        expect(published.body.publish_error).toBeUndefined();

        const log = await h.call("GET", `/v1/jobs/${job.job_id}/events`, { token: agent });
        expect(log.status).toBe(200);
        const events = log.body.items.map((e: { event: string }) => e.event);
        expect(events).toContain("publish_event");
        expect(events).toContain("published");
        const limited = await h.call("GET", `/v1/jobs/${job.job_id}/events?limit=1`, { token: h.operator });
        expect(limited.body.items).toHaveLength(1);

        const after = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: agent });
        expect(after.body.pending_notification).toBeUndefined();
      });

      it("POST /v1/jobs/{id}/evaluations commits on evidence (200) and a refusal is a 200 too", async () => {
        const h = await harness({ env: { MAM_AUTO_COMPLETE: "1" } });
        const job = await register(h, { agent: "claude-code", auto_complete: true });
        await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, { token: h.operator, json: CANDIDATE_DISPATCH });
        await transition(h, job.job_id, h.operator, { action: "claim", expected_seq: 0 });
        expect((await stage(h, job.job_id, 1, h.operator)).status).toBe(201);
        expect(
          (await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, { token: h.operator, json: { side_effects: [] } })).status,
        ).toBe(200);

        const refused = await h.call("POST", `/v1/jobs/${job.job_id}/evaluations`, {
          token: h.operator,
          json: { scenario: "not a scenario" },
        });
        expect(refused.status).toBe(200);
        expect(refused.body).toMatchObject({ committed: false, decision: null });
        expect(refused.body.reason).toContain("dispatch_context");

        const res = await h.call("POST", `/v1/jobs/${job.job_id}/evaluations`, {
          token: h.operator,
          json: { scenario: candidateScenario(job.job_id) },
        });
        expect(res.status, res.text).toBe(200);
        expect(res.body).toMatchObject({ committed: true, decision: { decision: "candidate_approved" } });
        expect(res.body.record).toMatchObject({ status: "completed", completed_by: "auto_complete" });
      });

      it("the gate refuses with 200 while auto-completion is off", async () => {
        const h = await harness();
        const job = await register(h);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/evaluations`, {
          token: h.operator,
          json: { scenario: candidateScenario(job.job_id) },
        });
        expect(res.status).toBe(200);
        expect(res.body).toEqual({ committed: false, reason: expect.stringContaining("disabled"), decision: null });
      });

      it("issue 22: POST /v1/jobs/{id}/notification-sends sends that job's owed intent now and settles it; a refused send is an answer, the intent still owed and no failure counted; nothing owed says so", async () => {
        const h = await harness();
        const job = await register(h);
        const t = await transition(h, job.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        const intent = t.body.pending_notification.id;
        h.refusedTopics.add(`mam/jobs/${job.job_id}/events`);
        const refused = await h.call("POST", `/v1/jobs/${job.job_id}/notification-sends`, { token: h.operator });
        expect(refused.status, refused.text).toBe(200);
        expect(refused.body).toMatchObject({ outcome: "failed", intent_id: intent, error: { code: expect.any(String) } });
        const owed = (await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body.pending_notification;
        expect(owed).toMatchObject({ id: intent });
        expect(owed.failures).toBeUndefined();
        h.refusedTopics.delete(`mam/jobs/${job.job_id}/events`);
        const sent = await h.call("POST", `/v1/jobs/${job.job_id}/notification-sends`, { token: h.operator });
        expect(sent.body).toEqual({ outcome: "sent", intent_id: intent, settled: true });
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body.pending_notification).toBeUndefined();
        const again = await h.call("POST", `/v1/jobs/${job.job_id}/notification-sends`, { token: h.operator });
        expect(again.body).toEqual({ outcome: "nothing_owed" });
        expect((await h.call("POST", "/v1/jobs/no-such-job/notification-sends", { token: h.operator })).status).toBe(404);
        const reader = h.tokens.mintOperator(["read"]);
        expect((await h.call("POST", `/v1/jobs/${job.job_id}/notification-sends`, { token: reader })).status).toBe(403);
      });

      it("POST /v1/recovery-sweeps sends every owed notification, with no body or with {}", async () => {
        const h = await harness();
        const job = await register(h);
        const t = await transition(h, job.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        expect(t.body.pending_notification).toMatchObject({ event: "cancelled", seq: 1 });

        const res = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator });
        expect(res.status, res.text).toBe(200);
        expect(res.body).toEqual({
          owed: 1,
          sent: 1,
          failed: 0,
          quarantined: 0,
          not_tried: 0,
          results: [{ job_id: job.job_id, intent_id: t.body.pending_notification.id, outcome: "sent" }],
          ...QUIET_PARTS,
        });
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body.pending_notification).toBeUndefined();

        const again = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: {} });
        expect(again.body).toEqual({ owed: 0, sent: 0, failed: 0, quarantined: 0, not_tried: 0, results: [], ...QUIET_PARTS });
      });

      it("POST /v1/recovery-sweeps answers per-intent outcomes: a refused notification backs off, is quarantined, listed, released, then sent", async () => {
        const h = await harness({ sweep: { maxFailures: 2, backoffMs: 1000 } });
        const refused = await register(h);
        const healthy = await register(h);
        const r = await transition(h, refused.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        h.clock.advance(1);
        const g = await transition(h, healthy.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        const [refusedIntent, healthyIntent] = [r.body.pending_notification.id, g.body.pending_notification.id];
        h.refusedTopics.add(`mam/jobs/${refused.job_id}/events`);
        const sweep = () => h.call("POST", "/v1/recovery-sweeps", { token: h.operator });

        const first = await sweep();
        expect(first.status, first.text).toBe(200);
        expect(first.body).toMatchObject({ owed: 2, sent: 1, failed: 1, quarantined: 0, not_tried: 0 });
        expect(first.body.results).toEqual([
          {
            job_id: refused.job_id,
            intent_id: refusedIntent,
            outcome: "failed",
            error: { code: "publish.refused", message: expect.any(String) },
            failures: 1,
            retry_at: new Date(h.clock.now().getTime() + 1000).toISOString(),
          },
          { job_id: healthy.job_id, intent_id: healthyIntent, outcome: "sent" },
        ]);
        expect((await sweep()).body).toMatchObject({ owed: 0, results: [] });

        h.clock.advance(1000);
        const second = await sweep();
        expect(second.body).toMatchObject({ owed: 1, sent: 0, failed: 0, quarantined: 1 });
        expect(second.body.results).toEqual([
          expect.objectContaining({ job_id: refused.job_id, intent_id: refusedIntent, outcome: "quarantined", failures: 2 }),
        ]);
        const logged = h.lines.map((l) => JSON.parse(l)).filter((l) => l.msg === "notification_quarantined");
        expect(logged).toEqual([
          expect.objectContaining({
            level: "warn",
            job_id: refused.job_id,
            intent_id: refusedIntent,
            failures: 2,
            request_id: expect.any(String),
          }),
        ]);

        const listed = await h.call("GET", "/v1/jobs?owed=quarantined", { token: h.operator });
        expect(listed.status, listed.text).toBe(200);
        expect(listed.body.items.map((j: { job_id: string }) => j.job_id)).toEqual([refused.job_id]);
        expect(listed.body.items[0].pending_notification).toMatchObject({
          id: refusedIntent,
          failures: 2,
          quarantined_at: h.clock.now().toISOString(),
        });
        const none = await h.call("GET", "/v1/jobs?owed=quarantined&limit=1", { token: h.tokens.mintOperator(["read"]) });
        expect(none.body.next_cursor).toBeUndefined();

        h.clock.advance(3_600_000);
        h.refusedTopics.delete(`mam/jobs/${refused.job_id}/events`);
        expect((await sweep()).body).toMatchObject({ owed: 0, results: [] });

        // Release is the ops scope's; an intent id that is not the owed one releases nothing.
        const path = `/v1/jobs/${refused.job_id}/notification-release`;
        expectProblem(await h.call("POST", path, { token: h.tokens.mintOperator(["read", "write"]) }), 403, "auth.forbidden");
        const wrong = await h.call("POST", path, { token: h.operator, json: { intent_id: "not-this-one" } });
        expect(wrong.status, wrong.text).toBe(200);
        expect(wrong.body).toMatchObject({ released: false, record: { pending_notification: { quarantined_at: expect.any(String) } } });
        const released = await h.call("POST", path, { token: h.operator, json: { intent_id: refusedIntent } });
        expect(released.status, released.text).toBe(200);
        expect(released.body.released).toBe(true);
        expect(released.body.record.pending_notification).not.toHaveProperty("quarantined_at");
        expect((await h.call("GET", "/v1/jobs?owed=quarantined", { token: h.operator })).body.items).toEqual([]);

        const third = await sweep();
        expect(third.body).toMatchObject({ owed: 1, sent: 1, failed: 0, quarantined: 0 });
        expect((await h.call("GET", `/v1/jobs/${refused.job_id}`, { token: h.operator })).body.pending_notification).toBeUndefined();
        expectProblem(await h.call("POST", "/v1/jobs/nobody-here/notification-release", { token: h.operator }), 404, "job.notFound");
      });

      it("POST /v1/recovery-sweeps answers 200 with per-intent failures when every settle throws, never a 500", async () => {
        const h = await harness({ failJobStore: ["settleNotification", "settlePublished"] });
        for (let i = 0; i < 2; i++) {
          const job = await register(h);
          await transition(h, job.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        }
        const res = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator });
        expect(res.status, res.text).toBe(200);
        expect(res.body).toMatchObject({ owed: 2, sent: 0, failed: 2, not_tried: 0 });
        expect(res.body.results.map((r: { outcome: string; error: { code: string } }) => [r.outcome, r.error.code])).toEqual([
          ["failed", "internal"],
          ["failed", "internal"],
        ]);
        // What went wrong is logged, never answered.
        expect(res.text).not.toContain("disk on fire");
        const errors = h.lines.map((l) => JSON.parse(l)).filter((l) => l.msg === "notification_sweep_error");
        expect(errors).toHaveLength(2);
        expect(errors[0]).toMatchObject({ level: "error", request_id: res.headers.get("x-request-id") });
        expect(JSON.stringify(errors)).toContain("disk on fire");
      });

      it("where another path publishes each commit, POST /events answers without published and publishes nothing; the sweep waits out its grace", async () => {
        const h = await harness({ publishInline: false, sweepGraceSeconds: 5 });
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/events`, { token: agent, json: { event: "started" } });
        expect(res.status, res.text).toBe(200);
        expect(res.body).not.toHaveProperty("published");
        expect(res.body).not.toHaveProperty("publish_error");
        const intent = res.body.record.pending_notification;
        const log = await h.call("GET", `/v1/jobs/${job.job_id}/events`, { token: h.operator });
        expect(log.body.items.map((e: { event: string }) => e.event)).toEqual(["publish_event"]);
        // Fresh: the other path's. Past the grace: the sweep's, once.
        expect((await h.call("POST", "/v1/recovery-sweeps", { token: h.operator })).body).toMatchObject({ owed: 0, sent: 0 });
        h.clock.advance(5_000);
        const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: {} });
        expect(sweep.body).toMatchObject({ owed: 1, sent: 1, results: [{ job_id: job.job_id, intent_id: intent.id, outcome: "sent" }] });
        const bad = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: { grace_seconds: 3601 } });
        expect(bad.status).toBe(400);
        expect(bad.body.errors).toEqual([expect.objectContaining({ path: "body.grace_seconds" })]);
      });

      it("a publish that fails after the commit is a 200 with published: false; the intent stays owed", async () => {
        const h = await harness({ publisher: "unreachable" });
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/events`, { token: agent, json: { event: "error" } });
        expect(res.status, res.text).toBe(200);
        expect(res.body.published).toBe(false);
        expect(res.body.publish_error).toMatchObject({ code: "publish.unreachable" });
        expect(res.body.record).toMatchObject({ status: "error", transition_seq: 1 });
        const got = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator });
        expect(got.body.pending_notification).toMatchObject({ event: "error", seq: 1 });
        const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator });
        expect(sweep.body).toEqual({
          owed: 1,
          sent: 0,
          failed: 1,
          quarantined: 0,
          not_tried: 0,
          results: [
            {
              job_id: job.job_id,
              intent_id: got.body.pending_notification.id,
              outcome: "deferred",
              error: { code: "publish.unreachable", message: expect.any(String) },
            },
          ],
          ...QUIET_PARTS,
        });
        // An unreachable broker counts against nobody: the intent carries no failure.
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body.pending_notification).toEqual(
          got.body.pending_notification,
        );
      });

      it("POST /v1/recovery-sweeps keeps to the sweep's time budget (MAM_SWEEP_BUDGET_SECONDS): once spent, the rest are not_tried and stay owed, untouched", async () => {
        // A budget already spent when the pass starts: no intent is tried. Without the
        // budget the unreachable broker's intents are each tried (deferred), one by one.
        const h = await harness({ publisher: "unreachable", sweepBudgetSeconds: 0 });
        const owed = [];
        for (let i = 0; i < 3; i++) {
          const job = await register(h);
          const t = await transition(h, job.job_id, h.operator, { action: "cancel", expected_seq: 0 });
          owed.push({ job_id: job.job_id, intent: t.body.pending_notification });
          h.clock.advance(1);
        }
        const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator });
        expect(sweep.status, sweep.text).toBe(200);
        expect(sweep.body).toMatchObject({ owed: 3, sent: 0, failed: 0, quarantined: 0, not_tried: 3 });
        for (const o of owed) {
          const got = await h.call("GET", `/v1/jobs/${o.job_id}`, { token: h.operator });
          expect(got.body.pending_notification).toEqual(o.intent);
        }
        const unbounded = await harness({ publisher: "unreachable" });
        const job = await register(unbounded);
        await transition(unbounded, job.job_id, unbounded.operator, { action: "cancel", expected_seq: 0 });
        expect((await unbounded.call("POST", "/v1/recovery-sweeps", { token: unbounded.operator })).body).toMatchObject({
          owed: 1,
          not_tried: 0,
        });
      });

      it("GET /openapi.json is OpenAPI 3.1 covering every route, with bearer security and problem responses", async () => {
        const h = await harness();
        const res = await h.call("GET", "/openapi.json");
        expect(res.status).toBe(200);
        const doc = res.body;
        expect(doc.openapi).toBe("3.1.0");
        expect(doc.components.securitySchemes.bearerAuth).toMatchObject({ type: "http", scheme: "bearer" });
        for (const key of Object.keys(ROUTE_PERMISSIONS) as RouteKey[]) {
          const [method, path] = key.split(" ") as [string, string];
          const op = doc.paths[path]?.[method.toLowerCase()];
          expect(op, key).toBeDefined();
          const access = ROUTE_PERMISSIONS[key];
          if (access.kind === "protected") {
            expect(op.security, key).toEqual([{ bearerAuth: [access.scope] }]);
            expect(op.responses["401"].content["application/problem+json"], key).toBeDefined();
            expect(op.responses["403"], key).toBeDefined();
          } else {
            expect(op.security, key).toEqual([]);
          }
          for (const name of path.match(/\{([a-z_]+)\}/g) ?? []) {
            expect(
              op.parameters.some((p: { in: string; name: string }) => p.in === "path" && `{${p.name}}` === name),
              `${key} ${name}`,
            ).toBe(true);
          }
        }
        // Exactly the table: no undocumented operation, no documented route missing.
        const documented = Object.entries(doc.paths).flatMap(([p, ops]) =>
          Object.keys(ops as object).map((m) => `${m.toUpperCase()} ${p}`),
        );
        expect(documented.sort()).toEqual(Object.keys(ROUTE_PERMISSIONS).sort());
        expect(ROUTES.map(({ route }) => `${route.method.toUpperCase()} ${route.path}`).sort()).toEqual(
          Object.keys(ROUTE_PERMISSIONS).sort(),
        );

        const register = doc.paths["/v1/jobs"].post;
        expect(register.requestBody.content["application/json"].schema).toEqual({ $ref: "#/components/schemas/RegisterJob" });
        expect(doc.components.schemas.RegisterJob.additionalProperties).toBe(false);
        expect(register.responses["415"]).toBeDefined();
        expect(register.responses["413"]).toBeDefined();
        expect(doc.paths["/v1/jobs/{job_id}/transitions"].post.responses["412"]).toBeDefined();
        expect(doc.paths["/v1/jobs"].get.parameters.map((p: { name: string }) => p.name)).toEqual([
          "status",
          "owed",
          "stale",
          "overdue",
          "candidate",
          "limit",
          "cursor",
        ]);
        expect(doc.paths["/v1/jobs/{job_id}/attempts/{attempt}/report"].put.requestBody.content["text/markdown"]).toBeDefined();

        // Every reference resolves inside the document.
        const refs: string[] = [];
        const walk = (v: unknown): void => {
          if (Array.isArray(v)) v.forEach(walk);
          else if (v !== null && typeof v === "object") {
            for (const [k, x] of Object.entries(v)) {
              if (k === "$ref" && typeof x === "string") refs.push(x);
              else walk(x);
            }
          }
        };
        walk(doc);
        expect(refs.length).toBeGreaterThan(10);
        for (const ref of new Set(refs)) {
          expect(ref, ref).toMatch(/^#\/components\/schemas\/[A-Za-z]+$/);
          expect(doc.components.schemas[ref.split("/").pop()!], ref).toBeDefined();
        }
      });

      it("GET /docs renders Swagger UI over /openapi.json, its assets served by the app", async () => {
        const h = await harness();
        const page = await h.call("GET", "/docs");
        expect(page.status).toBe(200);
        expect(page.headers.get("content-type")).toMatch(/^text\/html/);
        expect(page.text).toContain('<script src="docs/assets/mam-docs.js"></script>');
        expect(page.text).not.toMatch(/(src|href)="(https?:)?\/\//);
        const init = await h.call("GET", "/docs/assets/mam-docs.js");
        expect(init.status).toBe(200);
        expect(init.headers.get("content-type")).toMatch(/^text\/javascript/);
        expect(init.text).toContain("SwaggerUIBundle");
        expect(init.text).toContain('url: "openapi.json"');

        const css = await h.call("GET", "/docs/assets/swagger-ui.css");
        expect(css.status).toBe(200);
        expect(css.headers.get("content-type")).toMatch(/^text\/css/);
        expect(css.text.length).toBeGreaterThan(1000);
        const js = await h.call("GET", "/docs/assets/swagger-ui-bundle.js");
        expect(js.status).toBe(200);
        expect(js.headers.get("content-type")).toMatch(/^text\/javascript/);

        expectProblem(await h.call("GET", "/docs/assets/package.json"), 404, "route.notFound");
        expectProblem(await h.call("GET", "/docs/assets/..%2Fpackage.json"), 404, "route.notFound");
      });

      it("GET / serves the dashboard built by @mam/dashboard (read from its files), its script and stylesheet served by the app, nothing else", async () => {
        const h = await harness();
        const res = await h.call("GET", "/");
        expect(res.status).toBe(200);
        expect(res.headers.get("content-type")).toMatch(/^text\/html/);
        expect(res.text).toContain('<script type="module" src="assets/app.js"></script>');
        expect(res.text).toContain('<link rel="stylesheet" href="assets/app.css">');
        expect(res.text).toMatch(/<meta name="mam-feed" content="(stream|poll)">/);
        expect(res.text).not.toMatch(/(src|href)="(https?:)?\/\//);
        const csp = res.headers.get("content-security-policy") ?? "";
        expect(csp).toContain("default-src 'none'");
        expect(csp).toContain("script-src 'self'");
        expect(csp).not.toContain("unsafe-inline");

        const js = await h.call("GET", "/assets/app.js");
        expect(js.status).toBe(200);
        expect(js.headers.get("content-type")).toMatch(/^text\/javascript/);
        expect(js.headers.get("x-content-type-options")).toBe("nosniff");
        expect(js.text).toContain("sessionStorage");
        expect(js.text).toContain("v1/events/stream");
        const css = await h.call("GET", "/assets/app.css");
        expect(css.status).toBe(200);
        expect(css.headers.get("content-type")).toMatch(/^text\/css/);
        for (const bad of ["index.html", "package.json", "..%2Fapp.js", "main.tsx", "app.js.map", "constructor", "__proto__"]) {
          expectProblem(await h.call("GET", `/assets/${bad}`), 404, "route.notFound");
        }
      });

      it("a token is read from the Authorization header only: in a cookie, a query string or a form body it authorizes nothing (the dashboard's CSRF defence)", async () => {
        const h = await harness();
        const reader = h.tokens.mintOperator(["read"], { name: "dashboard" });
        expect((await h.call("GET", "/v1/jobs", { token: reader })).status).toBe(200);
        expectProblem(
          await h.call("GET", "/v1/jobs", { headers: { cookie: `token=${reader}; authorization=Bearer%20${reader}` } }),
          401,
          "auth.missing",
        );
        const query = await h.call("GET", `/v1/jobs?access_token=${reader}`);
        expect([400, 401], query.text).toContain(query.status);
        const form = await h.call("POST", "/v1/jobs", {
          headers: { "content-type": "application/x-www-form-urlencoded" },
          body: `access_token=${reader}&prompt=x&agent=codex`,
        });
        expect([401, 415], form.text).toContain(form.status);
      });

      it("every HTML answer (/ and /docs) is nosniff, framed by nobody, sends no Referer, and runs no inline script", async () => {
        const h = await harness();
        for (const path of ["/", "/docs"]) {
          const res = await h.call("GET", path);
          expect(res.status, path).toBe(200);
          expect(res.headers.get("content-type"), path).toMatch(/^text\/html/);
          expect(res.headers.get("x-content-type-options"), path).toBe("nosniff");
          expect(res.headers.get("referrer-policy"), path).toBe("no-referrer");
          expect(res.headers.get("x-frame-options"), path).toBe("DENY");
          const csp = Object.fromEntries(
            (res.headers.get("content-security-policy") ?? "").split(";").map((d) => {
              const [name = "", ...values] = d.trim().split(/\s+/);
              return [name, values];
            }),
          );
          expect(csp["default-src"], path).toEqual(["'none'"]);
          expect(csp["frame-ancestors"], path).toEqual(["'none'"]);
          expect(csp["script-src"], path).toEqual(["'self'"]);
          expect(csp["base-uri"], path).toEqual(["'none'"]);
          // Every <script> loads a file of the app's own: none has a body, none an inline handler.
          const scripts = [...res.text.matchAll(/<script\b([^>]*)>([\s\S]*?)<\/script>/gi)];
          expect(scripts.length, path).toBeGreaterThan(0);
          for (const [, attrs = "", body = ""] of scripts) {
            expect(attrs, path).toMatch(/\ssrc="(docs\/)?assets\/[A-Za-z0-9._-]+\.js"/);
            expect(body.trim(), path).toBe("");
          }
          expect(res.text, path).not.toMatch(/\son[a-z]+\s*=/i);
          expect(res.text, path).not.toMatch(/javascript:/i);
          for (const [, src] of res.text.matchAll(/<script\b[^>]*\ssrc="([^"]+)"/gi)) {
            const asset = await h.call("GET", `/${src}`);
            expect(asset.status, `${path} loads ${src}`).toBe(200);
          }
        }
      });
    });

    // ------------------------------------------------------------------ auth

    describe("authentication and authorization", () => {
      it("every protected route answers 401 auth.missing with a Bearer challenge, without a token", async () => {
        const h = await harness();
        const job = await register(h);
        for (const key of protectedKeys) {
          const { method, path } = concrete(key, job.job_id);
          const res = await h.call(method, path, validRequest(key));
          expectProblem(res, 401, "auth.missing");
          expect(res.headers.get("www-authenticate"), key).toMatch(/^Bearer /);
        }
      });

      it("a malformed token, a bad signature, a tampered claim, alg none and another scheme are 401 auth.invalid", async () => {
        const h = await harness();
        const job = await register(h);
        const other = createTokenService({ signingKey: "another-key-0123456789abcdef-0123456789", clock: h.clock });
        const good = h.operator;
        const [header, payload, sig] = good.split(".") as [string, string, string];
        const claims = JSON.parse(Buffer.from(payload, "base64url").toString());
        const tampered = `${header}.${Buffer.from(JSON.stringify({ ...claims, scopes: SCOPES, jti: "x" })).toString("base64url")}.${sig}`;
        const none = `${Buffer.from(JSON.stringify({ alg: "none", typ: "JWT" })).toString("base64url")}.${payload}.`;
        const cases: [string, Record<string, string>][] = [
          ["garbage", { authorization: "Bearer not-a-token" }],
          ["other key", { authorization: `Bearer ${other.mintOperator(["read"])}` }],
          ["tampered", { authorization: `Bearer ${tampered}` }],
          ["alg none", { authorization: `Bearer ${none}` }],
          ["basic", { authorization: "Basic dXNlcjpwYXNz" }],
        ];
        for (const [label, headers] of cases) {
          const res = await h.call("GET", `/v1/jobs/${job.job_id}`, { headers });
          expectProblem(res, 401, "auth.invalid");
          expect(res.headers.get("www-authenticate"), label).toMatch(/^Bearer .*invalid_token/);
        }
      });

      it("an expired agent token and an expired operator token are 401 auth.invalid", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const shortOperator = h.tokens.mintOperator(["read"], { ttlSeconds: 60 });
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: agent })).status).toBe(200);
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: shortOperator })).status).toBe(200);
        h.clock.advance(61_000);
        expectProblem(await h.call("GET", `/v1/jobs/${job.job_id}`, { token: shortOperator }), 401, "auth.invalid");
        h.clock.advance(86_400_000);
        const res = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: agent });
        expectProblem(res, 401, "auth.invalid");
        expect(res.body.detail).toContain("expired");
        // The bootstrap-style operator token (no TTL) still works.
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).status).toBe(200);
      });

      it("an operator token without the route's scope is 403 auth.forbidden naming the scope; with it, the route runs", async () => {
        const h = await harness();
        const job = await register(h);
        await dispatch(h, job.job_id);
        for (const key of protectedKeys) {
          const access = ROUTE_PERMISSIONS[key];
          if (access.kind !== "protected") continue;
          if (access.agentOnly === true) {
            // An agent hook's route takes no operator token, whatever its scopes (the token names the job and attempt).
            const { method, path } = concrete(key, job.job_id);
            const res = await h.call(method, path, { token: h.tokens.mintOperator([...SCOPES]), ...validRequest(key) });
            expectProblem(res, 403, "auth.forbidden");
            expect(res.body.detail, key).toContain("only an agent's token");
            continue;
          }
          if (access.anyScope === true) {
            // What the token may do is answered to any valid token, of any scopes.
            const { method, path } = concrete(key, job.job_id);
            for (const scope of SCOPES)
              expect((await h.call(method, path, { token: h.tokens.mintOperator([scope]) })).status, `${key} ${scope}`).toBe(200);
            continue;
          }
          const others = SCOPES.filter((s) => s !== access.scope) as Scope[];
          const { method, path } = concrete(key, job.job_id);
          const res = await h.call(method, path, { token: h.tokens.mintOperator(others), ...validRequest(key) });
          expectProblem(res, 403, "auth.forbidden");
          expect(res.body.detail, key).toContain(access.scope);
          expect(res.headers.get("www-authenticate"), key).toContain(`scope="${access.scope}"`);
          const allowed = await h.call(method, path, { token: h.tokens.mintOperator([access.scope]), ...validRequest(key) });
          expect([401, 403], `${key}: ${allowed.text}`).not.toContain(allowed.status);
        }
      });

      it("an agent token is refused (403) on every operator-only route", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const operatorOnly = protectedKeys.filter((k) => {
          const a = ROUTE_PERMISSIONS[k];
          return a.kind === "protected" && !("agent" in a);
        });
        expect(operatorOnly.sort()).toEqual(
          [
            "POST /v1/jobs",
            "GET /v1/jobs",
            "GET /v1/job-counts",
            "POST /v1/jobs/{job_id}/dispatches",
            "GET /v1/jobs/{job_id}/attempts/{attempt}/verification",
            "GET /v1/jobs/{job_id}/gate",
            "POST /v1/jobs/{job_id}/evaluations",
            "POST /v1/recovery-sweeps",
            "POST /v1/jobs/{job_id}/notification-release",
            "POST /v1/jobs/{job_id}/notification-sends",
          ].sort(),
        );
        for (const key of operatorOnly) {
          const { method, path } = concrete(key, job.job_id);
          const res = await h.call(method, path, { token: agent, ...validRequest(key) });
          expectProblem(res, 403, "auth.forbidden");
          expect(res.body.detail, key).toContain("operator");
        }
      });

      it("an agent may read its job and events, claim, progress, stage, finalize and publish — on its own job and attempt only", async () => {
        const h = await harness();
        const job = await register(h);
        const other = await register(h);
        const agent = await dispatch(h, job.job_id);
        await dispatch(h, other.job_id);

        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: agent })).status).toBe(200);
        expect((await h.call("GET", `/v1/jobs/${job.job_id}/events`, { token: agent })).status).toBe(200);
        expect((await transition(h, job.job_id, agent, { action: "claim", expected_seq: 0 })).status).toBe(200);
        expect(
          (await transition(h, job.job_id, agent, { action: "progress", expected_seq: 1, fields: { progress: { pct: 50 } } })).status,
        ).toBe(200);
        expect((await stage(h, job.job_id, 1, agent)).status).toBe(201);

        for (const key of protectedKeys) {
          const a = ROUTE_PERMISSIONS[key];
          // `self` routes name no job: they read the agent's own (tests/api/feed.suite.ts).
          if (a.kind !== "protected" || !("agent" in a) || a.agent === "self") continue;
          const { method, path } = concrete(key, other.job_id);
          const res = await h.call(method, path, { token: agent, ...validRequest(key) });
          expectProblem(res, 403, "auth.forbidden");
          expect(res.body.detail, key).toContain(`bound to job ${job.job_id}`);
        }
        for (const key of [
          "PUT /v1/jobs/{job_id}/attempts/{attempt}/report",
          "POST /v1/jobs/{job_id}/attempts/{attempt}/finalize",
        ] as const) {
          const { method, path } = concrete(key, job.job_id, 2);
          const res = await h.call(method, path, { token: agent, ...validRequest(key, 2) });
          expectProblem(res, 403, "auth.forbidden");
          expect(res.body.detail, key).toContain("bound to attempt 1");
        }
        const wrongAttempt = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: { event: "progress", finalize: { attempt_id: 2, side_effects: [] } },
        });
        expectProblem(wrongAttempt, 403, "auth.forbidden");
      });

      it("the engine keeps an agent to its own actions and fields: cancel and operator-only fields are 403", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        await transition(h, job.job_id, agent, { action: "claim", expected_seq: 0 });
        expectProblem(await transition(h, job.job_id, agent, { action: "cancel", expected_seq: 1 }), 403, "job.actionForbidden");
        const field = await transition(h, job.job_id, agent, { action: "progress", expected_seq: 1, fields: { auto_complete: true } });
        expectProblem(field, 403, "job.fieldNotAllowed");
        expect(field.body.errors).toEqual([{ path: "body.fields.auto_complete", message: "operator only" }]);
        // The operator may.
        expect(
          (await transition(h, job.job_id, h.operator, { action: "progress", expected_seq: 1, fields: { auto_complete: true } })).status,
        ).toBe(200);
      });

      it("a newer dispatch retires the older attempt's token (403, superseded); the new token works", async () => {
        const h = await harness();
        const job = await register(h);
        const first = await dispatch(h, job.job_id, 1);
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: first })).status).toBe(200);
        const second = await dispatch(h, job.job_id, 2);
        const res = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: first });
        expectProblem(res, 403, "auth.forbidden");
        expect(res.body.detail).toContain("superseded by attempt 2");
        expectProblem(await stage(h, job.job_id, 1, first), 403, "auth.forbidden");
        expect((await stage(h, job.job_id, 2, second)).status).toBe(201);
      });
    });

    // ------------------------------------------------------------------ validation

    describe("validation", () => {
      it("an unknown field is 400 naming it; a wrong type is 400 naming it", async () => {
        const h = await harness();
        const unknown = await h.call("POST", "/v1/jobs", { token: h.operator, json: { prompt: "p", agent: "codex", colour: "red" } });
        expectProblem(unknown, 400, "input.invalid");
        expect(unknown.body.errors).toEqual([{ path: "body.colour", message: "unknown field" }]);

        const wrong = await h.call("POST", "/v1/jobs", { token: h.operator, json: { prompt: 5, agent: "codex", role: "Boss" } });
        expectProblem(wrong, 400, "input.invalid");
        expect(wrong.body.errors.map((e: { path: string }) => e.path).sort()).toEqual(["body.prompt", "body.role"]);

        const job = await register(h);
        const nested = await transition(h, job.job_id, h.operator, { action: "claim", expected_seq: 0, fields: { colour: 1 } });
        expectProblem(nested, 400, "input.invalid");
        expect(nested.body.errors).toEqual([{ path: "body.fields.colour", message: "unknown field" }]);

        const noSeq = await transition(h, job.job_id, h.operator, { action: "claim" });
        expectProblem(noSeq, 400, "input.invalid");
        expect(noSeq.body.errors).toEqual([{ path: "body.expected_seq", message: "required" }]);

        const envelope = await h.call("POST", `/v1/jobs/${job.job_id}/evaluations`, {
          token: h.operator,
          json: { scenario: {}, extra: 1 },
        });
        expectProblem(envelope, 400, "input.invalid");
        expect(envelope.body.errors).toEqual([{ path: "body.extra", message: "unknown field" }]);
        // Without a scenario the gate builds one from what mam recorded (issue 20): an answer, not a 400.
        const noScenario = await h.call("POST", `/v1/jobs/${job.job_id}/evaluations`, { token: h.operator, json: {} });
        expect(noScenario.status, noScenario.text).toBe(200);
        expect(noScenario.body).toMatchObject({ committed: false });
        const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: { all: true } });
        expectProblem(sweep, 400, "input.invalid");
      });

      it("a bad job id in the path is 400 input.jobId before any store is asked (operator or agent)", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        const bad = ["bad!id", "-leading-dash", "x".repeat(65), "a.b", "%F0%9F%92%A5"];
        for (const id of bad) {
          for (const token of [h.operator, agent]) {
            h.calls.length = 0;
            const res = await h.call("GET", `/v1/jobs/${id}`, { token });
            expectProblem(res, 400, "input.jobId");
            expect(res.body.errors[0].path).toBe("path.job_id");
            expect(h.calls, id).toEqual([]);
          }
        }
        h.calls.length = 0;
        const post = await transition(h, "bad!id", h.operator, { action: "claim", expected_seq: 0 });
        expectProblem(post, 400, "input.jobId");
        expect(h.calls).toEqual([]);
      });

      it("an attempt that is not a positive integer is 400 naming path.attempt", async () => {
        const h = await harness();
        const job = await register(h);
        for (const attempt of ["0", "-1", "abc", "1.5", "01", "99999999"]) {
          h.calls.length = 0;
          const res = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/${attempt}/verification`, { token: h.operator });
          expectProblem(res, 400, "input.invalid");
          expect(
            res.body.errors.map((e: { path: string }) => e.path),
            attempt,
          ).toEqual(["path.attempt"]);
          expect(h.calls).toEqual([]);
        }
      });

      it("query parameters are validated: limit range, status, unknown parameters, cursors", async () => {
        const h = await harness();
        for (const [q, field] of [
          ["limit=0", "query.limit"],
          ["limit=201", "query.limit"],
          ["limit=ten", "query.limit"],
          ["status=done", "query.status"],
          ["colour=red", "query.colour"],
          ["owed=yes", "query.owed"],
          ["owed=quarantined&status=running", "query.owed"],
          ["stale=yes", "query.stale"],
          ["candidate=later", "query.candidate"],
          ["stale=true&overdue=true", "query.stale"],
          ["stale=true&owed=quarantined", "query.stale"],
          ["overdue=true&status=pending", "query.status"],
        ] as const) {
          const res = await h.call("GET", `/v1/jobs?${q}`, { token: h.operator });
          expectProblem(res, 400, "input.invalid");
          expect(
            res.body.errors.map((e: { path: string }) => e.path),
            q,
          ).toEqual([field]);
        }
        expectProblem(await h.call("GET", "/v1/jobs?cursor=not-a-cursor", { token: h.operator }), 400, "input.invalid");
        const job = await register(h);
        const badKind = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/1/verification?expected_artifacts=Commit`, {
          token: h.operator,
        });
        expectProblem(badKind, 400, "input.invalid");
        expect(badKind.body.errors[0].path).toBe("query.expected_artifacts.0");
      });

      it("malformed JSON is 400 naming body; a wrong or missing content type is 415", async () => {
        const h = await harness();
        const malformed = await h.call("POST", "/v1/jobs", {
          token: h.operator,
          body: '{"prompt": "p",',
          headers: { "content-type": "application/json" },
        });
        expectProblem(malformed, 400, "input.invalid");
        expect(malformed.body.errors).toEqual([{ path: "body", message: expect.stringContaining("not valid JSON") }]);

        const text = await h.call("POST", "/v1/jobs", {
          token: h.operator,
          body: '{"prompt":"p","agent":"codex"}',
          headers: { "content-type": "text/plain" },
        });
        expectProblem(text, 415, "input.unsupportedMediaType");
        const form = await h.call("POST", "/v1/recovery-sweeps", {
          token: h.operator,
          body: "a=1",
          headers: { "content-type": "application/x-www-form-urlencoded" },
        });
        expectProblem(form, 415, "input.unsupportedMediaType");
        const withCharset = await h.call("POST", "/v1/jobs", {
          token: h.operator,
          body: '{"prompt":"p","agent":"codex"}',
          headers: { "content-type": "application/json; charset=utf-8" },
        });
        expect(withCharset.status).toBe(201);
      });

      it("a bad side effect is 400 input.sideEffect naming it, and nothing is finalized", async () => {
        const h = await harness();
        const job = await register(h);
        await dispatch(h, job.job_id);
        await stage(h, job.job_id, 1, h.operator);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, {
          token: h.operator,
          json: {
            side_effects: [
              { kind: "commit", reference: "abc" },
              { kind: "commit", reference: "   " },
            ],
          },
        });
        expectProblem(res, 400, "input.sideEffect");
        expect(res.body.errors).toEqual([{ path: "body.side_effects.1.reference", message: "a side effect needs a non-blank reference" }]);
        const verification = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/1/verification`, { token: h.operator });
        expect(verification.body.ok).toBe(false);

        const viaEvent = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: h.operator,
          json: { event: "completed", finalize: { attempt_id: 1, side_effects: [{ kind: "Bad Kind", reference: "x" }] } },
        });
        expectProblem(viaEvent, 400, "input.sideEffect");
        expect(viaEvent.body.errors[0].path).toBe("body.finalize.side_effects.0.kind");
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body.status).toBe("pending");
      });

      it("publishing with finalize for an attempt never dispatched is 404 dispatch.notFound; an unknown job 404 job.notFound", async () => {
        const h = await harness();
        const job = await register(h);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: h.operator,
          json: { event: "completed", finalize: { attempt_id: 3, side_effects: [] } },
        });
        expectProblem(res, 404, "dispatch.notFound");
        const unknown = await h.call("POST", `/v1/jobs/${newId()}/events`, {
          token: h.operator,
          json: { event: "completed", finalize: { attempt_id: 1, side_effects: [] } },
        });
        expectProblem(unknown, 404, "job.notFound");
      });
    });

    // ------------------------------------------------------------------ limits

    describe("body limits", () => {
      it("a JSON body declared over 1 MiB is 413 before a byte is read", async () => {
        const h = await harness();
        const { stream, pulled } = lazyBytes(2 * 1024 * 1024);
        const res = await h.call("POST", "/v1/jobs", {
          token: h.operator,
          body: stream,
          headers: { "content-type": "application/json", "content-length": String(1024 * 1024 + 1) },
        });
        expectProblem(res, 413, "input.tooLarge");
        expect(pulled()).toBe(0);
        expect(h.calls).toEqual([]);
      });

      it("a chunked JSON body is counted while it streams and abandoned past the limit", async () => {
        const h = await harness({ jsonBodyLimit: 4096 });
        const { stream, pulled } = lazyBytes(1024 * 1024, 1024);
        const res = await h.call("POST", "/v1/jobs", { token: h.operator, body: stream, headers: { "content-type": "application/json" } });
        expectProblem(res, 413, "input.tooLarge");
        expect(pulled()).toBeLessThanOrEqual(4096 + 1024);
        expect(h.calls).toEqual([]);
      });

      it("a report declared over 10 MiB is 413 before a byte is read or the store is asked", async () => {
        const h = await harness();
        const job = await register(h);
        await dispatch(h, job.job_id);
        h.calls.length = 0;
        const { stream, pulled } = lazyBytes(11 * 1024 * 1024);
        const res = await h.call("PUT", `/v1/jobs/${job.job_id}/attempts/1/report`, {
          token: h.operator,
          body: stream,
          headers: { "content-type": "text/markdown", "content-length": String(10 * 1024 * 1024 + 1) },
        });
        expectProblem(res, 413, "input.tooLarge");
        expect(pulled()).toBe(0);
        expect(h.calls).toEqual([]);
      });

      it("a chunked report over the limit is 413, abandoned while streaming, and nothing is staged", async () => {
        const h = await harness({ reportBodyLimit: 64 * 1024 });
        const job = await register(h);
        await dispatch(h, job.job_id);
        const { stream, pulled } = lazyBytes(4 * 1024 * 1024, 16 * 1024);
        const res = await h.call("PUT", `/v1/jobs/${job.job_id}/attempts/1/report`, { token: h.operator, body: stream });
        expectProblem(res, 413, "input.tooLarge");
        expect(pulled()).toBeLessThanOrEqual(64 * 1024 + 16 * 1024);
        expect(await h.ports.reports.exists(`reports/${job.job_id}/1`, "report-final.md.tmp")).toBe(false);
        // Exactly at the limit is fine.
        const { stream: exact } = lazyBytes(64 * 1024, 16 * 1024);
        const ok = await h.call("PUT", `/v1/jobs/${job.job_id}/attempts/1/report`, { token: h.operator, body: exact });
        expect(ok.status, ok.text).toBe(201);
        expect(ok.body.bytes).toBe(64 * 1024);
      });
    });

    // ------------------------------------------------------------------ concurrency and errors

    describe("concurrency, preconditions and errors", () => {
      it("a stale expected_seq is 409 job.transitionConflict carrying the current record", async () => {
        const h = await harness();
        const job = await register(h);
        await transition(h, job.job_id, h.operator, { action: "claim", expected_seq: 0 });
        const res = await transition(h, job.job_id, h.operator, { action: "progress", expected_seq: 0, fields: { progress: { a: 1 } } });
        expectProblem(res, 409, "job.transitionConflict");
        expect(res.body.current).toMatchObject({ job_id: job.job_id, status: "running", transition_seq: 1 });
      });

      it("a transition the status does not allow is 409 job.transitionRefused carrying the current record", async () => {
        const h = await harness();
        const job = await register(h);
        await transition(h, job.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        const res = await transition(h, job.job_id, h.operator, { action: "claim", expected_seq: 1 });
        expectProblem(res, 409, "job.transitionRefused");
        expect(res.body.current).toMatchObject({ status: "cancelled", transition_seq: 1 });
      });

      it("If-Match that does not name the current seq is 412 with the current record; a matching one commits", async () => {
        const h = await harness();
        const job = await register(h);
        const stale = await h.call("POST", `/v1/jobs/${job.job_id}/transitions`, {
          token: h.operator,
          json: { action: "claim", expected_seq: 0 },
          headers: { "if-match": '"5"' },
        });
        expectProblem(stale, 412, "job.preconditionFailed");
        expect(stale.body.current).toMatchObject({ transition_seq: 0 });
        const weak = await h.call("POST", `/v1/jobs/${job.job_id}/transitions`, {
          token: h.operator,
          json: { action: "claim", expected_seq: 0 },
          headers: { "if-match": 'W/"0"' },
        });
        expectProblem(weak, 412, "job.preconditionFailed");

        const etag = (await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).headers.get("etag")!;
        // No expected_seq in the body: the If-Match seq is the compare-and-swap's.
        const ok = await h.call("POST", `/v1/jobs/${job.job_id}/transitions`, {
          token: h.operator,
          json: { action: "claim" },
          headers: { "if-match": etag },
        });
        expect(ok.status, ok.text).toBe(200);
        expect(ok.headers.get("etag")).toBe('"1"');
        const star = await h.call("POST", `/v1/jobs/${job.job_id}/transitions`, {
          token: h.operator,
          json: { action: "progress", expected_seq: 1 },
          headers: { "if-match": "*" },
        });
        expect(star.status, star.text).toBe(200);
      });

      it("an unknown job is 404 job.notFound; a second dispatch of an attempt is 409; staging on a terminal job is 409", async () => {
        const h = await harness();
        expectProblem(await h.call("GET", `/v1/jobs/${newId()}`, { token: h.operator }), 404, "job.notFound");
        expectProblem(await h.call("GET", `/v1/jobs/${newId()}/events`, { token: h.operator }), 404, "job.notFound");
        const job = await register(h);
        expectProblem(
          await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: job.job_id, prompt: "p", agent: "codex" } }),
          409,
          "job.exists",
        );
        await dispatch(h, job.job_id, 1);
        const twice = await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, {
          token: h.operator,
          json: { attempt_id: 1, agent_session_uuid: "again", pane_process_generation: 1 },
        });
        // not greater than the latest (1): refused naming it, and attempt 1's dispatch stands
        expectProblem(twice, 409, "dispatch.outOfOrder");
        expect(twice.body.detail).toContain("latest dispatched attempt 1");
        expectProblem(await stage(h, job.job_id, 2, h.operator), 404, "dispatch.notFound");
        await transition(h, job.job_id, h.operator, { action: "cancel", expected_seq: 0 });
        expectProblem(await stage(h, job.job_id, 1, h.operator), 409, "report.frozen");
        const late = await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, {
          token: h.operator,
          json: { attempt_id: 2, agent_session_uuid: "late", pane_process_generation: 1 },
        });
        expectProblem(late, 409, "job.transitionRefused");
        expect(late.body.current).toMatchObject({ status: "cancelled", transition_seq: 1 });
        expectProblem(
          await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, { token: h.operator, json: { side_effects: [] } }),
          409,
          "report.frozen",
        );
      });

      it("an unexpected error is a 500 problem with a generic detail, logged with the request id", async () => {
        const h = await harness({ failJobStore: ["get"] });
        const res = await h.call("GET", "/v1/jobs/some-job", { token: h.operator });
        expectProblem(res, 500, "internal");
        expect(res.text).not.toContain("disk on fire");
        const logged = h.lines.map((l) => JSON.parse(l));
        expect(logged.find((l) => l.msg === "unexpected error")).toMatchObject({ level: "error", request_id: res.body.request_id });
        expect(JSON.stringify(logged)).toContain("disk on fire");
      });

      it("an unknown route is 404 and a known path with another method is 405 with Allow, both problems", async () => {
        const h = await harness();
        expectProblem(await h.call("GET", "/v2/nothing"), 404, "route.notFound");
        const res = await h.call("DELETE", "/v1/jobs/abc");
        expectProblem(res, 405, "route.methodNotAllowed");
        expect(res.headers.get("allow")).toBe("GET");
        expect((await h.call("PATCH", "/v1/jobs")).headers.get("allow")).toBe("POST, GET");
      });
    });

    // ------------------------------------------------------------------ cross-cutting

    // ------------------------------------------------------------------ integrity (issue 8): one test per finding

    describe("integrity under attack", () => {
      /** A job ready for the gate: opted in, dispatched as the reference scenario, claimed, its report finalized. */
      async function readyForGate(h: Harness, over: Record<string, unknown> = {}) {
        const job = await register(h, { agent: "claude-code", auto_complete: true, ...over });
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, { token: h.operator, json: CANDIDATE_DISPATCH });
        expect(res.status, res.text).toBe(201);
        const agent: string = res.body.agent_token;
        expect((await transition(h, job.job_id, agent, { action: "claim", expected_seq: 0 })).status).toBe(200);
        expect((await stage(h, job.job_id, 1, agent, "v1\n")).status).toBe(201);
        const fin = await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, {
          token: agent,
          json: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
        });
        expect(fin.status, fin.text).toBe(200);
        return { jobId: job.job_id, agent };
      }
      const evaluate = (h: Harness, jobId: string) =>
        h.call("POST", `/v1/jobs/${jobId}/evaluations`, { token: h.operator, json: { scenario: candidateScenario(jobId) } });

      it("finding 1: a chunked upload begun before the completion and finished after it is refused (409), and the completion's evidence verifies", async () => {
        const h = await harness({ env: { MAM_AUTO_COMPLETE: "1" } });
        const { jobId, agent } = await readyForGate(h, { expected_artifacts: ["git_push"] });
        let finish!: () => void;
        const completed = new Promise<void>((resolve) => {
          finish = resolve;
        });
        const body = new ReadableStream<Uint8Array>({
          async start(ctrl) {
            ctrl.enqueue(new TextEncoder().encode("v2, begun before the completion; "));
            await completed;
            ctrl.enqueue(new TextEncoder().encode("finished after it\n"));
            ctrl.close();
          },
        });
        const upload = h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
          token: agent,
          body,
          headers: { "content-type": "text/markdown" },
        });
        const gate = await evaluate(h, jobId);
        expect(gate.body.committed, gate.text).toBe(true);
        finish();
        expectProblem(await upload, 409, "report.frozen");
        const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
        expect(v.body).toMatchObject({ ok: true, pinned: { ok: true, report_sha256: gate.body.record.completed_evidence.report_sha256 } });
        expect(v.body.manifest_sha256).toBe(gate.body.record.completed_evidence.manifest_sha256);
      });

      it("finding 1: an upload whose token is retired by a newer dispatch while it streams is refused at its last byte (409)", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id, 1);
        let finish!: () => void;
        const dispatched = new Promise<void>((resolve) => {
          finish = resolve;
        });
        const body = new ReadableStream<Uint8Array>({
          async start(ctrl) {
            ctrl.enqueue(new TextEncoder().encode("begun under attempt 1; "));
            await dispatched;
            ctrl.enqueue(new TextEncoder().encode("finished under attempt 2\n"));
            ctrl.close();
          },
        });
        const upload = h.call("PUT", `/v1/jobs/${job.job_id}/attempts/1/report`, {
          token: agent,
          body,
          headers: { "content-type": "text/markdown" },
        });
        await dispatch(h, job.job_id, 2);
        finish();
        const res = await upload;
        expectProblem(res, 409, "report.notLatest");
        expect(res.body.detail).toContain("latest attempt (2");
      });

      it("finding 4: POST /events with finalize and a stale expected_seq is 409 and writes nothing: no manifest, the upload still staged", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id, 1);
        expect((await stage(h, job.job_id, 1, agent)).status).toBe(201);
        const before = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator });
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: { event: "started", expected_seq: 7, finalize: { attempt_id: 1, side_effects: [] } },
        });
        expectProblem(res, 409, "job.transitionConflict");
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body).toEqual(before.body);
        // not even an unreferenced pinned copy: the stale seq is refused before anything is prepared
        const sha = createHash("sha256").update(REPORT).digest("hex");
        expect(await h.ports.reports.exists(`reports/${job.job_id}/1/evidence`, sha)).toBe(false);
        const v = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/1/verification`, { token: h.operator });
        expect(v.body).toMatchObject({ ok: false, manifest: null });
        expect(v.body.reason).toContain("no completion manifest");
        // the staged upload is still there for the agent's corrected request
        const ok = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: { event: "started", expected_seq: 0, finalize: { attempt_id: 1, side_effects: [] } },
        });
        expect(ok.status, ok.text).toBe(200);
        expect(ok.body.record.finalized_report).toMatchObject({ attempt_id: 1, manifest_sha256: ok.body.finalized.manifest_sha256 });
      });

      it.each([
        ["POST /transitions", "transitions", { action: "completed", expected_seq: 0 }],
        ["POST /events", "events", { event: "error", expected_seq: 0 }],
        ["POST /transitions (progress)", "transitions", { action: "claim", expected_seq: 0, fields: { progress: { by: "old" } } }],
      ])(
        "a retired token's %s whose body was still in flight when a newer attempt was dispatched commits nothing (403)",
        async (_, route, json) => {
          const h = await harness();
          const job = await register(h);
          const agent = await dispatch(h, job.job_id, 1);
          const text = JSON.stringify(json);
          let finish!: () => void;
          const dispatched = new Promise<void>((resolve) => {
            finish = resolve;
          });
          const body = new ReadableStream<Uint8Array>({
            async start(ctrl) {
              ctrl.enqueue(new TextEncoder().encode(text.slice(0, 5)));
              await dispatched;
              ctrl.enqueue(new TextEncoder().encode(text.slice(5)));
              ctrl.close();
            },
          });
          const pending = h.call("POST", `/v1/jobs/${job.job_id}/${route}`, {
            token: agent,
            body,
            headers: { "content-type": "application/json" },
          });
          await dispatch(h, job.job_id, 2);
          finish();
          const res = await pending;
          expectProblem(res, 403, "auth.forbidden");
          expect(res.body.detail).toContain("superseded by attempt 2");
          const record = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator });
          expect(record.body).toMatchObject({ status: "pending", transition_seq: 0, latest_attempt: 2 });
          expect(record.body).not.toHaveProperty("progress");
        },
      );

      it("finding 6: a dispatch whose attempt is not greater than the latest is 409 naming the latest; the latest attempt's token stays valid", async () => {
        const h = await harness();
        const job = await register(h);
        const five = await dispatch(h, job.job_id, 5);
        const three = await h.call("POST", `/v1/jobs/${job.job_id}/dispatches`, {
          token: h.operator,
          json: { attempt_id: 3, agent_session_uuid: "late", pane_process_generation: 1 },
        });
        expectProblem(three, 409, "dispatch.outOfOrder");
        expect(three.body.detail).toContain("latest dispatched attempt 5");
        expect(three.body.agent_token).toBeUndefined();
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: five })).status).toBe(200);
        const record = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator });
        expect(record.body).toMatchObject({ latest_attempt: 5 });
        expect(record.body).not.toHaveProperty("attempt_id");
      });

      it("finding 7: an agent may not suppress its terminal notification nor choose the reason subscribers read (403, nothing written)", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id, 1);
        const quiet = await transition(h, job.job_id, agent, { action: "completed", expected_seq: 0, notify: false });
        expectProblem(quiet, 403, "job.fieldNotAllowed");
        expect(quiet.body.detail).toContain("suppress");
        const disguised = await transition(h, job.job_id, agent, { action: "completed", expected_seq: 0, reason: "auto_complete" });
        expectProblem(disguised, 403, "job.fieldNotAllowed");
        expect(disguised.body.detail).toContain("reason");
        const record = await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator });
        expect(record.body).toMatchObject({ status: "pending", transition_seq: 0 });
        // the agent's plain completion notifies, saying who ended the job
        const done = await transition(h, job.job_id, agent, { action: "completed", expected_seq: 0 });
        expect(done.status, done.text).toBe(200);
        expect(done.body.pending_notification).toMatchObject({ event: "completed", by: "agent" });
        expect(done.body.pending_notification).not.toHaveProperty("reason");
        expect(done.body).not.toHaveProperty("completed_by");
      });

      it("finding 7: an agent's own completed on a job with expected_artifacts needs a verified manifest of its attempt; with one it pins completed_evidence", async () => {
        const h = await harness();
        const job = await register(h, { expected_artifacts: ["git_push"] });
        const agent = await dispatch(h, job.job_id, 1);
        const bare = await transition(h, job.job_id, agent, { action: "completed", expected_seq: 0 });
        expectProblem(bare, 409, "job.evidenceMissing");
        expect(bare.body.detail).toContain("git_push");
        expect((await stage(h, job.job_id, 1, agent, "done\n")).status).toBe(201);
        const withoutPush = await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, {
          token: agent,
          json: { side_effects: [] },
        });
        expect(withoutPush.status).toBe(200);
        const stillMissing = await transition(h, job.job_id, agent, { action: "completed", expected_seq: 0 });
        expectProblem(stillMissing, 409, "job.evidenceMissing");
        expect(stillMissing.body.detail).toContain("git_push");
        const fin = await h.call("POST", `/v1/jobs/${job.job_id}/attempts/1/finalize`, {
          token: agent,
          json: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
        });
        expect(fin.status).toBe(200);
        const done = await transition(h, job.job_id, agent, { action: "completed", expected_seq: 0 });
        expect(done.status, done.text).toBe(200);
        expect(done.body).not.toHaveProperty("completed_by");
        expect(done.body.completed_evidence).toMatchObject({ attempt_id: 1, manifest_sha256: fin.body.manifest_sha256 });
        expect(done.body.pending_notification).toMatchObject({ event: "completed", by: "agent" });
      });

      it("finding 7: an agent's completed through POST /events with finalize pins the evidence it finalized in the same write", async () => {
        const h = await harness();
        const job = await register(h, { expected_artifacts: ["git_push"] });
        const agent = await dispatch(h, job.job_id, 1);
        expect((await stage(h, job.job_id, 1, agent, "done\n")).status).toBe(201);
        const missing = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: { event: "completed", finalize: { attempt_id: 1, side_effects: [] } },
        });
        expectProblem(missing, 409, "job.evidenceMissing");
        expect((await h.call("GET", `/v1/jobs/${job.job_id}`, { token: h.operator })).body).toMatchObject({
          status: "pending",
          evidence_seq: 2,
        });
        const done = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: { event: "completed", finalize: { attempt_id: 1, side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] } },
        });
        expect(done.status, done.text).toBe(200);
        expect(done.body.record.completed_evidence).toMatchObject({ manifest_sha256: done.body.finalized.manifest_sha256 });
        const v = await h.call("GET", `/v1/jobs/${job.job_id}/attempts/1/verification`, { token: h.operator });
        expect(v.body).toMatchObject({ ok: true, manifest_sha256: done.body.finalized.manifest_sha256, pinned: { ok: true } });
      });

      it("finding 3: a store failure after the commit (the event log line) is not a 5xx: 200, the commit stands, a warning says what was lost", async () => {
        const h = await harness({ failJobStore: ["appendEvent"] });
        const job = await register(h);
        const agent = await dispatch(h, job.job_id, 1);
        const res = await h.call("POST", `/v1/jobs/${job.job_id}/events`, { token: agent, json: { event: "completed", expected_seq: 0 } });
        expect(res.status, res.text).toBe(200);
        expect(res.body.record).toMatchObject({ status: "completed", transition_seq: 1 });
        expect(res.body.warnings).toEqual([expect.stringContaining("event log line was not written")]);
        // the agent's retry is told the truth: the job is already completed
        const retry = await h.call("POST", `/v1/jobs/${job.job_id}/events`, {
          token: agent,
          json: { event: "completed", expected_seq: 0 },
        });
        expectProblem(retry, 409, "job.transitionConflict");
      });

      it("finding 7: the gate's completion notification says the gate ended the job", async () => {
        const h = await harness({ env: { MAM_AUTO_COMPLETE: "1" } });
        const { jobId } = await readyForGate(h);
        const res = await evaluate(h, jobId);
        expect(res.body.committed, res.text).toBe(true);
        expect(res.body.record.pending_notification).toMatchObject({ event: "completed", reason: "auto_complete", by: "gate" });
        expect(res.body.record.completed_evidence.evidence_location).not.toMatch(/^\//);
      });
    });

    describe("request ids and logs", () => {
      it("every response carries X-Request-Id: a sane incoming one is kept, anything else replaced", async () => {
        const h = await harness();
        const kept = await h.call("GET", "/healthz", { headers: { "x-request-id": "trace-abc_123.4:5" } });
        expect(kept.headers.get("x-request-id")).toBe("trace-abc_123.4:5");
        for (const insane of ["has space", "x".repeat(200), "<script>", "-lead"]) {
          const res = await h.call("GET", "/healthz", { headers: { "x-request-id": insane } });
          expect(res.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
        }
        const problem = await h.call("GET", "/v1/jobs");
        expect(problem.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
        expect(problem.body.request_id).toBe(problem.headers.get("x-request-id"));
        const asset = await h.call("GET", "/docs/assets/swagger-ui.css", { headers: { "x-request-id": "asset-1" } });
        expect(asset.headers.get("x-request-id")).toBe("asset-1");
      });

      it("logs one JSON line per request with the request id, status, duration and actor", async () => {
        const h = await harness();
        const job = await register(h);
        const agent = await dispatch(h, job.job_id);
        h.lines.length = 0;
        await h.call("GET", `/v1/jobs/${job.job_id}`, { token: agent, headers: { "x-request-id": "req-1" } });
        await h.call("GET", "/v1/jobs", { headers: { "x-request-id": "req-2" } });
        const lines = h.lines.map((l) => JSON.parse(l));
        expect(lines).toHaveLength(2);
        expect(lines[0]).toMatchObject({
          level: "info",
          msg: "request",
          request_id: "req-1",
          method: "GET",
          path: `/v1/jobs/${job.job_id}`,
          status: 200,
          actor: `agent:${job.job_id}/1`,
        });
        expect(typeof lines[0].duration_ms).toBe("number");
        expect(lines[1]).toMatchObject({ level: "warn", request_id: "req-2", status: 401, actor: "anonymous" });
      });
    });
  });
}
