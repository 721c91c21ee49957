import type { ErrorCode } from "@mam/core";

/**
 * The CLI's one map from core's closed set of error codes to an exit code (DESIGN,
 * "The `mam` command"): 1 bad input or a refusal — nothing finalized, committed or
 * published; 2 the broker, the store or the service could not be reached — what was
 * committed stays, and the notification stays owed for the sweep. Total by its type:
 * a code added in core does not compile until it is mapped here.
 */
export const EXIT_CODES = {
  "input.invalid": 1,
  "input.jobId": 1,
  "input.sideEffect": 1,
  "input.tooLarge": 1,
  "input.unsupportedMediaType": 1,
  "job.notFound": 1,
  "job.exists": 1,
  "job.transitionConflict": 1,
  "job.transitionRefused": 1,
  "job.evidenceConflict": 1,
  "job.evidenceMissing": 1,
  "job.preconditionFailed": 1,
  "job.fieldNotAllowed": 1,
  "job.actionForbidden": 1,
  "bookkeeping.fieldRefused": 1,
  "dispatch.exists": 1,
  "dispatch.outOfOrder": 1,
  "dispatch.notFound": 1,
  "observation.mismatch": 1,
  "report.notFound": 1,
  "report.frozen": 1,
  "report.notLatest": 1,
  "report.changed": 1,
  "report.location": 1,
  "report.mismatch": 1,
  "quota.bytes": 1,
  "quota.events": 1,
  "quota.observations": 1,
  // Another upload or finalize of the attempt holds it: a refusal, nothing was written
  // (try again once it ends or expires, as its message says). Not 2: nothing is
  // unreachable, and no commit stands.
  "report.uploadInFlight": 1,
  "report.finalizeInProgress": 1,
  "auth.missing": 1,
  "auth.invalid": 1,
  "auth.forbidden": 1,
  "publish.unreachable": 2,
  "publish.refused": 2,
  "publish.tooLarge": 2,
  "store.unavailable": 2,
  // The engine refused the statement as built (a limit of D1's, say): nothing was
  // written, and retrying does not help. Not 2: the store was reached.
  "store.unsupported": 1,
  "store.insufficientSpace": 2,
  "service.unreachable": 2,
  "stream.tooMany": 2,
  "rate.limited": 2,
  "config.invalid": 1,
  // A store older than the code (run `mam migrate`) or newer (run the newer mam): nothing was written.
  "store.version": 1,
  internal: 1,
} as const satisfies Record<ErrorCode, 1 | 2>;

/** A run that printed its answer: 0. */
export const EXIT_OK = 0;
/** Bad usage (unknown command or option) or a refusal. */
export const EXIT_REFUSED = 1;
/** The commit stands but the broker could not be reached (a failed publish answered `published: false`). */
export const EXIT_UNREACHABLE = 2;
