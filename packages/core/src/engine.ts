import { conflictFor } from "./conflicts.ts";
import type { Actor, Deps, Using } from "./deps.ts";
import { MamError } from "./errors.ts";
import { noteOf } from "./feed.ts";
import { attemptReportLocation, type PreparedFinalize, verifyFinalizedEvidence } from "./finalize.ts";
import type { EvidenceGuard, JobChange, JobRecords, OwedNotifications } from "./ports.ts";
import { type ExpectedSeq, NO_CONCURRENCY_CHECK } from "./record-write.ts";
import {
  type Action,
  type CompletedEvidence,
  type FinalizedReport,
  type IntentCause,
  isTerminal,
  JOB_ID_PATTERN,
  JobId,
  type JobRecord,
  type NotificationIntent,
  NotificationIntentSchema,
  type ProgressFields,
  type RegisterJob,
  RegisterJobSchema,
  type Status,
  zodIssues,
} from "./schemas.ts";

type ActorKind = Actor["kind"];

/**
 * The transition table. Every state change is one of these, committed as one
 * compare-and-swap on `transition_seq`. Anything not here is refused naming the
 * current status; terminal records accept no further state change.
 *
 *   pending --claim--> running --progress--> running
 *   pending|running --completed|error--> completed|error   (an agent may report unclaimed)
 *   pending|running --cancel--> cancelled                   (operator only)
 */
export const TRANSITIONS = {
  claim: { from: ["pending"], to: "running", actors: ["agent", "operator"], event: "running", fields: true },
  progress: { from: ["running"], to: "running", actors: ["agent", "operator"], event: "progress", fields: true },
  completed: { from: ["pending", "running"], to: "completed", actors: ["agent", "operator"], event: "completed", fields: false },
  error: { from: ["pending", "running"], to: "error", actors: ["agent", "operator"], event: "error", fields: false },
  cancel: { from: ["pending", "running"], to: "cancelled", actors: ["operator"], event: "cancelled", fields: false },
} as const satisfies Record<Action, { from: readonly Status[]; to: Status; actors: readonly ActorKind[]; event: string; fields: boolean }>;

/**
 * Which actor may write which field (on `claim` and `progress`). An agent writes
 * only its free-form progress fields, never what the gate reads.
 */
export const FIELD_WRITERS = {
  progress: ["agent", "operator"],
  agent_session: ["agent", "operator"],
  auto_complete: ["operator"],
  nudge_on_stop: ["operator"],
  role: ["operator"],
  expected_artifacts: ["operator"],
} as const satisfies Record<keyof ProgressFields, readonly ActorKind[]>;

/** The fields a transition may write that the gate reads (an operator's alone). */
const GATE_FIELDS = ["auto_complete", "role", "expected_artifacts"] as const satisfies readonly (keyof ProgressFields)[];

export function assertJobId(jobId: string): void {
  // `JobId` is this pattern (no flags, so no state between tests); zod is asked only to
  // word a refusal. Every store call asks this (the settle on bench/notify's path, 1-3 us by zod).
  if (typeof jobId === "string" && JOB_ID_PATTERN.test(jobId)) return;
  const r = JobId.safeParse(jobId);
  if (!r.success)
    throw new MamError("input.jobId", `not a valid job id: ${String(JSON.stringify(jobId)).slice(0, 80)}`, {
      issues: zodIssues(r.error, "job_id"),
    });
}

export async function getJob(deps: Using<Pick<JobRecords, "get">>, jobId: string): Promise<JobRecord> {
  assertJobId(jobId);
  const job = await deps.jobs.get(jobId);
  if (!job) throw new MamError("job.notFound", `job ${jobId} does not exist`);
  return job;
}

