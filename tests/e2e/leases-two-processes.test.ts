/**
 * One upload in flight and one finalize in progress per attempt across processes on
 * one data dir (issue 17): the leases are fields of the job record in SQLite, never an
 * in-memory lock, so `mam serve` (a child process), `mam --data-dir` (another) and a
 * third connection (this test's, standing for a process that crashed mid-finalize)
 * see the same. Nothing is timed: each lease is held until the test lets it go.
 */
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { EXIT_CODES } from "@mam/cli";
import { randomIds, releaseLease, systemClock, takeLease } from "@mam/core";
import { openDataDir, readCredentials } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runMam } from "../support/mam-process.ts";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { tempDir } from "../support/temp-dir.ts";

let root: string;
let dataDir: string;
let serve: ServeProcess;
let operator: string;

beforeAll(async () => {
  root = (await tempDir("leases-two-processes")).dir;
  dataDir = path.join(root, "data");
  serve = await startServeProcess(dataDir, {}, { broker: true });
  const credentials = await readCredentials(dataDir);
  operator = credentials?.operator_token ?? "";
}, 30_000);

afterAll(async () => {
  await serve?.stop();
});

/** `mam --data-dir <dir> ...` as its own process: exit status and streams. */
const mamDataDir = (args: readonly string[]) =>
  runMam([...args, "--data-dir", dataDir, "--json"], { cwd: root, env: { MAM_MQTT_PORT: new URL(serve.mqttUrl).port } });

// biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field in assertions
async function api(method: string, route: string, token: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(`${serve.url}${route}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  return { status: res.status, body: text === "" ? undefined : JSON.parse(text) };
}

async function dispatchedJob(jobId: string): Promise<string> {
  expect((await api("POST", "/v1/jobs", operator, { job_id: jobId, prompt: "p", agent: "codex" })).status).toBe(201);
  const d = await api("POST", `/v1/jobs/${jobId}/dispatches`, operator, {
    attempt_id: 1,
    agent_session_uuid: "0c9a2d11-0000-4000-8000-000000000009",
    pane_process_generation: 1,
  });
  expect(d.status).toBe(201);
  return d.body.agent_token;
}

describe("e2e: one finalize in progress and one upload in flight per attempt, across processes on one data dir", () => {
  it("a finalize held by another process refuses mam --data-dir (exit 1, report.finalizeInProgress naming it) and mam serve (409); once released, mam --data-dir finalizes", async () => {
    const jobId = "lease-e2e-finalize";
    await dispatchedJob(jobId);
    const tree = path.join(root, "tree");
    await mkdir(tree, { recursive: true });
    await writeFile(path.join(tree, "report-final.md.tmp"), "# done\n");
    // A third process's connection to the same SQLite file takes the attempt's finalize.
    const store = openDataDir(dataDir);
    try {
      const lease = await takeLease({ jobs: store.jobs, clock: systemClock, ids: randomIds }, jobId, {
        kind: "finalize",
        attemptId: 1,
        seconds: 300,
      });
      const publish = ["publish-event", "--job", jobId, "--event", "completed", "--attempt", "1"];
      const refused = await mamDataDir([...publish, "--finalize-report", path.join(tree, "report-final.md")]);
      expect(refused.status, refused.stderr).toBe(EXIT_CODES["report.finalizeInProgress"]);
      expect(refused.status).toBe(1);
      expect(refused.stderr + refused.stdout).toContain("report.finalizeInProgress");
      expect(refused.stderr + refused.stdout).toContain(`a finalize of attempt 1 of job ${jobId} is in progress`);
      expect(refused.stderr + refused.stdout).toContain(lease.expires_at);
      // mam serve, a process of its own, sees the same lease.
      const served = await api("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, operator, { side_effects: [] });
      expect(served.status).toBe(409);
      expect(served.body).toMatchObject({ code: "report.finalizeInProgress", in_progress: { id: lease.id, kind: "finalize" } });
      // Nothing was written by either: the job is still running, untouched by the refused commit.
      const record = await api("GET", `/v1/jobs/${jobId}`, operator);
      expect(record.body).toMatchObject({ status: "pending", finalize_in_progress: { id: lease.id } });
      expect(record.body.finalized_report).toBeUndefined();

      await releaseLease({ jobs: store.jobs }, jobId, "finalize", lease);
      const done = await mamDataDir([...publish, "--finalize-report", path.join(tree, "report-final.md")]);
      expect(done.status, done.stderr).toBe(0);
      expect(JSON.parse(done.stdout)).toMatchObject({ record: { status: "completed" } });
    } finally {
      store.close();
    }
  }, 30_000);

  it("an upload mam serve holds (a declaration) is seen by another process: a second upload there is refused, and serve refuses a second declaration", async () => {
    const jobId = "lease-e2e-upload";
    const agent = await dispatchedJob(jobId);
    const declared = await api("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, agent, { sha256: "a".repeat(64), bytes: 10 });
    expect(declared.status).toBe(200);
    const store = openDataDir(dataDir);
    try {
      const other = takeLease({ jobs: store.jobs, clock: systemClock, ids: randomIds }, jobId, {
        kind: "upload",
        attemptId: 1,
        seconds: 60,
        declared: true,
      });
      await expect(other).rejects.toMatchObject({ code: "report.uploadInFlight" });
      const again = await api("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, agent, { sha256: "b".repeat(64), bytes: 10 });
      expect(again.status).toBe(409);
      expect(again.body.code).toBe("report.uploadInFlight");
    } finally {
      store.close();
    }
  }, 30_000);
});
