import { createHash } from "node:crypto";
import { deadlineOf } from "./attention.ts";
import { utf8Bytes } from "./bounds.ts";
import { conflictFor, reportFrozen, TransitionConflict } from "./conflicts.ts";
import type { Actor, Deps, Using } from "./deps.ts";
import { getJob, TRANSITIONS, type TransitionInput, transitionJob } from "./engine.ts";
import { isMamError, MamError } from "./errors.ts";
import { noteOf } from "./feed.ts";
import {
  applyFinalize,
  attemptReportLocation,
  checkDeclaredUpload,
  evidenceLocation,
  type Finalized,
  type Manifest,
  missingArtifacts,
  type PreparedFinalize,
  prepareFinalize,
  REPORT_NAME,
  readUploadDeclaration,
  STAGED_REPORT_NAME,
  validateSideEffects,
  verifyManifest,
  verifyPinnedReport,
} from "./finalize.ts";
import { evaluateGate, type GateDeps, type GateResult } from "./gate.ts";
import { releaseLease, withLease } from "./leases.ts";
import { type FlushResult, flushNotification } from "./notifier.ts";
import { observationsOf } from "./observations.ts";
import type { DispatchRecords, JobRecords, ReportStore } from "./ports.ts";
import { candidateDueOf } from "./quiescence-rules.ts";
import { chargeAgentUsage, keepDiskFloor } from "./quotas.ts";
import { type ExpectedSeq, NO_CONCURRENCY_CHECK } from "./record-write.ts";
import {
  type Action,
  type DispatchRecord,
  type DispatchRequest,
  DispatchRequestSchema,
  type FinalizedReport,
  isTerminal,
  type JobRecord,
  type Lease,
  NON_TERMINAL,
  zodIssues,
} from "./schemas.ts";

/**
 * The use cases every entry point shares (HTTP routes, the CLI, the Lambda
 * handlers): one function per thing a user can do, so there is one way to do it.
 */

/**
 * Record a dispatch with its execution anchor. Two writes, in this order: the job's
 * `latest_attempt` moves to this attempt in one conditional write (the job not
 * terminal, the attempt greater than the latest: `dispatch.outOfOrder` otherwise,
 * naming the latest), bumping `evidence_seq` so a gate deciding on the older attempt
 * loses; then the write-once dispatch item. A dispatch whose second write was lost
 * (a crash between the two) is completed by the same request again.
 */
export async function recordDispatch(
  deps: Using<Pick<JobRecords, "get" | "recordEvidence"> & DispatchRecords, "clock" | "flags">,
  jobId: string,
  req: DispatchRequest,
  /** Who dispatches, for the change feed; the service itself when absent. */
  actor?: Actor,
): Promise<DispatchRecord> {
  const parsed = DispatchRequestSchema.safeParse(req);
  if (!parsed.success) throw new MamError("input.invalid", "invalid dispatch", { issues: zodIssues(parsed.error) });
  const job = await getJob(deps, jobId);
  if (isTerminal(job.status)) throw notDispatchedAgain(job);
  const now = deps.clock.now().toISOString();
  const d = parsed.data;
  const record: { -readonly [K in keyof DispatchRecord]: DispatchRecord[K] } = {
    job_id: jobId,
    attempt_id: d.attempt_id,
    agent_session_uuid: d.agent_session_uuid,
    pane_process_generation: d.pane_process_generation,
    ...(d.pane_id === undefined ? {} : { pane_id: d.pane_id }),
    ...(d.terminal_id === undefined ? {} : { terminal_id: d.terminal_id }),
    anchor: {
      started_at: d.anchor?.started_at ?? now,
      ...(d.anchor?.workspace_revision === undefined ? {} : { workspace_revision: d.anchor.workspace_revision }),
    },
    recorded_at: now,
  };
  const deadline = deadlineOf(now, d.deadline_seconds, deps.flags);
  if (deadline !== undefined) record.deadline_at = deadline;
  try {
    // The attempt's deadline (or none) on the job, and a running job due for a look now:
    // the sweep sets its attention key from the whole record (issue 20, part 4); a
    // pending one gets its key when it is claimed.
    await deps.jobs.recordEvidence(jobId, {
      guard: { newAttempt: d.attempt_id },
      ...(deadline === undefined ? {} : { deadline }),
      ...(actor === undefined ? {} : { note: noteOf(actor) }),
      activity: { at: now, ...(job.status === "running" ? { attention: now } : {}) },
    });
  } catch (e) {
    if (!(e instanceof TransitionConflict)) throw e;
    if (isTerminal(e.current.status)) throw notDispatchedAgain(e.current);
    // This very attempt is the latest, but its dispatch item is missing: a dispatch
    // that committed its first write and was lost before its second. Complete it.
    const unfinished = e.current.latest_attempt === d.attempt_id && (await deps.jobs.getDispatch(jobId, d.attempt_id)) === undefined;
    if (!unfinished) throw e;
  }
  await deps.jobs.recordDispatch(record);
  return record;
}

