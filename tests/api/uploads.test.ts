import { createHash, randomUUID } from "node:crypto";
import { S3ReportStore } from "@mam/aws";
import { attemptReportLocation, evidenceLocation, REPORT_NAME, STAGED_REPORT_NAME, UPLOAD_DECLARATION_NAME } from "@mam/core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { localPorts } from "../support/local-backend.ts";
import { type Harness, type HarnessOptions, makeHarness, type PortsFactory, type Res } from "./harness.ts";

/**
 * Reports larger than a request body: `POST .../report/upload` declares the report
 * ({sha256, bytes}) and answers where to send it; finalize verifies what arrived
 * against the declaration before anything is pinned. On both backends:
 * - files (`mam serve`): the answer is the service's own `PUT .../report`, which then
 *   takes up to the declared size (past the body limit) and only the declared bytes;
 * - S3 (s3rver): a presigned PUT to the staged name. s3rver ignores `x-amz-checksum-*`
 *   (real S3 refuses bytes that do not hash to the signed checksum), so here a PUT of
 *   other bytes lands: the service's own hash at finalize is what protects, and these
 *   tests show it does. The S3 store is built with a small `maxBodyBytes`, so the
 *   large-object paths (a copy inside S3, never the bytes in memory) are the ones run.
 */

const BODY_LIMIT = 16 * 1024;
const UPLOAD_LIMIT = 1024 * 1024;
const PROBLEM = /^application\/problem\+json/;

interface Backend {
  readonly name: string;
  readonly factory: PortsFactory;
  /** Send the bytes where the answer says. */
  send(h: Harness, answer: Res["body"], token: string, bytes: Uint8Array): Promise<number>;
}

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

const sendToRoute = async (h: Harness, answer: Res["body"], token: string, bytes: Uint8Array): Promise<number> => {
  expect(answer.bearer).toBe(true);
  const url = new URL(answer.url);
  const res = await h.call("PUT", url.pathname, { token, body: bytes, headers: answer.headers });
  return res.status;
};

const sendToS3 = async (_h: Harness, answer: Res["body"], _token: string, bytes: Uint8Array): Promise<number> => {
  expect(answer.bearer).toBe(false);
  // fetch sets Content-Length from the body itself (it is a header a caller may not set).
  const { "content-length": length, ...headers } = answer.headers as Record<string, string>;
  expect(Number(length)).toBeGreaterThanOrEqual(0);
  const res = await fetch(answer.url, { method: "PUT", headers, body: bytes });
  await res.arrayBuffer();
  return res.status;
};

const BACKENDS: readonly Backend[] = [
  { name: "the local adapters (files: the answer is the service's own report route)", factory: localPorts, send: sendToRoute },
  {
    name: "the AWS adapters (S3 on s3rver: the answer is a presigned PUT)",
    factory: async (opts) => {
      const ports = await peers.ports(opts);
      // Smaller than the uploads: the store never holds one in memory.
      return { ...ports, reports: new S3ReportStore({ client: peers.s3.client, bucket: ports.bucket, maxBodyBytes: 32 * 1024 }) };
    },
    send: sendToS3,
  },
];

const sha256 = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");
const report = (bytes: number, fill = "a"): Uint8Array => new TextEncoder().encode(`# Report\n${fill.repeat(bytes - 9)}`);

