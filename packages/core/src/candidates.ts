import { DEFAULT_SETTLE_WINDOW_MS, evidenceFor } from "./allowlist.ts";
import { type AttentionDeps, type AttentionResult, readOf, reviewAttention } from "./attention.ts";
import type { Using } from "./deps.ts";
import { isMamError, MamError } from "./errors.ts";
import { type GateDeps, RECORDED } from "./gate.ts";
import type { LogEvent } from "./logger.ts";
import { type RecoverOptions, type RecoveryResult, recoverNotifications } from "./notifier.ts";
import type { JobEventLog, JobRecords, OwedNotifications, ReportStore } from "./ports.ts";
import type { JobRecord } from "./schemas.ts";
import { evaluateJob } from "./services.ts";

/**
 * Scheduled evaluation (issue 20): the sweep's second part, after its owed
 * notifications. A job whose recorded evidence may now complete it carries a
 * candidate mark (`candidate_at`, set by the evidence write that made it so: an
 * observation, a repeat whose span now covers the settle window, a finalize); the
 * sweep reads the marks due, oldest first, through their sparse index, and asks the
 * gate of each on the scenario it builds from what mam recorded.
 *
 *   owed notifications (never limited by what follows)
 *     -> due candidates, at most `evaluations` read, until `bytes` of reports hashed
 *          committed ........ the completion's terminal write removed the mark
 *          held ............. mark cleared iff evidence_seq, the observation rev and
 *                             transition_seq are still what the gate read (an observation,
 *                             a claim or an opt-in meanwhile keeps it due)
 *          lost the race .... left as it is (the write that won moved it)
 *          finalize running . left due, not evaluated (its lease may still be promoting the tree)
 *
 * With MAM_AUTO_COMPLETE=0 nothing is read, evaluated or cleared. A candidate's own
 * failure is counted for it alone; an unreachable store stops the part (the rest
 * `not_tried`), as it stops the notifications.
 */

export interface EvaluationBudget {
  /** At most this many candidates read and evaluated per pass (0: none). */
  readonly evaluations: number;
  /** Stop starting evaluations once the gate has hashed this many bytes of reports in the pass. */
  readonly bytes: number;
}

export const CANDIDATE_OUTCOMES = ["completed", "held", "kept", "lost_race", "failed", "not_tried"] as const;
export type CandidateOutcome = (typeof CANDIDATE_OUTCOMES)[number];

export interface CandidateResult {
  readonly job_id: string;
  readonly outcome: CandidateOutcome;
  /** The gate's answer (completed, held, lost), or why it was not evaluated. */
  readonly reason?: string;
}

export interface EvaluationResult {
  /** Candidates due that the pass read (at most the budget's evaluations). */
  readonly due: number;
  readonly completed: number;
  readonly held: number;
  /** Not evaluated (a finalize in progress), or lost its race: still a candidate. */
  readonly kept: number;
  readonly failed: number;
  readonly not_tried: number;
  /** Bytes of reports the gate hashed in the pass. */
  readonly bytes_hashed: number;
  /** The pass evaluated nothing because auto-completion is off (MAM_AUTO_COMPLETE=0). */
  readonly disabled?: true;
  readonly results: readonly CandidateResult[];
}

export type CandidateDeps = GateDeps & {
  readonly jobs: GateDeps["jobs"] & Pick<JobRecords, "listCandidates" | "clearCandidate" | "postponeCandidate">;
};

export interface EvaluateCandidatesOptions {
  readonly budget: EvaluationBudget;
  /** One entry per candidate that failed unexpectedly (its message stays in the log). */
  readonly log?: (entry: LogEvent) => void;
}

/** The due candidates, evaluated within `budget` (see above). */
export async function evaluateDueCandidates(deps: CandidateDeps, opts: EvaluateCandidatesOptions): Promise<EvaluationResult> {
  const { evaluations, bytes } = opts.budget;
  if (!Number.isSafeInteger(evaluations) || evaluations < 0 || !Number.isSafeInteger(bytes) || bytes < 1) {
    throw new MamError("internal", `an evaluation budget is whole evaluations >= 0 and bytes >= 1, not ${evaluations} and ${bytes}`);
  }
  const empty = { due: 0, completed: 0, held: 0, kept: 0, failed: 0, not_tried: 0, bytes_hashed: 0, results: [] };
  if (!deps.flags.autoComplete) return { ...empty, disabled: true };
  if (evaluations === 0) return empty;
  const now = deps.clock.now();
  const due = await deps.jobs.listCandidates(evaluations, { dueBy: now.toISOString() });
  const meter = { bytes: 0 };
  const metered: CandidateDeps = { ...deps, reports: meteredReports(deps.reports, meter) };
  const results: CandidateResult[] = [];
  let stopped = false;
  for (const job of due) {
    if (stopped || meter.bytes >= bytes) {
      results.push({ job_id: job.job_id, outcome: "not_tried" });
      continue;
    }
    let result: CandidateResult;
    try {
      result = await evaluateOne(metered, job, now);
    } catch (e) {
      const code = isMamError(e) ? e.code : "internal";
      const message = e instanceof Error ? e.message : String(e);
      opts.log?.({ level: "error", event: "candidate_failed", job_id: job.job_id, code, message });
      stopped = code === "store.unavailable";
      // A candidate that fails goes behind the others too (best effort: the store may be what failed).
      if (!stopped) await postpone(metered, job, now).catch(() => undefined);
      result = { job_id: job.job_id, outcome: "failed", reason: isMamError(e) ? message : "internal error (see the log)" };
    }
    results.push(result);
  }
  const count = (outcome: CandidateOutcome) => results.filter((r) => r.outcome === outcome).length;
  return {
    due: due.length,
    completed: count("completed"),
    held: count("held"),
    kept: count("kept") + count("lost_race"),
    failed: count("failed"),
    not_tried: count("not_tried"),
    bytes_hashed: meter.bytes,
    results,
  };
}