const notDispatchedAgain = (job: JobRecord): MamError =>
  new MamError("job.transitionRefused", `job ${job.job_id} is ${job.status}; a terminal job is not dispatched again`, {
    details: { current: job },
  });

/**
 * The job exists, is not terminal (its report tree is frozen once it is), and this
 * attempt is its latest dispatch. A cheap early refusal only: the write that ends a
 * report write checks the same in its own condition.
 */
export async function writableAttempt(deps: Using<Pick<JobRecords, "get">>, jobId: string, attemptId: number): Promise<string> {
  const job = await getJob(deps, jobId);
  if (isTerminal(job.status)) throw reportFrozen(job);
  if (job.latest_attempt !== attemptId) {
    if (job.latest_attempt === undefined || job.latest_attempt < attemptId) {
      throw new MamError("dispatch.notFound", `job ${jobId} has no recorded dispatch for attempt ${attemptId}`);
    }
    throw conflictFor(job, NO_CONCURRENCY_CHECK, NON_TERMINAL, { attempt: attemptId });
  }
  return attemptReportLocation(jobId, attemptId);
}

/**
 * Stage a report body for an attempt (`report-final.md.tmp`). The body streams into
 * a name nothing reads; the check that ends the upload is made when its last byte
 * is written — one conditional write (job not terminal, the attempt still the
 * latest) bumping `evidence_seq` — and only then does the upload take the staged
 * name. An upload refused at its end is deleted.
 *
 *   take the upload lease -> bytes ... last byte -> recordEvidence (refused: delete
 *   upload) -> promote to .tmp -> release the lease (also when refused or failed)
 *
 * The attempt's one upload in flight (`takeLease`, issue 17) is held from before the
 * quota is charged until the staged name is taken: a second PUT meanwhile is 409
 * `report.uploadInFlight` and writes nothing; a PUT of a declared upload takes over
 * the declaration's lease (it is that upload's body), so parallel PUTs of one
 * declaration stage one body, and the feed's last `report.staged` row is the staged bytes.
 */
export async function stageAttemptReport(
  deps: Using<Pick<JobRecords, "get" | "recordEvidence" | "chargeUsage" | "holdLease">, "reports" | "ids" | "flags" | "clock" | "disk">,
  jobId: string,
  attemptId: number,
  body: Uint8Array | AsyncIterable<Uint8Array>,
  /** Who stages it, for the change feed; the service itself when absent. */
  actor?: Actor,
  /**
   * The most the body can be (its Content-Length, else the route's limit): what an
   * agent's upload reserves against its quotas before a byte is written. A body
   * handed in whole counts its length.
   */
  atMostBytes?: number,
): Promise<{ sha256: string; bytes: number }> {
  const location = await writableAttempt(deps, jobId, attemptId);
  const lease = { kind: "upload", attemptId, seconds: deps.flags.leases.uploadSeconds, actor } as const;
  return withLease(deps, jobId, lease, async () => {
    // A body of exactly the length the attempt's standing declaration announced is that
    // upload's body (only the declared bytes may take the staged name): its declaration
    // reserved them, so it is charged nothing more, as a presigned PUT is not. Any other
    // body reserves its whole length. Read under the upload lease, which no new
    // declaration can take meanwhile.
    const standing = await readUploadDeclaration(deps.reports, location);
    const atMost = body instanceof Uint8Array ? body.byteLength : (atMostBytes ?? 0);
    const declaredBody = standing?.attempt_id === attemptId && standing.bytes === atMost;
    await chargeAgentUsage(deps, jobId, actor, { events: 0, bytes: declaredBody ? 0 : atMost });
    const upload = `${STAGED_REPORT_NAME}.upload-${deps.ids.uuid()}`;
    let staged: { sha256: string; bytes: number };
    try {
      staged = await deps.reports.put(location, upload, body);
      // A declared upload binds the staged name: only its bytes may take it.
      const declared = await readUploadDeclaration(deps.reports, location);
      if (declared !== undefined) checkDeclaredUpload(declared, staged, "the report body");
      await deps.jobs.recordEvidence(jobId, {
        guard: { attempt: attemptId },
        note: { ...noteOf(actor), staged },
        activity: { at: deps.clock.now().toISOString() },
      });
    } catch (e) {
      await deps.reports.delete(location, upload).catch(() => undefined);
      throw e;
    }
    await deps.reports.promote(location, upload, STAGED_REPORT_NAME);
    return staged;
  });
}

