/**
 * readReportText (packages/core/src/report-text.ts) without a service: which file it
 * reads when a finalize runs under it, and where it cuts a long report.
 */
import { attemptReportLocation, MemoryReportStore, REPORT_NAME, type ReportText, readReportText, STAGED_REPORT_NAME } from "@mam/core";
import { describe, expect, it } from "vitest";

const JOB = "fix-flaky";
const jobs = { get: async (id: string) => (id === JOB ? ({ job_id: JOB, latest_attempt: 1 } as never) : undefined) };
const utf8 = (s: string) => new TextEncoder().encode(s);
const text = (r: ReportText) => new TextDecoder().decode(r.bytes);

describe("readReportText", () => {
  it("a finalize between its look for report-final.md and its read of the staged report serves the finalized one (it answered report.notFound)", async () => {
    const location = attemptReportLocation(JOB, 1);
    // The finalize lands just after the reader found no report-final.md: it promotes the staged report and deletes it.
    class FinalizedMeanwhile extends MemoryReportStore {
      #landed = false;
      override async exists(l: string, name: string): Promise<boolean> {
        const there = await super.exists(l, name);
        if (name === REPORT_NAME && !there) await this.#finalize(l);
        return there;
      }
      override async read(l: string, name: string): Promise<AsyncIterable<Uint8Array> | undefined> {
        const stream = await super.read(l, name);
        if (name === REPORT_NAME && stream === undefined) await this.#finalize(l);
        return stream;
      }
      async #finalize(l: string): Promise<void> {
        if (this.#landed) return;
        this.#landed = true;
        await this.put(l, REPORT_NAME, utf8("the report"));
        await this.delete(l, STAGED_REPORT_NAME);
      }
    }
    const reports = new FinalizedMeanwhile();
    await reports.put(location, STAGED_REPORT_NAME, utf8("the report"));
    const r = await readReportText({ jobs, reports }, JOB, 1);
    expect(text(r)).toBe("the report");
    expect(r.state).toBe("finalized");
  });
});
