import { type ErrorCode, MamError } from "./errors.ts";
import type { EvidenceGuard } from "./ports.ts";
import { type ExpectedSeq, NO_CONCURRENCY_CHECK } from "./record-write.ts";
import { isTerminal, type JobRecord } from "./schemas.ts";

/**
 * A conditional write lost: the stored record no longer has the expected
 * `transition_seq` or evidence, or its status does not allow the change. Carries the
 * record it lost to, so a caller can show it (HTTP 409) or retry from it.
 */
export class TransitionConflict extends MamError {
  readonly current: JobRecord;
  constructor(code: ErrorCode, message: string, current: JobRecord) {
    super(code, message, { details: { current } });
    this.current = current;
  }
}

/**
 * The one way an adapter turns a failed conditional write into a conflict: given
 * the record as it now stands and what the write required, say which requirement
 * failed, in the order a caller can act on.
 */
/** The refusal of a report write on a terminal job: its report tree is frozen (`report.frozen`). */
export function reportFrozen(job: Pick<JobRecord, "job_id" | "status">): MamError {
  return new MamError("report.frozen", `job ${job.job_id} is ${job.status}: its report tree is frozen`);
}

export function conflictFor(
  current: JobRecord,
  expectedSeq: ExpectedSeq,
  from: readonly string[],
  evidence: EvidenceGuard = {},
): TransitionConflict {
  const id = current.job_id;
  if (expectedSeq !== NO_CONCURRENCY_CHECK && current.transition_seq !== expectedSeq) {
    return new TransitionConflict(
      "job.transitionConflict",
      `stale transition_seq: you expected ${expectedSeq}, but job ${id} is at ${current.transition_seq} (status ${current.status}); re-read it and decide again`,
      current,
    );
  }
  if (!from.includes(current.status)) {
    const code =
      isTerminal(current.status) && expectedSeq === NO_CONCURRENCY_CHECK && evidence.bump ? "report.frozen" : "job.transitionRefused";
    const message =
      code === "report.frozen"
        ? `job ${id} is ${current.status}: its report tree and dispatches are frozen`
        : `job ${id} is ${current.status}; this change needs ${from.join(" or ") || "a status it can never have"}`;
    return new TransitionConflict(code, message, current);
  }
  const latest = current.latest_attempt;
  if (evidence.currentAttempt !== undefined && latest !== undefined && latest !== evidence.currentAttempt) {
    return new TransitionConflict(
      "auth.forbidden",
      `attempt ${evidence.currentAttempt} was superseded by attempt ${latest} of job ${id}; its token is retired`,
      current,
    );
  }
  if (evidence.newAttempt !== undefined && latest !== undefined && latest >= evidence.newAttempt) {
    return new TransitionConflict(
      "dispatch.outOfOrder",
      `attempt ${evidence.newAttempt} is not greater than job ${id}'s latest dispatched attempt ${latest}; dispatch attempt ${latest + 1} or later`,
      current,
    );
  }
  if (evidence.attempt !== undefined && latest !== evidence.attempt) {
    return new TransitionConflict(
      "report.notLatest",
      latest === undefined
        ? `job ${id} has no recorded dispatch, so attempt ${evidence.attempt} takes no report`
        : `attempt ${evidence.attempt} is not job ${id}'s latest attempt (${latest} is); reports and completions are accepted for the latest attempt only`,
      current,
    );
  }
  if (evidence.seq !== undefined && current.evidence_seq !== evidence.seq) {
    return new TransitionConflict(
      "job.evidenceConflict",
      `job ${id}'s evidence changed (evidence_seq ${evidence.seq} is now ${current.evidence_seq}): a report write, finalize or dispatch landed first; verify again`,
      current,
    );
  }
  if (evidence.observationsRev !== undefined && (current.observations?.rev ?? 0) !== evidence.observationsRev) {
    return new TransitionConflict(
      "job.evidenceConflict",
      `job ${id}'s observations changed (rev ${evidence.observationsRev} is now ${current.observations?.rev ?? 0}): an observation landed first; evaluate again`,
      current,
    );
  }
  return new TransitionConflict("job.transitionRefused", `job ${id} did not take the change (status ${current.status})`, current);
}