/**
 * Finalize an attempt's report on the service (location derived, never supplied):
 * pin the bytes and build the manifest (nothing visible yet), commit the
 * `finalized_report` pointer in one conditional write (not terminal, the latest
 * attempt, `evidence_seq` bumped), then write the live names.
 *
 *   take the finalize lease -> prepare -> commit the pointer -> write the live names
 *   -> release a declared upload it took the bytes of -> release the lease (also on a throw)
 *
 * The attempt's one finalize in progress (`takeLease`, issue 17): a second finalize
 * meanwhile, by the same agent, another or an operator, is 409
 * `report.finalizeInProgress` and writes nothing, so the live names are always one
 * finalize's, the one `finalized_report` names.
 *
 * Then, best effort and still under the lease, the copies this finalize left
 * unreferenced are retired (`retireIfUnreferenced`): the copy of the pointer it
 * superseded (same attempt, other bytes), or, when its commit was refused (terminal
 * job, superseded attempt, lost race), the copy it just pinned. Without this, every
 * finalize of changed bytes leaves one more copy for ever, and one agent token can
 * fill the disk. Under the lease no other finalize can pin the copy being retired
 * again between the read and the retire.
 */
export async function finalizeAttemptReport(
  deps: Using<Pick<JobRecords, "get" | "recordEvidence" | "holdLease">, "reports" | "clock" | "ids" | "flags" | "metrics" | "disk">,
  jobId: string,
  attemptId: number,
  sideEffects: readonly unknown[],
  /** Who finalizes, for the change feed; the service itself when absent. */
  actor?: Actor,
): Promise<Finalized> {
  validateSideEffects(sideEffects);
  const location = await writableAttempt(deps, jobId, attemptId);
  // An agent's finalize pins a copy of its report: below the disk floor it is refused, writing nothing.
  if (actor?.kind === "agent") await keepDiskFloor(deps, 0);
  const lease = { kind: "finalize", attemptId, seconds: deps.flags.leases.finalizeSeconds, actor } as const;
  return withLease(deps, jobId, lease, async (held) => {
    // Read under the lease: the pointer this finalize supersedes, which no other finalize can move now.
    const before = await getJob(deps, jobId);
    const prepared = await prepareFinalize(deps.reports, deps.clock, { location, jobId, attemptId, sideEffects });
    const pinned = prepared.manifest.sha256;
    let committed: JobRecord;
    try {
      // A finalize may be what a quiescent job lacked: the same write marks it due.
      const due = before.auto_complete ? candidateDueOf(observationsOf(before, attemptId), before.agent, deps.flags.quiescenceRules) : null;
      committed = await deps.jobs.recordEvidence(jobId, {
        guard: { attempt: attemptId },
        set: { finalized_report: pointerOf(prepared) },
        ...(actor === undefined ? {} : { note: noteOf(actor) }),
        ...(due === null ? {} : { candidate: due }),
        activity: { at: deps.clock.now().toISOString() },
      });
    } catch (e) {
      await retireRefused(deps, jobId, attemptId, pinned, e, held);
      throw e;
    }
    try {
      await applyFinalizeIfCurrent(deps, prepared, committed.evidence_seq);
      await releaseDeclaredUpload(deps, jobId, attemptId, before, committed);
    } finally {
      // The commit stands whatever became of the live names: the pointer it replaced is superseded.
      await retireSuperseded(deps, before, attemptId, pinned, held);
    }
    return { manifest: prepared.manifest, manifestSha256: prepared.manifestSha256 };
  });
}

/**
 * A finalize took the staged bytes (checked against their declaration, if any): the
 * upload its declaration held (bytes sent straight to the store, e.g. a presigned S3
 * PUT) is complete. Only the declaration already held when this finalize read the
 * record under its lease, before it read the declaration and the staged bytes: one
 * declared while it ran was not checked against what it took, and stays in flight.
 * Released on its id, so a later upload is left alone.
 */
async function releaseDeclaredUpload(
  deps: Using<Pick<JobRecords, "holdLease">>,
  jobId: string,
  attemptId: number,
  before: JobRecord,
  committed: JobRecord,
): Promise<void> {
  const held = committed.upload_in_flight;
  if (held?.declared === true && held.attempt_id === attemptId && held.id === before.upload_in_flight?.id) {
    await releaseLease(deps, jobId, "upload", held);
  }
}

