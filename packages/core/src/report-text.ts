import type { Using } from "./deps.ts";
import { getJob } from "./engine.ts";
import { MamError } from "./errors.ts";
import { attemptReportLocation, REPORT_NAME, STAGED_REPORT_NAME } from "./finalize.ts";
import type { JobRecords } from "./ports.ts";

/** The most of a report the API serves as text; beyond it, a notice (and, where the store has one, an address for the whole). */
export const REPORT_TEXT_MAX_BYTES = 1024 * 1024;
/** How long an address for the whole report is good. */
export const REPORT_DOWNLOAD_SECONDS = 300;

/** An attempt's report as a reader gets it: its first bytes, whether there is more, which file, where the whole is. */
export interface ReportText {
  /** The report's first bytes, cut at a character boundary at most `REPORT_TEXT_MAX_BYTES` in. */
  readonly bytes: Uint8Array;
  readonly truncated: boolean;
  /** `finalized`: report-final.md; `staged`: only report-final.md.tmp exists (not finalized yet). */
  readonly state: "finalized" | "staged";
  /** Where the whole report can be fetched, when the store can say (S3: presigned). */
  readonly download?: { readonly url: string; readonly expiresAt: string };
}

/**
 * An attempt's report, to read (the dashboard's "readable as text"): the finalized
 * report, else the staged one, of a recorded attempt — never a location a caller
 * names. Reads at most `maxBytes` (and stops the stream there). `job.notFound`,
 * `dispatch.notFound` (no such attempt), `report.notFound` (nothing stored yet).
 */
export async function readReportText(
  deps: Using<Pick<JobRecords, "get">, "reports">,
  jobId: string,
  attemptId: number,
  maxBytes = REPORT_TEXT_MAX_BYTES,
): Promise<ReportText> {
  const job = await getJob(deps, jobId);
  if (job.latest_attempt === undefined || attemptId > job.latest_attempt) {
    throw new MamError("dispatch.notFound", `job ${jobId} has no recorded dispatch for attempt ${attemptId}`);
  }
  const location = attemptReportLocation(jobId, attemptId);
  // The finalized report, else the staged one, else the finalized one again: a finalize
  // that lands between the first two reads promotes the staged report and deletes it.
  let state: ReportText["state"] = "finalized";
  let stream = await deps.reports.read(location, REPORT_NAME);
  if (stream === undefined) {
    state = "staged";
    stream = await deps.reports.read(location, STAGED_REPORT_NAME);
  }
  if (stream === undefined) {
    state = "finalized";
    stream = await deps.reports.read(location, REPORT_NAME);
  }
  if (stream === undefined) throw new MamError("report.notFound", `attempt ${attemptId} of job ${jobId} has no report stored yet`);
  const name = state === "finalized" ? REPORT_NAME : STAGED_REPORT_NAME;
  const chunks: Uint8Array[] = [];
  let held = 0;
  let truncated = false;
  for await (const chunk of stream) {
    const room = maxBytes - held;
    if (chunk.byteLength > room) {
      chunks.push(chunk.subarray(0, room));
      held += room;
      truncated = true;
      break;
    }
    chunks.push(chunk);
    held += chunk.byteLength;
  }
  const bytes = new Uint8Array(held);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.byteLength;
  }
  const cut = truncated ? bytes.subarray(0, characterBoundary(bytes)) : bytes;
  const whole = truncated ? await deps.reports.downloadUrl?.(location, name, REPORT_DOWNLOAD_SECONDS) : undefined;
  return {
    bytes: cut,
    truncated,
    state,
    ...(whole === undefined ? {} : { download: { url: whole.url, expiresAt: whole.expiresAt.toISOString() } }),
  };
}

/** The length of `bytes` without a UTF-8 sequence its end cut in two. */
function characterBoundary(bytes: Uint8Array): number {
  const i = bytes.length;
  // Step back over continuation bytes (10xxxxxx) to the start of the last sequence.
  let back = 0;
  while (i - back - 1 >= 0 && back < 4 && ((bytes[i - back - 1] as number) & 0xc0) === 0x80) back++;
  const lead = bytes[i - back - 1];
  if (lead === undefined || lead < 0xc0) return i;
  const need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
  return back + 1 < need ? i - back - 1 : i;
}