/** Register a job: status pending, transition_seq 0. */
export async function registerJob(
  deps: Using<Pick<JobRecords, "create">, "clock" | "ids">,
  input: RegisterJob,
  /** Who registers it, for the change feed; the service itself when absent. */
  actor?: Actor,
): Promise<JobRecord> {
  const parsed = RegisterJobSchema.safeParse(input);
  if (!parsed.success) throw new MamError("input.invalid", "invalid job registration", { issues: zodIssues(parsed.error) });
  const req = parsed.data;
  const now = deps.clock.now().toISOString();
  const record: JobRecord = {
    job_id: req.job_id ?? deps.ids.uuid(),
    prompt: req.prompt,
    agent: req.agent,
    role: req.role ?? "Worker",
    status: "pending",
    iteration: 1,
    transition_seq: 0,
    evidence_seq: 0,
    expected_artifacts: req.expected_artifacts ?? [],
    auto_complete: req.auto_complete ?? false,
    ...(req.nudge_on_stop === true ? { nudge_on_stop: true } : {}),
    created_at: now,
    updated_at: now,
  };
  await deps.jobs.create(record, actor === undefined ? undefined : noteOf(actor));
  return record;
}

export function newIntent(
  deps: Pick<Deps, "clock" | "ids">,
  event: string,
  seq: number,
  reason?: string,
  by?: IntentCause,
): NotificationIntent {
  return {
    id: deps.ids.uuid(),
    event,
    seq,
    ...(reason === undefined ? {} : { reason }),
    ...(by === undefined ? {} : { by }),
    created_at: deps.clock.now().toISOString(),
  };
}

export interface TransitionInput {
  readonly action: Action;
  /** Required while MAM_ENGINE_CAS=1; ignored (last writer wins) when it is 0. */
  readonly expectedSeq?: number | undefined;
  readonly fields?: ProgressFields | undefined;
  /** Commit a notification intent with the state. Default: on for terminal actions. */
  readonly notify?: boolean | undefined;
  readonly reason?: string | undefined;
  /**
   * A finalize prepared for an attempt, committed in the same conditional write: its
   * `finalized_report` pointer and an `evidence_seq` bump, under `guard` (the attempt
   * still the latest; or, for a job never dispatched, no evidence write since it was read).
   */
  readonly finalized?: { readonly prepared: PreparedFinalize; readonly guard: Omit<EvidenceGuard, "bump"> } | undefined;
  /** Where the attempt's report tree is, for an agent's completion on evidence; derived from the attempt by default. */
  readonly reportLocation?: string | undefined;
}

/**
 * Apply one transition from the table, as one conditional write. Throws:
 * `job.actionForbidden` / `job.fieldNotAllowed` (the actor may not), `input.invalid`
 * (no expected_seq while CAS is on), `job.notFound`, and `TransitionConflict`
 * (`job.transitionConflict` when stale, `job.transitionRefused` when the status
 * does not allow it), each writing nothing.
 */
