import type { ChangeNote } from "./feed.ts";
import { type JobRecord, type LEASE_FIELDS, type NotificationIntent, STATUS, type Status } from "./schemas.ts";

/**
 * Every conditional write of a job record, as data core builds (`JobStoreBase`,
 * persistence.ts) and an adapter only compiles: to an `UPDATE … WHERE` (SQL), to a
 * `ConditionExpression` (DynamoDB), or, in the memory reference, evaluated by
 * `conditionHolds` and applied by `applyRecordWrite` below. No adapter decides what a
 * write requires or what it changes; each condition has a name, and its meaning is
 * the reference evaluator's.
 */

/**
 * The named "no concurrency check" sentinel (Emmett's `NO_CONCURRENCY_CHECK`): a
 * transition that does not compare `transition_seq` (the MAM_ENGINE_CAS=0 rollback
 * path). Its status condition still holds.
 */
export const NO_CONCURRENCY_CHECK = Symbol.for("mam.noConcurrencyCheck");
export type NoConcurrencyCheck = typeof NO_CONCURRENCY_CHECK;
/** What a transition expects of `transition_seq`: exactly this number, or no check. */
export type ExpectedSeq = number | NoConcurrencyCheck;

/** The two counters a write may bump by one. */
export type CounterField = "transition_seq" | "evidence_seq";

/** A lease's field on the record. */
export type LeaseField = (typeof LEASE_FIELDS)[keyof typeof LEASE_FIELDS];

/**
 * One condition on the stored record, by name. A write commits only if all of its
 * conditions hold, and the record exists (implicit in every write).
 */
export type RecordCondition =
  /** `transition_seq` is `seq`. */
  | { readonly kind: "transitionSeqIs"; readonly seq: number }
  /** `status` is one of `statuses` (none: never holds). */
  | { readonly kind: "statusIn"; readonly statuses: readonly Status[] }
  /** `evidence_seq` (absent: 0) is `seq`. */
  | { readonly kind: "evidenceSeqIs"; readonly seq: number }
  /** `latest_attempt` is `attempt` (absent: never holds). */
  | { readonly kind: "latestAttemptIs"; readonly attempt: number }
  /** `latest_attempt` is absent or `attempt`: the attempt is not superseded. */
  | { readonly kind: "latestAttemptAbsentOrIs"; readonly attempt: number }
  /** `latest_attempt` (absent: 0) is below `attempt`. */
  | { readonly kind: "latestAttemptBelow"; readonly attempt: number }
  /** `observations.rev` (no observations: 0) is `rev`. */
  | { readonly kind: "observationsRevIs"; readonly rev: number }
  /** `candidate_at` is `at`, exactly as stored (no mark: never holds). */
  | { readonly kind: "candidateIs"; readonly at: string }
  /** `attention_at` is `at`, exactly as stored (no key: never holds). */
  | { readonly kind: "attentionIs"; readonly at: string }
  /** The owed intent's id is `id` (none owed: never holds). */
  | { readonly kind: "intentIs"; readonly id: string }
  /** No intent is owed. */
  | { readonly kind: "noIntent" }
  /** `agent_usage` counts exactly `events` and `bytes` (absent: 0 and 0). */
  | { readonly kind: "usageIs"; readonly events: number; readonly bytes: number }
  /** The lease in `field` has id `id`. */
  | { readonly kind: "leaseHeldBy"; readonly field: LeaseField; readonly id: string }
  /**
   * The lease in `field` is free for `attempt` at `at`: absent, expired
   * (`expires_at <= at`, ISO strings of one format), or an older attempt's.
   */
  | { readonly kind: "leaseFree"; readonly field: LeaseField; readonly at: string; readonly attempt: number };

/** Where a record sits in the owed index: due at `at`, or quarantined since `at` (`sortableTime`). */
export interface OwedPlace {
  readonly part: "due" | "quarantined";
  /** `sortableTime` of `retry_at` (else `created_at`), or of `quarantined_at`. */
  readonly at: string;
  readonly intentId: string;
}

/**
 * The keys an adapter's indexes sort and find records by, derived by core from the
 * record (`keysOf`), never by an adapter: the listings' recency, and the owed index.
 * In a `RecordWrite`, a key absent is one the write does not move.
 */