for (const backend of BACKENDS) {
  describe(`report uploads over ${backend.name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}) =>
      makeHarness(backend.factory, { reportBodyLimit: BODY_LIMIT, reportUploadLimit: UPLOAD_LIMIT, ...opts }, cleanup);

    async function dispatched(h: Harness, attempt = 1): Promise<{ jobId: string; token: string }> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const created = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } });
      expect(created.status, created.text).toBe(201);
      let token = "";
      for (let a = 1; a <= attempt; a++) {
        const d = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
          token: h.operator,
          json: { attempt_id: a, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
        });
        expect(d.status, d.text).toBe(201);
        token = d.body.agent_token;
      }
      return { jobId, token };
    }

    const ask = (h: Harness, jobId: string, token: string, declared: { sha256: string; bytes: number }, attempt = 1) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/${attempt}/report/upload`, { token, json: declared });
    const finalize = (h: Harness, jobId: string, token: string, attempt = 1) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/${attempt}/finalize`, { token, json: { side_effects: [] } });

    function expectProblem(res: Res, status: number, code: string): void {
      expect(res.status, res.text).toBe(status);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.body).toMatchObject({ status, code });
    }

    /** What a refusal must not have written: no declaration, no pinned copy, no manifest, no live report. */
    async function expectNothingPinned(h: Harness, jobId: string, digest: string): Promise<void> {
      const location = attemptReportLocation(jobId, 1);
      expect(await h.deps.reports.exists(evidenceLocation(location), digest)).toBe(false);
      expect(await h.deps.reports.exists(location, "report-manifest.json")).toBe(false);
      expect(await h.deps.reports.exists(location, REPORT_NAME)).toBe(false);
      expect((await h.deps.jobs.get(jobId))?.finalized_report).toBeUndefined();
    }

    it("a report over the body limit goes by the upload answered, and finalize pins exactly the declared bytes", async () => {
      const h = await harness();
      const { jobId, token } = await dispatched(h);
      const bytes = report(200 * 1024);
      const declared = { sha256: sha256(bytes), bytes: bytes.byteLength };
      // Through the report route it is too large, and the 413 points at the upload route.
      const direct = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, { token, body: bytes });
      expectProblem(direct, 413, "input.tooLarge");
      expect(direct.body).toMatchObject({ limit: BODY_LIMIT, upload: `/v1/jobs/${jobId}/attempts/1/report/upload` });

      const seqBefore = (await h.deps.jobs.get(jobId))?.evidence_seq ?? 0;
      const asked = Date.now();
      const answer = await ask(h, jobId, token, declared);
      expect(answer.status, answer.text).toBe(200);
      expect(answer.body).toMatchObject({
        method: "PUT",
        staged: h.deps.reports.describe(attemptReportLocation(jobId, 1), STAGED_REPORT_NAME),
      });
      if (answer.body.bearer) {
        // The service's route: the declaration's own expiry, on the service's clock.
        expect(Date.parse(answer.body.expires_at)).toBe(h.clock.now().getTime() + 900_000);
      } else {
        // A presigned URL expires on the signer's clock (S3 checks it against its own): the system's.
        expect(Date.parse(answer.body.expires_at)).toBeGreaterThanOrEqual(asked + 900_000);
        expect(Date.parse(answer.body.expires_at)).toBeLessThanOrEqual(Date.now() + 900_000);
      }
      // Issuing is an evidence write: conditional on the latest attempt, bumping evidence_seq.
      expect((await h.deps.jobs.get(jobId))?.evidence_seq).toBe(seqBefore + 1);

      expect([200, 201]).toContain(await backend.send(h, answer.body, token, bytes));
      const fin = await finalize(h, jobId, token);
      expect(fin.status, fin.text).toBe(200);
      expect(fin.body.manifest).toMatchObject({ sha256: declared.sha256, bytes: declared.bytes });
      const location = attemptReportLocation(jobId, 1);
      expect(await h.deps.reports.hash(location, REPORT_NAME)).toEqual(declared);
      expect(await h.deps.reports.hash(evidenceLocation(location), declared.sha256)).toEqual(declared);
      // The declaration went with the bytes it bound.
      expect(await h.deps.reports.exists(location, UPLOAD_DECLARATION_NAME)).toBe(false);
      expect(await h.deps.reports.exists(location, STAGED_REPORT_NAME)).toBe(false);
      const verified = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(verified.body).toMatchObject({ ok: true });
    });

    it("bytes other than the declared ones are refused at finalize (409 report.mismatch naming what differs), and nothing is pinned", async () => {
      const h = await harness();
      const { jobId, token } = await dispatched(h);
      const declaredBytes = report(100 * 1024);
      const other = report(100 * 1024, "b"); // same size, other bytes
      const answer = await ask(h, jobId, token, { sha256: sha256(declaredBytes), bytes: declaredBytes.byteLength });
      expect(answer.status, answer.text).toBe(200);
      if (answer.body.bearer === false) {
        // s3rver stores it (it ignores x-amz-checksum-sha256; real S3 would answer 400 BadDigest).
        expect(await backend.send(h, answer.body, token, other)).toBe(200);
      } else {
        // The service's own route checks the declaration as the bytes arrive: refused, nothing staged.
        const staged = await h.call("PUT", new URL(answer.body.url).pathname, { token, body: other });
        expectProblem(staged, 409, "report.mismatch");
        expect(await h.deps.reports.exists(attemptReportLocation(jobId, 1), STAGED_REPORT_NAME)).toBe(false);
        // Put the other bytes in the staged name the way an earlier stage would have: before the declaration.
        const again = await ask(h, jobId, token, { sha256: sha256(other), bytes: other.byteLength });
        expect(again.status).toBe(200);
        expect(await backend.send(h, again.body, token, other)).toBe(201);
        expect((await ask(h, jobId, token, { sha256: sha256(declaredBytes), bytes: declaredBytes.byteLength })).status).toBe(200);
      }
      const fin = await finalize(h, jobId, token);
      expectProblem(fin, 409, "report.mismatch");
      expect(fin.body.errors).toEqual([{ path: "sha256", message: `declared ${sha256(declaredBytes)}, received ${sha256(other)}` }]);
      expect(fin.body).toMatchObject({ declared: { sha256: sha256(declaredBytes) }, received: { sha256: sha256(other) } });
      await expectNothingPinned(h, jobId, sha256(other));
    });

    it("a size other than the declared one is named as such (409 report.mismatch, bytes)", async () => {
      const h = await harness();
      const { jobId, token } = await dispatched(h);
      const staged = report(1000);
      // Staged through the body route first (it fits), then an upload of something else is declared.
      expect((await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, { token, body: staged })).status).toBe(201);
      const declared = report(50 * 1024);
      expect((await ask(h, jobId, token, { sha256: sha256(declared), bytes: declared.byteLength })).status).toBe(200);
      const fin = await finalize(h, jobId, token);
      expectProblem(fin, 409, "report.mismatch");
      expect(fin.body.errors.map((i: { path: string }) => i.path)).toEqual(["bytes", "sha256"]);
      expect(fin.body.errors[0].message).toBe(`declared ${declared.byteLength}, received ${staged.byteLength}`);
      await expectNothingPinned(h, jobId, sha256(staged));
    });

    it("a declared upload that never arrived is not silently replaced by the report it was to replace (404 at finalize)", async () => {
      const h = await harness();
      const { jobId, token } = await dispatched(h);
      const bytes = report(40 * 1024);
      expect((await ask(h, jobId, token, { sha256: sha256(bytes), bytes: bytes.byteLength })).status).toBe(200);
      const fin = await finalize(h, jobId, token);
      expectProblem(fin, 404, "report.notFound");
      expect(fin.body.detail).toContain("has not arrived");
    });

    it("a retired attempt's token gets no upload (403), nor does the operator for a retired attempt (409 report.notLatest); nothing is written", async () => {
      const h = await harness();
      const { jobId, token: first } = await dispatched(h);
      const d2 = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 2, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(d2.status).toBe(201);
      const seq = (await h.deps.jobs.get(jobId))?.evidence_seq;
      const declared = { sha256: "a".repeat(64), bytes: 40_000 };
      expect((await ask(h, jobId, first, declared)).status).toBe(403);
      expectProblem(await ask(h, jobId, h.operator, declared), 409, "report.notLatest");
      expect((await h.deps.jobs.get(jobId))?.evidence_seq).toBe(seq);
      expect(await h.deps.reports.exists(attemptReportLocation(jobId, 1), UPLOAD_DECLARATION_NAME)).toBe(false);
    });

    it("a terminal job gets no upload (409 report.frozen); an address issued before it ended changes no evidence", async () => {
      const h = await harness();
      const { jobId, token } = await dispatched(h);
      const bytes = report(60 * 1024);
      const answer = await ask(h, jobId, token, { sha256: sha256(bytes), bytes: bytes.byteLength });
      expect(answer.status).toBe(200);
      const job = await h.deps.jobs.get(jobId);
      const cancelled = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "cancel", expected_seq: job?.transition_seq },
      });
      expect(cancelled.status, cancelled.text).toBe(200);
      expectProblem(await ask(h, jobId, token, { sha256: sha256(bytes), bytes: bytes.byteLength }), 409, "report.frozen");
      const sent = await backend.send(h, answer.body, token, bytes);
      // The service's route refuses it (409); a presigned S3 URL cannot be revoked and lands in the staged name…
      expect(sent).toBe(answer.body.bearer ? 409 : 200);
      // …which is never evidence: finalize is refused and nothing is pinned or made live.
      expectProblem(await finalize(h, jobId, token), 409, "report.frozen");
      await expectNothingPinned(h, jobId, sha256(bytes));
    });

    it("a declaration over MAM_REPORT_UPLOAD_LIMIT is refused (400 naming body.bytes) and writes nothing", async () => {
      const h = await harness();
      const { jobId, token } = await dispatched(h);
      const seq = (await h.deps.jobs.get(jobId))?.evidence_seq;
      const res = await ask(h, jobId, token, { sha256: "a".repeat(64), bytes: UPLOAD_LIMIT + 1 });
      expectProblem(res, 400, "input.invalid");
      expect(res.body.errors).toEqual([{ path: "body.bytes", message: `at most ${UPLOAD_LIMIT}` }]);
      expect((await h.deps.jobs.get(jobId))?.evidence_seq).toBe(seq);
      expect(await h.deps.reports.exists(attemptReportLocation(jobId, 1), UPLOAD_DECLARATION_NAME)).toBe(false);
    });

    if (backend.send === sendToS3) {
      it("the presigned PUT signs the declared length and checksum as headers, for the staged name only", async () => {
        const h = await harness();
        const { jobId, token } = await dispatched(h);
        const bytes = report(20 * 1024);
        const answer = await ask(h, jobId, token, { sha256: sha256(bytes), bytes: bytes.byteLength });
        const url = new URL(answer.body.url);
        expect(url.pathname.endsWith(`/reports/${jobId}/1/${STAGED_REPORT_NAME}`)).toBe(true);
        expect(url.searchParams.get("X-Amz-Expires")).toBe("900");
        expect(url.searchParams.get("X-Amz-SignedHeaders")?.split(";")).toEqual(
          expect.arrayContaining(["content-length", "host", "x-amz-checksum-sha256"]),
        );
        expect(answer.body.headers).toEqual({
          "content-length": String(bytes.byteLength),
          "x-amz-checksum-sha256": Buffer.from(sha256(bytes), "hex").toString("base64"),
          "x-amz-meta-sha256": sha256(bytes),
        });
      });
    } else {
      it("the report route takes a declared upload past the body limit, but not one byte past the declared size (413)", async () => {
        const h = await harness();
        const { jobId, token } = await dispatched(h);
        const bytes = report(64 * 1024);
        const answer = await ask(h, jobId, token, { sha256: sha256(bytes), bytes: bytes.byteLength - 1 });
        const res = await h.call("PUT", new URL(answer.body.url).pathname, { token, body: bytes });
        expectProblem(res, 413, "input.tooLarge");
        expect(res.body.limit).toBe(bytes.byteLength - 1);
        expect(await h.deps.reports.exists(attemptReportLocation(jobId, 1), STAGED_REPORT_NAME)).toBe(false);
      });
    }
  });
}