export async function transitionJob(
  // `reports` is read only for an agent's completion of a job that expects artifacts.
  deps: Using<Pick<JobRecords, "get" | "transition">, "clock" | "ids" | "flags" | "metrics"> & Partial<Pick<Deps, "reports">>,
  jobId: string,
  input: TransitionInput,
  actor: Actor,
): Promise<JobRecord> {
  assertJobId(jobId);
  const rule = TRANSITIONS[input.action];
  if (actor.kind === "agent" && actor.jobId !== jobId) {
    throw new MamError("auth.forbidden", `this agent is bound to job ${actor.jobId}, not ${jobId}`);
  }
  if (!(rule.actors as readonly ActorKind[]).includes(actor.kind)) {
    throw new MamError("job.actionForbidden", `an ${actor.kind} may not ${input.action} a job; only ${rule.actors.join(" or ")} may`);
  }
  const fields = input.fields ?? {};
  const names = Object.keys(fields) as (keyof ProgressFields)[];
  if (names.length > 0 && !rule.fields) {
    throw new MamError("job.fieldNotAllowed", `${input.action} writes no fields; set ${names.join(", ")} with claim or progress`);
  }
  const denied = names.filter((n) => !(FIELD_WRITERS[n] as readonly ActorKind[]).includes(actor.kind));
  if (denied.length > 0) {
    throw new MamError("job.fieldNotAllowed", `an ${actor.kind} may not set ${denied.join(", ")}; only an operator may`, {
      issues: denied.map((d) => ({ path: `fields.${d}`, message: "operator only" })),
    });
  }

  const terminal = isTerminal(rule.to);
  if (actor.kind === "agent") {
    // What subscribers read is mam's to say: an agent reports what happened, not how it is announced.
    if (input.reason !== undefined) {
      throw new MamError("job.fieldNotAllowed", "an agent may not choose the reason subscribers read; only an operator may", {
        issues: [{ path: "reason", message: "operator only" }],
      });
    }
    if (terminal && input.notify === false) {
      throw new MamError(
        "job.fieldNotAllowed",
        `an agent may not suppress the notification of ${input.action}: every subscriber hears how a job ended`,
        {
          issues: [{ path: "notify", message: "an agent's terminal transition always notifies" }],
        },
      );
    }
  }

  // Subscribers hear how every job ended unless an operator says, in words, why not:
  // a silent terminal transition without a stated reason is refused, nothing written.
  if (terminal && input.notify === false && (input.reason === undefined || input.reason.trim() === "")) {
    throw new MamError("input.invalid", `suppressing the notification of ${input.action} needs a stated reason`, {
      issues: [{ path: "reason", message: "required with notify: false on a terminal transition" }],
    });
  }

  let expectedSeq: ExpectedSeq;
  let nextSeq: number;
  let current: JobRecord | undefined;
  if (deps.flags.engineCas) {
    if (input.expectedSeq === undefined) {
      throw new MamError("input.invalid", "expected_seq is required: every transition is compare-and-swap on transition_seq", {
        issues: [{ path: "expected_seq", message: "required" }],
      });
    }
    expectedSeq = input.expectedSeq;
    nextSeq = expectedSeq + 1;
  } else {
    // Rollback path (MAM_ENGINE_CAS=0): the caller's expected_seq is not checked,
    // the status still is. The intent's seq comes from a fresh read; a writer that
    // lands between the read and the write makes it trail the record (documented).
    expectedSeq = NO_CONCURRENCY_CHECK;
    current = await getJob(deps, jobId);
    nextSeq = current.transition_seq + 1;
  }

  /**
   * The record a decision on evidence is made from. It must be the one the write will
   * commit against: a stale caller is refused now, and under the rollback switch the
   * write is held to the seq read here, so nothing (expected_artifacts, say) can change
   * between what was checked and what commits.
   */
  const readForEvidence = async (): Promise<JobRecord> => {
    current ??= await getJob(deps, jobId);
    if (expectedSeq === null) expectedSeq = current.transition_seq;
    else if (current.transition_seq !== expectedSeq) throw conflictFor(current, expectedSeq, rule.from);
    return current;
  };

  const now = deps.clock.now().toISOString();
  const set: Record<string, unknown> = { ...fields, status: rule.to, updated_at: now };
  let evidence: EvidenceGuard = {};
  const prepared = input.finalized?.prepared;
  if (prepared !== undefined) {
    // The finalize commits with the transition: one write, so a refused transition
    // leaves no finalize visible, and a finalize for a superseded attempt is refused.
    const attemptId = prepared.manifest.attempt_id;
    set.finalized_report = {
      attempt_id: attemptId,
      report_sha256: prepared.manifest.sha256,
      manifest_sha256: prepared.manifestSha256,
      finalized_at: prepared.manifest.finalized_at,
    } satisfies FinalizedReport;
    evidence = { ...input.finalized?.guard, bump: true };
    if (rule.to === "completed") {
      const job = await readForEvidence();
      const missing = job.expected_artifacts.filter((k) => !prepared.manifest.side_effects.some((s) => s.kind === k));
      if (missing.length > 0) {
        throw new MamError("job.evidenceMissing", `no side-effect evidence for ${missing.join(", ")} (expected by the job): not completed`);
      }
      set.completed_evidence = {
        attempt_id: attemptId,
        report_sha256: prepared.manifest.sha256,
        manifest_sha256: prepared.manifestSha256,
        report_location: prepared.manifest.report_location,
        evidence_location: prepared.evidence,
        verified_at: now,
      } satisfies CompletedEvidence;
    }
  } else if (actor.kind === "agent" && rule.to === "completed") {
    // An agent's own completion of a job that expects artifacts rests on evidence, as
    // the gate's does: a verified manifest of its current attempt, committed under the
    // same evidence_seq condition, pinned in completed_evidence (completed_by stays absent).
    const job = await readForEvidence();
    if (job.expected_artifacts.length > 0) {
      const attemptId = job.latest_attempt;
      if (attemptId === undefined || attemptId !== actor.attemptId) {
        throw new MamError(
          "job.evidenceMissing",
          `job ${jobId} expects ${job.expected_artifacts.join(", ")}: completing it needs a finalized report of its latest attempt${attemptId === undefined ? ", and it has no recorded dispatch" : ` (${attemptId}), not attempt ${actor.attemptId}`}`,
        );
      }
      if (deps.reports === undefined) throw new MamError("internal", "an agent's completion on evidence needs the report store");
      const verified = await verifyFinalizedEvidence(deps.reports, {
        location: input.reportLocation ?? attemptReportLocation(jobId, attemptId),
        jobId,
        attemptId,
        expectedArtifacts: job.expected_artifacts,
        finalized: job.finalized_report,
      });
      if (!verified.ok) {
        throw new MamError(
          "job.evidenceMissing",
          `job ${jobId} expects ${job.expected_artifacts.join(", ")}: not completed, because ${verified.reason}`,
        );
      }
      set.completed_evidence = { ...verified.evidence, verified_at: now } satisfies CompletedEvidence;
      evidence = { seq: job.evidence_seq, attempt: attemptId };
    }
  }

  // An agent acts for its attempt only while that attempt is the job's latest: checked
  // in the write itself, so a token retired while its request was in flight commits nothing.
  if (actor.kind === "agent") evidence = { ...evidence, currentAttempt: actor.attemptId };

  const notify = input.notify ?? terminal;
  if (notify) set.pending_notification = newIntent(deps, rule.event, nextSeq, input.reason, actor.kind);
  // A claim, or an operator's change of what the gate reads, moves no evidence but may be
  // what a quiescent job lacked (the sweep held it pending, or not opted in, and cleared
  // its mark): the same write marks it due now, and the sweep's next pass asks the gate
  // (one evaluation a claim; the transition still reads no record).
  const marksDue = !terminal && (input.action === "claim" || GATE_FIELDS.some((f) => fields[f] !== undefined));
  const change: JobChange = {
    from: rule.from,
    set: set as JobChange["set"],
    ...(Object.keys(evidence).length === 0 ? {} : { evidence }),
    note: noteOf(actor),
    // Becoming running puts the job in the attention index, due now: the sweep's first
    // look sets its key from the whole record (its deadline, its activity).
    ...(input.action === "claim" ? { activity: { at: now, attention: now } } : {}),
    ...(marksDue ? { candidate: now } : {}),
  };
  const record = await deps.jobs.transition(jobId, expectedSeq, change);
  deps.metrics?.transition(input.action);
  return record;
}

