import { randomUUID } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { type Harness, type HarnessOptions, makeHarness, type PortsFactory, type Res } from "./harness.ts";

const PROBLEM = /^application\/problem\+json/;
const MiB = 1024 * 1024;

/**
 * Quotas on what an agent sends (issue 17), kept by core on every backend: each
 * event, and the bytes of event data, report bodies and upload declarations, are
 * reserved on the job record by a conditional write before anything is written; past
 * a bound the request is refused, naming it, and nothing is written. Run over every
 * adapter family, like routes.suite.ts.
 */
export function apiQuotaSuite(name: string, factory: PortsFactory): void {
  describe(`quotas on what an agent sends, over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}) => makeHarness(factory, opts, cleanup);

    async function dispatchedJob(h: Harness, attempt = 1, jobId = `job-${randomUUID().slice(0, 12)}`): Promise<[string, string]> {
      if (attempt === 1) {
        const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } });
        expect(reg.status, reg.text).toBe(201);
      }
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: attempt, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      return [jobId, res.body.agent_token];
    }

    function expectQuota(res: Res, status: number, code: string, bound: string): void {
      expect(res.status, res.text).toBe(status);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.body).toMatchObject({ status, code, quota: bound, type: `https://mam.dev/problems/${code}` });
      expect(res.body.detail).toContain(bound);
      expect(res.body.detail).toContain("nothing was written");
    }

    /**
     * The job as the store holds it and its whole event log: what a refusal must leave
     * as it was. Less an upload lease: a request refused by its quota has taken the
     * attempt's upload in flight (an expired one is free) and released it again.
     */
    async function fingerprint(h: Harness, jobId: string): Promise<unknown> {
      const { upload_in_flight: _lease, ...record } = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
      const events = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
      return { record, events: events.body };
    }

    const declare = (h: Harness, jobId: string, attempt: number, token: string, bytes: number) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/${attempt}/report/upload`, { token, json: { sha256: "a".repeat(64), bytes } });

    it("an agent's events past MAM_QUOTA_JOB_EVENTS are 429 quota.events naming the bound, before anything is written; the service's own lines and an operator's transitions are never refused", async () => {
      const h = await harness({ env: { MAM_QUOTA_JOB_EVENTS: "3" } });
      const [jobId, agent] = await dispatchedJob(h);
      for (const event of ["started", "progress", "progress"]) {
        const res = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event, data: { step: event } } });
        expect(res.status, res.text).toBe(200);
        expect(res.body.published).toBe(true);
      }
      const before = await fingerprint(h, jobId);
      expect((before as { record: { agent_usage: unknown } }).record.agent_usage).toMatchObject({ events: 3, attempt_id: 1 });
      const refused = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "progress", data: { step: 4 } } });
      expectQuota(refused, 429, "quota.events", "MAM_QUOTA_JOB_EVENTS");
      expect(refused.body).toMatchObject({ limit: 3, used: 3 });
      expect(await fingerprint(h, jobId)).toEqual(before);
      // The operator is not charged: the job still ends, and its notification is published and settled.
      const cancel = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "cancel", expected_seq: (before as { record: { transition_seq: number } }).record.transition_seq },
      });
      expect(cancel.status, cancel.text).toBe(200);
      // The sweep publishes and settles it: bookkeeping and log lines are the service's own, never charged.
      const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: { grace_seconds: 0 } });
      expect(sweep.body).toMatchObject({ sent: 1 });
      const after = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(after.body.pending_notification).toBeUndefined();
      expect(after.body.agent_usage).toEqual(cancel.body.agent_usage);
      const log = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
      expect((log.body.items as { event: string }[]).filter((e) => e.event === "published")).toHaveLength(4);
    });

    it("an agent's bytes past MAM_QUOTA_ATTEMPT_BYTES, then MAM_QUOTA_JOB_BYTES, are 413 quota.bytes naming the bound; a newer attempt starts its own count, the job's goes on", async () => {
      const h = await harness({ env: { MAM_QUOTA_ATTEMPT_BYTES: String(MiB), MAM_QUOTA_JOB_BYTES: String(2 * MiB) } });
      const [jobId, first] = await dispatchedJob(h);
      expect((await declare(h, jobId, 1, first, 700_000)).status).toBe(200);
      // The declared upload holds the attempt's one upload in flight until its TTL passes (never sent here).
      h.clock.advance(900_000);
      const before = await fingerprint(h, jobId);
      const over = await declare(h, jobId, 1, first, 700_000);
      expectQuota(over, 413, "quota.bytes", "MAM_QUOTA_ATTEMPT_BYTES");
      expect(over.body).toMatchObject({ limit: MiB, used: 700_000 });
      expect(await fingerprint(h, jobId)).toEqual(before);
      // A report body reserves its Content-Length before a byte is stored.
      const body = new Uint8Array(400_000).fill(0x61);
      const put = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: first,
        body,
        headers: { "content-type": "text/markdown", "content-length": String(body.byteLength) },
      });
      expectQuota(put, 413, "quota.bytes", "MAM_QUOTA_ATTEMPT_BYTES");
      expect(await fingerprint(h, jobId)).toEqual(before);
      // Event data counts too, and what fits is taken.
      const small = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: first,
        json: { event: "started", data: { note: "x".repeat(1000) } },
      });
      expect(small.status, small.text).toBe(200);

      const [, second] = await dispatchedJob(h, 2, jobId);
      expect((await declare(h, jobId, 2, second, 700_000)).status).toBe(200);
      const [, third] = await dispatchedJob(h, 3, jobId);
      const job = await declare(h, jobId, 3, third, 700_000);
      expectQuota(job, 413, "quota.bytes", "MAM_QUOTA_JOB_BYTES");
      expect(job.body.limit).toBe(2 * MiB);
    });

    it("parallel declarations take the attempt's one upload in flight before their quota: of four, one is accepted and charged, the others are 409 and charge nothing", async () => {
      const h = await harness({ env: { MAM_QUOTA_ATTEMPT_BYTES: String(MiB) } });
      const [jobId, agent] = await dispatchedJob(h);
      const answers = await Promise.all([0, 1, 2, 3].map(() => declare(h, jobId, 1, agent, 400_000)));
      const statuses = answers.map((a) => a.status).sort();
      expect(statuses, answers.map((a) => a.text).join("\n")).toEqual([200, 409, 409, 409]);
      const record = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(record.body.agent_usage).toEqual({ events: 0, bytes: 400_000, attempt_id: 1, attempt_bytes: 400_000 });
      // Past its TTL, the next is reserved against what is left: 400,000 + 400,000 fits 1 MiB, a third does not.
      h.clock.advance(900_000);
      expect((await declare(h, jobId, 1, agent, 400_000)).status).toBe(200);
      h.clock.advance(900_000);
      expect((await declare(h, jobId, 1, agent, 400_000)).status).toBe(413);
    });
  });
}
