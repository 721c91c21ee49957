import { createHash, randomUUID } from "node:crypto";
import { REPORT_NAME } from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import { type Harness, makeHarness, type PortsFactory } from "./harness.ts";

const REPORT = "# Report\n\nFixed the race in the retry test.\n";
const FORGED = "# Report\n\nNothing to see here: everything passed.\n";
const MANIFEST_NAME = "report-manifest.json";

/**
 * Issue 17: once a job completed on an attempt, `GET .../verification` says whether
 * the live tree is the one the completion names (`matches_completion`), and is
 * `ok: false` when it is not — however consistent the live report and manifest are
 * with each other.
 */
export function apiVerificationSuite(name: string, factory: PortsFactory): void {
  describe(`verification against the completion over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });

    async function completedJob(h: Harness): Promise<string> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      expect(
        (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "fix it", agent: "codex" } })).status,
      ).toBe(201);
      const dispatched = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(dispatched.status, dispatched.text).toBe(201);
      const agent = dispatched.body.agent_token;
      const staged = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: agent,
        body: REPORT,
        headers: { "content-type": "text/markdown" },
      });
      expect(staged.status, staged.text).toBe(201);
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: agent,
        json: { event: "completed", finalize: { attempt_id: 1, side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] } },
      });
      expect(done.status, done.text).toBe(200);
      expect(done.body.record).toMatchObject({ status: "completed", completed_evidence: { attempt_id: 1 } });
      return jobId;
    }

    it("issue 17: an untouched completion's live tree matches it: ok, matches_completion, pinned.ok", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = await completedJob(h);
      const record = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(v.status, v.text).toBe(200);
      expect(v.body).toMatchObject({
        ok: true,
        matches_completion: true,
        manifest_sha256: record.completed_evidence.manifest_sha256,
        pinned: { ok: true, report_sha256: record.completed_evidence.report_sha256 },
      });
    });

    it("issue 17: a consistent live report and manifest written into the store after the completion, which it does not name, are ok: false, matches_completion: false; the pinned copy still verifies", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = await completedJob(h);
      const record = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
      const location = `reports/${jobId}/1`;
      // As an attacker with store access (or a finalize that lost its race and wrote late)
      // would: a report and a manifest that agree with each other.
      const live = JSON.parse(new TextDecoder().decode(await h.ports.reports.getBytes(location, MANIFEST_NAME)));
      const forged = new TextEncoder().encode(FORGED);
      const manifest = { ...live, sha256: createHash("sha256").update(forged).digest("hex"), bytes: forged.byteLength };
      const manifestBytes = new TextEncoder().encode(`${JSON.stringify(manifest, null, 2)}\n`);
      await h.ports.reports.put(location, REPORT_NAME, forged);
      await h.ports.reports.put(location, MANIFEST_NAME, manifestBytes);

      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(v.status, v.text).toBe(200);
      expect(v.body).toMatchObject({
        ok: false,
        matches_completion: false,
        manifest: { sha256: manifest.sha256 },
        pinned: { ok: true, report_sha256: record.completed_evidence.report_sha256 },
      });
      expect(v.body.reason).toContain(record.completed_evidence.manifest_sha256);
      expect(v.body.reason).toContain(createHash("sha256").update(manifestBytes).digest("hex"));
      // Written nothing: the record is as the completion left it.
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body).toEqual(record);
    });

    it("issue 17: asked about artifacts the completion's manifest does not evidence, the tree still matches the completion: ok: false for the artifacts, matches_completion: true", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = await completedJob(h);
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification?expected_artifacts=git_push,pr`, { token: h.operator });
      expect(v.status, v.text).toBe(200);
      expect(v.body).toMatchObject({ ok: false, matches_completion: true, pinned: { ok: true } });
      expect(v.body.reason).toContain("no side-effect evidence for pr");
    });

    it("issue 17: an attempt the job did not complete on carries no matches_completion", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = await completedJob(h);
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/2/verification`, { token: h.operator });
      expect(v.status, v.text).toBe(200);
      expect(v.body.ok).toBe(false);
      expect(v.body.matches_completion).toBeUndefined();
      expect(v.body.pinned).toBeUndefined();
    });
  });
}
