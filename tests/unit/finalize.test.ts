/** finalizeReport's input errors are the closed set's, never a raw validation exception. */
import { finalizeReport, isMamError, MemoryReportStore, REPORT_NAME, STAGED_REPORT_NAME } from "@mam/core";
import { beforeEach, describe, expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import { rejection } from "../support/rejection.ts";

const clock = new TestClock("2026-11-20T12:00:00Z");
const LOCATION = "reports/job1/1";
let reports: MemoryReportStore;

beforeEach(async () => {
  reports = new MemoryReportStore();
  await reports.put(LOCATION, STAGED_REPORT_NAME, new TextEncoder().encode("report\n"));
});

describe("finalizeReport input", () => {
  it.each([
    { case: "a malformed job id", jobId: "../escape", attemptId: 1, code: "input." },
    { case: "attempt 0", jobId: "job1", attemptId: 0, code: "input." },
    { case: "a fractional attempt", jobId: "job1", attemptId: 1.5, code: "input." },
  ])("$case is refused as a MamError of the input family, and nothing is promoted", async ({ jobId, attemptId, code }) => {
    const thrown = await rejection(finalizeReport(reports, clock, { location: LOCATION, jobId, attemptId, sideEffects: [] }));
    expect(isMamError(thrown, code), `a ${(thrown as Error)?.constructor?.name}, not a MamError of ${code}`).toBe(true);
    expect(await reports.exists(LOCATION, STAGED_REPORT_NAME)).toBe(true);
    expect(await reports.exists(LOCATION, REPORT_NAME)).toBe(false);
  });

  it("a well-formed call promotes and writes the manifest (control)", async () => {
    const { manifest } = await finalizeReport(reports, clock, { location: LOCATION, jobId: "job1", attemptId: 1, sideEffects: [] });
    expect(manifest).toMatchObject({ job_id: "job1", attempt_id: 1, bytes: 7 });
    expect(await reports.exists(LOCATION, REPORT_NAME)).toBe(true);
  });
});
