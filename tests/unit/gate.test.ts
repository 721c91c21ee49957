/**
 * Gate rules beyond the seed's cases. The evidence's backend decides which
 * quiescence evidence (states, settle window) the policy applies, so it must be the
 * job's own backend: a scenario may not borrow another backend's evidence.
 */
import { evaluateGate, parseFlags } from "@mam/core";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BACKENDS, type SeedBackend } from "../seed/harness.ts";
import { readyJob, type ScenarioDoc } from "../seed/scenario.ts";

const ON = parseFlags({ MAM_AUTO_COMPLETE: "1" });

/** Rename the backend everywhere the scenario names it, consistently. */
function claimBackend(scenario: ScenarioDoc, backend: string): void {
  scenario.dispatch_context.backend = backend;
  for (const o of scenario.timeline) if (o.collector_attribution) o.collector_attribution.backend = backend;
}

/** Keep the quiescent run at 10:05:30 and 10:06:00 only: 30 s of stillness. */
function thirtySecondsQuiet(scenario: ScenarioDoc): void {
  const last = scenario.timeline.pop();
  expect(last?.payload?.agent_status).toBe("idle");
}

describe("the evidence's backend is the job's backend", () => {
  let backend: SeedBackend;
  beforeEach(async () => {
    backend = await BACKENDS[0]!.make();
  });
  afterEach(async () => {
    await backend.close();
  });

  it("controls: 30 s of stillness completes a claude-code job (30 s window) but not a grok job on grok evidence (45 s)", async () => {
    const deps = backend.deps(ON);
    const claude = await readyJob(deps, { backend: "claude-code" });
    thirtySecondsQuiet(claude.scenario);
    const ok = await evaluateGate(deps, { jobId: claude.jobId, scenario: claude.scenario, reportLocation: claude.reportLocation });
    expect(ok.committed, ok.reason).toBe(true);

    const grok = await readyJob(deps, { backend: "grok" });
    thirtySecondsQuiet(grok.scenario);
    const held = await evaluateGate(deps, { jobId: grok.jobId, scenario: grok.scenario, reportLocation: grok.reportLocation });
    expect(held.committed).toBe(false);
    expect(held.reason).toContain("settle window");
  });

  it.each([
    { job: "grok", evidence: "claude-code", why: "a shorter settle window (30 s instead of 45 s)" },
    { job: "claude-code", evidence: "hermes", why: "a backend with no quiescence evidence at all" },
  ])("a $job job is not completed on evidence that claims to be $evidence ($why)", async ({ job, evidence }) => {
    const deps = backend.deps(ON);
    const r = await readyJob(deps, { backend: job });
    claimBackend(r.scenario, evidence);
    thirtySecondsQuiet(r.scenario);
    const result = await evaluateGate(deps, { jobId: r.jobId, scenario: r.scenario, reportLocation: r.reportLocation });
    expect(result.committed, result.reason).toBe(false);
    expect(result.reason).toContain("backend");
    expect((await deps.jobs.get(r.jobId))?.status).toBe("running");
  });
});
