/**
 * Review of issue 20 (parts 1-2): cases where the gate on recorded evidence, or a
 * posted scenario, completes a job it should hold. Over every backend, with the test
 * clock, on the real stores.
 */
import { type Deps, evaluateJob, type ObservedState, type Observer, parseFlags, RECORDED, recordObservation } from "@mam/core";
import { expect, it } from "vitest";
import { describeBackends, type SeedBackend } from "../seed/harness.ts";
import { type ReadyJob, readyJob } from "../seed/scenario.ts";
import { TestClock } from "../support/clock.ts";

const WATCHER: Observer = { kind: "watcher", name: "herdr-1" };
const SESSION = "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa";

describeBackends("review 20: the gate on recorded evidence holds", (backend) => {
  async function ready(env: Record<string, string> = {}, b: SeedBackend = backend()) {
    const clock = new TestClock("2026-11-20T10:10:00.000Z");
    const deps = b.deps(parseFlags({ MAM_AUTO_COMPLETE: "1", ...env }), { clock });
    return { b, deps, clock, job: await readyJob(deps, {}) };
  }

  const see = (deps: Deps, job: ReadyJob, state: ObservedState, observer: Observer = WATCHER, sourceKind = "pane_status") =>
    recordObservation(
      deps,
      job.jobId,
      {
        state,
        source_kind: sourceKind,
        attempt_id: job.attemptId,
        agent_session_uuid: SESSION,
        ...(observer.kind === "watcher" ? { pane_process_generation: 3, pane_id: "%12" } : {}),
        observed_at: deps.clock.now().toISOString(),
      },
      observer,
    );

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
