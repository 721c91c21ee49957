import type { Actor, Deps, Using } from "./deps.ts";
import type { ErrorCode } from "./errors.ts";
import type { Finalized, Manifest, Verification } from "./finalize.ts";
import type { JobRecords } from "./ports.ts";
import type { JobRecord } from "./schemas.ts";
import {
  type AttemptVerification,
  completedAlready,
  finalizeAttemptReport,
  type PinnedVerification,
  type PublishEventInput,
  type PublishEventResult,
  type PublishOptions,
  publishAgentEvent,
  type ResentReport,
  verifyAttemptReport,
} from "./services.ts";

/**
 * What a caller is answered for publish-event, finalize and verification, built
 * once for every entry point that answers them: the API's routes send these as
 * JSON, the CLI's embedded backend prints them, so `mam ... --json` is one document
 * in both modes. Plain data in the wire's own names (snake_case, as the job record
 * already is); core knows no HTTP, the API picks the status. A key whose value would
 * be `undefined` is left out, as JSON leaves it out.
 */

/** The job is already completed by the caller's attempt, on the report it shows: nothing was written. */
export interface AlreadyCompletedAnswer {
  readonly already_completed: true;
  readonly record: JobRecord;
}

/** A finalize: the manifest written and its digest. */
export interface FinalizedAnswer {
  readonly manifest: Manifest;
  readonly manifest_sha256: string;
}

/**
 * An agent event: the committed record, and the inline publish's outcome where this
 * process publishes (`published`, with `publish_error` when it failed: the commit
 * stands and the intent stays owed); where another path publishes every commit, no
 * `published` at all.
 */
export interface PublishEventAnswer {
  readonly record: JobRecord;
  readonly published?: boolean;
  readonly finalized?: FinalizedAnswer;
  readonly publish_error?: { readonly code: ErrorCode; readonly message: string };
  readonly warnings?: string[];
}

/** A verification; a failed one is an answer (`ok: false` and the reason), not an error. */
export interface VerificationAnswer {
  readonly ok: boolean;
  readonly reason: string;
  readonly manifest: Manifest | null;
  readonly manifest_sha256?: string;
  readonly matches_completion?: boolean;
  readonly pinned?: PinnedVerification;
}

export function finalizedAnswer(f: Finalized): FinalizedAnswer {
  return { manifest: f.manifest, manifest_sha256: f.manifestSha256 };
}

/** An attempt's verification on the service's store, or a report tree's verified where it lies (no completion there: no `pinned`). */
export function verificationAnswer(v: AttemptVerification | Verification): VerificationAnswer {
  const attempt: AttemptVerification = v;
  return {
    ok: attempt.ok,
    reason: attempt.reason,
    manifest: attempt.manifest ?? null,
    ...(attempt.manifestSha256 === undefined ? {} : { manifest_sha256: attempt.manifestSha256 }),
    ...(attempt.matchesCompletion === undefined ? {} : { matches_completion: attempt.matchesCompletion }),
    ...(attempt.pinned === undefined ? {} : { pinned: attempt.pinned }),
  };
}

/**
 * A publish that fails after the commit is not a failure of the request: the
 * transition and its intent are committed, and the intent stays owed until the
 * recovery sweep (or the change relay) delivers it. Answering an error would invite
 * the agent to retry a transition that already happened, so the answer says so
 * (`published: false` and why). Where another path publishes every commit (the relay,
 * the stream publisher), this process does not know, and says nothing.
 */
export function publishEventAnswer(r: PublishEventResult): PublishEventAnswer {
  const flush = r.flush;
  return {
    record: r.record,
    ...(flush === undefined ? {} : { published: flush.outcome !== "failed" }),
    ...(r.finalized === undefined ? {} : { finalized: finalizedAnswer(r.finalized) }),
    ...(flush?.outcome === "failed" ? { publish_error: { code: flush.error.code, message: flush.error.message } } : {}),
    ...(r.warnings.length > 0 ? { warnings: [...r.warnings] } : {}),
  };
}

/**
 * `publishAgentEvent`, answered: the agent re-sending the completion its attempt
 * already committed, on the report that completion pinned (`resent`: what it shows),
 * is told it is done and nothing is written (core's rule, `completedAlready`);
 * anything else refused is thrown as it was.
 */
export async function answerPublishEvent(
  deps: Deps,
  jobId: string,
  input: PublishEventInput,
  actor: Actor,
  opts: PublishOptions & { readonly resent: ResentReport },
): Promise<PublishEventAnswer | AlreadyCompletedAnswer> {
  try {
    return publishEventAnswer(await publishAgentEvent(deps, jobId, input, actor, opts));
  } catch (refusal) {
    if (input.event !== "completed") throw refusal;
    return await alreadyCompletedOr(refusal, deps, jobId, actor, opts.resent);
  }
}

/** `finalizeAttemptReport`, answered: a re-sent finalize of the completed attempt's own bytes is told it is done. */
export async function answerFinalize(
  deps: Parameters<typeof finalizeAttemptReport>[0] & Using<Pick<JobRecords, "get">, "reports">,
  jobId: string,
  attemptId: number,
  sideEffects: readonly unknown[],
  actor: Actor,
): Promise<FinalizedAnswer | AlreadyCompletedAnswer> {
  try {
    return finalizedAnswer(await finalizeAttemptReport(deps, jobId, attemptId, sideEffects, actor));
  } catch (refusal) {
    return await alreadyCompletedOr(refusal, deps, jobId, actor, { stored: "finalize" });
  }
}

/** The refusal, unless it is the caller's own completion sent again (`completedAlready`): then that it is done. */
async function alreadyCompletedOr(
  refusal: unknown,
  deps: Parameters<typeof completedAlready>[0],
  jobId: string,
  actor: Actor,
  resent: ResentReport,
): Promise<AlreadyCompletedAnswer> {
  const record = await completedAlready(deps, jobId, refusal, actor, resent);
  if (record === undefined) throw refusal;
  return { already_completed: true, record };
}

/**
 * `verifyAttemptReport`, answered: the store's live copy of the attempt, and once the
 * job completed on it the copy its completion pinned. `expectedArtifacts` absent: the
 * job's own list.
 */
export async function answerVerification(
  deps: Using<Pick<JobRecords, "get">, "reports">,
  jobId: string,
  attemptId: number,
  expectedArtifacts?: readonly string[],
): Promise<VerificationAnswer> {
  return verificationAnswer(await verifyAttemptReport(deps, jobId, attemptId, expectedArtifacts));
}
