import type { Flags } from "./config.ts";
import type { Using } from "./deps.ts";
import { newIntent } from "./engine.ts";
import { isMamError } from "./errors.ts";
import type { LogEvent } from "./logger.ts";
import type { AttentionExpectation, CandidateExpectation, JobRecords } from "./ports.ts";
import type { JobRecord } from "./schemas.ts";

/**
 * Stale and overdue jobs (issue 20, part 4). A running job carries `activity_at` (every
 * transition, dispatch, report write and new observation, and a `working` sighted
 * again, sets it) and, when its attempt's dispatch gave one, `deadline_at` (a
 * start-to-close timeout: MAM_DEADLINE_SECONDS by default). The sweep marks a job
 * **stale** once it had no activity for MAM_STALE_AFTER_SECONDS, and **overdue** once it
 * is past its deadline: each once, a mark conditional on what the sweep read, with a
 * feed row and one notification. Activity clears the stale mark; a new dispatch the
 * overdue one; a terminal write removes both.
 *
 * When to look is the attention index's key (`attention_at`), which only a claim, a
 * dispatch and the sweep move: an activity never does (no index write per
 * observation). The sweep, at each look, marks what is due and moves the key to the
 * next time anything could be:
 *
 *   claim ............... key = activity + stale window (or the deadline, if sooner)
 *   look, nothing due ... key = last activity + stale window (or the deadline)
 *   look, stale ......... mark stale; key = now + stale window (to see the activity that clears it)
 *   look, overdue ....... mark overdue; key as above, without the deadline
 *   terminal ............ every mark and the key removed, in the terminal write
 *
 * So a job is looked at about once per stale window while it is active, exactly when
 * it turns stale, and at its deadline. Overdue and stale apply to running jobs only: a
 * dispatched job no agent claimed stays `pending` (listed by status), and its deadline
 * is counted from the dispatch, so it is overdue as soon as it is claimed late.
 */

/** What the sweep read of `job` that a mark it writes is conditional on (every write that moves the job moves one of them). */
export function readOf(job: JobRecord): CandidateExpectation {
  return { transitionSeq: job.transition_seq, evidenceSeq: job.evidence_seq, observationsRev: job.observations?.rev ?? 0 };
}

/** When the sweep should next look at `job` (epoch ms): null when it is not running. */
export function nextLookOf(job: JobRecord, nowMs: number, flags: Pick<Flags, "attention">): number | null {
  if (job.status !== "running") return null;
  const staleMs = flags.attention.staleAfterSeconds * 1000;
  const activity = Date.parse(job.activity_at ?? job.updated_at);
  let at = job.stale_since === undefined ? activity + staleMs : Math.max(nowMs, activity) + staleMs;
  if (job.deadline_at !== undefined && job.overdue_since === undefined) at = Math.min(at, Date.parse(job.deadline_at));
  return at;
}

/** `nextLookOf` as the attention key a write leaves (ISO-8601, or null). */
export function attentionKeyOf(job: JobRecord, nowMs: number, flags: Pick<Flags, "attention">): string | null {
  const at = nextLookOf(job, nowMs, flags);
  return at === null ? null : new Date(at).toISOString();
}

/** A dispatch's deadline: its own `deadline_seconds`, else MAM_DEADLINE_SECONDS (0: none), from when it was recorded. */
export function deadlineOf(recordedAt: string, seconds: number | undefined, flags: Pick<Flags, "attention">): string | undefined {
  const s = seconds ?? flags.attention.deadlineSeconds;
  return s > 0 ? new Date(Date.parse(recordedAt) + s * 1000).toISOString() : undefined;
}

export const ATTENTION_OUTCOMES = ["stale", "overdue", "rekeyed", "lost_race", "failed", "not_tried"] as const;
export type AttentionOutcome = (typeof ATTENTION_OUTCOMES)[number];

export interface AttentionResult {
  /** Jobs due for a look that the pass read. */
  readonly due: number;
  readonly stale: number;
  readonly overdue: number;
  /** Looked at, nothing due (or a due mark waiting for an owed intent to go): the key moved to the next look. */
  readonly rekeyed: number;
  readonly lost_race: number;
  readonly failed: number;
  readonly results: readonly { readonly job_id: string; readonly outcome: AttentionOutcome }[];
}

/** At most this many jobs looked at per sweep pass (each a read and at most one write; no report is read). */
export const ATTENTION_PER_PASS = 500;

export type AttentionDeps = Using<Pick<JobRecords, "listAttention" | "markAttention" | "rekeyAttention">, "clock" | "ids" | "flags">;

/**
 * The sweep's look at the jobs due for attention, oldest due first: mark each stale or
 * overdue when it is (one mark a look: an overdue job that is also stale is marked
 * stale at a later look, once the overdue notification went: a mark never supersedes
 * an owed intent unsent, but an earlier mark of its own kind), else move its key. Each write is conditional on the status, sequences and observation rev
 * read: an activity meanwhile wins, and the job is looked at again when its key says.
 */
