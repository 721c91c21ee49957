import { randomUUID } from "node:crypto";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { runCli } from "@mam/cli";
import { STAGED_REPORT_NAME } from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import { captureIo, publishCompletedArgs } from "../support/cli-io.ts";
import { tempDir } from "../support/temp-dir.ts";
import { type Harness, makeHarness, type PortsFactory, type Res } from "./harness.ts";

const REPORT = "# Report\n\nFixed the race in the retry test.\n";
const PROBLEM = /^application\/problem\+json/;
/** The job store calls a refused request may make: reads, and the engine's conditional write, refused by the store. */
const ALLOWED = new Set(["get", "getDispatch", "transition"]);

/**
 * Issue 16: an agent that re-sends its own `completed` after it committed is told it
 * is already done (200 `{already_completed: true, record}`), and the CLI exits 0 —
 * only for that job's agent, on the attempt its completion pinned, with the bytes it
 * pinned. Everything else keeps today's refusal, and writes nothing.
 */
export function apiResentCompletionSuite(name: string, factory: PortsFactory): void {
  describe(`re-sent completions over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });

    async function completedJob(h: Harness): Promise<{ jobId: string; agent: string }> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      expect(
        (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "fix it", agent: "codex" } })).status,
      ).toBe(201);
      const agent = await dispatch(h, jobId, 1);
      expect((await stage(h, jobId, agent, REPORT)).status).toBe(201);
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: completedWithFinalize });
      expect(done.status, done.text).toBe(200);
      expect(done.body.record).toMatchObject({ status: "completed", completed_evidence: { attempt_id: 1 } });
      return { jobId, agent };
    }

    async function dispatch(h: Harness, jobId: string, attempt: number): Promise<string> {
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: attempt, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      return res.body.agent_token;
    }

    const completedWithFinalize = {
      event: "completed",
      finalize: { attempt_id: 1, side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
    };

    const stage = (h: Harness, jobId: string, token: string, text: string, attempt = 1) =>
      h.call("PUT", `/v1/jobs/${jobId}/attempts/${attempt}/report`, { token, body: text, headers: { "content-type": "text/markdown" } });

    /** The requests a re-sent completion makes: the bare event, the event with its finalize, the upload, the finalize. */
    const resends = (h: Harness, jobId: string, token: string, text = REPORT): [string, () => Promise<Res>][] => [
      ["POST /events completed", () => h.call("POST", `/v1/jobs/${jobId}/events`, { token, json: { event: "completed" } })],
      ["POST /events completed with finalize", () => h.call("POST", `/v1/jobs/${jobId}/events`, { token, json: completedWithFinalize })],
      ["PUT .../report", () => stage(h, jobId, token, text)],
      [
        "POST .../finalize",
        () =>
          h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, {
            token,
            json: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
          }),
      ],
    ];

    /**
     * Runs `send`, and checks it wrote nothing: no store call but reads and the engine's
     * conditional write (which the store refuses on a terminal record); the record, its
     * event log and the attempt's report tree (staged, live, pinned) as they were.
     */
    async function writesNothing(h: Harness, jobId: string, send: () => Promise<Res>, attempt = 1): Promise<Res> {
      const read = async () => ({
        record: (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body,
        events: (await h.call("GET", `/v1/jobs/${jobId}/events`, { token: h.operator })).body,
        staged: await h.ports.reports.hash(`reports/${jobId}/${attempt}`, STAGED_REPORT_NAME),
        live: await h.ports.reports.hash(`reports/${jobId}/${attempt}`, "report-final.md"),
      });
      const before = await read();
      const from = h.calls.length;
      const res = await send();
      expect(
        h.calls.slice(from).filter((c) => !ALLOWED.has(c)),
        `${res.status} ${res.text}`,
      ).toEqual([]);
      expect(await read()).toEqual(before);
      if (before.record.completed_evidence !== undefined) {
        const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/${attempt}/verification`, { token: h.operator });
        expect(v.body).toMatchObject({ ok: true, pinned: { ok: true } });
      }
      return res;
    }

    function expectRefused(res: Res, status: number, code: string): void {
      expect(res.status, res.text).toBe(status);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.body.code).toBe(code);
      expect(res.body.already_completed).toBeUndefined();
    }

    it("issue 16: the job's agent re-sending its completed, on the bytes it pinned, is told it is already done, and nothing is written", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const { jobId, agent } = await completedJob(h);
      const record = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
      for (const [what, send] of resends(h, jobId, agent)) {
        const res = await writesNothing(h, jobId, send);
        expect(res.status, `${what}: ${res.text}`).toBe(200);
        expect(res.body, what).toEqual({ already_completed: true, record });
      }
    });

    it("issue 16: the CLI over the API exits 0 on a re-sent publish-event and finalize, printing {already_completed, record}", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const { jobId, agent } = await completedJob(h);
      const record = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
      const tree = await tempDir("resent");
      cleanup.push(() => tree.remove());
      await writeFile(join(tree.dir, "report-final.md"), REPORT);
      const appFetch: typeof fetch = async (input, init) => h.app.fetch(new Request(input, init));
      const api = ["--api", "http://mam.test", "--token", agent, "--json"];
      const report = join(tree.dir, "report-final.md");
      for (const args of [
        publishCompletedArgs(jobId, report, "git_push=a1b2c3d"),
        ["publish-event", "--job", jobId, "--event", "completed"],
        ["finalize", "--job", jobId, "--attempt", "1", "--report", report, "--side-effect", "git_push=a1b2c3d"],
      ]) {
        const io = { ...captureIo({}), fetch: appFetch };
        const code = await runCli([...args, ...api], io);
        expect(code, `${args[0]}: ${io.err.join("")}`).toBe(0);
        expect(JSON.parse(io.out.join(""))).toEqual({ already_completed: true, record });
      }
      // other bytes where it lies: the upload is refused, as before (exit 1)
      await writeFile(report, `${REPORT}edited after the completion\n`);
      const io = { ...captureIo({}), fetch: appFetch };
      const args = ["publish-event", "--job", jobId, "--event", "completed", "--attempt", "1", "--finalize-report", report];
      expect(await runCli([...args, ...api], io)).toBe(1);
      expect(JSON.parse(io.out.join(""))).toMatchObject({ error: { code: "report.frozen" } });
    });

    it("issue 16: an operator's re-send keeps today's refusal and writes nothing", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const { jobId } = await completedJob(h);
      const expected = ["job.transitionRefused", "report.frozen", "report.frozen", "report.frozen"];
      for (const [i, [what, send]] of resends(h, jobId, h.operator).entries()) {
        const res = await writesNothing(h, jobId, send);
        expect(res.status, what).toBe(409);
        expectRefused(res, 409, expected[i]!);
      }
    });

    it("issue 16: another job's agent is refused as before (403) and learns nothing", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const { jobId } = await completedJob(h);
      const other = await completedJob(h);
      for (const [what, send] of resends(h, jobId, other.agent)) {
        const res = await writesNothing(h, jobId, send);
        expect(res.status, what).toBe(403);
        expectRefused(res, 403, "auth.forbidden");
        expect(res.text).not.toContain("report_sha256");
      }
    });

    it("issue 16: the token of another attempt than the completed one is refused as before (403)", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      expect(
        (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "fix it", agent: "codex" } })).status,
      ).toBe(201);
      const first = await dispatch(h, jobId, 1);
      expect((await stage(h, jobId, first, REPORT)).status).toBe(201);
      const second = await dispatch(h, jobId, 2);
      expect((await stage(h, jobId, second, REPORT, 2)).status).toBe(201);
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: second,
        json: { event: "completed", finalize: { attempt_id: 2, side_effects: [] } },
      });
      expect(done.body.record, done.text).toMatchObject({ status: "completed", completed_evidence: { attempt_id: 2 } });
      for (const [what, send] of resends(h, jobId, first)) {
        const res = await writesNothing(h, jobId, send, 2);
        expect(res.status, what).toBe(403);
        expectRefused(res, 403, "auth.forbidden");
      }
    });

    it("issue 16: the agent showing other bytes than its completion pinned is refused as before (409 report.frozen)", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const { jobId, agent } = await completedJob(h);
      const upload = await writesNothing(h, jobId, () => stage(h, jobId, agent, `${REPORT}one more line\n`));
      expectRefused(upload, 409, "report.frozen");
      // Bytes staged on the service that are not the pinned ones (a store no API call
      // writes once the job is terminal): a finalize, or the event with its finalize, would read them.
      await h.ports.reports.put(`reports/${jobId}/1`, STAGED_REPORT_NAME, new TextEncoder().encode("other bytes\n"));
      const [, withFinalize, , finalize] = resends(h, jobId, agent);
      expectRefused(await writesNothing(h, jobId, withFinalize![1]), 409, "report.frozen");
      expectRefused(await writesNothing(h, jobId, finalize![1]), 409, "report.frozen");
    });

    it.each([
      ["failed", "error"],
      ["cancelled", "cancel"],
    ])("issue 16: the agent's re-send on a job that ended %s (terminal, not completed) keeps the refusal", async (_, ending) => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      expect(
        (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "fix it", agent: "codex" } })).status,
      ).toBe(201);
      const agent = await dispatch(h, jobId, 1);
      expect((await stage(h, jobId, agent, REPORT)).status).toBe(201);
      const fin = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { token: agent, json: { side_effects: [] } });
      expect(fin.status, fin.text).toBe(200);
      const ended = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: ending === "cancel" ? h.operator : agent,
        json: { action: ending, expected_seq: 0 },
      });
      expect(ended.status, ended.text).toBe(200);
      const expected = ["job.transitionRefused", "report.frozen", "report.frozen", "report.frozen"];
      for (const [i, [what, send]] of resends(h, jobId, agent).entries()) {
        const res = await writesNothing(h, jobId, send);
        expect(res.status, what).toBe(409);
        expectRefused(res, 409, expected[i]!);
      }
    });

    it("issue 16: a completion that pinned no report (a job expecting nothing, completed without finalize) keeps the refusal", async () => {
      const h = await makeHarness(factory, {}, cleanup);
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      expect(
        (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "fix it", agent: "codex" } })).status,
      ).toBe(201);
      const agent = await dispatch(h, jobId, 1);
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "completed", expected_seq: 0 } });
      expect(done.body.record, done.text).toMatchObject({ status: "completed" });
      expect(done.body.record.completed_evidence).toBeUndefined();
      const again = await writesNothing(h, jobId, () =>
        h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "completed", expected_seq: 0 } }),
      );
      expectRefused(again, 409, "job.transitionConflict");
    });
  });
}