/** After a finalize's pointer committed: the copy of the pointer it replaced (read before), if of this attempt and other bytes. */
async function retireSuperseded(
  deps: Using<Pick<JobRecords, "get">, "reports" | "metrics" | "clock">,
  before: JobRecord,
  attemptId: number,
  pinned: string,
  lease: Lease,
): Promise<void> {
  const previous = before.finalized_report;
  if (previous === undefined || previous.attempt_id !== attemptId || previous.report_sha256 === pinned) return;
  await retireIfUnreferenced(deps, before.job_id, attemptId, previous.report_sha256, lease);
}

/**
 * After a finalize's commit was refused: nothing this finalize wrote is referenced by
 * it, so its copy goes unless the record names the same bytes (content-addressed: an
 * earlier finalize or the completion may pin this very copy). Any other failure (the
 * store unreachable) leaves the outcome unknown, and the copy where it is.
 */
async function retireRefused(
  deps: Using<Pick<JobRecords, "get">, "reports" | "metrics" | "clock">,
  jobId: string,
  attemptId: number,
  pinned: string,
  refusal: unknown,
  lease: Lease,
): Promise<void> {
  if (refusal instanceof TransitionConflict) await retireIfUnreferenced(deps, jobId, attemptId, pinned, lease);
}

/**
 * Whether the record names an attempt's pinned copy: its current finalize
 * (`finalized_report`) or its completion (`completed_evidence`), each for that
 * attempt (a copy lives under its attempt's location: the same bytes pinned for
 * another attempt are another object).
 */
export function namesPinnedCopy(job: JobRecord, attemptId: number, sha256: string): boolean {
  const finalized = job.finalized_report;
  const completed = job.completed_evidence;
  return (
    (finalized?.attempt_id === attemptId && finalized.report_sha256 === sha256) ||
    (completed?.attempt_id === attemptId && completed.report_sha256 === sha256)
  );
}

/**
 * The one rule for removing evidence: an attempt's pinned copy is unreferenced once
 * it is superseded by a newer finalize of the attempt (or was pinned by a finalize
 * whose commit was refused) and the record, read again now, names it neither in
 * `finalized_report` nor in `completed_evidence`. Then the store retires it (files:
 * removed; S3: tagged for the lifecycle rule). Only the service's finalizes call
 * this (`finalizeAttemptReport`, and an event other than `completed` carrying a
 * finalize in the service's tree); the paths that complete (the gate, an agent's
 * `completed`) never retire anything, and a copy of a superseded attempt stays unless
 * this same rule, applied by a finalize of that attempt, says otherwise.
 *
 * Best effort, after the commit: a failure is counted (`pinnedCopy("retire_failed")`)
 * and never fails the finalize.
 *
 * Callers run it inside the attempt's finalize lease (issue 17): no other finalize of
 * the attempt can pin the copy again between this read and the retire. Without the
 * lease, this is the race it would lose — on files a pointer to a missing copy, which
 * the gate refuses; on S3 a tagged copy a completion could pin (docs/decisions.md):
 *
 *   finalize A commits B ── re-read: names neither A nor … ── retire(A)
 *              finalize C: copyOnce(A) exists ─────────────────────────── commit pointer A
 */
async function retireIfUnreferenced(
  deps: Using<Pick<JobRecords, "get">, "reports" | "metrics" | "clock">,
  jobId: string,
  attemptId: number,
  sha256: string,
  lease: Lease,
): Promise<void> {
  try {
    const now = await deps.jobs.get(jobId);
    if (now === undefined || namesPinnedCopy(now, attemptId, sha256)) return;
    // Only while this finalize's lease still holds the attempt, with room to spare: a
    // finalize that outlived it no longer excludes the next, which may pin these very
    // bytes again and have a completion name them after this read. Then the copy
    // stays (counted as a retire not made): a leak, never evidence removed.
    if (!leaseStillHeld(now, lease, deps.clock.now())) {
      deps.metrics?.pinnedCopy("retire_failed");
      return;
    }
    const location = attemptReportLocation(jobId, attemptId);
    await deps.reports.retire(evidenceLocation(location), sha256);
    // The retire is not conditional on the record: read it once more. A finalize and a
    // completion that named these bytes in between (possible only if this one stalled
    // past its lease) pinned a copy that is gone (files) or tagged (S3): pin it again
    // from the live report, which hashes to it if the completion's finalize wrote its
    // live names (copyOnce checks the bytes, and clears a tag). Else the gap stays
    // visible: the verification's `pinned.ok` is false, never other bytes.
    const after = await deps.jobs.get(jobId);
    if (after !== undefined && namesPinnedCopy(after, attemptId, sha256)) {
      await deps.reports.copyOnce({ location, name: REPORT_NAME }, { location: evidenceLocation(location), name: sha256 }, sha256);
      deps.metrics?.pinnedCopy("retire_failed");
      return;
    }
    deps.metrics?.pinnedCopy("retired");
  } catch {
    deps.metrics?.pinnedCopy("retire_failed");
  }
}

