/**
 * Writes of a job record for the feed rules' property tests: a record before (or none:
 * created), the record after, and the write's note. Each feed field of the record
 * after is kept from before or drawn afresh from a small pool, so every branch of the
 * feed is reached often and values collide (the same intent id with other marks, the
 * same manifest under another attempt, evidence_seq absent beside 0): created,
 * transitions with and without a finalize or a superseded intent, evidence writes
 * (dispatch, finalize, declared, staged, neither), and bookkeeping (settled,
 * quarantined, failed, released, superseded, nothing).
 */
import {
  type ChangeKind,
  type ChangeNote,
  CREATE_SHAPE,
  FEED_BEFORE_FIELDS,
  type FeedPins,
  type FeedWriteShape,
  type FinalizedReport,
  type JobRecord,
  type NotificationIntent,
  type Status,
} from "@mam/core";
import fc from "fast-check";
import { jobRecord } from "./records.ts";

export interface FeedWrite {
  readonly before: JobRecord | undefined;
  readonly after: JobRecord;
  readonly note: ChangeNote | undefined;
}

/** The seed every feed-rule property runs with, so a failure is the same failure on every machine. */
export const FEED_CASES_SEED = 20261202;

const STATUSES: readonly Status[] = ["pending", "running", "completed", "error", "cancelled"];
const AT = "2026-12-02T10:00:00.000Z";
const hex = (c: string) => c.repeat(64);

const FINALIZED: readonly FinalizedReport[] = [
  { attempt_id: 1, report_sha256: hex("a"), manifest_sha256: hex("1"), finalized_at: AT },
  { attempt_id: 2, report_sha256: hex("b"), manifest_sha256: hex("2"), finalized_at: AT },
  // The first one's manifest under another attempt: not a finalize.
  { attempt_id: 3, report_sha256: hex("c"), manifest_sha256: hex("1"), finalized_at: AT },
];

const KEEP = Symbol("keep");
type Keep = typeof KEEP;

/** Absent (`undefined`) or one of `values`. */
const maybe = <T>(values: readonly T[]): fc.Arbitrary<T | undefined> => fc.constantFrom<T | undefined>(undefined, ...values);
/** Mostly kept from before, else drawn from `fresh`. */
const keepOr = <T>(fresh: fc.Arbitrary<T>): fc.Arbitrary<T | Keep> =>
  fc.oneof({ arbitrary: fc.constant<Keep>(KEEP), weight: 3 }, { arbitrary: fresh, weight: 1 });

const marks = fc.record({
  failures: maybe([1, 2, 3]),
  quarantined_at: maybe([AT]),
  last_error: maybe([
    { code: "broker.refused", message: "m", at: AT },
    { code: "payload.too_large", message: "m", at: AT },
  ]),
});

const intent = fc
  .tuple(fc.constantFrom("intent-1", "intent-2", "intent-3"), marks)
  .map(([id, m]) => defined<NotificationIntent>({ id, event: "completed", seq: 1, created_at: AT, ...m }));

/** What the write does to the owed intent: drops it, keeps it, rewrites its marks, or owes another. */
const nextIntent = (old: NotificationIntent | undefined): fc.Arbitrary<NotificationIntent | undefined> =>
  fc.oneof(
    { arbitrary: fc.constant(undefined), weight: 1 },
    { arbitrary: fc.constant(old), weight: 2 },
    { arbitrary: marks.map((m) => (old === undefined ? undefined : defined<NotificationIntent>({ ...without(old), ...m }))), weight: 3 },
    { arbitrary: intent, weight: 1 },
  );

function without(i: NotificationIntent): NotificationIntent {
  const { failures: _f, quarantined_at: _q, last_error: _l, ...rest } = i;
  return rest;
}

/** `value` without its keys whose value is `undefined`: a record as JSON would carry it. */
function defined<T extends object>(value: { [K in keyof T]?: T[K] | undefined }): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}

const feedFields = fc.record({
  status: fc.constantFrom(...STATUSES),
  transition_seq: fc.constantFrom(0, 1, 2),
  evidence_seq: maybe([0, 1, 2]),
  latest_attempt: maybe([1, 2, 3]),
  finalized_report: maybe(FINALIZED),
  pending_notification: fc.option(intent, { nil: undefined }),
});

const note: fc.Arbitrary<ChangeNote | undefined> = fc.option(
  fc
    .record({
      actor: maybe([{ type: "agent" as const, token_id: "tok-1" }, { type: "operator" as const }, { type: "gate" as const }]),
      staged: maybe([
        { sha256: hex("d"), bytes: 0 },
        { sha256: hex("e"), bytes: 4096 },
      ]),
      declared: maybe([{ sha256: hex("f"), bytes: 12 }]),
      observed: maybe([
        { source: "watcher:herdr-1", source_kind: "pane_status", state: "idle" },
        { source: "agent:claude-code", source_kind: "hook.stop", state: "done" },
      ]),
      overflowed: maybe([{ source: "agent:codex", bound: "count" }]),
      marked: maybe([{ mark: "stale" as const }, { mark: "overdue" as const }]),
    })
    .map((n) => defined<ChangeNote>(n)),
  { nil: undefined, freq: 4 },
);

