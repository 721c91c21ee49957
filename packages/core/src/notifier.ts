import type { SweepPolicy } from "./config.ts";
import type { Actor, Using } from "./deps.ts";
import { getJob } from "./engine.ts";
import { type ErrorCode, isMamError, MamError } from "./errors.ts";
import { noteOf } from "./feed.ts";
import type { LogEvent } from "./logger.ts";
import type { JobEventLog, JobRecords, OwedNotifications } from "./ports.ts";
import { type EventLogEntry, JOB_ID_PATTERN, type JobRecord, type NotificationIntent, NotificationIntentSchema } from "./schemas.ts";

/** What a flush touches: the owed notification, the event log (every publish attempt is logged), the record, the broker. */
export type NotifierDeps = Using<OwedNotifications & JobEventLog & Pick<JobRecords, "get">, "publisher" | "clock" | "ids" | "metrics">;

/**
 * Notifications are durable intents: committed with the state in the same
 * conditional write, published after the commit, settled only on the exact
 * intent that was sent. At least once on the wire; consumers drop duplicates by
 * `data.notification_intent.id`.
 *
 *   commit(state + intent) ... publish ... ack ... settle(intent.id)
 *                 ^ crash here: the sweep finds the intent owed and sends it again
 */
export const jobTopic = (jobId: string): string => `mam/jobs/${jobId}/events`;
export const FAN_IN_TOPIC = "mam/events";

/** A type, not an interface: it is a JSON value as it stands (the published line keeps it). */
export type NotificationPayload = {
  readonly event: string;
  readonly job_id: string;
  readonly seq: number;
  readonly at: string;
  readonly data: {
    readonly notification_intent: { readonly id: string; readonly seq: number };
    readonly status: string;
    readonly completed_by?: string;
    readonly reason?: string;
    /** Who caused the change (for a terminal one, who ended the job): agent, operator or gate. */
    readonly by?: string;
    /** A completion whose quiescence rests on the agent's own sources alone says so: `agent-attested`. */
    readonly quiescence?: string;
    /** A completion on recorded evidence: the policy's rule and the sources it rested on (`watcher:herdr-1`). */
    readonly rule?: string;
    readonly sources?: string[];
  };
};

/** Identifiers and status only, never report contents: it always fits IoT Core's 128 KB. */
export function notificationPayload(record: JobRecord, intent: NotificationIntent): NotificationPayload {
  return {
    event: intent.event,
    job_id: record.job_id,
    seq: intent.seq,
    at: intent.created_at,
    data: {
      notification_intent: { id: intent.id, seq: intent.seq },
      status: record.status,
      ...(record.completed_by === undefined ? {} : { completed_by: record.completed_by }),
      ...(intent.reason === undefined ? {} : { reason: intent.reason }),
      ...(intent.by === undefined ? {} : { by: intent.by }),
      ...(record.completed_evidence?.quiescence === undefined ? {} : { quiescence: record.completed_evidence.quiescence }),
      ...(record.completed_evidence?.rule === undefined ? {} : { rule: record.completed_evidence.rule }),
      ...(record.completed_evidence?.sources === undefined ? {} : { sources: [...record.completed_evidence.sources] }),
    },
  };
}

export type FlushResult =
  | { readonly outcome: "nothing_owed" }
  | { readonly outcome: "sent"; readonly intent: NotificationIntent; readonly settled: boolean }
  | { readonly outcome: "failed"; readonly intent: NotificationIntent; readonly error: MamError };

export const flushed = (r: FlushResult): boolean => r.outcome !== "failed";

