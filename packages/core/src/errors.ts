/**
 * The closed set of error codes. Each is mapped once, here, to a title, a problem
 * `type` and whether retrying may help; the HTTP API maps each once to a status
 * (packages/api), the CLI each once to an exit code (packages/cli). Codes are dotted (`job.transitionConflict`) so callers
 * can match a family by prefix.
 */
export const ERROR_TABLE = {
  "input.invalid": { retryable: false, title: "The request is not valid" },
  "input.jobId": { retryable: false, title: "Not a valid job id" },
  "input.sideEffect": { retryable: false, title: "A side effect is malformed" },
  "input.tooLarge": { retryable: false, title: "The body is too large" },
  "input.unsupportedMediaType": { retryable: false, title: "Unsupported media type" },
  "job.notFound": { retryable: false, title: "No such job" },
  "job.exists": { retryable: false, title: "The job already exists" },
  "job.transitionConflict": { retryable: false, title: "The job moved on: stale transition_seq" },
  "job.transitionRefused": { retryable: false, title: "The job's status does not allow this transition" },
  "job.evidenceConflict": {
    retryable: false,
    title: "The job's evidence moved on: another report write, finalize or dispatch landed first",
  },
  "job.evidenceMissing": { retryable: false, title: "The job expects evidence that is not there" },
  "job.preconditionFailed": { retryable: false, title: "If-Match does not match the job's transition_seq" },
  "job.fieldNotAllowed": { retryable: false, title: "This actor may not write that field" },
  "job.actionForbidden": { retryable: false, title: "This actor may not take that action" },
  "bookkeeping.fieldRefused": { retryable: false, title: "Bookkeeping may only write pending_notification" },
  "dispatch.exists": { retryable: false, title: "That attempt was already dispatched" },
  "dispatch.outOfOrder": {
    retryable: false,
    title: "The attempt is not greater than the job's latest dispatched attempt",
  },
  "dispatch.notFound": { retryable: false, title: "No such dispatch" },
  "observation.mismatch": { retryable: false, title: "The observation does not match the job's latest recorded dispatch" },
  "report.notFound": { retryable: false, title: "No report to finalize" },
  "report.frozen": { retryable: false, title: "The job is terminal; its report tree is frozen" },
  "report.notLatest": { retryable: false, title: "Reports are accepted only for the job's latest attempt" },
  "report.changed": { retryable: false, title: "The report changed while it was being pinned" },
  "report.location": { retryable: false, title: "Not a valid report location" },
  "report.mismatch": { retryable: false, title: "The uploaded report is not the one its upload declared" },
  "quota.bytes": { retryable: false, title: "The job's or the attempt's byte quota would be exceeded" },
  "quota.events": { retryable: false, title: "The job's event quota is spent" },
  "quota.observations": { retryable: false, title: "The source class's observation bound for this attempt is reached" },
  "report.uploadInFlight": { retryable: false, title: "Another upload of this attempt's report is in flight" },
  "report.finalizeInProgress": { retryable: false, title: "Another finalize of this attempt's report is in progress" },
  "auth.missing": { retryable: false, title: "A bearer token is required" },
  "auth.invalid": { retryable: false, title: "The token is not valid" },
  "auth.forbidden": { retryable: false, title: "The token does not grant this" },
  "publish.unreachable": { retryable: true, title: "The broker could not be reached" },
  "publish.refused": { retryable: true, title: "The broker refused the publish" },
  "publish.tooLarge": { retryable: false, title: "The notification payload is too large for the broker" },
  "store.unavailable": { retryable: true, title: "The store could not be reached or throttled the request" },
  "store.unsupported": { retryable: false, title: "The store's engine cannot run this write or read as built" },
  "store.insufficientSpace": {
    retryable: true,
    title: "The store's disk is below the floor kept for the service's own records",
  },
  "service.unreachable": { retryable: true, title: "The mam service could not be reached" },
  "stream.tooMany": { retryable: true, title: "This token already holds as many open streams as it may" },
  "rate.limited": { retryable: true, title: "This read token sent more requests than its rate allows" },
  "config.invalid": { retryable: false, title: "The configuration is not valid" },
  "store.version": { retryable: false, title: "The store's schema version is not the one this code runs on" },
  internal: { retryable: false, title: "Internal error" },
} as const satisfies Record<string, { retryable: boolean; title: string }>;

export type ErrorCode = keyof typeof ERROR_TABLE;

export interface FieldIssue {
  /** Dotted path of the bad field, e.g. `body.fields.role`. */
  readonly path: string;
  readonly message: string;
}

export class MamError extends Error {
  override readonly name = "MamError";
  readonly code: ErrorCode;
  /** Bad fields, for validation errors. */
  readonly issues: readonly FieldIssue[];
  /** Extra data a caller may show, e.g. `current` (the record a stale writer lost to). */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(
    code: ErrorCode,
    message: string,
    opts: { issues?: readonly FieldIssue[]; details?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.issues = opts.issues ?? [];
    this.details = opts.details ?? {};
  }

  get retryable(): boolean {
    return ERROR_TABLE[this.code].retryable;
  }
}

/** `isMamError(e, "job.")` matches every code of the `job` family. */
export function isMamError(e: unknown, prefix = ""): e is MamError {
  return e instanceof MamError && e.code.startsWith(prefix);
}

export function problemType(code: ErrorCode): string {
  return `https://mam.dev/problems/${code}`;
}
