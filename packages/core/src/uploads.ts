import type { Actor, Using } from "./deps.ts";
import { MamError } from "./errors.ts";
import { noteOf } from "./feed.ts";
import { STAGED_REPORT_NAME, UPLOAD_DECLARATION_NAME, type UploadDeclaration } from "./finalize.ts";
import { releaseLease, takeLease } from "./leases.ts";
import type { JobRecords, UploadTarget } from "./ports.ts";
import { chargeAgentUsage } from "./quotas.ts";
import { writableAttempt } from "./services.ts";

/** What an uploader declares of the report it will send: checked against the bytes that arrive. */
export interface ReportUploadRequest {
  /** SHA-256 of the report, 64 lowercase hex digits. */
  readonly sha256: string;
  readonly bytes: number;
}

export interface ReportUploadPolicy {
  /** The largest report a declaration may announce (MAM_REPORT_UPLOAD_LIMIT). */
  readonly maxBytes: number;
  /** How long an issued address is good (MAM_REPORT_UPLOAD_TTL_SECONDS). */
  readonly expiresInSeconds: number;
}

export interface IssuedReportUpload {
  readonly declaration: UploadDeclaration;
  /** The staged name the bytes go to, as the store describes it. */
  readonly staged: string;
  /** The store's own address for the bytes (S3: a presigned PUT); absent where uploads come through the service's report route. */
  readonly target?: UploadTarget;
}

const SHA256_HEX = /^[0-9a-f]{64}$/;

/**
 * Issue an upload of an attempt's report around the API's body limit. In order:
 *
 *   refuse early (terminal, not the latest attempt, too large)
 *   -> take the upload lease        the attempt's one upload in flight (issue 17), held
 *                                   until a PUT through the route stages the declared
 *                                   bytes, a finalize takes them, or the TTL passes;
 *                                   held by another: 409 report.uploadInFlight, nothing
 *                                   written; released again if anything below fails
 *   -> charge the quota
 *   -> recordEvidence {attempt}     one conditional write: not terminal, still the
 *                                   latest attempt; bumps evidence_seq; the feed's
 *                                   report.upload_declared, by `actor`
 *   -> put report-upload.json       the declaration, beside the staged name it binds
 *   -> the store's address          for report-final.md.tmp only (S3: presigned PUT)
 *
 * Nothing is issued for a retired attempt or a terminal job: the write refuses it,
 * and a refusal writes nothing. What an address lets through is never evidence: it
 * reaches only the staged name, and a finalize hashes what arrived, checks it against
 * the declaration, and pins a content-addressed copy before anything refers to it. An
 * address still good after its job ended reaches a staged name nothing reads any more.
 */
export async function requestReportUpload(
  deps: Using<Pick<JobRecords, "get" | "recordEvidence" | "chargeUsage" | "holdLease">, "reports" | "clock" | "flags" | "ids" | "disk">,
  jobId: string,
  attemptId: number,
  request: ReportUploadRequest,
  policy: ReportUploadPolicy,
  /** Who declares the upload, for the change feed (the service itself when absent); an agent's declaration reserves its bytes against the job's quotas. */
  actor?: Actor,
): Promise<IssuedReportUpload> {
  if (!SHA256_HEX.test(request.sha256)) {
    throw new MamError("input.invalid", "sha256 is 64 lowercase hex digits", {
      issues: [{ path: "sha256", message: "64 lowercase hex digits" }],
    });
  }
  if (!Number.isSafeInteger(request.bytes) || request.bytes < 0) {
    throw new MamError("input.invalid", "bytes is a byte count", { issues: [{ path: "bytes", message: "a non-negative integer" }] });
  }
  if (request.bytes > policy.maxBytes) {
    throw new MamError(
      "input.invalid",
      `the report declared is ${request.bytes} bytes; an upload takes at most ${policy.maxBytes} (MAM_REPORT_UPLOAD_LIMIT)`,
      { issues: [{ path: "bytes", message: `at most ${policy.maxBytes}` }], details: { limit: policy.maxBytes } },
    );
  }
  const location = await writableAttempt(deps, jobId, attemptId);
  const lease = await takeLease(deps, jobId, { kind: "upload", attemptId, seconds: policy.expiresInSeconds, declared: true, actor });
  try {
    await chargeAgentUsage(deps, jobId, actor, { events: 0, bytes: request.bytes });
    await deps.jobs.recordEvidence(jobId, {
      guard: { attempt: attemptId },
      note: noteOf(actor, { declared: { sha256: request.sha256, bytes: request.bytes } }),
      activity: { at: deps.clock.now().toISOString() },
    });
    // The address is good exactly as long as the lease holds the attempt for it.
    const declaration: UploadDeclaration = {
      schema: "mam.upload/v1",
      job_id: jobId,
      attempt_id: attemptId,
      sha256: request.sha256,
      bytes: request.bytes,
      issued_at: lease.since,
      expires_at: lease.expires_at,
    };
    await deps.reports.put(location, UPLOAD_DECLARATION_NAME, new TextEncoder().encode(`${JSON.stringify(declaration, null, 2)}\n`));
    const staged = deps.reports.describe(location, STAGED_REPORT_NAME);
    if (deps.reports.uploadUrl === undefined) return { declaration, staged };
    const target = await deps.reports.uploadUrl(location, STAGED_REPORT_NAME, {
      sha256: request.sha256,
      bytes: request.bytes,
      expiresInSeconds: policy.expiresInSeconds,
    });
    return { declaration, staged, target };
  } catch (e) {
    await releaseLease(deps, jobId, "upload", lease);
    throw e;
  }
}