/**
 * Whether `lease` is still the attempt's finalize in progress on `record`, with at
 * least half its term left at `now`: the retire that follows this read is one store
 * call, so no other finalize can take the attempt before it lands.
 */
function leaseStillHeld(record: JobRecord, lease: Lease, now: Date): boolean {
  const held = record.finalize_in_progress;
  if (held?.id !== lease.id) return false;
  const term = Date.parse(lease.expires_at) - Date.parse(lease.since);
  return Date.parse(held.expires_at) - now.getTime() >= term / 2;
}

/** The `finalized_report` a prepared finalize commits. */
export function pointerOf(prepared: PreparedFinalize): FinalizedReport {
  return {
    attempt_id: prepared.manifest.attempt_id,
    report_sha256: prepared.manifest.sha256,
    manifest_sha256: prepared.manifestSha256,
    finalized_at: prepared.manifest.finalized_at,
  };
}

/**
 * Write the live names of a committed finalize, unless a later evidence write has
 * superseded it (its live names would then be stale). The gate trusts the live
 * manifest only when it is the one `finalized_report` names, so a late writer can
 * delay a completion, never make one rest on other bytes.
 */
async function applyFinalizeIfCurrent(
  deps: Using<Pick<JobRecords, "get">, "reports">,
  prepared: PreparedFinalize,
  evidenceSeq: number,
): Promise<void> {
  const now = await deps.jobs.get(prepared.manifest.job_id);
  if (now !== undefined && now.evidence_seq !== evidenceSeq && now.finalized_report?.manifest_sha256 !== prepared.manifestSha256) return;
  await applyFinalize(deps.reports, prepared);
}

/**
 * Verify an attempt's live report tree (B-06..B-08), and, once the job completed on
 * this attempt, whether that tree is the one its completion names and the write-once
 * copy it pinned. A live report and manifest can agree with each other and still not
 * be the completion's (written into the store after it, by someone with access to it
 * or by a finalize that lost its race and wrote late): then `ok` is false and
 * `matchesCompletion` says why, beside the pinned copy's own check.
 */
export async function verifyAttemptReport(
  deps: Using<Pick<JobRecords, "get">, "reports">,
  jobId: string,
  attemptId: number,
  expectedArtifacts?: readonly string[],
): Promise<AttemptVerification> {
  const job = await getJob(deps, jobId);
  const location = attemptReportLocation(jobId, attemptId);
  const expected = expectedArtifacts ?? job.expected_artifacts;
  const completion = job.completed_evidence;
  if (completion === undefined || completion.attempt_id !== attemptId) {
    return verifyManifest(deps.reports, { location, jobId, attemptId, expectedArtifacts: expected });
  }
  // Whether the tree is the completion's does not depend on which artifacts are asked
  // about: the tree is verified on its own, compared, then held to `expected`.
  const live = await verifyManifest(deps.reports, { location, jobId, attemptId });
  const check = await verifyPinnedReport(deps.reports, location, completion.report_sha256);
  const pinned = {
    ok: check.ok,
    reason: check.reason,
    report_sha256: completion.report_sha256,
    evidence_location: completion.evidence_location,
  };
  if (!live.ok) return { ...live, matchesCompletion: false, pinned };
  const matchesCompletion = live.manifestSha256 === completion.manifest_sha256 && live.manifest.sha256 === completion.report_sha256;
  if (!matchesCompletion) {
    return {
      ok: false,
      reason:
        `the live report tree is not the one the completion names: the live manifest is ${live.manifestSha256} (report ${live.manifest.sha256}), ` +
        `the completion names manifest ${completion.manifest_sha256} (report ${completion.report_sha256}); the pinned copy ${completion.evidence_location} is the evidence`,
      manifest: live.manifest,
      manifestSha256: live.manifestSha256,
      matchesCompletion,
      pinned,
    };
  }
  const missing = missingArtifacts(live.manifest, expected);
  if (missing !== undefined) return { ok: false, reason: missing, manifest: live.manifest, matchesCompletion, pinned };
  return { ...live, matchesCompletion, pinned };
}

