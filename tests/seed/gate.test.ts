/** Seed section 3: the auto-completion gate, and everything that must stop it. */
import {
  type Actor,
  type Deps,
  type EvaluateInput,
  evaluateGate,
  finalizeAttemptReport,
  finalizeReport,
  type GateDeps,
  OPERATOR,
  parseFlags,
  REPORT_NAME,
  transitionJob,
} from "@mam/core";
import { describe, expect, it } from "vitest";
import { describeBackends, type SeedBackend } from "./harness.ts";
import { type ReadyJob, type ReadyJobOptions, readyJob, utf8 } from "./scenario.ts";

/** MAM_AUTO_COMPLETE=1, everything else as the product default. */
const ON = parseFlags({ MAM_AUTO_COMPLETE: "1" });

const evaluate = (deps: GateDeps, ready: ReadyJob, over: Partial<EvaluateInput> = {}) =>
  evaluateGate(deps, { jobId: ready.jobId, scenario: ready.scenario, reportLocation: ready.reportLocation, ...over });

async function status(deps: Deps, jobId: string): Promise<string | undefined> {
  return (await deps.jobs.get(jobId))?.status;
}

describe("seed 3: flags", () => {
  it("B-20 MAM_AUTO_COMPLETE_BACKENDS narrows the evidence-backed allowlist but never widens it", () => {
    expect(parseFlags({ MAM_AUTO_COMPLETE_BACKENDS: "claude" }).allowedBackends).toEqual(["claude"]);
    expect(parseFlags({ MAM_AUTO_COMPLETE_BACKENDS: "claude,hermes,opencode" }).allowedBackends).toEqual(["claude"]);
  });
});