/** The feed fields of a record, `undefined` meaning absent (dropped by `record`). */
type Fields = {
  [K in "status" | "transition_seq" | "evidence_seq" | "latest_attempt" | "finalized_report" | "pending_notification"]?:
    | JobRecord[K]
    | undefined;
};

function record(fields: Fields): JobRecord {
  const base: Record<string, unknown> = { ...jobRecord("feed-rules-1", { updated_at: AT }) };
  delete base.evidence_seq;
  return defined<JobRecord>({ ...base, ...fields } as JobRecord);
}

/** One write: created (one in ten), or each feed field of the record kept or drawn afresh. */
export const feedWrite: fc.Arbitrary<FeedWrite> = fc.oneof(
  {
    arbitrary: fc.tuple(feedFields, note).map(([after, n]): FeedWrite => ({ before: undefined, after: record(after), note: n })),
    weight: 1,
  },
  {
    arbitrary: feedFields.chain((old) =>
      fc
        .tuple(
          fc.record({
            status: keepOr(fc.constantFrom(...STATUSES)),
            transition_seq: keepOr(fc.constantFrom(0, 1, 2, 3)),
            evidence_seq: keepOr(maybe([0, 1, 2, 3])),
            latest_attempt: keepOr(maybe([1, 2, 3])),
            finalized_report: keepOr(maybe(FINALIZED)),
          }),
          nextIntent(old.pending_notification),
          note,
        )
        .map(([next, pending_notification, n]): FeedWrite => {
          const pick = <K extends keyof typeof next>(k: K) => (next[k] === KEEP ? old[k] : next[k]) as Fields[K];
          return {
            before: record(old),
            after: record({
              status: pick("status"),
              transition_seq: pick("transition_seq"),
              evidence_seq: pick("evidence_seq"),
              latest_attempt: pick("latest_attempt"),
              finalized_report: pick("finalized_report"),
              pending_notification,
            }),
            note: n,
          };
        }),
    ),
    weight: 9,
  },
);

/** `count` writes drawn with `FEED_CASES_SEED` (the SQL tests batch them). */
export function feedWrites(count: number): FeedWrite[] {
  return fc.sample(feedWrite, { numRuns: count, seed: FEED_CASES_SEED });
}

/** How many rows of each kind `rows` holds, every kind named (0 where none). */
export function kindCounts(rows: readonly { kind: ChangeKind }[], kinds: readonly ChangeKind[]): Record<ChangeKind, number> {
  const counts = Object.fromEntries(kinds.map((k) => [k, 0])) as Record<ChangeKind, number>;
  for (const row of rows) counts[row.kind] += 1;
  return counts;
}

/**
 * A shape (core's `FeedWriteShape`) the write could have been declared with, as a
 * store declares it: its class from which counter moved, and of the fields a store
 * could truthfully call left alone (equal before and after) or removed (absent after),
 * and the statuses before and after it could name, and the owed intent before it its conditions could pin (`intentIs` the one
 * owed, `noIntent` when none was), a subset chosen by `i`, so that the folded rules are tried with each field both
 * declared and not; and whether it is a mark, which a store always knows. The values a pin names: `declaredPins`.
 */
export function declaredShape(w: FeedWrite, i: number): FeedWriteShape {
  if (w.before === undefined) return CREATE_SHAPE;
  const before = w.before as unknown as Record<string, unknown>;
  const after = w.after as unknown as Record<string, unknown>;
  const writeClass =
    before.transition_seq !== after.transition_seq
      ? "transition"
      : (before.evidence_seq ?? 0) !== (after.evidence_seq ?? 0)
        ? "evidence"
        : "intent";
  const chosen = (n: number) => ((i >> n) & 1) === 1 || i % 7 === 0;
  const untouched = FEED_BEFORE_FIELDS.filter((f, n) => JSON.stringify(before[f]) === JSON.stringify(after[f]) && chosen(n));
  const removed = FEED_BEFORE_FIELDS.filter((f, n) => after[f] === undefined && !untouched.includes(f) && chosen(n + 1));
  return {
    writeClass,
    untouched,
    removed,
    ...(chosen(7) ? { statusBefore: String(before.status) } : {}),
    ...(chosen(8) ? { statusAfter: String(after.status) } : {}),
    // Whether the write is the sweep's mark is always known to the store (its note says): never left open.
    ...(w.note?.marked === undefined ? {} : { marked: true as const }),
    ...(chosen(9) ? { intentBefore: before.pending_notification === undefined ? ("none" as const) : ("owed" as const) } : {}),
  };
}

/** What a write of `declaredShape` pins (core's `feedPinsOf` of its conditions): the owed intent's id, when one was owed. */
export function declaredPins(w: FeedWrite): FeedPins {
  const id = w.before?.pending_notification?.id;
  return id === undefined ? {} : { intent_id: id };
}
