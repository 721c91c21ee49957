import type { Deps } from "./deps.ts";
import { isMamError, MamError } from "./errors.ts";
import type { JobRecord, NotificationIntent } from "./schemas.ts";

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

export interface NotificationPayload {
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
  };
}

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
export async function flushNotification(deps: Pick<Deps, "jobs" | "publisher" | "clock" | "ids">, jobId: string): Promise<FlushResult> {
  const record = await deps.jobs.get(jobId);
  if (!record) throw new MamError("job.notFound", `job ${jobId} does not exist`);
  return flushRecord(deps, record);
}

export async function flushRecord(deps: Pick<Deps, "jobs" | "publisher" | "clock" | "ids">, record: JobRecord): Promise<FlushResult> {
  const intent = record.pending_notification;
  if (!intent) return { outcome: "nothing_owed" };
  const payload = notificationPayload(record, intent);
  const body = JSON.stringify(payload);
  let error: MamError | undefined;
  try {
    await deps.publisher.publish(jobTopic(record.job_id), body);
    await deps.publisher.publish(FAN_IN_TOPIC, body);
  } catch (e) {
    error = asPublishError(e);
  }
  await deps.jobs.appendEvent({
    job_id: record.job_id,
    at: deps.clock.now().toISOString(),
    id: deps.ids.uuid(),
    event: "published",
    data: {
      payload: JSON.parse(body),
      outcome: error ? "failed" : "acknowledged",
      ...(error ? { error: error.message, code: error.code } : {}),
    },
  });
  if (error) return { outcome: "failed", intent, error };
  const settled = await deps.jobs.settleNotification(record.job_id, intent.id);
  return { outcome: "sent", intent, settled };
}

/** Clear the owed intent iff it is still `sent` (B-39: a newer intent survives). */
export async function settleNotification(deps: Pick<Deps, "jobs">, jobId: string, sent: NotificationIntent): Promise<boolean> {
  return deps.jobs.settleNotification(jobId, sent.id);
}

export interface RecoveryResult {
  readonly owed: number;
  readonly sent: number;
  readonly failed: number;
  readonly results: Readonly<Record<string, boolean>>;
}

/**
 * The recovery sweep: re-send every owed notification, found through the owed
 * index (its cost is the number owed, not the number of jobs). Idempotent: an
 * intent settled meanwhile is simply not found owed again.
 */
export async function recoverNotifications(
  deps: Pick<Deps, "jobs" | "publisher" | "clock" | "ids">,
  opts: { limit?: number } = {},
): Promise<RecoveryResult> {
  const owed = await deps.jobs.listOwed(opts.limit ?? 1000);
  const results: Record<string, boolean> = {};
  let sent = 0;
  let failed = 0;
  for (const record of owed) {
    const r = await flushRecord(deps, record);
    results[record.job_id] = flushed(r);
    if (r.outcome === "failed") failed++;
    else sent++;
  }
  return { owed: owed.length, sent, failed, results };
}
