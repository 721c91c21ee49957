import { randomBytes } from "node:crypto";
import { realpath, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { tempDir } from "../support/temp-dir.ts";
import { CANDIDATE_DISPATCH, candidateScenario, type Harness, makeHarness, type Res } from "./harness.ts";

/**
 * No answer of the API names a path on the server: not a manifest, not a refusal
 * reason, not a problem. The embedded service keeps reports under its data dir; every
 * answer below is read whole for that dir (and the temp dir it lies in).
 */
describe("no absolute server path in any API answer", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  let dataDir = "";
  async function harness(): Promise<Harness> {
    dataDir = await realpath((await tempDir("api-paths")).dir);
    const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
    const broker = await startEmbeddedBroker({ port: 0, publisherCredentials: credentials });
    return makeHarness(
      async () => {
        const { jobs, close: closeJobs } = openEmbeddedJobStore(path.join(dataDir, "mam.db"));
        const publisher = new MqttPublisher({ url: broker.url, ...credentials });
        return {
          jobs,
          reports: new FileReportStore(dataDir, { allowAbsolute: false }),
          publisher,
          async close() {
            await publisher.close();
            await broker.close();
            await closeJobs();
            await rm(dataDir, { recursive: true, force: true });
          },
        };
      },
      { env: { MAM_AUTO_COMPLETE: "1" } },
      cleanup,
    );
  }

  const answers: Res[] = [];
  const seen = (res: Res): Res => {
    answers.push(res);
    return res;
  };
  function expectNoServerPath(): void {
    expect(answers.length).toBeGreaterThan(5);
    for (const res of answers) {
      expect(res.text).not.toContain(dataDir);
      expect(res.text).not.toContain(tmpdir());
    }
    answers.length = 0;
  }

  it("manifests carry mam-file:/// URIs; refusal reasons and problems, a file-system failure's too, name no server path", async () => {
    const h = await harness();
    const jobId = "job-paths";
    const op = { token: h.operator };
    seen(await h.call("POST", "/v1/jobs", { ...op, json: { job_id: jobId, prompt: "p", agent: "claude-code", auto_complete: true } }));
    seen(await h.call("POST", `/v1/jobs/${jobId}/dispatches`, { ...op, json: CANDIDATE_DISPATCH }));
    seen(await h.call("POST", `/v1/jobs/${jobId}/transitions`, { ...op, json: { action: "claim", expected_seq: 0 } }));

    // Nothing staged yet: the refusals name no file.
    const noReport = seen(await h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { ...op, json: { side_effects: [] } }));
    expect(noReport.status, noReport.text).toBe(404);
    expect(noReport.body.detail).toContain(`mam-file:///reports/${jobId}/1/`);
    const noManifest = seen(await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, op));
    expect(noManifest.body).toMatchObject({
      ok: false,
      reason: `no completion manifest at mam-file:///reports/${jobId}/1/report-manifest.json`,
    });
    const gateNoManifest = seen(
      await h.call("POST", `/v1/jobs/${jobId}/evaluations`, { ...op, json: { scenario: candidateScenario(jobId) } }),
    );
    expect(gateNoManifest.body.reason).toContain("mam-file:///");

    seen(
      await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        ...op,
        body: "# Report\n",
        headers: { "content-type": "text/markdown" },
      }),
    );
    const fin = seen(await h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { ...op, json: { side_effects: [] } }));
    expect(fin.status, fin.text).toBe(200);
    expect(fin.body.manifest.report_location).toBe(`mam-file:///reports/${jobId}/1/report-final.md`);
    const verified = seen(await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, op));
    expect(verified.body.ok, verified.text).toBe(true);

    // A report rewritten behind the manifest's back: the reason names both by URI.
    await writeFile(path.join(dataDir, "reports", jobId, "1", "report-final.md"), "# Rewritten\n");
    const changed = seen(await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, op));
    expect(changed.body.ok).toBe(false);
    expect(changed.body.reason).toContain("changed after finalization");
    const gateChanged = seen(
      await h.call("POST", `/v1/jobs/${jobId}/evaluations`, { ...op, json: { scenario: candidateScenario(jobId) } }),
    );
    expect(gateChanged.body.committed).toBe(false);

    seen(await h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { ...op, json: { side_effects: [] } }));
    const gate = seen(await h.call("POST", `/v1/jobs/${jobId}/evaluations`, { ...op, json: { scenario: candidateScenario(jobId) } }));
    expect(gate.body.committed, gate.text).toBe(true);
    const record = seen(await h.call("GET", `/v1/jobs/${jobId}`, op));
    expect(JSON.stringify(record.body.completed_evidence)).not.toContain(dataDir);

    // A file-system failure (a file where a job's report directory should be: mkdir
    // fails with the path in its message) is a 500 whose problem names no path; the
    // path stays in the server's log.
    const other = "job-fs-fails";
    seen(await h.call("POST", "/v1/jobs", { ...op, json: { job_id: other, prompt: "p", agent: "codex" } }));
    seen(await h.call("POST", `/v1/jobs/${other}/dispatches`, { ...op, json: CANDIDATE_DISPATCH }));
    await writeFile(path.join(dataDir, "reports", other), "in the way");
    const failed = seen(
      await h.call("PUT", `/v1/jobs/${other}/attempts/1/report`, {
        ...op,
        body: "# Report\n",
        headers: { "content-type": "text/markdown" },
      }),
    );
    expect(failed.status, failed.text).toBe(500);
    expect(failed.body.code).toBe("internal");
    expect(h.lines.some((l) => l.includes('"unexpected error"') && l.includes(dataDir))).toBe(true);
    expectNoServerPath();
  });
});