export interface DerivedKeys {
  readonly status?: Status;
  /** `sortableTime(updated_at)`: the listings are newest first by it, then by job id. */
  readonly recency?: string;
  /** The owed-index place; `null`: out of the index (nothing owed). */
  readonly owed?: OwedPlace | null;
  /** `sortableTime(candidate_at)`: the candidate index's key; `null`: out of it (no mark). */
  readonly candidate?: string | null;
  /** `sortableTime(attention_at)`: the attention index's key (when the sweep next looks); `null`: out of it. */
  readonly attention?: string | null;
}

/**
 * One conditional write of one job record, as data. `set` replaces whole top-level
 * fields, `unset` removes them (never both for one field), `bump` adds one to each
 * counter named, `keys` are the derived keys that move with it. `feed` is the note of
 * a write the change feed tells (its rows are core's `changeRowsOf` of the record
 * before and after); absent, the write adds no row (quota and lease bookkeeping).
 */
export interface RecordWrite {
  readonly jobId: string;
  readonly conditions: readonly RecordCondition[];
  readonly set: Readonly<Record<string, unknown>>;
  readonly unset: readonly string[];
  readonly bump: readonly CounterField[];
  readonly keys: DerivedKeys;
  readonly feed?: ChangeNote;
}

/**
 * The counts per status (issue 22): how many jobs each status holds, kept by the
 * store with the writes (exactly, on SQLite and in memory) or after them from the
 * stream (eventually, on DynamoDB: the feed writer). The rule, once, for every store:
 *
 *   a create ........................ +1 to its status
 *   a write that moves `keys.status` ... -1 to the status it leaves, +1 to the one it
 *                                      enters, nothing when they are the same
 *   anything else (and a lost write) .. nothing
 *
 * Here in terms of the status a job is counted under before and after one committed
 * write (`undefined`: not counted — no record yet, or, on DynamoDB, an item from
 * before the counts that the migration has not marked yet).
 */
export interface StatusCountMove {
  readonly leave?: Status;
  readonly enter?: Status;
}

export function statusCountMove(before: Status | undefined, after: Status | undefined): StatusCountMove {
  if (before === after) return {};
  return { ...(before === undefined ? {} : { leave: before }), ...(after === undefined ? {} : { enter: after }) };
}

/**
 * The status a write's conditions pin the record to before it: the one status of its
 * single one-status `statusIn`; undefined where none does, or where two do (such a
 * write pins nothing it could rely on). Read by the feed's shape and by the counts.
 */
export function pinnedStatusOf(write: RecordWrite): Status | undefined {
  let pinned: Status | undefined;
  let pins = 0;
  for (const c of write.conditions) {
    if (c.kind === "statusIn" && c.statuses.length === 1) {
      pinned = c.statuses[0];
      pins++;
    }
  }
  return pins === 1 ? pinned : undefined;
}

/**
 * Whether a write may move the counts: one that sets the status key (the store
 * compares old and new), unless its condition pins the status it sets
 * (`pinnedStatusOf`, as `progress` from running to running): then old and new are
 * the same, and the store asks nothing.
 */
export function movesStatusCount(write: RecordWrite): boolean {
  const status = write.keys.status;
  return status !== undefined && pinnedStatusOf(write) !== status;
}

/** How many jobs each status holds. */
export type StatusCountsOf = Readonly<Record<Status, number>>;

/** Counts with every status present (0 where a store holds none). */
export function fullCounts(partial: Partial<Record<Status, number>>): StatusCountsOf {
  const out = {} as Record<Status, number>;
  for (const status of Object.values(STATUS)) out[status] = partial[status] ?? 0;
  return out;
}

/** `counts` after `move`. */
export function applyCountMove(counts: Partial<Record<Status, number>>, move: StatusCountMove): void {
  if (move.leave !== undefined) counts[move.leave] = (counts[move.leave] ?? 0) - 1;
  if (move.enter !== undefined) counts[move.enter] = (counts[move.enter] ?? 0) + 1;
}

