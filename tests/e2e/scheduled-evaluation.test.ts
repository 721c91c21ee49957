import { type RunningService, runCli } from "@mam/cli";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { TestClock } from "../support/clock.ts";
import { serviceCaller, startTestService } from "../support/service-call.ts";
import { subscribe } from "../support/subscriber.ts";

let dataDir: string;
let service: RunningService;
let started: Awaited<ReturnType<typeof startTestService>> | undefined;
const clock = new TestClock(new Date().toISOString());

beforeAll(async () => {
  started = await startTestService("scheduled-evaluation", clock);
  ({ service, dataDir } = started);
});
afterAll(async () => {
  await started?.stop();
});

const call = serviceCaller(() => service.url);

describe("scheduled evaluation on mam serve (issue 20)", () => {
  it("a watcher's working, idle and covering idle complete the job by the sweep alone, and a subscriber receives the completion naming its rule and sources", async () => {
    const op = service.operatorToken;
    const jobId = "sched-1";
    expect((await call("POST", "/v1/jobs", op, { job_id: jobId, prompt: "p", agent: "claude-code" })).status).toBe(201);
    const claimed = await call("POST", `/v1/jobs/${jobId}/transitions`, op, { action: "claim", expected_seq: 0 });
    expect(claimed.status, claimed.text).toBe(200);
    const opted = await call("POST", `/v1/jobs/${jobId}/transitions`, op, {
      action: "progress",
      expected_seq: claimed.body.transition_seq,
      fields: { auto_complete: true },
    });
    expect(opted.status, opted.text).toBe(200);
    const session = "0c9a2d11-0000-4000-8000-00000000c0de";
    const dispatched = await call("POST", `/v1/jobs/${jobId}/dispatches`, op, {
      attempt_id: 1,
      agent_session_uuid: session,
      pane_process_generation: 3,
      pane_id: "%12",
      anchor: { started_at: clock.now().toISOString() },
    });
    expect(dispatched.status, dispatched.text).toBe(201);
    const agent = dispatched.body.agent_token as string;
    expect((await call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, agent, "# Report\n\ndone\n", "text/markdown")).status).toBe(201);
    const finalized = await call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, agent, { side_effects: [] });
    expect(finalized.status, finalized.text).toBe(200);

    // The watcher's token, as an operator makes one: `mam token create --scope observe --name herdr-1`.
    const io = captureIo({});
    expect(await runCli(["token", "create", "--scope", "observe", "--name", "herdr-1", "--data-dir", dataDir, "--json"], io)).toBe(0);
    const watcher = JSON.parse(io.out.join("")).token as string;

    const sub = await subscribe(service.mqttUrl, `mam/jobs/${jobId}/events`);
    try {
      const observe = (state: string) =>
        call("POST", `/v1/jobs/${jobId}/observations`, watcher, {
          state,
          source_kind: "pane_status",
          attempt_id: 1,
          agent_session_uuid: session,
          pane_process_generation: 3,
          pane_id: "%12",
          observed_at: clock.now().toISOString(),
        });
      expect((await observe("working")).status).toBe(201);
      clock.advance(2_000);
      expect((await observe("idle")).status).toBe(201);
      clock.advance(31_000);
      const repeat = await observe("idle");
      expect(repeat.status, repeat.text).toBe(200);
      expect(repeat.body.coalesced).toBe(true);

      // No evaluation asked: the sweep timer (every second) finds the job due and completes it.
      const message = await sub.waitFor((m) => JSON.parse(m.payload).event === "completed", 20_000);
      expect(JSON.parse(message.payload)).toMatchObject({
        event: "completed",
        job_id: jobId,
        data: {
          status: "completed",
          completed_by: "auto_complete",
          rule: "watcher.pane_status",
          sources: ["watcher:herdr-1"],
          quiescence: "watcher-observed",
        },
      });
      const record = await call("GET", `/v1/jobs/${jobId}`, op);
      expect(record.body).toMatchObject({
        status: "completed",
        completed_evidence: { evidence: "recorded", sources: ["watcher:herdr-1"] },
      });
      expect(record.body.candidate_at).toBeUndefined();
    } finally {
      await sub.close();
    }
  }, 60_000);

  it("a claimed job with no activity for the stale window is marked stale by the sweep alone: one `stale` notification, listed by ?stale=true; the next activity clears the mark", async () => {
    const op = service.operatorToken;
    const jobId = "sched-stale";
    expect((await call("POST", "/v1/jobs", op, { job_id: jobId, prompt: "p", agent: "codex" })).status).toBe(201);
    const claimed = await call("POST", `/v1/jobs/${jobId}/transitions`, op, { action: "claim", expected_seq: 0 });
    expect(claimed.status, claimed.text).toBe(200);
    const sub = await subscribe(service.mqttUrl, `mam/jobs/${jobId}/events`);
    try {
      // MAM_STALE_AFTER_SECONDS is 1800 (the default): the sweep timer marks the job once the clock passes it.
      clock.advance(1_801_000);
      const message = await sub.waitFor((m) => JSON.parse(m.payload).event === "stale", 20_000);
      expect(JSON.parse(message.payload)).toMatchObject({ event: "stale", job_id: jobId, data: { status: "running", by: "sweep" } });
      const listed = await call("GET", "/v1/jobs?stale=true", op);
      expect(listed.body.items.map((j: { job_id: string }) => j.job_id)).toEqual([jobId]);
      const progressed = await call("POST", `/v1/jobs/${jobId}/transitions`, op, {
        action: "progress",
        expected_seq: claimed.body.transition_seq,
        fields: { progress: { step: 2 } },
      });
      expect(progressed.status, progressed.text).toBe(200);
      expect(progressed.body.stale_since).toBeUndefined();
      expect((await call("GET", "/v1/jobs?stale=true", op)).body.items).toEqual([]);
      expect(sub.received.filter((m) => JSON.parse(m.payload).event === "stale")).toHaveLength(1);
    } finally {
      await sub.close();
    }
  }, 60_000);
});
