/**
 * Issue 20, part 3: scheduled evaluation. An evidence write marks its job a candidate
 * due at its last quiescent receipt plus the settle window (a sparse index read by due
 * time); the sweep, after its owed notifications, evaluates the due candidates within
 * its own budget, oldest due first; after a hold it clears the mark only if the
 * evidence it read is still the job's; every terminal write and every new dispatch
 * removes the mark; with MAM_AUTO_COMPLETE=0 the sweep neither evaluates nor clears.
 * Over every backend (SQLite and files; DynamoDB and S3), with the test clock.
 */
import {
  evaluateDueCandidates,
  type Observer,
  OPERATOR,
  parseFlags,
  recordDispatch,
  recoverNotifications,
  registerJob,
  sweepPass,
  transitionJob,
} from "@mam/core";
import { expect, it } from "vitest";
import { describeBackends } from "../seed/harness.ts";
import { type ReadyJob, readyJob } from "../seed/scenario.ts";
import { before, readyOn, SESSION, see } from "./observing.ts";

const BUDGET = { evaluations: 25, bytes: 64 * 1024 * 1024 };
/** The settle window of claude-code (the allowlist's), which `readyJob` registers. */
const WINDOW_MS = 30_000;

describeBackends("issue 20: scheduled evaluation of due candidates", (backend) => {
  const ready = (env: Record<string, string> = {}) => readyOn(backend(), env);
  type Ready = Awaited<ReturnType<typeof ready>>;

  /** A second job on the same stores and clock, ready for the gate. */
  const another = (r: Ready): Promise<ReadyJob> => readyJob(r.deps, {});

  /** A job dispatched and opted in but never claimed, which a watcher saw settle past the window. */
  async function pendingQuiescent(r: Ready) {
    const job = await registerJob(r.deps, { prompt: "p", agent: "claude-code", auto_complete: true });
    await recordDispatch(
      r.deps,
      job.job_id,
      { attempt_id: 1, agent_session_uuid: SESSION, pane_process_generation: 3, pane_id: "%12" },
      OPERATOR,
    );
    const pending: ReadyJob = { ...r.job, jobId: job.job_id, attemptId: 1 };
    await workedThenIdle(r, pending, 1_000);
    r.clock.advance(WINDOW_MS + 1_000);
    await see(r.deps, pending, "idle");
    return job;
  }

  /** A watcher saw `job` working, then idle `gapMs` later. */
  async function workedThenIdle(r: Ready, job: ReadyJob, gapMs: number) {
    await see(r.deps, job, "working");
    r.clock.advance(gapMs);
    await see(r.deps, job, "idle");
  }

  const candidates = async (r: Ready) =>
    (await r.deps.jobs.listCandidates(100, { dueBy: r.clock.now().toISOString() })).map((j) => j.job_id);

  it("a watcher's working then idle marks the job a candidate due at the idle's receipt plus the settle window; listed only once due; a working again removes the mark", async () => {
    const r = await ready();
    await see(r.deps, r.job, "working");
    expect((await r.deps.jobs.get(r.job.jobId))?.candidate_at).toBeUndefined();
    r.clock.advance(2_000);
    const idle = await see(r.deps, r.job, "idle");
    const due = new Date(Date.parse(idle.observation.received_at) + WINDOW_MS).toISOString();
    expect(idle.job.candidate_at).toBe(due);
    expect(await candidates(r)).toEqual([]);
    r.clock.advance(WINDOW_MS);
    expect(await candidates(r)).toEqual([r.job.jobId]);
    await see(r.deps, r.job, "working");
    expect((await r.deps.jobs.get(r.job.jobId))?.candidate_at).toBeUndefined();
    expect(await candidates(r)).toEqual([]);
  });

  it("the sweep completes a due candidate on recorded evidence once a repeat covers the window; before that it holds and clears the mark, and the covering repeat marks it due again (a watcher's every poll does not)", async () => {
    const r = await ready();
    await workedThenIdle(r, r.job, 2_000);
    r.clock.advance(10_000);
    // A repeat inside the window leaves the mark as it was.
    const early = await see(r.deps, r.job, "idle");
    expect(early.coalesced).toBe(true);
    r.clock.advance(WINDOW_MS);
    // Due: but the watcher's last sighting (10 s in) does not cover the window, so the gate holds.
    const held = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(held).toMatchObject({ due: 1, held: 1, completed: 0 });
    expect(held.results[0]?.reason).toContain("mam's clock does not extend a watcher's span");
    expect((await r.deps.jobs.get(r.job.jobId))?.candidate_at).toBeUndefined();
    expect((await evaluateDueCandidates(r.deps, { budget: BUDGET })).due).toBe(0);
    // The repeat that makes the span cover the window marks it due now, in the same (coalesced) write.
    const covering = await see(r.deps, r.job, "idle");
    expect(covering.coalesced).toBe(true);
    expect(Date.parse(covering.job.candidate_at ?? "")).toBeLessThanOrEqual(r.clock.now().getTime());
    const done = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(done).toMatchObject({ due: 1, completed: 1 });
    const record = await r.deps.jobs.get(r.job.jobId);
    expect(record).toMatchObject({ status: "completed", completed_evidence: { evidence: "recorded", sources: ["watcher:herdr-1"] } });
    // The completion's terminal write removed the mark.
    expect(record?.candidate_at).toBeUndefined();
    expect(await candidates(r)).toEqual([]);
  });

  it("with two watchers, the second's repeat that makes its own span cover the window marks the job due again, though the first watcher's earlier idle set an earlier due time the sweep found held", async () => {
    const r = await ready();
    const other: Observer = { kind: "watcher", name: "herdr-2" };
    await see(r.deps, r.job, "working");
    r.clock.advance(1_000);
    // herdr-1 sees idle once and stops reporting: the job is due at its receipt plus the window.
    await see(r.deps, r.job, "idle");
    r.clock.advance(10_000);
    await see(r.deps, r.job, "idle", other);
    r.clock.advance(WINDOW_MS - 10_000);
    // herdr-2's repeat at the due time: its own span is 20 s, short of the window.
    await see(r.deps, r.job, "idle", other);
    r.clock.advance(1_000);
    const held = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(held).toMatchObject({ due: 1, held: 1 });
    expect((await r.deps.jobs.get(r.job.jobId))?.candidate_at).toBeUndefined();
    // herdr-2 keeps reporting idle until its own span covers the window: the gate would now approve.
    r.clock.advance(10_000);
    const covering = await see(r.deps, r.job, "idle", other);
    expect(covering.coalesced).toBe(true);
    expect(covering.job.candidate_at).toBeDefined();
    const done = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(done).toMatchObject({ due: 1, completed: 1 });
    expect(await r.deps.jobs.get(r.job.jobId)).toMatchObject({ status: "completed", completed_evidence: { sources: ["watcher:herdr-2"] } });
  });

  it("a job the sweep held because it was not opted in is marked due again when an operator opts it in: the opt-in moves no evidence, so nothing else would", async () => {
    const r = await ready();
    const progress = async (auto_complete: boolean) => {
      const current = await r.deps.jobs.get(r.job.jobId);
      return transitionJob(
        r.deps,
        r.job.jobId,
        { action: "progress", expectedSeq: current?.transition_seq ?? -1, fields: { auto_complete } },
        OPERATOR,
      );
    };
    await progress(false);
    await workedThenIdle(r, r.job, 1_000);
    r.clock.advance(WINDOW_MS + 1_000);
    await see(r.deps, r.job, "idle");
    const held = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(held).toMatchObject({ due: 1, held: 1 });
    expect(held.results[0]?.reason).toContain("did not opt in");
    expect((await r.deps.jobs.get(r.job.jobId))?.candidate_at).toBeUndefined();
    const optedIn = await progress(true);
    expect(optedIn.candidate_at).toBeDefined();
    const done = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(done).toMatchObject({ due: 1, completed: 1 });
  });

  it("a job the sweep held while still pending is marked due again by its claim", async () => {
    const r = await ready();
    const job = await pendingQuiescent(r);
    const held = await evaluateDueCandidates(r.deps, { budget: BUDGET });
    expect(held.results).toEqual([expect.objectContaining({ job_id: job.job_id, outcome: "held" })]);
    expect(held.results[0]?.reason).toContain("not running");
    const current = await r.deps.jobs.get(job.job_id);
    const claimed = await transitionJob(r.deps, job.job_id, { action: "claim", expectedSeq: current?.transition_seq ?? -1 }, OPERATOR);
    expect(claimed.candidate_at).toBeDefined();
    expect(await candidates(r)).toEqual([job.job_id]);
  });

  it("a claim landing between the sweep's read of a pending job and its clear keeps the mark the claim set: the clear is conditional on the transition_seq the gate read too", async () => {
    const r = await ready();
    const job = await pendingQuiescent(r);
    const racing = before(r.deps, "clearCandidate", async () => {
      const current = await r.deps.jobs.get(job.job_id);
      await transitionJob(r.deps, job.job_id, { action: "claim", expectedSeq: current?.transition_seq ?? -1 }, OPERATOR);
    });
    const held = await evaluateDueCandidates(racing, { budget: BUDGET });
    expect(held.results[0]?.reason).toContain("not running");
    expect((await r.deps.jobs.get(job.job_id))?.status).toBe("running");
    expect(await candidates(r)).toEqual([job.job_id]);
  });

  it("an observation landing between the sweep's read and its clear keeps the job due: the clear is conditional on the evidence the gate read", async () => {
    const r = await ready();
    await workedThenIdle(r, r.job, 1_000);
    r.clock.advance(WINDOW_MS + 1_000);
    const other: Observer = { kind: "watcher", name: "herdr-2" };
    const racing = before(r.deps, "clearCandidate", async () => {
      await see(r.deps, r.job, "idle", other);
    });
    const pass = await evaluateDueCandidates(racing, { budget: BUDGET });
    expect(pass).toMatchObject({ due: 1, held: 0, kept: 1 });
    // The second watcher's idle moved the evidence in its own write; the sweep's clear lost, and the
    // job stays a candidate, behind the others (a settle window later).
    const record = await r.deps.jobs.get(r.job.jobId);
    expect(record?.observations?.entries.map((e) => e.source)).toEqual(["watcher:herdr-1", "watcher:herdr-1", "watcher:herdr-2"]);
    expect(record?.candidate_at).toBeDefined();
    r.clock.advance(WINDOW_MS);
    expect(await candidates(r)).toEqual([r.job.jobId]);
  });

  it("every terminal write and every new dispatch removes the mark in the same write", async () => {
    const r = await ready();
    const marked = async (job: ReadyJob) => {
      await see(r.deps, job, "working");
      r.clock.advance(1_000);
      return (await see(r.deps, job, "idle")).job.candidate_at;
    };
    expect(await marked(r.job)).toBeDefined();
    await recordDispatch(r.deps, r.job.jobId, { attempt_id: 2, agent_session_uuid: SESSION, pane_process_generation: 3 }, OPERATOR);
    expect((await r.deps.jobs.get(r.job.jobId))?.candidate_at).toBeUndefined();
    const second = await another(r);
    expect(await marked(second)).toBeDefined();
    const current = await r.deps.jobs.get(second.jobId);
    await transitionJob(r.deps, second.jobId, { action: "cancel", expectedSeq: current?.transition_seq ?? -1 }, OPERATOR);
    const cancelled = await r.deps.jobs.get(second.jobId);
    expect(cancelled?.status).toBe("cancelled");
    expect(cancelled?.candidate_at).toBeUndefined();
    r.clock.advance(10 * 60_000);
    expect(await candidates(r)).toEqual([]);
  });

  it("with MAM_AUTO_COMPLETE=0 the sweep reads, evaluates and clears nothing: the stores' fingerprint is unchanged", async () => {
    const r = await ready();
    await workedThenIdle(r, r.job, 1_000);
    r.clock.advance(WINDOW_MS + 5_000);
    await see(r.deps, r.job, "idle");
    const off = r.b.deps(parseFlags({ MAM_AUTO_COMPLETE: "0" }), { clock: r.clock });
    const fingerprint = await r.b.fingerprint();
    const pass = await evaluateDueCandidates(off, { budget: BUDGET });
    expect(pass).toMatchObject({ disabled: true, due: 0, held: 0, completed: 0 });
    expect(await r.b.fingerprint()).toBe(fingerprint);
    expect(await candidates(r)).toEqual([r.job.jobId]);
  });

  it("the budget: at most `evaluations` candidates read per pass, oldest due first; past the bytes budget the rest are not tried and stay due", async () => {
    const r = await ready();
    const jobs = [r.job, await another(r), await another(r)];
    for (const job of jobs) {
      await workedThenIdle(r, job, 1_000);
      r.clock.advance(1_000);
    }
    r.clock.advance(WINDOW_MS);
    // Two read, the two oldest due; both held (no covering sighting) and cleared; the third untouched.
    const two = await evaluateDueCandidates(r.deps, { budget: { evaluations: 2, bytes: BUDGET.bytes } });
    expect(two.results.map((x) => [x.job_id, x.outcome])).toEqual([
      [jobs[0]?.jobId, "held"],
      [jobs[1]?.jobId, "held"],
    ]);
    expect(await candidates(r)).toEqual([jobs[2]?.jobId]);
    // Covering repeats for all three: due again; a bytes budget of one byte lets one evaluation start, the rest wait.
    for (const job of jobs) await see(r.deps, job, "idle");
    const one = await evaluateDueCandidates(r.deps, { budget: { evaluations: 10, bytes: 1 } });
    expect(one.results.map((x) => x.outcome)).toEqual(["completed", "not_tried", "not_tried"]);
    expect(one.bytes_hashed).toBeGreaterThan(0);
    expect((await candidates(r)).sort()).toEqual([jobs[1]?.jobId, jobs[2]?.jobId].sort());
  });

  it("a sweep pass sends every owed notification first, whatever the evaluation budget: the notifications are never limited by evaluation", async () => {
    const r = await ready();
    const jobs = [r.job, await another(r), await another(r)];
    for (const job of jobs) {
      await workedThenIdle(r, job, 1_000);
    }
    r.clock.advance(WINDOW_MS + 1_000);
    for (const job of jobs) await see(r.deps, job, "idle");
    // Three other jobs cancelled: each owes its cancellation's notification (nothing here publishes inline).
    for (let i = 0; i < 3; i++) {
      const job = await registerJob(r.deps, { prompt: "p", agent: "claude-code" });
      await transitionJob(r.deps, job.job_id, { action: "cancel", expectedSeq: job.transition_seq }, OPERATOR);
    }
    const owedBefore = (await r.deps.jobs.listOwed(100, { dueBy: r.clock.now().toISOString() })).length;
    expect(owedBefore).toBeGreaterThanOrEqual(jobs.length);
    const pass = await sweepPass(r.deps, { evaluation: { evaluations: 1, bytes: BUDGET.bytes } });
    expect(pass.notifications).toMatchObject({ owed: owedBefore, sent: owedBefore, not_tried: 0 });
    expect(pass.candidates).toMatchObject({ due: 1, completed: 1 });
    // The completion owes its own notification, which the next pass sends, with the next candidate.
    const next = await sweepPass(r.deps, { evaluation: { evaluations: 1, bytes: BUDGET.bytes } });
    expect(next.notifications).toMatchObject({ sent: 1, not_tried: 0 });
    expect(next.candidates).toMatchObject({ due: 1, completed: 1 });
    expect((await recoverNotifications(r.deps)).sent).toBe(1);
  });

  it("an agent's Stop hook under the documented rule marks nothing until MAM_AUTO_COMPLETE_SOURCES names the rule; then the sweep completes the job, agent-attested, once mam's clock closes the window", async () => {
    const agentStop = async (env: Record<string, string>) => {
      const r = await ready(env);
      const agent: Observer = { kind: "agent", attempt: r.job.attemptId };
      await see(r.deps, r.job, "working", agent, "hook.prompt");
      r.clock.advance(1_000);
      const stop = await see(r.deps, r.job, "done", agent, "hook.stop");
      r.clock.advance(WINDOW_MS + 1_000);
      return { r, stop };
    };
    const off = await agentStop({});
    expect(off.stop.job.candidate_at).toBeUndefined();
    expect((await evaluateDueCandidates(off.r.deps, { budget: BUDGET })).due).toBe(0);
    expect((await off.r.deps.jobs.get(off.r.job.jobId))?.status).toBe("running");

    const on = await agentStop({ MAM_AUTO_COMPLETE_SOURCES: "watcher.pane_status,agent.claude-code.stop" });
    expect(on.stop.job.candidate_at).toBe(new Date(Date.parse(on.stop.observation.received_at) + WINDOW_MS).toISOString());
    const pass = await evaluateDueCandidates(on.r.deps, { budget: BUDGET });
    expect(pass).toMatchObject({ due: 1, completed: 1 });
    expect((await on.r.deps.jobs.get(on.r.job.jobId))?.completed_evidence).toMatchObject({
      rule: "agent.claude-code.stop",
      sources: ["agent:claude-code"],
      quiescence: "agent-attested",
    });
  });

  it("a candidate whose evidence keeps moving while the gate holds goes behind the others, due a settle window later: it cannot head every pass and starve the rest", async () => {
    const r = await ready();
    const first = r.job;
    const second = await another(r);
    for (const job of [first, second]) {
      await workedThenIdle(r, job, 1_000);
      r.clock.advance(1_000);
    }
    r.clock.advance(WINDOW_MS);
    // Each time the sweep clears the first job's mark, its watcher has just sighted it again (the rev moved).
    const racing = before(r.deps, "clearCandidate", async () => {
      await see(r.deps, first, "idle");
    });
    const budget = { evaluations: 1, bytes: BUDGET.bytes };
    const one = await evaluateDueCandidates(racing, { budget });
    expect(one.results.map((x) => [x.job_id, x.outcome])).toEqual([[first.jobId, "kept"]]);
    const postponed = await r.deps.jobs.get(first.jobId);
    expect(Date.parse(postponed?.candidate_at ?? "")).toBe(r.clock.now().getTime() + WINDOW_MS);
    // The next pass takes the other candidate, which was due later than the first's old time.
    const two = await evaluateDueCandidates(racing, { budget });
    expect(two.results.map((x) => x.job_id)).toEqual([second.jobId]);
  });
});