function asPublishError(e: unknown): MamError {
  if (isMamError(e)) return e;
  return new MamError("publish.unreachable", `publish failed: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
}

/**
 * Publish the job's owed intent (if any), record the attempt in its event log
 * whatever the outcome, and settle on success. A failed send leaves the intent
 * owed; the committed state is never touched.
 */
export async function flushNotification(deps: NotifierDeps, jobId: string): Promise<FlushResult> {
  const record = await deps.jobs.get(jobId);
  if (!record) throw new MamError("job.notFound", `job ${jobId} does not exist`);
  return flushRecord(deps, record);
}

export async function flushRecord(deps: NotifierDeps, record: JobRecord): Promise<FlushResult> {
  const intent = record.pending_notification;
  if (!intent) return { outcome: "nothing_owed" };
  const payload = notificationPayload(record, intent);
  const body = JSON.stringify(payload);
  let error: MamError | undefined;
  // A monotonic timer, not deps.clock: the latency is measured, never decided on.
  const started = performance.now();
  // The job's topic, then the fan-in, one after the other: a subscriber sees an
  // intent on its job's topic first, and a refused job topic sends nothing on the
  // fan-in (the intent stays owed and goes out whole on its retry). Sending both at
  // once saved a round trip in bench/notify but broke both.
  try {
    await deps.publisher.publish(jobTopic(record.job_id), body);
    await deps.publisher.publish(FAN_IN_TOPIC, body);
    deps.metrics?.publishLatency(performance.now() - started);
  } catch (e) {
    error = asPublishError(e);
  }
  const entry: EventLogEntry = {
    job_id: record.job_id,
    at: deps.clock.now().toISOString(),
    id: deps.ids.uuid(),
    event: "published",
    data: {
      // What was sent: `body` is this payload's JSON, and a store keeps the line as JSON.
      payload,
      outcome: error ? "failed" : "acknowledged",
      ...(error ? { error: error.message, code: error.code } : {}),
    },
  };
  if (error) {
    await deps.jobs.appendEvent(entry);
    deps.metrics?.intent("failed");
    return { outcome: "failed", intent, error };
  }
  // The log line and the settle in one write (where the store has transactions).
  const settled = await deps.jobs.settlePublished(entry, intent.id);
  // Settled here, or by a peer meanwhile (a newer intent survives): this one is delivered either way.
  deps.metrics?.intent("settled");
  return { outcome: "sent", intent, settled };
}

/** Clear the owed intent iff it is still `sent` (B-39: a newer intent survives). */
export async function settleNotification(
  deps: Using<Pick<OwedNotifications, "settleNotification">>,
  jobId: string,
  sent: NotificationIntent,
): Promise<boolean> {
  return deps.jobs.settleNotification(jobId, sent.id);
}

export const DEFAULT_SWEEP_POLICY: SweepPolicy = { maxFailures: 5, backoffMs: 60_000 };

/** The wait before the next try after `failures` failures: base, 2×, 4×, ... capped at 64× the base. */
export function backoffAfter(policy: SweepPolicy, failures: number): number {
  return policy.backoffMs * 2 ** Math.min(Math.max(failures - 1, 0), 6);
}

export const SWEEP_OUTCOMES = {
  /** Published and settled (or settled by a peer meanwhile). */
  sent: "sent",
  /** Failed for a reason of its own; counted, tried again after `retry_at`. */
  failed: "failed",
  /** Failed for the N-th time: still owed, not tried again until an operator releases it. */
  quarantined: "quarantined",
  /**
   * The broker or the store could not be reached (a publish that timed out under
   * congestion included): nobody's fault, not counted toward quarantine. The sweep
   * goes on after an unreachable publish and stops after an unreachable store.
   */
  deferred: "deferred",
  /** Not tried: the sweep stopped before it (the store could not be reached, or the pass's time budget was spent). */
  not_tried: "not_tried",
} as const;
export type SweepOutcome = (typeof SWEEP_OUTCOMES)[keyof typeof SWEEP_OUTCOMES];

export interface IntentOutcome {
  readonly job_id: string;
  readonly intent_id: string;
  readonly outcome: SweepOutcome;
  readonly error?: { readonly code: ErrorCode; readonly message: string };
  /** Failures of its own so far (failed, quarantined). */
  readonly failures?: number;
  /** When the sweep tries it next (failed). */
  readonly retry_at?: string;
}

export interface RecoveryResult {
  /** Owed intents due now that the sweep read (quarantined ones are never read). */
  readonly owed: number;
  readonly sent: number;
  /** Tried and not delivered, still owed and due again later (outcomes `failed` and `deferred`). */
  readonly failed: number;
  /** Quarantined by this sweep. */
  readonly quarantined: number;
  readonly not_tried: number;
  /** One per intent read, in the order tried. */
  readonly results: readonly IntentOutcome[];
}

export interface RecoverOptions {
  /** At most this many owed intents per sweep (default 1000). */
  readonly limit?: number;
  readonly policy?: SweepPolicy;
  /**
   * Take only intents due at least this long ago (default 0: everything due now). Every
   * composition root passes MAM_SWEEP_GRACE_SECONDS, so the sweep leaves a fresh
   * intent to the path that publishes each commit (the change relay, the stream
   * publisher, the command itself) instead of racing it into a duplicate. Measured on
   * the owed index's own key — `created_at`, or `retry_at` once a failure was recorded
   * — by the deps' clock, and asked of the index (`dueBy`), never filtered after reading.
   *
   *   commit ──relay/stream publishes──> settled
   *     |<──────── grace ────────>| sweep may take it from here
   */
  readonly graceMs?: number;
  /**
   * Receives one entry per intent quarantined and per unexpected error (whose message
   * stays in the log: the answer and the record say only `internal`); the composition
   * root writes each as a log line (`logEvent`).
   */
  readonly log?: (entry: LogEvent) => void;
  /**
   * The pass's time budget (MAM_SWEEP_BUDGET_SECONDS; default none): once spent, the
   * intents not yet tried are left `not_tried`, owed for the next pass. A flood that
   * slows every publish then delays notifications; it never holds a pass for ever.
   */
  readonly budgetMs?: number;
  /** Milliseconds on a monotonic clock, for the budget (default `performance.now`). */
  readonly elapsedClock?: () => number;
}

/**
 * Failures that say nothing about the intent: the broker or the store could not be
 * reached or throttled. They never count toward quarantine. After an unreachable
 * store the sweep stops (every intent after it would meet the same wall, and none
 * could even be recorded); after an unreachable publish it goes on: a publish that
 * timed out because the broker was congested says nothing of the next one, and
 * stopping there let a flood hold back every intent behind the first (issue 17).
 * The pass's time budget bounds what a broker that is really down costs.
 */
const NOBODYS_FAULT: ReadonlySet<ErrorCode> = new Set(["publish.unreachable", "store.unavailable"]);
const STOPS_THE_SWEEP: ReadonlySet<ErrorCode> = new Set(["store.unavailable"]);

/**
 * The recovery sweep: re-send every owed notification that is due, found through the
 * owed index (its cost is the number owed and due, not the number of jobs). Each
 * intent is handled on its own: whatever it throws is caught and counted for it
 * alone, so no record can stop the sweep or starve the others.
 *
 *   owed & due ──flush──> sent ............................ settled
 *              └─fails (its own reason)──> failures+1, retry_at = now + backoff
 *                        └─ failures == N ──> quarantined (still owed, listed, log line)
 *              └─broker unreachable (or congested)──> deferred, not counted; the sweep goes on
 *              └─store unreachable──> deferred, not counted; the rest not_tried
 *   the pass's time budget spent ──> the rest not_tried
 *
 * Its bookkeeping writes only `pending_notification`, conditional on the exact
 * intent id (B-39, B-41): an intent settled or superseded meanwhile is left alone.
 * Idempotent: an intent settled meanwhile is simply not found owed again.
 */
export async function recoverNotifications(deps: NotifierDeps, opts: RecoverOptions = {}): Promise<RecoveryResult> {
  const policy = opts.policy ?? DEFAULT_SWEEP_POLICY;
  const now = deps.clock.now();
  const graceMs = opts.graceMs ?? 0;
  if (!Number.isInteger(graceMs) || graceMs < 0)
    throw new MamError("internal", `the sweep's grace must be whole milliseconds >= 0, not ${graceMs}`);
  const owed = await deps.jobs.listOwed(opts.limit ?? 1000, { dueBy: new Date(now.getTime() - graceMs).toISOString() });
  deps.metrics?.oldestOwedIntentAge(oldestAgeSeconds(owed, now));
  const results: IntentOutcome[] = [];
  const elapsed = opts.elapsedClock ?? (() => performance.now());
  const startedAt = elapsed();
  const overBudget = () => opts.budgetMs !== undefined && elapsed() - startedAt >= opts.budgetMs;
  let stopped = false;
  for (const record of owed) {
    if (!stopped && overBudget()) stopped = true;
    const intentId = String(record.pending_notification?.id ?? "");
    if (stopped) {
      results.push({ job_id: record.job_id, intent_id: intentId, outcome: "not_tried" });
      continue;
    }
    let result: IntentOutcome;
    try {
      result = await recoverOne(deps, record, policy, now, opts.log);
    } catch (e) {
      // recoverOne catches what the intent's own steps throw; this is the last net
      // (a log sink that throws, say), so one intent still cannot end the sweep.
      const error = asSweepError(e, { job_id: String(record.job_id), intent_id: intentId }, "sweeping", undefined);
      result = {
        job_id: String(record.job_id),
        intent_id: intentId,
        outcome: "failed",
        error: { code: error.code, message: error.message },
      };
    }
    results.push(result);
    stopped = result.outcome === "deferred" && result.error !== undefined && STOPS_THE_SWEEP.has(result.error.code);
  }
  const count = (...outcomes: SweepOutcome[]) => results.filter((r) => outcomes.includes(r.outcome)).length;
  return {
    owed: owed.length,
    sent: count("sent"),
    failed: count("failed", "deferred"),
    quarantined: count("quarantined"),
    not_tried: count("not_tried"),
    results,
  };
}

async function recoverOne(
  deps: NotifierDeps,
  record: JobRecord,
  policy: SweepPolicy,
  now: Date,
  log: RecoverOptions["log"],
): Promise<IntentOutcome> {
  const intent = record.pending_notification;
  const base = { job_id: record.job_id, intent_id: String(intent?.id ?? "") };
  let error: MamError;
  try {
    assertFlushable(record);
    const r = await flushRecord(deps, record);
    if (r.outcome !== "failed") return { ...base, outcome: "sent" };
    error = r.error;
  } catch (e) {
    error = asSweepError(e, base, "flushing", log);
  }
  const reported = { code: error.code, message: error.message };
  if (NOBODYS_FAULT.has(error.code)) return { ...base, outcome: "deferred", error: reported };
  if (intent === undefined || typeof intent.id !== "string") return { ...base, outcome: "failed", error: reported };

  const failures = (intent.failures ?? 0) + 1;
  const at = now.toISOString();
  const { retry_at: _retry, quarantined_at: _quarantined, ...rest } = intent;
  const lastError = { code: error.code, message: error.message.slice(0, 1024), at };
  const quarantine = failures >= policy.maxFailures;
  const retryAt = new Date(now.getTime() + backoffAfter(policy, failures)).toISOString();
  const revised: NotificationIntent = quarantine
    ? { ...rest, failures, quarantined_at: at, last_error: lastError }
    : { ...rest, failures, retry_at: retryAt, last_error: lastError };
  let written: boolean;
  try {
    written = await deps.jobs.reviseNotification(record.job_id, revised);
  } catch (e) {
    // The failure could not be recorded either: the intent stays as it was, due
    // again on the next sweep. A store that cannot be reached stops the sweep as an
    // unreachable broker does; anything else is reported for this intent alone.
    const bookkeeping = asSweepError(e, base, "recording a failure", log);
    if (NOBODYS_FAULT.has(bookkeeping.code)) {
      return { ...base, outcome: "deferred", error: { code: bookkeeping.code, message: bookkeeping.message } };
    }
    return {
      ...base,
      outcome: "failed",
      error: { code: error.code, message: `${error.message}; recording the failure failed too: ${bookkeeping.message}` },
      failures,
    };
  }
  if (!written) return { ...base, outcome: "failed", error: reported, failures };
  if (quarantine) {
    deps.metrics?.intent("quarantined");
    log?.({ level: "warn", event: "notification_quarantined", job_id: record.job_id, intent_id: intent.id, failures, error: reported });
    return { ...base, outcome: "quarantined", error: reported, failures };
  }
  return { ...base, outcome: "failed", error: reported, failures, retry_at: retryAt };
}

/**
 * The age of the oldest intent among those owed and due (`created_at`, whatever its
 * retries since), in whole seconds; 0 when none is owed. Quarantined intents are
 * counted apart (IntentsQuarantined) and listed by the operator's own query.
 */
function oldestAgeSeconds(owed: readonly JobRecord[], now: Date): number {
  let oldest = now.getTime();
  for (const record of owed) {
    const at = Date.parse(String(record.pending_notification?.created_at ?? ""));
    if (Number.isFinite(at) && at < oldest) oldest = at;
  }
  return Math.floor((now.getTime() - oldest) / 1000);
}

/** What the payload and the topic read: an owed record the sweep cannot read is a failure of its own, never a publish. */
function assertFlushable(record: JobRecord): void {
  if (typeof record.job_id !== "string" || !JOB_ID_PATTERN.test(record.job_id)) {
    throw new MamError("internal", `an owed record's job id ${JSON.stringify(String(record.job_id)).slice(0, 80)} is not readable`);
  }
  const intent = NotificationIntentSchema.safeParse(record.pending_notification);
  if (!intent.success) throw new MamError("internal", `the owed notification of job ${record.job_id} is not readable`);
}

/**
 * A MamError as it is; anything else becomes `internal`, its own message kept for the
 * log alone (it may name server paths or internals an answer must not show).
 */
function asSweepError(
  e: unknown,
  intent: { readonly job_id: string; readonly intent_id: string },
  doing: string,
  log: RecoverOptions["log"],
): MamError {
  if (isMamError(e)) return e;
  log?.({
    level: "error",
    event: "notification_sweep_error",
    ...intent,
    while: doing,
    error: e instanceof Error ? { name: e.name, message: e.message, stack: e.stack } : String(e),
  });
  return new MamError("internal", `an unexpected error while ${doing} (logged by the sweep)`, { cause: e });
}

export interface ReleaseResult {
  /** True when the owed intent was cleared to be tried again by the next sweep. */
  readonly released: boolean;
  readonly reason: string;
  /** The record as it stands after the release. */
  readonly record: JobRecord;
}

/**
 * An operator's release: clear the owed intent's failure count, backoff and
 * quarantine, so the next sweep tries it at once. Bookkeeping, conditional on the
 * intent id (the one given, else the one read): an intent superseded meanwhile is
 * left alone, and releasing twice does no harm.
 */
export async function releaseNotification(
  deps: Using<OwedNotifications & Pick<JobRecords, "get">>,
  jobId: string,
  opts: { intentId?: string; actor?: Actor } = {},
): Promise<ReleaseResult> {
  const record = await getJob(deps, jobId);
  const intent = record.pending_notification;
  if (intent === undefined) return { released: false, reason: `job ${jobId} owes no notification`, record };
  if (opts.intentId !== undefined && opts.intentId !== intent.id) {
    return { released: false, reason: `job ${jobId} owes notification ${intent.id}, not ${opts.intentId}`, record };
  }
  const { failures: _f, retry_at: _r, quarantined_at: quarantinedAt, ...cleared } = intent;
  if (!(await deps.jobs.reviseNotification(jobId, cleared, opts.actor === undefined ? undefined : noteOf(opts.actor)))) {
    const current = (await deps.jobs.get(jobId)) ?? record;
    return { released: false, reason: `the notification owed by job ${jobId} changed meanwhile; read it again`, record: current };
  }
  return {
    released: true,
    reason:
      quarantinedAt === undefined
        ? `notification ${intent.id} will be tried by the next sweep`
        : `notification ${intent.id}, quarantined since ${quarantinedAt}, will be tried by the next sweep`,
    record: { ...record, pending_notification: cleared },
  };
}