export async function reviewAttention(
  deps: AttentionDeps,
  opts: { readonly limit?: number; readonly log?: (entry: LogEvent) => void } = {},
): Promise<AttentionResult> {
  const now = deps.clock.now();
  const nowMs = now.getTime();
  const at = now.toISOString();
  const due = await deps.jobs.listAttention(opts.limit ?? ATTENTION_PER_PASS, { dueBy: at });
  const results: { job_id: string; outcome: AttentionOutcome }[] = [];
  let stopped = false;
  for (const job of due) {
    if (stopped) {
      results.push({ job_id: job.job_id, outcome: "not_tried" });
      continue;
    }
    try {
      results.push({ job_id: job.job_id, outcome: await lookAt(deps, job, nowMs, at) });
    } catch (e) {
      const code = isMamError(e) ? e.code : "internal";
      opts.log?.({
        level: "error",
        event: "attention_failed",
        job_id: job.job_id,
        code,
        message: e instanceof Error ? e.message : String(e),
      });
      stopped = code === "store.unavailable";
      results.push({ job_id: job.job_id, outcome: "failed" });
    }
  }
  const count = (o: AttentionOutcome) => results.filter((r) => r.outcome === o).length;
  return {
    due: due.length,
    stale: count("stale"),
    overdue: count("overdue"),
    rekeyed: count("rekeyed"),
    lost_race: count("lost_race"),
    failed: count("failed") + count("not_tried"),
    results,
  };
}

async function lookAt(deps: AttentionDeps, job: JobRecord, nowMs: number, at: string): Promise<AttentionOutcome> {
  const expect: AttentionExpectation = {
    ...readOf(job),
    status: job.status,
    ...(job.attention_at === undefined ? {} : { attention: job.attention_at }),
  };
  const { flags } = deps;
  const running = job.status === "running";
  const overdue = running && job.deadline_at !== undefined && job.overdue_since === undefined && Date.parse(job.deadline_at) <= nowMs;
  const activity = Date.parse(job.activity_at ?? job.updated_at);
  const stale = running && job.stale_since === undefined && activity + flags.attention.staleAfterSeconds * 1000 <= nowMs;
  const owed = job.pending_notification;
  if ((overdue || stale) && owed !== undefined && !(owed.by === "sweep" && owed.event === (overdue ? "overdue" : "stale"))) {
    // A mark's intent would replace the one owed, unsent (the overdue one of the look
    // before, while a publisher lags or a broker is down; an operator's; a quarantined
    // one): the mark waits, and the job is looked at again when the owed one may have
    // gone. Only an earlier mark of the same kind, unsent, is replaced (it says less).
    const written = await deps.jobs.rekeyAttention(job.job_id, expect, deferredLook(owed, nowMs, flags));
    return written ? "rekeyed" : "lost_race";
  }
  if (overdue || stale) {
    const kind = overdue ? "overdue" : "stale";
    const marked: JobRecord = overdue ? { ...job, overdue_since: at } : { ...job, stale_since: at };
    const reason = overdue
      ? `past its deadline (${job.deadline_at})`
      : `no activity since ${job.activity_at ?? job.updated_at} (MAM_STALE_AFTER_SECONDS: ${flags.attention.staleAfterSeconds})`;
    const written = await deps.jobs.markAttention(job.job_id, {
      kind,
      at,
      expect,
      attention: attentionKeyOf(marked, nowMs, flags),
      intent: newIntent(deps, kind, job.transition_seq, reason, "sweep"),
      replaces: owed?.id ?? null,
      note: { actor: { type: "service" } },
    });
    return written ? kind : "lost_race";
  }
  const written = await deps.jobs.rekeyAttention(job.job_id, expect, attentionKeyOf(job, nowMs, flags));
  return written ? "rekeyed" : "lost_race";
}

/** While a job owes an intent, its due mark waits: the next look at the owed intent's retry (at most a stale window away), else a minute from now (a stale window when quarantined). */
export const OWED_DEFER_MS = 60_000;

function deferredLook(owed: NonNullable<JobRecord["pending_notification"]>, nowMs: number, flags: Pick<Flags, "attention">): string {
  const staleMs = flags.attention.staleAfterSeconds * 1000;
  if (owed.quarantined_at !== undefined) return new Date(nowMs + staleMs).toISOString();
  const retry = owed.retry_at === undefined ? Number.NaN : Date.parse(owed.retry_at);
  // A backoff may be long: never past a stale window from now.
  return new Date(retry > nowMs ? Math.min(retry, nowMs + staleMs) : nowMs + Math.min(OWED_DEFER_MS, staleMs)).toISOString();
}