/** An attempt's verification, as `GET .../verification` answers it. */
export interface AttemptVerification {
  readonly ok: boolean;
  readonly reason: string;
  readonly manifest?: Manifest;
  /** The live manifest's digest, whenever it verified on its own (also when it is not the completion's). */
  readonly manifestSha256?: string;
  /**
   * Once the job completed on this attempt: whether the live tree verifies on its own
   * (whatever artifacts are asked about) and is the one the completion names
   * (`completed_evidence.manifest_sha256` and `report_sha256`). Absent for any other
   * attempt.
   */
  readonly matchesCompletion?: boolean;
  /** Once the job completed on this attempt: the write-once copy its completion pinned, re-hashed. */
  readonly pinned?: PinnedVerification;
}

export interface PinnedVerification {
  readonly ok: boolean;
  readonly reason: string;
  readonly report_sha256: string;
  readonly evidence_location: string;
}

/** The gate over the service's own report tree: the location comes from the latest dispatch. */
/**
 * The gate on one job, the report location derived from its latest dispatch:
 * `scenario` as posted, or `RECORDED` (built from what mam recorded); `postedBy` the
 * posting token's id, kept in the completion's evidence; `dryRun` decides and writes
 * nothing (`GET /v1/jobs/{id}/gate`).
 */
export async function evaluateJob(
  deps: GateDeps,
  jobId: string,
  scenario: unknown,
  opts: {
    readonly postedBy?: string | undefined;
    readonly dryRun?: boolean | undefined;
    /** The record, when the caller has just read it (the sweep: the candidate it listed). */
    readonly job?: JobRecord | undefined;
  } = {},
): Promise<GateResult> {
  const job = opts.job ?? (await getJob(deps, jobId));
  return evaluateGate(deps, { jobId, job, scenario, reportLocation: (d) => attemptReportLocation(jobId, d.attempt_id), ...opts });
}

export const EVENT_ACTIONS = { started: "claim", progress: "progress", completed: "completed", error: "error" } as const satisfies Record<
  string,
  Action
>;
export type AgentEvent = keyof typeof EVENT_ACTIONS;

export interface PublishEventInput {
  readonly event: AgentEvent;
  /** Absent: the seq the caller sees now (read, then compare-and-swap on it). */
  readonly expectedSeq?: number | undefined;
  /** The attempt reporting (recorded in the event log); implied by `finalize`. */
  readonly attemptId?: number | undefined;
  /** Finalize first: where the report lies (the service derives it; the CLI passes the agent's own directory). */
  readonly finalize?: { readonly location: string; readonly attemptId: number; readonly sideEffects: readonly unknown[] } | undefined;
  readonly data?: Record<string, import("zod").z.core.util.JSONType> | undefined;
}

/**
 * Who publishes what the commit owes. Each committed intent is published by exactly
 * one path per process, and the composition root is the one that knows which:
 * - `inline: true` (the default): this call publishes and settles after its commit.
 *   The `mam` command in `--data-dir` mode, which has no relay, runs this way.
 * - `inline: false`: another path of the same process publishes every commit — the
 *   change relay in `mam serve`, the stream publisher on AWS — and this call only
 *   commits. Publishing here too would send every intent twice.
 * Either way the recovery sweep, after its grace period, sends what was missed.
 */
export interface PublishOptions {
  readonly inline?: boolean;
}

export interface PublishEventResult {
  readonly record: JobRecord;
  readonly finalized?: Finalized;
  /** The inline publish's outcome; absent when another path publishes (`inline: false`). */
  readonly flush?: FlushResult;
  /** What went wrong after the commit (the commit stands; nothing here undoes it). */
  readonly warnings: readonly string[];
}

/**
 * An explicit report from the agent: finalize first (when asked), commit the
 * transition with its intent, record the attempt in the job's event log, and — when
 * this process publishes inline (`opts.inline`, the default) — publish and settle.
 * Bad input is refused before anything is finalized or committed; a broker that
 * cannot be reached leaves the commit in place and the intent owed.
 */
