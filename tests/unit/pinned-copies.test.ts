/**
 * The rule for retiring pinned copies, in core (services.ts): what it counts. The
 * outcomes the stores show are tested through the API on every backend
 * (tests/api/pins.suite.ts); here, that each retire is counted, and that a failed
 * one is counted and fails nothing.
 */
import { randomUUID } from "node:crypto";
import {
  attemptReportLocation,
  type Deps,
  finalizeAttemptReport,
  MemoryJobStore,
  MemoryReportStore,
  NO_METRICS,
  type PinnedCopyOutcome,
  parseFlags,
  randomIds,
  recordDispatch,
  registerJob,
  STAGED_REPORT_NAME,
} from "@mam/core";
import { describe, expect, it } from "vitest";
import { tickingClock } from "../support/clock.ts";

function depsWith(reports: MemoryReportStore): { deps: Deps; counted: PinnedCopyOutcome[] } {
  const counted: PinnedCopyOutcome[] = [];
  const deps: Deps = {
    jobs: new MemoryJobStore(),
    reports,
    publisher: { publish: async () => undefined },
    clock: tickingClock("2026-11-20T12:00:00.000Z"),
    ids: randomIds,
    flags: parseFlags({}),
    metrics: { ...NO_METRICS, pinnedCopy: (outcome) => counted.push(outcome) },
  };
  return { deps, counted };
}

async function finalizeTwice(deps: Deps): Promise<{ location: string; shas: string[] }> {
  const job = await registerJob(deps, { prompt: "p", agent: "codex" });
  await recordDispatch(deps, job.job_id, { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 });
  const location = attemptReportLocation(job.job_id, 1);
  const shas: string[] = [];
  for (const text of ["first\n", "second\n"]) {
    await deps.reports.put(location, STAGED_REPORT_NAME, new TextEncoder().encode(text));
    shas.push((await finalizeAttemptReport(deps, job.job_id, 1, [])).manifest.sha256);
  }
  return { location, shas };
}

describe("retiring pinned copies nothing references", () => {
  it("a superseded copy is retired and counted once", async () => {
    const { deps, counted } = depsWith(new MemoryReportStore());
    const { location, shas } = await finalizeTwice(deps);
    expect(counted).toEqual(["retired"]);
    expect(await deps.reports.exists(`${location}/evidence`, shas[0] as string)).toBe(false);
    expect(await deps.reports.exists(`${location}/evidence`, shas[1] as string)).toBe(true);
  });

  it("a retire that fails is counted, and the finalize stands", async () => {
    class RefusingRetire extends MemoryReportStore {
      override async retire(): Promise<void> {
        throw new Error("the store refused to retire");
      }
    }
    const { deps, counted } = depsWith(new RefusingRetire());
    const { location, shas } = await finalizeTwice(deps);
    expect(counted).toEqual(["retire_failed"]);
    expect(await deps.reports.exists(`${location}/evidence`, shas[0] as string)).toBe(true);
  });
});