async function evaluateOne(deps: CandidateDeps, job: JobRecord, now: Date): Promise<CandidateResult> {
  const lease = job.finalize_in_progress;
  if (lease !== undefined && Date.parse(lease.expires_at) > now.getTime()) {
    await postpone(deps, job, now);
    return { job_id: job.job_id, outcome: "kept", reason: `a finalize of attempt ${lease.attempt_id} is in progress` };
  }
  const answer = await evaluateJob(deps, job.job_id, RECORDED, { job });
  if (answer.committed) return { job_id: job.job_id, outcome: "completed", reason: answer.reason };
  if (answer.lostRace === true) {
    await postpone(deps, job, now);
    return { job_id: job.job_id, outcome: "lost_race", reason: answer.reason };
  }
  // A hold: the mark goes until the evidence moves (conditionally on what the gate read).
  const cleared = await deps.jobs.clearCandidate(job.job_id, readOf(job));
  if (cleared) return { job_id: job.job_id, outcome: "held", reason: answer.reason };
  // Its evidence moved while the gate held: still a candidate, but behind the others.
  await postpone(deps, job, now);
  return { job_id: job.job_id, outcome: "kept", reason: `${answer.reason}; its evidence moved meanwhile: due again in a settle window` };
}

/**
 * A candidate the sweep could not settle (its evidence moved while the gate held, it
 * lost its race, its finalize is in progress, its evaluation failed) goes behind the
 * others: due again one settle window from now, if its mark is still the one read (an
 * evidence write that moved it meanwhile keeps its own). Without it, such a job would
 * keep its old due time and head every pass, oldest first, and an agent that kept its
 * job's evidence moving could take the whole budget (review finding).
 */
async function postpone(deps: CandidateDeps, job: JobRecord, now: Date): Promise<void> {
  if (job.candidate_at === undefined) return;
  const windowMs = evidenceFor(job.agent)?.settleWindowMs ?? DEFAULT_SETTLE_WINDOW_MS;
  await deps.jobs.postponeCandidate(job.job_id, job.candidate_at, new Date(now.getTime() + windowMs).toISOString());
}

/** `reports` counting the bytes the gate hashes and reads through it into `meter` (every other method as it is). */
function meteredReports(reports: ReportStore, meter: { bytes: number }): ReportStore {
  const metered: Partial<ReportStore> = {
    hash: async (location, name) => {
      const hashed = await reports.hash(location, name);
      if (hashed !== undefined) meter.bytes += hashed.bytes;
      return hashed;
    },
    getBytes: async (location, name) => {
      const got = await reports.getBytes(location, name);
      if (got !== undefined) meter.bytes += got.byteLength;
      return got;
    },
    read: async (location, name) => {
      const stream = await reports.read(location, name);
      if (stream === undefined) return undefined;
      return (async function* () {
        for await (const chunk of stream) {
          meter.bytes += chunk.byteLength;
          yield chunk;
        }
      })();
    },
  };
  return new Proxy(reports, {
    get(target, prop, receiver) {
      if (typeof prop === "string" && Object.hasOwn(metered, prop)) return metered[prop as keyof ReportStore];
      const value = Reflect.get(target, prop, receiver);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** What one sweep pass did: the owed notifications first, then the due candidates, then the jobs due for attention. */
export interface SweepPassResult {
  readonly notifications: RecoveryResult;
  readonly candidates: EvaluationResult;
  readonly attention: AttentionResult;
}

export type SweepDeps = CandidateDeps &
  AttentionDeps &
  Using<OwedNotifications & JobEventLog & Pick<JobRecords, "get">, "publisher" | "clock" | "ids" | "metrics">;

/**
 * One sweep pass, the same on every root (the `mam serve` timer, the scheduled
 * function, `POST /v1/recovery-sweeps`): every owed notification due, within the
 * pass's time budget and never limited by evaluation; then the due candidates within
 * their own budget; then the jobs due for attention (stale, overdue: attention.ts).
 */
export async function sweepPass(
  deps: SweepDeps,
  opts: RecoverOptions & { readonly evaluation: EvaluationBudget },
): Promise<SweepPassResult> {
  const notifications = await recoverNotifications(deps, opts);
  const log = opts.log === undefined ? {} : { log: opts.log };
  const candidates = await evaluateDueCandidates(deps, { budget: opts.evaluation, ...log });
  // Stale and overdue marks owe notifications: the next pass (or the path that publishes each commit) sends them.
  const attention = await reviewAttention(deps, log);
  return { notifications, candidates, attention };
}
