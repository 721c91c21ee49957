/** Seed section 1: the fail-closed preconditions (x01..x05). */
import { readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { type Actor, policy, registerJob, transitionJob } from "@mam/core";
import { describe, expect, it } from "vitest";
import { describeBackends } from "./harness.ts";
import { loadScenario } from "./scenario.ts";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** Production sources: every .ts file under packages/<pkg>/src and functions/. */
function productionSources(): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const name of readdirSync(dir)) {
      if (name === "node_modules" || name === "dist") continue;
      const full = path.join(dir, name);
      if (statSync(full).isDirectory()) walk(full);
      else if (name.endsWith(".ts")) out.push(full);
    }
  };
  const packages = path.join(REPO_ROOT, "packages");
  for (const pkg of readdirSync(packages)) {
    const src = path.join(packages, pkg, "src");
    if (statSync(path.join(packages, pkg)).isDirectory() && safeIsDir(src)) walk(src);
  }
  const functions = path.join(REPO_ROOT, "functions");
  if (safeIsDir(functions)) walk(functions);
  return out;
}

function safeIsDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}

describe("seed 1: fail-closed preconditions", () => {
  it("B-01 the policy approves the reference scenario and holds (manifest) once every report_manifest is stripped", () => {
    const scenario = loadScenario();
    expect(policy.decide(scenario).decision).toBe("candidate_approved");

    const stripped = loadScenario();
    let removed = 0;
    for (const item of stripped.timeline) {
      if (item.payload && "report_manifest" in item.payload) {
        delete item.payload.report_manifest;
        removed++;
      }
    }
    expect(removed).toBeGreaterThan(0);
    stripped.filesystem.manifest_committed = false;
    const decision = policy.decide(stripped);
    expect(decision.decision).toBe("hold");
    expect(decision.reason).toContain("manifest");
  });

  it("B-02 the literal report-manifest appears in the production sources only in core's finalize module", () => {
    const sources = productionSources();
    const finalize = path.join(REPO_ROOT, "packages", "core", "src", "finalize.ts");
    expect(sources).toContain(finalize);
    const hits = sources.filter((f) => readFileSync(f, "utf8").includes("report-manifest")).map((f) => path.relative(REPO_ROOT, f));
    expect(hits).toEqual([path.join("packages", "core", "src", "finalize.ts")]);
  });

  it("B-04 the policy holds, naming attempt_id, on evidence from a superseded attempt", () => {
    const superseded = loadScenario();
    superseded.dispatch_context.attempt_id = 2; // the evidence still says 1
    const decision = policy.decide(superseded);
    expect(decision.decision).toBe("hold");
    expect(decision.reason).toContain("attempt_id");
  });
});

describeBackends("seed 1: fail-closed preconditions", (backend) => {
  it("B-03 a job record carries iteration, never attempt_id", async () => {
    const deps = backend().deps();
    const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
    const record = await deps.jobs.get(job.job_id);
    expect(record).toBeDefined();
    expect(record).toHaveProperty("iteration");
    expect(record).not.toHaveProperty("attempt_id");
  });

  it("B-05 an explicit running then completed by the agent works and leaves no completed_by marker", async () => {
    const deps = backend().deps();
    const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
    const agent: Actor = { kind: "agent", jobId: job.job_id, attemptId: 1 };
    const running = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: job.transition_seq }, agent);
    expect(running.status).toBe("running");
    await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: running.transition_seq }, agent);
    const record = await deps.jobs.get(job.job_id);
    expect(record?.status).toBe("completed");
    expect(record).not.toHaveProperty("completed_by");
  });
});
