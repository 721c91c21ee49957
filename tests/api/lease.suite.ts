import { createHash, randomUUID } from "node:crypto";
import {
  attemptReportLocation,
  REPORT_NAME,
  type ReportStore,
  releaseLease,
  STAGED_REPORT_NAME,
  takeLease,
  UPLOAD_DECLARATION_NAME,
} from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import {
  type ApiPorts,
  CANDIDATE_DISPATCH,
  candidateScenario,
  type Harness,
  type HarnessOptions,
  makeHarness,
  type PortsFactory,
  type Res,
} from "./harness.ts";

const PROBLEM = /^application\/problem\+json/;

/**
 * One upload in flight and one finalize in progress per attempt (issue 17): each a
 * lease on the job record, taken and released by one conditional write; a second one
 * while one is held is 409 naming it and writes nothing. Run over every adapter
 * family, like quota.suite.ts. Pauses are forced, never slept for: a report body the
 * test holds open, a report-store call held until the test lets it go.
 */
export function apiLeaseSuite(
  name: string,
  factory: PortsFactory,
  /** Whether the backend's feed has rows here (dynalite keeps no stream, so the DynamoDB feed has none: feed-aws.test.ts). */
  { feedRows }: { feedRows: boolean },
): void {
  describe(`one upload in flight and one finalize in progress per attempt, over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}, wrap?: (ports: ApiPorts) => ApiPorts) =>
      makeHarness(async (o) => (wrap === undefined ? factory(o) : wrap(await factory(o))), opts, cleanup);

    async function dispatchedJob(h: Harness, jobId = `job-${randomUUID().slice(0, 12)}`): Promise<[string, string]> {
      const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } });
      expect(reg.status, reg.text).toBe(201);
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      return [jobId, res.body.agent_token];
    }

    function expectHeld(res: Res, code: string, kind: "upload" | "finalize"): void {
      expect(res.status, res.text).toBe(409);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.body).toMatchObject({ status: 409, code, type: `https://mam.dev/problems/${code}` });
      expect(res.body.in_progress).toMatchObject({ kind, attempt_id: 1 });
      // It names the one in progress: its kind, its attempt, since when, and when it expires.
      expect(res.body.detail).toContain(kind === "upload" ? "an upload of attempt 1" : "a finalize of attempt 1");
      expect(res.body.detail).toContain(res.body.in_progress.since);
      expect(res.body.detail).toContain(res.body.in_progress.expires_at);
      expect(res.body.detail).toContain("nothing was written");
    }

    /** The record, the job's feed rows and event log, and the attempt's report names: what a refusal must leave as it was. */
    async function fingerprint(h: Harness, jobId: string): Promise<unknown> {
      const record = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      const events = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
      const feed = await h.call("GET", "/v1/events?limit=200", { token: h.operator });
      const rows = (feed.body.items as { job_id: string }[]).filter((r) => r.job_id === jobId);
      return { record: record.body, events: events.body, rows, files: await files(h.deps.reports, jobId) };
    }

    async function files(reports: ReportStore, jobId: string): Promise<Record<string, string | undefined>> {
      const location = attemptReportLocation(jobId, 1);
      const out: Record<string, string | undefined> = {};
      for (const name of [UPLOAD_DECLARATION_NAME, STAGED_REPORT_NAME, REPORT_NAME]) {
        const bytes = await reports.getBytes(location, name);
        out[name] = bytes === undefined ? undefined : createHash("sha256").update(bytes).digest("hex");
      }
      return out;
    }

    const declare = (h: Harness, jobId: string, token: string, body: Uint8Array) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, {
        token,
        json: { sha256: createHash("sha256").update(body).digest("hex"), bytes: body.byteLength },
      });
    const put = (h: Harness, jobId: string, token: string, body: Uint8Array | ReadableStream<Uint8Array>, bytes?: number) =>
      h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token,
        body,
        headers: { "content-type": "text/markdown", ...(bytes === undefined ? {} : { "content-length": String(bytes) }) },
      });
    const finalize = (h: Harness, jobId: string, token: string) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { token, json: { side_effects: [] } });

    /** A body whose first chunk is sent at once and the rest only when `finish()` is called; `started` resolves once it is being read. */
    function heldBody(first: Uint8Array, rest: Uint8Array) {
      let finish!: () => void;
      let started!: () => void;
      const go = new Promise<void>((r) => {
        finish = r;
      });
      const reading = new Promise<void>((r) => {
        started = r;
      });
      let step = 0;
      const stream = new ReadableStream<Uint8Array>(
        {
          async pull(ctrl) {
            if (step === 0) {
              step = 1;
              ctrl.enqueue(first);
              started();
              return;
            }
            if (step === 1) {
              step = 2;
              await go;
              ctrl.enqueue(rest);
              return;
            }
            ctrl.close();
          },
        },
        { highWaterMark: 0 },
      );
      return { stream, finish, reading };
    }

    it("a second declaration while one is in flight is 409 report.uploadInFlight naming it, and writes nothing (record, feed, files); past its TTL by the clock, the next is accepted", async () => {
      const h = await harness({ env: { MAM_REPORT_UPLOAD_TTL_SECONDS: "900" } });
      const [jobId, agent] = await dispatchedJob(h);
      const first = new TextEncoder().encode("# first\n");
      const declared = await declare(h, jobId, agent, first);
      expect(declared.status, declared.text).toBe(200);
      const before = await fingerprint(h, jobId);
      // Held for the upload TTL, by the service's clock.
      const held = { attempt_id: 1, declared: true, since: "2026-11-20T10:10:00.000Z", expires_at: "2026-11-20T10:25:00.000Z" };
      expect((before as { record: { upload_in_flight: unknown } }).record.upload_in_flight).toMatchObject(held);
      const second = await declare(h, jobId, agent, new TextEncoder().encode("# second\n"));
      expectHeld(second, "report.uploadInFlight", "upload");
      expect(second.body.in_progress).toMatchObject(held);
      // The rule is per attempt, not per agent: an operator's declaration waits too.
      expectHeld(await declare(h, jobId, h.operator, new TextEncoder().encode("# op\n")), "report.uploadInFlight", "upload");
      expect(await fingerprint(h, jobId)).toEqual(before);
      // Just before its TTL it still holds; at it, it holds nothing.
      h.clock.advance(899_000);
      expectHeld(await declare(h, jobId, agent, new TextEncoder().encode("# second\n")), "report.uploadInFlight", "upload");
      h.clock.advance(1_000);
      const after = await declare(h, jobId, agent, new TextEncoder().encode("# second\n"));
      expect(after.status, after.text).toBe(200);
    });

    it("a PUT of the declared bytes completes the upload in flight, and a finalize of bytes sent around the service does too: the next declaration is accepted at once", async () => {
      const h = await harness();
      const [jobId, agent] = await dispatchedJob(h);
      const body = new TextEncoder().encode("# declared and sent\n");
      expect((await declare(h, jobId, agent, body)).status).toBe(200);
      const sent = await put(h, jobId, agent, body);
      expect(sent.status, sent.text).toBe(201);
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.upload_in_flight).toBeUndefined();
      // Bytes staged straight into the store (as a presigned S3 PUT does), then finalized.
      const next = new TextEncoder().encode("# around the service\n");
      expect((await declare(h, jobId, agent, next)).status).toBe(200);
      await h.deps.reports.put(attemptReportLocation(jobId, 1), STAGED_REPORT_NAME, next);
      const fin = await finalize(h, jobId, agent);
      expect(fin.status, fin.text).toBe(200);
      const record = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(record.body.upload_in_flight).toBeUndefined();
      expect(record.body.finalize_in_progress).toBeUndefined();
      expect((await declare(h, jobId, agent, body)).status).toBe(200);
    });

    it("a second PUT while one streams is 409 report.uploadInFlight and writes nothing; of parallel PUTs of one declaration one is staged, and the feed's last report.staged row is the staged bytes; a refused PUT releases its upload", async () => {
      const h = await harness();
      const [jobId, agent] = await dispatchedJob(h);
      const first = new TextEncoder().encode("# held report, ");
      const rest = new TextEncoder().encode("sent in two parts\n");
      const whole = new Uint8Array([...first, ...rest]);
      expect((await declare(h, jobId, agent, whole)).status).toBe(200);
      const held = heldBody(first, rest);
      const streaming = put(h, jobId, agent, held.stream, whole.byteLength);
      await held.reading;
      const before = await fingerprint(h, jobId);
      expect((before as { record: { upload_in_flight: { declared?: true } } }).record.upload_in_flight.declared).toBeUndefined();
      const others = await Promise.all([0, 1, 2].map(() => put(h, jobId, agent, whole)));
      for (const other of others) {
        expectHeld(other, "report.uploadInFlight", "upload");
        expect(other.body.in_progress.declared).toBeUndefined();
      }
      expect(await fingerprint(h, jobId)).toEqual(before);
      held.finish();
      const staged = await streaming;
      expect(staged.status, staged.text).toBe(201);
      const sha256 = createHash("sha256").update(whole).digest("hex");
      const feed = await h.call("GET", "/v1/events?limit=200", { token: h.operator });
      const rows = (feed.body.items as { job_id: string; kind: string; data: unknown }[]).filter(
        (r) => r.job_id === jobId && r.kind === "report.staged",
      );
      if (feedRows) expect(rows.at(-1)?.data).toEqual({ attempt_id: 1, sha256, bytes: whole.byteLength });
      expect((await files(h.deps.reports, jobId))[STAGED_REPORT_NAME]).toBe(sha256);
      // A PUT refused at its end (not the declared bytes) releases the upload it held.
      expect((await declare(h, jobId, agent, whole)).status).toBe(200);
      const wrong = await put(h, jobId, agent, new TextEncoder().encode("# not what was declared\n"));
      expect(wrong.status, wrong.text).toBe(409);
      expect(wrong.body.code).toBe("report.mismatch");
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.upload_in_flight).toBeUndefined();
      expect((await put(h, jobId, agent, whole)).status).toBe(201);
    });

    it("a second finalize while one is in progress is 409 report.finalizeInProgress naming it, an operator's too, and writes nothing; once it returns the next is accepted; a crashed holder's lease expires by the clock", async () => {
      let hold: { reached: () => void; go: Promise<void> } | undefined;
      const h = await harness({ env: { MAM_FINALIZE_LEASE_SECONDS: "300" } }, (ports) => ({
        ...ports,
        close: () => ports.close(),
        reports: new Proxy(ports.reports, {
          get(target, prop) {
            const value: unknown = Reflect.get(target, prop, target);
            if (typeof value !== "function" || prop !== "exists") return typeof value === "function" ? value.bind(target) : value;
            return async (...args: unknown[]) => {
              // The first thing a finalize reads of the report store: held there, its lease is held.
              if (args[1] === STAGED_REPORT_NAME && hold !== undefined) {
                const h0 = hold;
                hold = undefined;
                h0.reached();
                await h0.go;
              }
              return (value as (...a: unknown[]) => unknown).apply(target, args);
            };
          },
        }),
      }));
      const [jobId, agent] = await dispatchedJob(h);
      expect((await put(h, jobId, agent, new TextEncoder().encode("# report\n"))).status).toBe(201);
      let go!: () => void;
      const reached = new Promise<void>((r) => {
        hold = {
          reached: r,
          go: new Promise<void>((g) => {
            go = g;
          }),
        };
      });
      const running = finalize(h, jobId, agent);
      await reached;
      const before = await fingerprint(h, jobId);
      expect((before as { record: { finalize_in_progress: unknown } }).record.finalize_in_progress).toMatchObject({
        attempt_id: 1,
        actor: { type: "agent" },
      });
      expectHeld(await finalize(h, jobId, agent), "report.finalizeInProgress", "finalize");
      expectHeld(await finalize(h, jobId, h.operator), "report.finalizeInProgress", "finalize");
      expect(await fingerprint(h, jobId)).toEqual(before);
      go();
      const done = await running;
      expect(done.status, done.text).toBe(200);
      const record = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(record.body.finalize_in_progress).toBeUndefined();
      // The lease is bookkeeping: a finalize bumps evidence_seq once, the lease nothing.
      expect(record.body.evidence_seq).toBe((before as { record: { evidence_seq: number } }).record.evidence_seq + 1);
      expect((await finalize(h, jobId, agent)).status).toBe(200);

      // A process that crashed holding it: the lease stays until its TTL passes, by the clock.
      await takeLease(h.deps, jobId, { kind: "finalize", attemptId: 1, seconds: 300 });
      const stuck = await fingerprint(h, jobId);
      expectHeld(await finalize(h, jobId, agent), "report.finalizeInProgress", "finalize");
      h.clock.advance(299_000);
      expectHeld(await finalize(h, jobId, agent), "report.finalizeInProgress", "finalize");
      expect(await fingerprint(h, jobId)).toEqual(stuck);
      h.clock.advance(1_000);
      expect((await finalize(h, jobId, agent)).status).toBe(200);
    });

    it("a finalize in progress does not hold the gate: it decides on the committed evidence, the tree finalized_report names, and the finalize then finds the job terminal", async () => {
      const h = await harness({ env: { MAM_AUTO_COMPLETE: "1" } });
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const reg = await h.call("POST", "/v1/jobs", {
        token: h.operator,
        json: { job_id: jobId, prompt: "p", agent: "claude-code", auto_complete: true },
      });
      expect(reg.status, reg.text).toBe(201);
      expect((await h.call("POST", `/v1/jobs/${jobId}/dispatches`, { token: h.operator, json: CANDIDATE_DISPATCH })).status).toBe(201);
      const claim = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "claim", expected_seq: 0 },
      });
      expect(claim.status, claim.text).toBe(200);
      expect((await put(h, jobId, h.operator, new TextEncoder().encode("# report\n"))).status).toBe(201);
      const finalized = await finalize(h, jobId, h.operator);
      expect(finalized.status).toBe(200);
      const lease = await takeLease(h.deps, jobId, { kind: "finalize", attemptId: 1, seconds: 300 });
      const done = await h.call("POST", `/v1/jobs/${jobId}/evaluations`, {
        token: h.operator,
        json: { scenario: candidateScenario(jobId) },
      });
      expect(done.body, done.text).toMatchObject({
        committed: true,
        record: { status: "completed", completed_evidence: { manifest_sha256: finalized.body.manifest_sha256 } },
      });
      await releaseLease(h.deps, jobId, "finalize", lease);
      const late = await finalize(h, jobId, h.operator);
      expect(late.status, late.text).toBe(409);
      expect(late.body.code).toBe("report.frozen");
    });

    it("an event that finalizes takes the same lease: refused while another finalize is in progress, before its quota is charged", async () => {
      const h = await harness();
      const [jobId, agent] = await dispatchedJob(h);
      expect((await put(h, jobId, agent, new TextEncoder().encode("# report\n"))).status).toBe(201);
      await takeLease(h.deps, jobId, { kind: "finalize", attemptId: 1, seconds: 300 });
      const before = await fingerprint(h, jobId);
      const res = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: agent,
        json: { event: "completed", finalize: { attempt_id: 1, side_effects: [] } },
      });
      expectHeld(res, "report.finalizeInProgress", "finalize");
      expect(await fingerprint(h, jobId)).toEqual(before);
    });
  });
}