export async function publishAgentEvent(
  deps: Deps,
  jobId: string,
  input: PublishEventInput,
  actor: Actor,
  opts: PublishOptions = {},
): Promise<PublishEventResult> {
  if (input.finalize) validateSideEffects(input.finalize.sideEffects);
  const job = await getJob(deps, jobId);
  const action = EVENT_ACTIONS[input.event];
  if (input.finalize && isTerminal(job.status)) throw reportFrozen(job);
  // Refuse what the commit would refuse before writing anything: bad input changes
  // nothing, not its quota, not even an unreferenced pinned copy. (The commit still checks both.)
  const rule = TRANSITIONS[action];
  const stale: ExpectedSeq = deps.flags.engineCas && input.expectedSeq !== undefined ? input.expectedSeq : NO_CONCURRENCY_CHECK;
  if (!(rule.from as readonly string[]).includes(job.status) || (stale !== NO_CONCURRENCY_CHECK && stale !== job.transition_seq)) {
    throw conflictFor(job, stale, rule.from);
  }
  if (input.finalize === undefined) return publishHoldingLease(deps, jobId, input, actor, opts, job, action);
  // A finalize holds the attempt's one finalize in progress (issue 17) from before
  // anything is written (the quota included) until its live names are written.
  const request = { kind: "finalize", attemptId: input.finalize.attemptId, seconds: deps.flags.leases.finalizeSeconds, actor } as const;
  return withLease(deps, jobId, request, async (lease) => {
    // The pointer this finalize supersedes, read under its lease (no other finalize can
    // move it now): the record read above may predate a finalize that committed since.
    const before = await getJob(deps, jobId);
    const result = await publishHoldingLease(deps, jobId, input, actor, opts, job, action, { lease, before });
    // The record as the commit wrote it carries this request's lease; the caller is
    // answered after its release, so the answer does not show one that no longer holds.
    const { finalize_in_progress: held, ...released } = result.record;
    return held?.id === lease.id ? { ...result, record: released } : result;
  });
}

async function publishHoldingLease(
  deps: Deps,
  jobId: string,
  input: PublishEventInput,
  actor: Actor,
  opts: PublishOptions,
  job: JobRecord,
  action: Action,
  held?: { readonly lease: Lease; readonly before: JobRecord },
): Promise<PublishEventResult> {
  // The event and its data are reserved against the job's quotas before anything is written.
  await chargeAgentUsage(deps, jobId, actor, { events: 1, bytes: input.data === undefined ? 0 : utf8Bytes(JSON.stringify(input.data)) });
  let prepared: PreparedFinalize | undefined;
  if (input.finalize) {
    // Only unreferenced, write-once bytes are written before the commit; the finalize
    // becomes visible once the transition that carries its pointer has committed.
    prepared = await prepareFinalize(deps.reports, deps.clock, { ...input.finalize, jobId });
  }
  const t: TransitionInput = {
    action,
    expectedSeq: input.expectedSeq ?? job.transition_seq,
    notify: true,
    ...(prepared === undefined
      ? {}
      : {
          finalized: {
            prepared,
            // A job never dispatched (the CLI, in the agent's own tree) has no latest
            // attempt to hold to: then no evidence write may land since it was read.
            guard: job.latest_attempt === undefined ? { seq: job.evidence_seq } : { attempt: prepared.manifest.attempt_id },
          },
        }),
    ...(input.finalize === undefined ? {} : { reportLocation: input.finalize.location }),
  };
  // A finalize carried by an event other than a completion (progress, started, error)
  // supersedes the attempt's previous one as `finalizeAttemptReport` does, and retires
  // by the same rule; a completion never retires anything. Only in the service's own
  // tree: the CLI's finalize of the agent's own directory keeps every copy.
  const retiring =
    prepared !== undefined &&
    held !== undefined &&
    action !== "completed" &&
    prepared.location === attemptReportLocation(jobId, prepared.manifest.attempt_id)
      ? { attemptId: prepared.manifest.attempt_id, pinned: prepared.manifest.sha256, ...held }
      : undefined;
  let record: JobRecord;
  try {
    record = await transitionJob(deps, jobId, t, actor);
  } catch (e) {
    if (retiring !== undefined) await retireRefused(deps, jobId, retiring.attemptId, retiring.pinned, e, retiring.lease);
    throw e;
  }
  // From here on the commit stands: nothing below may turn it into a failure of the request.
  if (retiring !== undefined) await retireSuperseded(deps, retiring.before, retiring.attemptId, retiring.pinned, retiring.lease);
  const warnings: string[] = [];
  if (prepared !== undefined) {
    try {
      await applyFinalizeIfCurrent(deps, prepared, record.evidence_seq);
    } catch (e) {
      warnings.push(`the finalize committed, but its live report and manifest were not written: ${messageOf(e)}; finalize again`);
    }
  }
  const attemptId = input.attemptId ?? input.finalize?.attemptId;
  try {
    await deps.jobs.appendEvent({
      job_id: jobId,
      at: deps.clock.now().toISOString(),
      id: deps.ids.uuid(),
      event: "publish_event",
      data: {
        event: input.event,
        transition_seq: record.transition_seq,
        ...(attemptId === undefined ? {} : { attempt_id: attemptId }),
        ...(prepared ? { report_sha256: prepared.manifest.sha256 } : {}),
        ...(input.data ? { data: input.data } : {}),
      },
    });
  } catch (e) {
    warnings.push(`the transition committed, but its event log line was not written: ${messageOf(e)}`);
  }
  const flush = (opts.inline ?? true) ? await flushInline(deps, jobId, record) : undefined;
  const finalized = prepared === undefined ? undefined : { manifest: prepared.manifest, manifestSha256: prepared.manifestSha256 };
  return { record, ...(finalized ? { finalized } : {}), ...(flush === undefined ? {} : { flush }), warnings };
}