/** A time as it compares as a string: UTC, fixed width (`toISOString`), so string order is time order. */
export function sortableTime(iso: string): string {
  // Asked several times a write of the same clock reading (the record's updated_at, its
  // log line's at): the last answer is kept.
  if (iso === lastTime.iso) return lastTime.sortable;
  const t = Date.parse(iso);
  const sortable = Number.isNaN(t) ? iso : new Date(t).toISOString();
  lastTime = { iso, sortable };
  return sortable;
}

let lastTime = { iso: "", sortable: "" };

/** Where `intent` sits in the owed index. */
export function owedPlaceOf(intent: NotificationIntent): OwedPlace {
  if (intent.quarantined_at !== undefined) return { part: "quarantined", at: sortableTime(intent.quarantined_at), intentId: intent.id };
  return { part: "due", at: sortableTime(intent.retry_at ?? intent.created_at), intentId: intent.id };
}

/** Every derived key of `record`, as a create writes them. */
export function keysOf(record: JobRecord): Required<DerivedKeys> {
  return {
    status: record.status,
    recency: sortableTime(record.updated_at),
    owed: record.pending_notification === undefined ? null : owedPlaceOf(record.pending_notification),
    candidate: record.candidate_at === undefined ? null : sortableTime(record.candidate_at),
    attention: record.attention_at === undefined ? null : sortableTime(record.attention_at),
  };
}

/** The reference meaning of one condition, on the stored record. */
export function conditionHolds(record: JobRecord, condition: RecordCondition): boolean {
  switch (condition.kind) {
    case "transitionSeqIs":
      return record.transition_seq === condition.seq;
    case "statusIn":
      return condition.statuses.includes(record.status);
    case "evidenceSeqIs":
      return (record.evidence_seq ?? 0) === condition.seq;
    case "latestAttemptIs":
      return record.latest_attempt === condition.attempt;
    case "latestAttemptAbsentOrIs":
      return record.latest_attempt === undefined || record.latest_attempt === condition.attempt;
    case "latestAttemptBelow":
      return (record.latest_attempt ?? 0) < condition.attempt;
    case "observationsRevIs":
      return (record.observations?.rev ?? 0) === condition.rev;
    case "candidateIs":
      return record.candidate_at === condition.at;
    case "attentionIs":
      return record.attention_at === condition.at;
    case "intentIs":
      return record.pending_notification?.id === condition.id;
    case "noIntent":
      return record.pending_notification === undefined;
    case "usageIs":
      return (record.agent_usage?.events ?? 0) === condition.events && (record.agent_usage?.bytes ?? 0) === condition.bytes;
    case "leaseHeldBy":
      return record[condition.field]?.id === condition.id;
    case "leaseFree": {
      const lease = record[condition.field];
      return lease === undefined || lease.expires_at <= condition.at || lease.attempt_id < condition.attempt;
    }
    default:
      return condition satisfies never;
  }
}

/** Whether every condition of `write` holds of `record`. */
export function writeHolds(record: JobRecord, write: RecordWrite): boolean {
  return write.conditions.every((c) => conditionHolds(record, c));
}

/** The record `write` makes of `record` (the reference: what every adapter's compiled write must store). */
export function applyRecordWrite(record: JobRecord, write: RecordWrite): JobRecord {
  const next: Record<string, unknown> = { ...record };
  for (const field of write.unset) delete next[field];
  for (const [field, value] of Object.entries(write.set)) next[field] = structuredClone(value);
  for (const counter of write.bump) next[counter] = ((record[counter] as number | undefined) ?? 0) + 1;
  return next as JobRecord;
}

/** The reference meaning of a marked listing's filter (`JobListing`'s `mark`): whether `record` carries the mark. */
export function carriesMark(record: JobRecord, mark: "stale" | "overdue" | "candidate", dueBy: string | undefined): boolean {
  switch (mark) {
    case "stale":
      return record.stale_since !== undefined;
    case "overdue":
      return record.overdue_since !== undefined;
    case "candidate":
      return record.candidate_at !== undefined && dueBy !== undefined && sortableTime(record.candidate_at) <= dueBy;
    default:
      return mark satisfies never;
  }
}
