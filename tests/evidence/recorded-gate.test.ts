/**
 * Issue 20: the gate on what mam recorded itself. An evaluation with no scenario
 * builds a `mam.scenario/v2` from the job's observations of its latest dispatch; the
 * policy's rules per (backend, source kind) decide; the dry run answers the same and
 * writes nothing; a posted scenario from the future is held. Over every backend (the
 * seed harness: SQLite and files; DynamoDB and S3), with the test clock.
 */
import { evaluateJob, notificationPayload, type Observer, OPERATOR, RECORDED, recordDispatch } from "@mam/core";
import { expect, it } from "vitest";
import { describeBackends, type SeedBackend } from "../seed/harness.ts";
import { before, readyOn, SESSION, see } from "./observing.ts";

describeBackends("issue 20: the gate on recorded evidence", (backend) => {
  const ready = (env: Record<string, string> = {}, b: SeedBackend = backend()) => readyOn(b, env);

  it("a watcher's working, idle, and idle again past the settle window (coalesced) complete the job with no scenario posted; the completion names its source and what it can be rebuilt from", async () => {
    const { deps, clock, job } = await ready();
    await see(deps, job, "working");
    clock.advance(2_000);
    await see(deps, job, "idle");
    clock.advance(15_000);
    expect((await evaluateJob(deps, job.jobId, RECORDED)).committed).toBe(false);
    clock.advance(16_000);
    const repeat = await see(deps, job, "idle");
    expect(repeat.coalesced).toBe(true);
    const result = await evaluateJob(deps, job.jobId, RECORDED);
    expect(result.committed, result.reason).toBe(true);
    expect(result.decision).toMatchObject({ rule: "watcher.pane_status", sources: ["watcher:herdr-1"], quiescence: "watcher-observed" });
    const record = await deps.jobs.get(job.jobId);
    expect(record?.status).toBe("completed");
    expect(record?.completed_evidence).toMatchObject({
      evidence: "recorded",
      rule: "watcher.pane_status",
      sources: ["watcher:herdr-1"],
      quiescence: "watcher-observed",
      observations_rev: repeat.job.observations?.rev,
    });
    // The stored observations are what the scenario is rebuilt from: they stay with the terminal record.
    expect(record?.observations?.entries.map((e) => e.state)).toEqual(["working", "idle"]);
    expect(result.scenario?.timeline.filter((i) => i.source_kind === "pane_status")).toHaveLength(2);
    const payload = notificationPayload(record as NonNullable<typeof record>, record?.pending_notification as never);
    expect(payload.data.quiescence).toBe("watcher-observed");
  });

  it("a watcher that dies after posting idle completes nothing: mam's clock never closes a polling source's span", async () => {
    const { deps, clock, job } = await ready();
    await see(deps, job, "working");
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(5_000);
    expect((await see(deps, job, "idle")).coalesced).toBe(true);
    // Two sightings, 5 s apart; then nothing from the watcher for ten minutes.
    clock.advance(10 * 60_000);
    const result = await evaluateJob(deps, job.jobId, RECORDED);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("quiescent for 5s by its last sighting");
    expect(result.reason).toContain("mam's clock does not extend a watcher's span");
  });

  it("an observation of attempt 1 followed by a dispatch of attempt 2 holds the gate: nothing was observed of the latest dispatch", async () => {
    const { deps, clock, job } = await ready();
    await see(deps, job, "working");
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(40_000);
    await see(deps, job, "idle");
    await recordDispatch(
      deps,
      job.jobId,
      { attempt_id: 2, agent_session_uuid: SESSION, pane_process_generation: 3, pane_id: "%12" },
      OPERATOR,
    );
    const result = await evaluateJob(deps, job.jobId, RECORDED);
    expect(result.committed).toBe(false);
    expect((await deps.jobs.get(job.jobId))?.status).toBe("running");
  });

  it("an agent's evidence overflowing its bound holds the gate, naming the overflow, though a watcher saw the job settle", async () => {
    const { deps, clock, job } = await ready();
    const agent: Observer = { kind: "agent", attempt: job.attemptId };
    await see(deps, job, "working");
    let overflowed = false;
    for (let i = 0; i < 200 && !overflowed; i++) {
      try {
        await see(deps, job, i % 2 === 0 ? "working" : "done", agent, "hook.event");
      } catch (e) {
        expect(e).toMatchObject({ code: "quota.observations" });
        overflowed = true;
      }
    }
    expect(overflowed).toBe(true);
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(40_000);
    await see(deps, job, "idle");
    const result = await evaluateJob(deps, job.jobId, RECORDED);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("overflowed");
  });

  it("a hook-shaped agent source under a documented, not observed rule completes nothing until MAM_AUTO_COMPLETE_SOURCES names it, then completes as agent-attested", async () => {
    for (const env of [{}, { MAM_AUTO_COMPLETE_SOURCES: "watcher.pane_status,agent.claude-code.stop" }]) {
      const { deps, clock, job } = await ready(env);
      const agent: Observer = { kind: "agent", attempt: job.attemptId };
      await see(deps, job, "working", agent, "hook.user_prompt_submit");
      clock.advance(5_000);
      await see(deps, job, "done", agent, "hook.stop");
      clock.advance(31_000);
      const result = await evaluateJob(deps, job.jobId, RECORDED);
      if (env.MAM_AUTO_COMPLETE_SOURCES === undefined) {
        expect(result.committed).toBe(false);
        expect(result.reason).toContain("agent.claude-code.stop (documented, not observed)");
        expect(result.reason).toContain("MAM_AUTO_COMPLETE_SOURCES");
        continue;
      }
      expect(result.committed, result.reason).toBe(true);
      const record = await deps.jobs.get(job.jobId);
      expect(record?.completed_evidence).toMatchObject({
        rule: "agent.claude-code.stop",
        sources: ["agent:claude-code"],
        quiescence: "agent-attested",
      });
      expect(notificationPayload(record as never, record?.pending_notification as never).data.quiescence).toBe("agent-attested");
    }
  });

  it("an event source's span is closed by mam's clock only while nothing else is recorded after it: a watcher's working after the Stop holds", async () => {
    const { deps, clock, job } = await ready({ MAM_AUTO_COMPLETE_SOURCES: "agent.claude-code.stop" });
    const agent: Observer = { kind: "agent", attempt: job.attemptId };
    await see(deps, job, "working", agent, "hook.user_prompt_submit");
    clock.advance(5_000);
    await see(deps, job, "done", agent, "hook.stop");
    clock.advance(5_000);
    await see(deps, job, "working");
    clock.advance(60_000);
    const result = await evaluateJob(deps, job.jobId, RECORDED);
    expect(result.committed).toBe(false);
  });

  it("a gate racing a coalesced working (another watcher sighting its working again) loses: the commit is conditional on the observations it was built from", async () => {
    const { deps, clock, job } = await ready();
    const other: Observer = { kind: "watcher", name: "herdr-2" };
    await see(deps, job, "working", other);
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(40_000);
    await see(deps, job, "idle");
    const racing = before(deps, "transition", async () => {
      // A repeat: no evidence_seq bump, only the set's rev moves.
      expect((await see(deps, job, "working", other)).coalesced).toBe(true);
    });
    const result = await evaluateJob(racing, job.jobId, RECORDED);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("observations changed");
    expect((await deps.jobs.get(job.jobId))?.status).toBe("running");
    // Evaluated again, the working sighted after the idle holds it.
    expect((await evaluateJob(deps, job.jobId, RECORDED)).committed).toBe(false);
  });

  it("the dry run writes nothing and answers what the evaluation then answers", async () => {
    const { b, deps, clock, job } = await ready();
    await see(deps, job, "working");
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(40_000);
    await see(deps, job, "idle");
    const before = await b.fingerprint();
    const dry = await evaluateJob(deps, job.jobId, RECORDED, { dryRun: true });
    expect(await b.fingerprint()).toBe(before);
    expect(dry).toMatchObject({ committed: false, wouldCommit: true });
    expect(dry.scenario?.schema).toBe("mam.scenario/v2");
    const real = await evaluateJob(deps, job.jobId, RECORDED);
    expect(real.committed).toBe(true);
    expect(real.decision).toEqual(dry.decision);
    // And on a hold: the same reason, nothing written.
    const other = await ready({}, b);
    const held = await b.fingerprint();
    const dryHold = await evaluateJob(other.deps, other.job.jobId, RECORDED, { dryRun: true });
    expect(await b.fingerprint()).toBe(held);
    expect(dryHold.wouldCommit).toBeUndefined();
    expect((await evaluateJob(other.deps, other.job.jobId, RECORDED)).reason).toBe(dryHold.reason);
  });

  it("the reference scenario with every observation dated 2031 is held: the evaluation knows mam's clock", async () => {
    const { deps, job } = await ready();
    const future = structuredClone(job.scenario);
    for (const item of future.timeline) item.at = item.at.replace(/^2026/, "2031");
    const result = await evaluateJob(deps, job.jobId, future, { postedBy: "tok-1" });
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("later than mam's clock");
    expect(result.reason).toContain("MAM_OBSERVATION_SKEW_SECONDS");
    // The same scenario as the watcher collected it completes, recorded as posted, by whom.
    const posted = await evaluateJob(deps, job.jobId, job.scenario, { postedBy: "tok-1" });
    expect(posted.committed, posted.reason).toBe(true);
    expect((await deps.jobs.get(job.jobId))?.completed_evidence).toMatchObject({ evidence: "posted", posted_by: "tok-1" });
  });

  it("a gate racing an observation never commits past a stored working: the working lands between the gate's read and its write, and the gate loses", async () => {
    const { deps, clock, job } = await ready();
    await see(deps, job, "working");
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(40_000);
    await see(deps, job, "idle");
    // The gate's own write is the transition: the watcher's working commits just before it.
    const racing = before(deps, "transition", async () => {
      await see(deps, job, "working");
    });
    const result = await evaluateJob(racing, job.jobId, RECORDED);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("moved while the gate was deciding");
    const record = await deps.jobs.get(job.jobId);
    expect(record?.status).toBe("running");
    expect(record?.observations?.entries.at(-1)?.state).toBe("working");
  });

  it("a source still reporting blocked after the last working holds the gate, though its first blocked was received before that working", async () => {
    const { deps, clock, job } = await ready();
    const agent: Observer = { kind: "agent", attempt: job.attemptId };
    await see(deps, job, "working");
    clock.advance(1_000);
    // The agent's hook says it waits on a person, and keeps saying so (coalesced).
    await see(deps, job, "blocked", agent, "hook.notification");
    clock.advance(1_000);
    expect((await see(deps, job, "working")).coalesced).toBe(true);
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(20_000);
    expect((await see(deps, job, "blocked", agent, "hook.notification")).coalesced).toBe(true);
    clock.advance(20_000);
    expect((await see(deps, job, "idle")).coalesced).toBe(true);
    expect((await see(deps, job, "blocked", agent, "hook.notification")).coalesced).toBe(true);
    const result = await evaluateJob(deps, job.jobId, RECORDED);
    expect(result.committed, result.reason).toBe(false);
    expect(result.reason).toContain("blocked");
    expect((await deps.jobs.get(job.jobId))?.status).toBe("running");
  });

  it("a posted mam.scenario/v2 dated 2031 is held like a v1 one: the future check reads every time in the timeline", async () => {
    const { deps, clock, job } = await ready();
    await see(deps, job, "working");
    clock.advance(1_000);
    await see(deps, job, "idle");
    clock.advance(1_000);
    await see(deps, job, "idle");
    const dry = await evaluateJob(deps, job.jobId, RECORDED, { dryRun: true });
    const forged = structuredClone(dry.scenario) as NonNullable<typeof dry.scenario>;
    // The idle's last sighting, and mam's own clock, moved to 2031.
    for (const item of forged.timeline) {
      if (item.state === "idle" || item.source_kind === "mam.clock") item.last_seen_at = item.last_seen_at.replace(/^2026/, "2031");
    }
    const result = await evaluateJob(deps, job.jobId, forged, { postedBy: "tok-1" });
    expect(result.committed, result.reason).toBe(false);
    expect(result.reason).toContain("later than mam's clock");
    expect((await deps.jobs.get(job.jobId))?.status).toBe("running");
  });
});