describeBackends("seed 3: the gate", (backend) => {
  /** A ready job built with the flag on, and the deps to evaluate it with. */
  async function ready(opts: ReadyJobOptions = {}, b: SeedBackend = backend()) {
    const deps = b.deps(ON);
    return { deps, ready: await readyJob(deps, opts) };
  }

  it("B-17 the gate commits when every condition holds: completed, completed_by auto_complete, a completed intent", async () => {
    const { deps, ready: r } = await ready();
    const result = await evaluate(deps, r);
    expect(result.committed, result.reason).toBe(true);
    const record = await deps.jobs.get(r.jobId);
    expect(record?.status).toBe("completed");
    expect(record?.completed_by).toBe("auto_complete");
    expect(record?.pending_notification?.event).toBe("completed");
    expect(record?.pending_notification?.seq).toBe(record?.transition_seq);
    expect(record?.completed_evidence?.attempt_id).toBe(r.attemptId);
  });

  it("B-18 auto-completion is off by default: MAM_AUTO_COMPLETE unset refuses (disabled) and the store is unchanged", async () => {
    const b = backend();
    const { ready: r } = await ready({}, b);
    const before = await b.fingerprint();
    const result = await evaluate(b.deps(parseFlags({})), r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("disabled");
    expect(await b.fingerprint()).toBe(before);
    // the same job, the flag on: it commits, and the fingerprint sees that write
    expect((await evaluate(b.deps(ON), r)).committed).toBe(true);
    expect(await b.fingerprint()).not.toBe(before);
  });

  it.each(["agy", "hermes", "opencode", "unknown-agent"])(
    "B-19 a backend without quiescent-state evidence (%s) is refused and stays running",
    async (agent) => {
      const { deps, ready: r } = await ready({ backend: agent });
      const result = await evaluate(deps, r);
      expect(result.committed).toBe(false);
      expect(result.reason).toContain("quiescent-state evidence");
      expect(await status(deps, r.jobId)).toBe("running");
    },
  );

  it("B-21 a job that did not opt in is refused (opt in)", async () => {
    const { deps, ready: r } = await ready({ optIn: false });
    const result = await evaluate(deps, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("opt in");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it("B-22 a report rewritten after finalization stops the gate (changed after finalization)", async () => {
    const { deps, ready: r } = await ready();
    await deps.reports.put(r.reportLocation, REPORT_NAME, utf8("rewritten after finalization\n"));
    const result = await evaluate(deps, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("changed after finalization");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it("B-23 a job expecting git_push whose manifest was re-declared without it is refused, naming git_push", async () => {
    const { deps, ready: r } = await ready({ artifacts: ["git_push"] });
    await finalizeReport(deps.reports, deps.clock, { location: r.reportLocation, jobId: r.jobId, attemptId: 1, sideEffects: [] });
    const result = await evaluate(deps, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("git_push");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it("B-24 a policy that throws is a hold (policy error), never a completion", async () => {
    const { deps, ready: r } = await ready();
    const exploding: GateDeps = {
      ...deps,
      decide: () => {
        throw new Error("evidence is contradictory");
      },
    };
    const result = await evaluate(exploding, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("policy error");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it("B-25 a late explicit terminal beats the gate: the record stays error, with no completed_by", async () => {
    const { deps, ready: r } = await ready();
    const current = await deps.jobs.get(r.jobId);
    const agent: Actor = { kind: "agent", jobId: r.jobId, attemptId: r.attemptId };
    await transitionJob(deps, r.jobId, { action: "error", expectedSeq: current?.transition_seq }, agent);
    const result = await evaluate(deps, r);
    expect(result.committed).toBe(false);
    const record = await deps.jobs.get(r.jobId);
    expect(record?.status).toBe("error");
    expect(record).not.toHaveProperty("completed_by");
  });

  it("B-26 no report location given: refused (independently verify), and nothing is written", async () => {
    const b = backend();
    const { deps, ready: r } = await ready({}, b);
    const before = await b.fingerprint();
    const result = await evaluateGate(deps, { jobId: r.jobId, scenario: r.scenario });
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("independently verify");
    expect(await b.fingerprint()).toBe(before);
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it.each([
    { case: "the empty string", location: () => "" },
    { case: "a location holding nothing", location: (r: ReadyJob) => `${r.reportLocation}-empty` },
  ])("B-27 an empty report location ($case) is refused (no completion manifest)", async ({ location }) => {
    const { deps, ready: r } = await ready();
    const result = await evaluate(deps, r, { reportLocation: location(r) });
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("no completion manifest");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it("B-28 evidence whose dispatch context names another job cannot complete this one (not ... match)", async () => {
    const { deps, ready: r } = await ready();
    r.scenario.dispatch_context.job_id = "some-other-job";
    const result = await evaluate(deps, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("not");
    expect(result.reason).toContain("match");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  /** Another dispatch's values, of the right types, so only the binding to the recorded dispatch can tell. */
  const OTHER_DISPATCH: Record<string, unknown> = {
    attempt_id: 2,
    agent_session_uuid: "0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b",
    pane_process_generation: 4,
  };

  it.each(
    ["attempt_id", "agent_session_uuid", "pane_process_generation"].flatMap((field) => [
      { field, how: "in the context alone", everywhere: false, value: "not-what-was-dispatched" },
      { field, how: "consistently, as another dispatch's evidence", everywhere: true, value: OTHER_DISPATCH[field] },
    ]),
  )(
    "B-29 evidence must match the recorded dispatch on $field ($how); the refusal names the field",
    async ({ field, everywhere, value }) => {
      const { deps, ready: r } = await ready();
      (r.scenario.dispatch_context as Record<string, unknown>)[field] = value;
      if (everywhere) for (const o of r.scenario.timeline) if (o.collector_attribution) o.collector_attribution[field] = value;
      const result = await evaluate(deps, r);
      expect(result.committed).toBe(false);
      expect(result.reason).toContain(field);
      expect(await status(deps, r.jobId)).toBe("running");
    },
  );

  it("B-30 a job with no recorded dispatch is refused (no recorded dispatch)", async () => {
    const { deps, ready: r } = await ready({ dispatch: false });
    const result = await evaluate(deps, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("no recorded dispatch");
    expect(await status(deps, r.jobId)).toBe("running");
  });

  it("B-31 MAM_ENGINE_CAS=0 also disables auto-completion (rolled back); the job stays running", async () => {
    const b = backend();
    const { ready: r } = await ready({}, b);
    const rolledBack = b.deps(parseFlags({ MAM_AUTO_COMPLETE: "1", MAM_ENGINE_CAS: "0" }));
    const result = await evaluate(rolledBack, r);
    expect(result.committed).toBe(false);
    expect(result.reason).toContain("rolled back");
    expect(await status(rolledBack, r.jobId)).toBe("running");
  });

  it.each(["claude-experimental", "codexish", "grok2"])(
    "B-32 backend keys match exactly, never by prefix: %s is refused (quiescent-state evidence)",
    async (agent) => {
      const { deps, ready: r } = await ready({ backend: agent });
      const result = await evaluate(deps, r);
      expect(result.committed).toBe(false);
      expect(result.reason).toContain("quiescent-state evidence");
      expect(await status(deps, r.jobId)).toBe("running");
    },
  );

  it("B-33 a Reviewer needs a verdict token: refused without one; after the report gains it and is finalized again, committed", async () => {
    const { deps, ready: r } = await ready({ body: "a thorough review with no verdict line\n" });
    const current = await deps.jobs.get(r.jobId);
    await transitionJob(
      deps,
      r.jobId,
      { action: "progress", expectedSeq: current?.transition_seq, fields: { role: "Reviewer" } },
      OPERATOR,
    );

    const refused = await evaluate(deps, r);
    expect(refused.committed).toBe(false);
    expect(refused.reason).toContain("verdict token");
    expect(await status(deps, r.jobId)).toBe("running");

    // writing the verdict requires a fresh finalization, and then it passes
    await deps.reports.put(r.reportLocation, REPORT_NAME, utf8("a thorough review\n\n[VERDICT: PASS]\n"));
    await finalizeAttemptReport(deps, r.jobId, r.attemptId, []);
    const ok = await evaluate(deps, r);
    expect(ok.committed, ok.reason).toBe(true);
    expect(await status(deps, r.jobId)).toBe("completed");
  });

  it("B-34 a Worker (the default role) needs no verdict token", async () => {
    const { deps, ready: r } = await ready({ body: "worker output, no verdict\n" });
    expect((await deps.jobs.get(r.jobId))?.role).toBe("Worker");
    const result = await evaluate(deps, r);
    expect(result.committed, result.reason).toBe(true);
  });
});
