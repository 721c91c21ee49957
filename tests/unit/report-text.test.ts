/**
 * readReportText (packages/core/src/report-text.ts) without a service: which file it
 * reads when a finalize runs under it, and where it cuts a long report.
 */
import { attemptReportLocation, MemoryReportStore, REPORT_NAME, type ReportText, readReportText, STAGED_REPORT_NAME } from "@mam/core";
import fc from "fast-check";
import { describe, expect, it } from "vitest";

const JOB = "fix-flaky";
const jobs = { get: async (id: string) => (id === JOB ? ({ job_id: JOB, latest_attempt: 1 } as never) : undefined) };
const utf8 = (s: string) => new TextEncoder().encode(s);
const text = (r: ReportText) => new TextDecoder().decode(r.bytes);

/** The length of the well-formed UTF-8 multi-byte sequence starting at `k` (RFC 3629's table), 0 when none does. */
function sequenceAt(b: Uint8Array, k: number): number {
  const x = b[k] as number;
  const [n, lo, hi] =
    x >= 0xc2 && x <= 0xdf
      ? [2, 0x80, 0xbf]
      : x === 0xe0
        ? [3, 0xa0, 0xbf]
        : x === 0xed
          ? [3, 0x80, 0x9f]
          : x >= 0xe1 && x <= 0xef
            ? [3, 0x80, 0xbf]
            : x === 0xf0
              ? [4, 0x90, 0xbf]
              : x === 0xf4
                ? [4, 0x80, 0x8f]
                : x >= 0xf1 && x <= 0xf3
                  ? [4, 0x80, 0xbf]
                  : [0, 0, 0];
  if (n === 0 || k + n > b.length) return 0;
  const second = b[k + 1] as number;
  if (second < lo || second > hi) return 0;
  for (let i = 2; i < n; i++) if (((b[k + i] as number) & 0xc0) !== 0x80) return 0;
  return n;
}

/** Bytes of text and of noise, mixed, cut into chunks as a stream hands them out. */
const reportBytes = fc
  .array(fc.oneof(fc.string({ unit: "binary", maxLength: 12 }).map(utf8), fc.uint8Array({ maxLength: 6 })), { maxLength: 8 })
  .map((parts) => Uint8Array.from(parts.flatMap((p) => [...p])));

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

  it("a long report's head is a prefix of it, at most maxBytes, at most 3 bytes short of it, and never ends inside a well-formed character", async () => {
    await fc.assert(
      fc.asyncProperty(reportBytes, fc.integer({ min: 1, max: 40 }), fc.integer({ min: 1, max: 7 }), async (report, maxBytes, chunk) => {
        const reports = new (class extends MemoryReportStore {
          override async read(): Promise<AsyncIterable<Uint8Array>> {
            return (async function* () {
              for (let at = 0; at < report.length; at += chunk) yield report.slice(at, at + chunk);
            })();
          }
        })();
        const r = await readReportText({ jobs, reports }, JOB, 1, maxBytes);
        expect(r.truncated).toBe(report.length > maxBytes);
        expect([...r.bytes]).toEqual([...report.subarray(0, r.bytes.length)]);
        if (!r.truncated) {
          expect(r.bytes.length).toBe(report.length);
          return;
        }
        expect(r.bytes.length).toBeLessThanOrEqual(maxBytes);
        expect(r.bytes.length).toBeGreaterThanOrEqual(maxBytes - 3);
        const cut = r.bytes.length;
        for (let k = Math.max(0, cut - 3); k < cut; k++)
          expect(k + sequenceAt(report, k) <= cut, `a character at ${k} cut at ${cut}`).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });
});