/**
 * Bookkeeping: the only write that is not a state transition. It may write
 * exactly one field, `pending_notification` (B-41), and never bumps
 * `transition_seq`. Clearing an intent goes through `settleNotification`, which is
 * conditional on the intent that was sent.
 */
export async function bookkeeping(
  deps: Using<Pick<OwedNotifications, "replaceNotification">>,
  jobId: string,
  fields: Record<string, unknown>,
): Promise<void> {
  assertJobId(jobId);
  const others = Object.keys(fields).filter((k) => k !== "pending_notification");
  if (others.length > 0) {
    throw new MamError("bookkeeping.fieldRefused", `bookkeeping may not merge ${others.join(", ")}: it writes pending_notification only`, {
      issues: others.map((o) => ({ path: `fields.${o}`, message: "not writable by bookkeeping" })),
    });
  }
  if (!("pending_notification" in fields)) throw new MamError("input.invalid", "bookkeeping needs pending_notification");
  const intent = NotificationIntentSchema.safeParse(fields.pending_notification);
  if (!intent.success) {
    throw new MamError(
      "bookkeeping.fieldRefused",
      "bookkeeping may only replace pending_notification with a whole intent; clearing is settleNotification, conditional on the intent that was sent",
      { issues: zodIssues(intent.error, "fields.pending_notification") },
    );
  }
  // One conditional write; the store reports a missing job (`job.notFound`).
  await deps.jobs.replaceNotification(jobId, intent.data);
}
