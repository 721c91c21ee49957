/**
 * A frozen copy of `changeRowsOf` as core had it before the feed's rows were declared
 * as rules (packages/core/src/feed.ts at 25d1c6c, copied verbatim): the oracle the
 * rules' property tests compare against (tests/unit/feed-rules.test.ts,
 * tests/contract/sql-feed-rules.test.ts, tests/d1/sql-feed-rules.test.ts). Never edit
 * it to make a test pass: it is what the feed meant before the rules existed. The row
 * kinds added since (the observations') are written beside it, marked as such.
 */
import {
  type ChangeDraft,
  type ChangeKind,
  type ChangeNote,
  type JobRecord,
  type NotificationIntent,
  SERVICE_ACTOR,
  type Status,
} from "@mam/core";

/** Which action moved a job from `from` to `to` (the engine's table, read backwards). */
function actionOf(from: Status, to: Status): string {
  if (to === "running") return from === "pending" ? "claim" : "progress";
  if (to === "cancelled") return "cancel";
  return to;
}

const samePending = (a: NotificationIntent | undefined, b: NotificationIntent | undefined): boolean => a?.id === b?.id;

export function oracleChangeRowsOf(before: JobRecord | undefined, after: JobRecord, note: ChangeNote = {}): ChangeDraft[] {
  const actor = note.actor ?? SERVICE_ACTOR;
  const row = (kind: ChangeKind, extra: { intent_id?: string | undefined; data?: Record<string, string | number | boolean> } = {}) => ({
    job_id: after.job_id,
    kind,
    actor,
    ...(extra.intent_id === undefined ? {} : { intent_id: extra.intent_id }),
    ...(extra.data === undefined ? {} : { data: extra.data }),
  });
  if (before === undefined) return [row("job.registered", { data: { status: after.status } })];

  const rows: ChangeDraft[] = [];
  const superseded = (): void => {
    const old = before.pending_notification;
    const now = after.pending_notification;
    if (old !== undefined && now !== undefined && old.id !== now.id) {
      rows.push(row("intent.superseded", { intent_id: old.id, data: { by: now.id } }));
    }
  };
  const finalized = (): boolean => {
    const f = after.finalized_report;
    if (f === undefined || f.manifest_sha256 === before.finalized_report?.manifest_sha256) return false;
    rows.push(row("report.finalized", { data: { attempt_id: f.attempt_id, sha256: f.report_sha256 } }));
    return true;
  };

  if (after.transition_seq !== before.transition_seq) {
    const committed = samePending(before.pending_notification, after.pending_notification) ? undefined : after.pending_notification?.id;
    finalized();
    rows.push(
      row("job.transitioned", {
        intent_id: committed,
        data: { action: actionOf(before.status, after.status), status: after.status, transition_seq: after.transition_seq },
      }),
    );
    superseded();
    return rows;
  }
  if ((after.evidence_seq ?? 0) !== (before.evidence_seq ?? 0)) {
    if (after.latest_attempt !== undefined && after.latest_attempt !== before.latest_attempt) {
      return [row("dispatch.recorded", { data: { attempt_id: after.latest_attempt } })];
    }
    if (finalized()) return rows;
    const attempt = after.latest_attempt;
    const attemptData = attempt === undefined ? {} : { attempt_id: attempt };
    // Added with the observations (issue 20), beside the 25d1c6c copy: the kinds it did not know.
    if (note.observed !== undefined) {
      const { source, source_kind, state } = note.observed;
      return [row("observation.recorded", { data: { ...attemptData, source, source_kind, state } })];
    }
    if (note.overflowed !== undefined) {
      return [row("observation.overflowed", { data: { ...attemptData, source: note.overflowed.source, bound: note.overflowed.bound } })];
    }
    if (note.declared !== undefined) {
      return [row("report.upload_declared", { data: { ...attemptData, sha256: note.declared.sha256, bytes: note.declared.bytes } })];
    }
    return [
      row("report.staged", {
        data: {
          ...attemptData,
          ...(note.staged === undefined ? {} : { sha256: note.staged.sha256, bytes: note.staged.bytes }),
        },
      }),
    ];
  }

  // Added with the attention marks (issue 20, part 4), beside the 25d1c6c copy: bookkeeping
  // whose note says the sweep marked the job, after what its intent change says.
  const stale = note.marked?.mark === "stale";
  const since = stale ? after.stale_since : after.deadline_at;
  const marked: ChangeDraft[] =
    note.marked === undefined
      ? []
      : [
          row(stale ? "job.stale" : "job.overdue", {
            intent_id: after.pending_notification?.id,
            data: since === undefined ? {} : stale ? { since } : { deadline_at: since },
          }),
        ];
  return [...intentRows(), ...marked];

  function intentRows(): ChangeDraft[] {
    if (before === undefined) return [];
    const old = before.pending_notification;
    const now = after.pending_notification;
    if (old !== undefined && now === undefined) return [row("intent.published", { intent_id: old.id })];
    if (now === undefined) return [];
    if (old === undefined || old.id !== now.id) {
      superseded();
      return rows;
    }
    if (now.quarantined_at !== undefined && old.quarantined_at === undefined) {
      return [row("intent.quarantined", { intent_id: now.id, ...(now.last_error ? { data: { code: now.last_error.code } } : {}) })];
    }
    if ((now.failures ?? 0) > (old.failures ?? 0)) {
      return [row("intent.failed", { intent_id: now.id, data: { code: now.last_error?.code ?? "unknown" } })];
    }
    if (
      now.failures === undefined &&
      now.quarantined_at === undefined &&
      (old.failures !== undefined || old.quarantined_at !== undefined)
    ) {
      return [row("intent.released", { intent_id: now.id })];
    }
    return [];
  }
}