/** Publish and settle right after the commit; whatever fails leaves the intent owed in the store, for the sweep. */
async function flushInline(deps: Deps, jobId: string, record: JobRecord): Promise<FlushResult> {
  try {
    return await flushNotification(deps, jobId);
  } catch (e) {
    const intent = record.pending_notification;
    const error = isMamError(e) ? e : new MamError("internal", messageOf(e));
    return intent === undefined ? { outcome: "nothing_owed" } : { outcome: "failed", intent, error };
  }
}

/**
 * The report a re-sent completion shows: the bytes it sends now (`bytes`, hashed as
 * they arrive and kept nowhere), or what the service holds for its attempt —
 * `finalize`: what a finalize would read (the staged upload, else the live report);
 * `report`: the live report.
 */
export type ResentReport = { readonly bytes: Uint8Array | AsyncIterable<Uint8Array> } | { readonly stored: "finalize" | "report" };

/** The refusals a request on a terminal record ends in: its status (or its stale seq), or its frozen report tree. */
const TERMINAL_REFUSALS: ReadonlySet<string> = new Set(["job.transitionRefused", "job.transitionConflict", "report.frozen"]);

/**
 * Whether a refused request is an agent re-sending the completion it already
 * committed: then the caller is told it is done, not that it failed. The engine
 * still refuses it (B-42: a terminal record takes no further change); this only
 * reads, and answers the record when every one of these holds, undefined otherwise
 * (the caller then throws `refusal` as it was):
 *
 * - `refusal` is a refusal because the record is terminal (or moved on);
 * - the record is `completed` and pins its evidence (`completed_evidence`);
 * - the caller is that job's agent, acting for the attempt the completion pinned,
 *   which is still the job's latest;
 * - the report it shows hashes to the pinned `report_sha256`.
 *
 * It tells the caller nothing it could not read already (its own job record, with
 * that hash), and the bytes it is shown are hashed only once everything else
 * holds, so anyone else's request is refused exactly as before, before a byte is read.
 */
export async function completedAlready(
  deps: Using<Pick<JobRecords, "get">, "reports">,
  jobId: string,
  refusal: unknown,
  caller: Actor,
  report: ResentReport,
): Promise<JobRecord | undefined> {
  if (!isMamError(refusal) || !TERMINAL_REFUSALS.has(refusal.code)) return undefined;
  if (caller.kind !== "agent" || caller.jobId !== jobId) return undefined;
  const job = await deps.jobs.get(jobId);
  const pinned = job?.completed_evidence;
  if (job === undefined || job.status !== "completed" || pinned === undefined) return undefined;
  if (pinned.attempt_id !== caller.attemptId || job.latest_attempt !== caller.attemptId) return undefined;
  const sha256 =
    "bytes" in report ? await sha256Of(report.bytes) : await storedSha256(deps.reports, jobId, caller.attemptId, report.stored);
  return sha256 === pinned.report_sha256 ? job : undefined;
}

async function sha256Of(body: Uint8Array | AsyncIterable<Uint8Array>): Promise<string> {
  const hash = createHash("sha256");
  if (body instanceof Uint8Array) hash.update(body);
  else for await (const chunk of body) hash.update(chunk);
  return hash.digest("hex");
}

async function storedSha256(
  reports: ReportStore,
  jobId: string,
  attemptId: number,
  which: "finalize" | "report",
): Promise<string | undefined> {
  const location = attemptReportLocation(jobId, attemptId);
  const name = which === "finalize" && (await reports.exists(location, STAGED_REPORT_NAME)) ? STAGED_REPORT_NAME : REPORT_NAME;
  return (await reports.hash(location, name))?.sha256;
}

const messageOf = (e: unknown): string => (e instanceof Error ? e.message : String(e));
