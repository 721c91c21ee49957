import { type ChangeActor, type ChangeDraft, type ChangeKind, type ChangeNote, SERVICE_ACTOR } from "./feed.ts";
import { KeptByKey } from "./kept-by-key.ts";
import { pinnedStatusOf, type RecordWrite } from "./record-write.ts";
import type { JobRecord } from "./schemas.ts";

/**
 * The change feed's rows, declared once as data (`FEED_RULES`): which rows one
 * committed write of a job record produces, from the record before the write, the
 * record after it and the write's `ChangeNote`. Being data, the rules have two
 * evaluators that must agree, and the property tests hold them to it:
 * - `rowsOfRules`, here, in JavaScript: what `changeRowsOf` is (the memory store, the
 *   DynamoDB stream function, the SQLite store);
 * - `feedRowStatements` (`@mam/local`, sql-feed-rules.ts), compiled to SQLite-dialect
 *   `INSERT … SELECT` statements that run in the write's own batch, for an engine that
 *   runs no JavaScript between two statements of a batch (Cloudflare D1).
 *
 * So the algebra is small and closed, and every operator means the same in both:
 * a value is absent (`undefined` in JS, `NULL` in SQL) or a scalar; no operator ever
 * yields "unknown" (SQL's three-valued logic is closed off in the compiler).
 */

/**
 * The rows one committed write of a job record produces, from the record before it
 * (`undefined`: the write created it) and after it: core's `FEED_RULES` evaluated in
 * JavaScript (`rowsOfRules`, feed-rules.ts, where the rows are listed). Pure, so every
 * adapter and the DynamoDB stream function derive the same rows from the same write;
 * an SQL store on a batch-only engine compiles the same rules into its batch
 * (`feedRowStatements` in `@mam/local`). A write that changed nothing the feed tells
 * (a revise that rewrote the same marks) produces no row. Of `before` it reads only
 * `status`, `transition_seq`, `evidence_seq`, `latest_attempt`, `finalized_report`
 * and `pending_notification` (what an adapter must capture of the record before its
 * write; `FEED_BEFORE_FIELDS`).
 */
export function changeRowsOf(before: JobRecord | undefined, after: JobRecord, note: ChangeNote = {}): ChangeDraft[] {
  return rowsOfRules(before, after, note);
}

/** The fields of the record before a write that `changeRowsOf` compares. */
export const FEED_BEFORE_FIELDS = [
  "status",
  "transition_seq",
  "evidence_seq",
  "latest_attempt",
  "finalized_report",
  "pending_notification",
] as const;

/** A field of the record before the write that a rule may read: only what an adapter captures (`FEED_BEFORE_FIELDS`). */
export type FeedBeforeField = (typeof FEED_BEFORE_FIELDS)[number];

/**
 * A field read by a rule. `before`: the record before the write, only its
 * `FEED_BEFORE_FIELDS` (absent altogether when the write created it); `after`: the
 * record the write committed; `note`: the write's note (`staged`, `declared`; the
 * actor is every row's and no rule's); `pinned`: a value of the record before that
 * the write's own conditions pin (`FeedPins`), which only folding puts in a rule (no
 * rule of `FEED_RULES` reads it). A path through a missing object reads absent.
 */
export type FeedRef =
  | { readonly op: "ref"; readonly side: "before"; readonly path: readonly [FeedBeforeField, ...string[]] }
  | { readonly op: "ref"; readonly side: "after"; readonly path: readonly [string, ...string[]] }
  | { readonly op: "ref"; readonly side: "note"; readonly path: readonly [NoteFact, ...string[]] }
  | { readonly op: "ref"; readonly side: "pinned"; readonly path: readonly [keyof FeedPins] };

/**
 * What a write's conditions pin of the record before it, taken from the write itself
 * (`feedPinsOf`): `intent_id`, the owed intent's id an `intentIs` condition names (the
 * write commits only if that intent is owed). A store binds these where the folded
 * rules read them, so it need not capture or read them of the old row.
 */
export interface FeedPins {
  readonly intent_id?: string;
}

/** The facts of a `ChangeNote` a rule may read (the actor is every row's). */
type NoteFact = "staged" | "declared" | "observed" | "overflowed" | "marked";

/**
 * A value: a field (`ref`), a literal, the first present of two (`coalesce`), the
 * value of the first case whose predicate holds, else `else` (`case`), or absent
 * (`nothing`: an `intent_id` or a `data` key that is left out of the row).
 */
export type FeedValue =
  | FeedRef
  | { readonly op: "literal"; readonly value: string | number }
  | { readonly op: "coalesce"; readonly values: readonly [FeedValue, FeedValue] }
  | {
      readonly op: "case";
      readonly cases: readonly { readonly when: FeedPredicate; readonly value: FeedValue }[];
      readonly else: FeedValue;
    }
  | { readonly op: "nothing" };

/**
 * A predicate, always true or false (never unknown): `created` (there was no record
 * before the write), `all`/`any`/`not`, `present`/`absent` of a value, `eq`/`ne`
 * (absent equals absent only; a number never equals a string), `gt` (both present
 * and the left greater).
 */
export type FeedPredicate =
  | { readonly op: "created" }
  | { readonly op: "all"; readonly of: readonly FeedPredicate[] }
  | { readonly op: "any"; readonly of: readonly FeedPredicate[] }
  | { readonly op: "not"; readonly of: FeedPredicate }
  | { readonly op: "present" | "absent"; readonly value: FeedValue }
  | { readonly op: "eq" | "ne" | "gt"; readonly left: FeedValue; readonly right: FeedValue };

/**
 * One row a write may produce: its `kind`, when it is produced, and how its
 * `intent_id` and `data` are built. Every row's `job_id` is the record's and its
 * `actor` the note's (the service's when the note has none). An absent `intent_id`
 * value leaves the key out; without `data` the row has no `data` key, with it the row
 * has one holding the keys whose value is present (possibly none: `{}`).
 */
export interface FeedRule {
  readonly kind: ChangeKind;
  readonly when: FeedPredicate;
  readonly intent_id?: FeedValue;
  readonly data?: Readonly<Record<string, FeedValue>>;
}

const before = (...path: [FeedBeforeField, ...string[]]): FeedRef => ({ op: "ref", side: "before", path });
const after = (...path: [string, ...string[]]): FeedRef => ({ op: "ref", side: "after", path });
const note = (...path: [NoteFact, ...string[]]): FeedRef => ({ op: "ref", side: "note", path });
const literal = (value: string | number): FeedValue => ({ op: "literal", value });
const coalesce = (value: FeedValue, otherwise: FeedValue): FeedValue => ({ op: "coalesce", values: [value, otherwise] });
const NOTHING: FeedValue = { op: "nothing" };
const CREATED: FeedPredicate = { op: "created" };
const all = (...of: FeedPredicate[]): FeedPredicate => ({ op: "all", of });
const any = (...of: FeedPredicate[]): FeedPredicate => ({ op: "any", of });
const not = (of: FeedPredicate): FeedPredicate => ({ op: "not", of });
const present = (value: FeedValue): FeedPredicate => ({ op: "present", value });
const absent = (value: FeedValue): FeedPredicate => ({ op: "absent", value });
const eq = (left: FeedValue, right: FeedValue): FeedPredicate => ({ op: "eq", left, right });
const ne = (left: FeedValue, right: FeedValue): FeedPredicate => ({ op: "ne", left, right });
const gt = (left: FeedValue, right: FeedValue): FeedPredicate => ({ op: "gt", left, right });

// The three kinds of write, exclusive, as changeRowsOf's if/else chain had them:
// a transition (transition_seq moved), else an evidence write (evidence_seq moved,
// absent reading 0), else bookkeeping on the owed intent.
const TRANSITION = all(not(CREATED), ne(after("transition_seq"), before("transition_seq")));
const EVIDENCE = all(
  not(CREATED),
  not(TRANSITION),
  ne(coalesce(after("evidence_seq"), literal(0)), coalesce(before("evidence_seq"), literal(0))),
);
const BOOKKEEPING = all(not(CREATED), not(TRANSITION), not(EVIDENCE));

const OLD_INTENT = before("pending_notification");
const NEW_INTENT = after("pending_notification");
/** The owed intent was replaced by another (both present, ids differ). */
const INTENT_REPLACED = all(
  present(OLD_INTENT),
  present(NEW_INTENT),
  ne(before("pending_notification", "id"), after("pending_notification", "id")),
);
/** The same intent is owed before and after (bookkeeping on it). */
const SAME_INTENT = all(
  present(OLD_INTENT),
  present(NEW_INTENT),
  eq(before("pending_notification", "id"), after("pending_notification", "id")),
);
/** The finalized report changed to another (or to one): a finalize committed. */
const FINALIZED = all(
  present(after("finalized_report")),
  ne(after("finalized_report", "manifest_sha256"), before("finalized_report", "manifest_sha256")),
);
/** An evidence write that moved the latest attempt: a dispatch. */
const DISPATCHED = all(present(after("latest_attempt")), ne(after("latest_attempt"), before("latest_attempt")));
/** An evidence write that recorded an observation, or a source's overflow, as its note says. */
const OBSERVED = all(EVIDENCE, not(DISPATCHED), not(FINALIZED), present(note("observed")));
const OVERFLOWED = all(EVIDENCE, not(DISPATCHED), not(FINALIZED), absent(note("observed")), present(note("overflowed")));
/** An evidence write that is neither a dispatch, a finalize nor an observation: a report's stage or an upload's declaration. */
const REPORT_WRITE = all(EVIDENCE, not(DISPATCHED), not(FINALIZED), absent(note("observed")), absent(note("overflowed")));
/** The sweep's mark (the note's `marked`): a fact of the write's shape, so every other write's rules fold it away. */
const MARKED = present(note("marked"));

const QUARANTINED = all(
  SAME_INTENT,
  present(after("pending_notification", "quarantined_at")),
  absent(before("pending_notification", "quarantined_at")),
);
const FAILED = all(
  SAME_INTENT,
  not(QUARANTINED),
  gt(coalesce(after("pending_notification", "failures"), literal(0)), coalesce(before("pending_notification", "failures"), literal(0))),
);
const RELEASED = all(
  SAME_INTENT,
  not(QUARANTINED),
  not(FAILED),
  absent(after("pending_notification", "failures")),
  absent(after("pending_notification", "quarantined_at")),
  any(present(before("pending_notification", "failures")), present(before("pending_notification", "quarantined_at"))),
);

/** Which action moved the job (the engine's table read backwards; `actionOf` before the rules). */
const ACTION: FeedValue = {
  op: "case",
  cases: [
    { when: all(eq(after("status"), literal("running")), eq(before("status"), literal("pending"))), value: literal("claim") },
    { when: eq(after("status"), literal("running")), value: literal("progress") },
    { when: eq(after("status"), literal("cancelled")), value: literal("cancel") },
  ],
  else: after("status"),
};

/**
 * Every row a write may produce, in the order a write produces them. The rules of one
 * kind of write are exclusive but for a transition's, which may produce, in order,
 * `report.finalized`, `job.transitioned` and `intent.superseded`:
 * - created: `job.registered`;
 * - `transition_seq` moved: `job.transitioned` (`intent_id` the intent it committed),
 *   `report.finalized` when it committed a finalize, and `intent.superseded` when it
 *   replaced an owed intent that was never settled (`data.by` the newer one);
 * - else `evidence_seq` moved: `dispatch.recorded` (the latest attempt moved), else
 *   `report.finalized` (the finalized report changed), else `observation.recorded`
 *   or `observation.overflowed` (the note says which), else `report.upload_declared`
 *   (the note declares an upload), else `report.staged`;
 * - else (bookkeeping on the owed intent): `intent.published` (settled),
 *   `intent.superseded` (replaced), `intent.quarantined`, `intent.failed` or
 *   `intent.released`; or nothing (a revise that rewrote the same marks); and, for
 *   the sweep's mark (the note's `marked`), `job.stale` or `job.overdue` after the
 *   `intent.superseded` of the intent its own replaced, if one was owed.
 */
export const FEED_RULES: readonly FeedRule[] = [
  { kind: "job.registered", when: CREATED, data: { status: after("status") } },
  {
    kind: "report.finalized",
    when: all(any(TRANSITION, all(EVIDENCE, not(DISPATCHED))), FINALIZED),
    data: { attempt_id: after("finalized_report", "attempt_id"), sha256: after("finalized_report", "report_sha256") },
  },
  {
    kind: "job.transitioned",
    when: TRANSITION,
    // The intent the transition committed: the owed one, unless it was owed before.
    intent_id: {
      op: "case",
      cases: [{ when: eq(before("pending_notification", "id"), after("pending_notification", "id")), value: NOTHING }],
      else: after("pending_notification", "id"),
    },
    data: { action: ACTION, status: after("status"), transition_seq: after("transition_seq") },
  },
  {
    kind: "intent.superseded",
    when: all(any(TRANSITION, BOOKKEEPING), INTENT_REPLACED),
    intent_id: before("pending_notification", "id"),
    data: { by: after("pending_notification", "id") },
  },
  { kind: "dispatch.recorded", when: all(EVIDENCE, DISPATCHED), data: { attempt_id: after("latest_attempt") } },
  {
    kind: "report.upload_declared",
    when: all(REPORT_WRITE, present(note("declared"))),
    data: { attempt_id: after("latest_attempt"), sha256: note("declared", "sha256"), bytes: note("declared", "bytes") },
  },
  {
    kind: "report.staged",
    when: all(REPORT_WRITE, absent(note("declared"))),
    data: { attempt_id: after("latest_attempt"), sha256: note("staged", "sha256"), bytes: note("staged", "bytes") },
  },
  {
    kind: "observation.recorded",
    when: OBSERVED,
    data: {
      attempt_id: after("latest_attempt"),
      source: note("observed", "source"),
      source_kind: note("observed", "source_kind"),
      state: note("observed", "state"),
    },
  },
  {
    kind: "observation.overflowed",
    when: OVERFLOWED,
    data: { attempt_id: after("latest_attempt"), source: note("overflowed", "source"), bound: note("overflowed", "bound") },
  },
  {
    kind: "intent.published",
    when: all(BOOKKEEPING, present(OLD_INTENT), absent(NEW_INTENT)),
    intent_id: before("pending_notification", "id"),
  },
  // Quarantined, twice: with the last error's code as data, or (no error kept) without data.
  {
    kind: "intent.quarantined",
    when: all(BOOKKEEPING, QUARANTINED, present(after("pending_notification", "last_error"))),
    intent_id: after("pending_notification", "id"),
    data: { code: after("pending_notification", "last_error", "code") },
  },
  {
    kind: "intent.quarantined",
    when: all(BOOKKEEPING, QUARANTINED, absent(after("pending_notification", "last_error"))),
    intent_id: after("pending_notification", "id"),
  },
  {
    kind: "intent.failed",
    when: all(BOOKKEEPING, FAILED),
    intent_id: after("pending_notification", "id"),
    data: { code: coalesce(after("pending_notification", "last_error", "code"), literal("unknown")) },
  },
  { kind: "intent.released", when: all(BOOKKEEPING, RELEASED), intent_id: after("pending_notification", "id") },
  // The sweep's attention marks (issue 20, part 4): bookkeeping whose note says which, with the intent it owes.
  {
    kind: "job.stale",
    when: all(BOOKKEEPING, MARKED, eq(note("marked", "mark"), literal("stale"))),
    intent_id: after("pending_notification", "id"),
    data: { since: after("stale_since") },
  },
  {
    kind: "job.overdue",
    when: all(BOOKKEEPING, MARKED, eq(note("marked", "mark"), literal("overdue"))),
    intent_id: after("pending_notification", "id"),
    data: { deadline_at: after("deadline_at") },
  },
];

// ---- a write's shape, and the rules folded by it

/**
 * What a write can be, from what it bumps: a create (no record before), a transition
 * (`transition_seq` bumped), an evidence write (`evidence_seq` bumped alone) or
 * bookkeeping on the owed intent (neither; the base lets no write set either counter).
 */
export type FeedWriteClass = "create" | "transition" | "evidence" | "intent";

/**
 * What a store knows of a write before it runs: its class, and the fields of the
 * record before it (`FEED_BEFORE_FIELDS`) that the write leaves as they were (it
 * neither sets, unsets nor bumps them) and those it removes. The class decides the
 * three kind-of-write predicates the rules are built on (`CREATED`, `TRANSITION`,
 * `EVIDENCE`); a field left alone reads the same before and after; a removed one is
 * absent after; a status the write's conditions pin (before) or that it sets (after)
 * is that status. So the rules a write can set off, and what
 * they read, follow from its shape alone (`feedRulesOf`).
 */
export interface FeedWriteShape {
  readonly writeClass: FeedWriteClass;
  /** Fields the write leaves alone; for a create, none. */
  readonly untouched: readonly FeedBeforeField[];
  /** Fields the write removes (absent after it); for a create, none. */
  readonly removed: readonly FeedBeforeField[];
  /** The status before the write, where its conditions allow one alone (`statusIn` of one). */
  readonly statusBefore?: string;
  /** The status the write sets, where it sets one. */
  readonly statusAfter?: string;
  /** The write is the sweep's mark (its note's `marked`); absent: it is not. */
  readonly marked?: true;
  /**
   * What the write's conditions pin of the owed intent before it: `owed`, the intent
   * whose id the write's `FeedPins` name (an `intentIs` condition); `none`, no intent
   * (`noIntent`); absent, nothing.
   */
  readonly intentBefore?: "owed" | "none";
}

/** Each class's facts: the kind-of-write predicates it decides (by identity: the rules share these objects). */
const CLASS_FACTS: Readonly<Record<FeedWriteClass, ReadonlyMap<FeedPredicate, boolean>>> = {
  create: new Map([[CREATED, true]]),
  transition: new Map([
    [CREATED, false],
    [TRANSITION, true],
  ]),
  evidence: new Map([
    [CREATED, false],
    [TRANSITION, false],
    [EVIDENCE, true],
  ]),
  intent: new Map([
    [CREATED, false],
    [TRANSITION, false],
    [EVIDENCE, false],
  ]),
};

/** A create's shape: no record before it, so nothing left alone or removed. */
export const CREATE_SHAPE: FeedWriteShape = { writeClass: "create", untouched: [], removed: [] };

/**
 * The shape of a record write (an update; a create's is `CREATE_SHAPE`). Asked on
 * every write, so built in one pass and kept: the same shape object for every write
 * of that shape.
 */
export function feedShapeOf(write: RecordWrite): FeedWriteShape {
  const bump = write.bump as readonly string[];
  const writeClass: FeedWriteClass = bump.includes("transition_seq") ? "transition" : bump.includes("evidence_seq") ? "evidence" : "intent";
  let fields = "";
  for (const field of FEED_BEFORE_FIELDS) {
    if (write.unset.includes(field)) fields += "r";
    else fields += field in write.set || bump.includes(field) ? "t" : "u";
  }
  const statusBefore = pinnedStatusOf(write);
  let intentBefore: "owed" | "none" | undefined;
  let intentPins = 0;
  for (const c of write.conditions) {
    if (c.kind === "intentIs" || c.kind === "noIntent") {
      intentBefore = c.kind === "intentIs" ? "owed" : "none";
      intentPins++;
    }
  }
  // Two intent conditions (never both hold, or the same twice): nothing is pinned.
  if (intentPins !== 1) intentBefore = undefined;
  const setStatus = write.set.status;
  const statusAfter = typeof setStatus === "string" ? setStatus : undefined;
  const marked = write.feed?.marked !== undefined;
  const key = shapeKey(writeClass, fields, statusBefore, statusAfter, marked, intentBefore);
  return SHAPES.get(key, () => {
    const shape: FeedWriteShape = {
      writeClass,
      untouched: FEED_BEFORE_FIELDS.filter((_, i) => fields[i] === "u"),
      removed: FEED_BEFORE_FIELDS.filter((_, i) => fields[i] === "r"),
      ...(statusBefore === undefined ? {} : { statusBefore }),
      ...(statusAfter === undefined ? {} : { statusAfter }),
      ...(marked ? { marked: true as const } : {}),
      ...(intentBefore === undefined ? {} : { intentBefore }),
    };
    KEYS.set(shape, key);
    return shape;
  });
}

/** Shapes by key, so a write of a shape seen before costs its key alone. */
const SHAPES = new KeptByKey<string, FeedWriteShape>();
/** Keys of shapes already keyed (every shape `feedShapeOf` hands out). */
const KEYS = new WeakMap<FeedWriteShape, string>();

/**
 * A shape's key: its class, a letter per feed field (`u` left alone, `r` removed, `t`
 * touched), the statuses it knows, whether it marks, the intent it pins.
 */
function shapeKey(
  writeClass: FeedWriteClass,
  fields: string,
  statusBefore: string | undefined,
  statusAfter: string | undefined,
  marked: boolean,
  intentBefore: "owed" | "none" | undefined,
): string {
  return `${writeClass}:${fields}:${statusBefore ?? ""}:${statusAfter ?? ""}${marked ? ":m" : ""}${intentBefore === undefined ? "" : `:${intentBefore}`}`;
}

/** The values `write`'s conditions pin of the record before it (`FeedPins`), for the folded rules of its shape. */
export function feedPinsOf(write: RecordWrite): FeedPins {
  for (const c of write.conditions) if (c.kind === "intentIs") return { intent_id: c.id };
  return NO_PINS;
}

const NO_PINS: FeedPins = {};

interface Folding {
  readonly facts: ReadonlyMap<FeedPredicate, boolean>;
  readonly untouched: ReadonlySet<string>;
  readonly removed: ReadonlySet<string>;
  readonly status: { readonly before?: string; readonly after?: string };
  readonly intentBefore: "owed" | "none" | undefined;
}

/** Whether two values are the same reading of the same write (a field read on the same side, equal literals, or both absent). */
function sameValue(a: FeedValue, b: FeedValue): boolean {
  if (a.op === "ref" && b.op === "ref")
    return a.side === b.side && a.path.length === b.path.length && a.path.every((k, i) => k === b.path[i]);
  if (a.op === "literal" && b.op === "literal") return a.value === b.value;
  return a.op === "nothing" && b.op === "nothing";
}

/** `predicate` with the shape put in and simplified: `true`/`false` when that decides it. */
function foldPredicate(predicate: FeedPredicate, folding: Folding): FeedPredicate | boolean {
  const fact = folding.facts.get(predicate);
  if (fact !== undefined) return fact;
  switch (predicate.op) {
    case "created":
      return folding.facts.get(CREATED) ?? predicate;
    case "all":
    case "any": {
      const decisive = predicate.op === "any";
      const left: FeedPredicate[] = [];
      for (const p of predicate.of) {
        const folded = foldPredicate(p, folding);
        if (folded === decisive) return decisive;
        if (folded !== !decisive) left.push(folded as FeedPredicate);
      }
      if (left.length === 0) return !decisive;
      return left.length === 1 ? (left[0] as FeedPredicate) : { op: predicate.op, of: left };
    }
    case "not": {
      const folded = foldPredicate(predicate.of, folding);
      return typeof folded === "boolean" ? !folded : { op: "not", of: folded };
    }
    case "present":
    case "absent": {
      const value = foldValue(predicate.value, folding);
      // The owed intent the write's condition names is there before it (only its id is known).
      if (
        folding.intentBefore === "owed" &&
        value.op === "ref" &&
        value.side === "before" &&
        value.path.length === 1 &&
        value.path[0] === "pending_notification"
      )
        return predicate.op === "present";
      if (value.op === "nothing") return predicate.op === "absent";
      if (value.op === "literal") return predicate.op === "present";
      return { op: predicate.op, value };
    }
    case "eq":
    case "ne":
    case "gt": {
      const left = foldValue(predicate.left, folding);
      const right = foldValue(predicate.right, folding);
      // A reading equals itself (absent equals absent), and is never greater than itself
      // (nor is anything greater than absent, or absent than anything).
      if (sameValue(left, right)) return predicate.op === "eq";
      if (predicate.op === "gt" && (left.op === "nothing" || right.op === "nothing")) return false;
      if (left.op === "literal" && right.op === "literal") {
        return predicate.op === "gt" ? left.value > right.value : (left.value === right.value) === (predicate.op === "eq");
      }
      return { op: predicate.op, left, right };
    }
    default:
      return predicate satisfies never;
  }
}

/** `value` with the shape put in: a field left alone read after the write; a case decided false dropped, the first decided true ending them. */
function foldValue(value: FeedValue, folding: Folding): FeedValue {
  switch (value.op) {
    case "ref": {
      const ref: FeedRef =
        value.side === "before" && folding.untouched.has(value.path[0]) ? { op: "ref", side: "after", path: value.path } : value;
      if (ref.side === "after" && folding.removed.has(ref.path[0])) return NOTHING;
      // The owed intent before, where the write's condition pins it: none at all, or the
      // one whose id the write names (its id is a pinned value; nothing need capture it).
      if (ref.side === "before" && ref.path[0] === "pending_notification") {
        if (folding.intentBefore === "none") return NOTHING;
        if (folding.intentBefore === "owed" && ref.path.length === 2 && ref.path[1] === "id")
          return { op: "ref", side: "pinned", path: ["intent_id"] };
      }
      // A status the shape knows is that status (read before or after the write).
      if ((ref.side === "before" || ref.side === "after") && ref.path.length === 1 && ref.path[0] === "status") {
        const known = folding.status[ref.side];
        if (known !== undefined) return literal(known);
      }
      return ref;
    }
    case "literal":
    case "nothing":
      return value;
    case "coalesce": {
      const first = foldValue(value.values[0], folding);
      const second = foldValue(value.values[1], folding);
      if (first.op === "nothing") return second;
      if (first.op === "literal") return first;
      return { op: "coalesce", values: [first, second] };
    }
    case "case": {
      const cases: { when: FeedPredicate; value: FeedValue }[] = [];
      for (const c of value.cases) {
        const when = foldPredicate(c.when, folding);
        if (when === false) continue;
        if (when === true) {
          const chosen = foldValue(c.value, folding);
          return cases.length === 0 ? chosen : { op: "case", cases, else: chosen };
        }
        cases.push({ when, value: foldValue(c.value, folding) });
      }
      const otherwise = foldValue(value.else, folding);
      return cases.length === 0 ? otherwise : { op: "case", cases, else: otherwise };
    }
    default:
      return value satisfies never;
  }
}

/** An always-true predicate, for a folded rule that nothing more decides. */
const ALWAYS: FeedPredicate = { op: "all", of: [] };

function foldRule(rule: FeedRule, folding: Folding): FeedRule | undefined {
  const when = foldPredicate(rule.when, folding);
  if (when === false) return undefined;
  return {
    kind: rule.kind,
    when: when === true ? ALWAYS : when,
    ...(rule.intent_id === undefined ? {} : { intent_id: foldValue(rule.intent_id, folding) }),
    ...(rule.data === undefined
      ? {}
      : { data: Object.fromEntries(Object.entries(rule.data).map(([key, v]) => [key, foldValue(v, folding)])) }),
  };
}

/** The key of a shape: equal for shapes that decide the same (`feedRulesOf` and its compilers keep their work by it). */
export function feedShapeKey(shape: FeedWriteShape): string {
  let key = KEYS.get(shape);
  if (key === undefined) {
    let fields = "";
    for (const field of FEED_BEFORE_FIELDS) fields += shape.removed.includes(field) ? "r" : shape.untouched.includes(field) ? "u" : "t";
    key = shapeKey(shape.writeClass, fields, shape.statusBefore, shape.statusAfter, shape.marked === true, shape.intentBefore);
    KEYS.set(shape, key);
  }
  return key;
}

const FOLDED = new KeptByKey<string, readonly FeedRule[]>();

/**
 * The rules a write of `shape` can set off, in `FEED_RULES`' order, each folded by what
 * the shape decides (a rule it rules out is left out; a field left alone is read after
 * the write, so nothing need capture it; the owed intent's id that the write's
 * `intentIs` names is read from the write, `pinned`). For a write of that shape, given
 * the values it pins (`feedPinsOf`), they make the same rows as `FEED_RULES`
 * (tests/unit/feed-rules.test.ts). An SQL store compiles these, so
 * its statements compute only what the write leaves open. Kept per shape (a store's
 * writes have a few dozen shapes).
 */
export function feedRulesOf(shape: FeedWriteShape): readonly FeedRule[] {
  return FOLDED.get(feedShapeKey(shape), () => {
    const folding: Folding = {
      facts: new Map([...CLASS_FACTS[shape.writeClass], [MARKED, shape.marked === true]]),
      untouched: new Set(shape.writeClass === "create" ? [] : shape.untouched),
      removed: new Set(shape.writeClass === "create" ? [] : shape.removed),
      status: {
        ...(shape.writeClass === "create" || shape.statusBefore === undefined ? {} : { before: shape.statusBefore }),
        ...(shape.statusAfter === undefined ? {} : { after: shape.statusAfter }),
      },
      intentBefore: shape.writeClass === "create" ? undefined : shape.intentBefore,
    };
    return FEED_RULES.flatMap((rule) => foldRule(rule, folding) ?? []);
  });
}

/** The fields of the record before the write that `rules` read (what a store must capture for them). */
export function beforeFieldsOf(rules: readonly FeedRule[]): FeedBeforeField[] {
  const fields = new Set<FeedBeforeField>();
  const value = (v: FeedValue): void => {
    switch (v.op) {
      case "ref":
        if (v.side === "before") fields.add(v.path[0]);
        return;
      case "coalesce":
        v.values.forEach(value);
        return;
      case "case":
        for (const c of v.cases) {
          predicate(c.when);
          value(c.value);
        }
        value(v.else);
        return;
      case "literal":
      case "nothing":
        return;
      default:
        v satisfies never;
    }
  };
  const predicate = (p: FeedPredicate): void => {
    switch (p.op) {
      case "created":
        return;
      case "all":
      case "any":
        p.of.forEach(predicate);
        return;
      case "not":
        predicate(p.of);
        return;
      case "present":
      case "absent":
        value(p.value);
        return;
      case "eq":
      case "ne":
      case "gt":
        value(p.left);
        value(p.right);
        return;
      default:
        p satisfies never;
    }
  };
  for (const rule of rules) {
    predicate(rule.when);
    if (rule.intent_id !== undefined) value(rule.intent_id);
    for (const v of Object.values(rule.data ?? {})) value(v);
  }
  return [...fields];
}

/** A value as the JS evaluator reads it: absent is `undefined` (an object only where a rule asks whether it is present). */
export type FeedReading = string | number | boolean | object | undefined;

/**
 * What the rules read: the record before the write (`undefined`: created), the record
 * after it, its note, and what its conditions pin of the record before (`FeedPins`;
 * only folded rules read them).
 */
export interface FeedInput {
  readonly before: JobRecord | undefined;
  readonly after: JobRecord;
  readonly note: ChangeNote;
  readonly pinned?: FeedPins;
}

function readPath(from: unknown, path: readonly string[]): FeedReading {
  let at: unknown = from;
  for (const key of path) {
    if (at === null || typeof at !== "object") return undefined;
    at = (at as Record<string, unknown>)[key];
  }
  return at === null ? undefined : (at as FeedReading);
}

/** A value of `FEED_RULES`' algebra, in JavaScript. */
export function evaluateFeedValue(value: FeedValue, input: FeedInput): FeedReading {
  switch (value.op) {
    case "ref":
      return readPath(input[value.side], value.path);
    case "literal":
      return value.value;
    case "coalesce":
      return evaluateFeedValue(value.values[0], input) ?? evaluateFeedValue(value.values[1], input);
    case "case": {
      const chosen = value.cases.find((c) => evaluateFeedPredicate(c.when, input));
      return evaluateFeedValue(chosen === undefined ? value.else : chosen.value, input);
    }
    case "nothing":
      return undefined;
    default:
      return value satisfies never;
  }
}

/** A predicate of `FEED_RULES`' algebra, in JavaScript. */
export function evaluateFeedPredicate(predicate: FeedPredicate, input: FeedInput): boolean {
  switch (predicate.op) {
    case "created":
      return input.before === undefined;
    case "all":
      return predicate.of.every((p) => evaluateFeedPredicate(p, input));
    case "any":
      return predicate.of.some((p) => evaluateFeedPredicate(p, input));
    case "not":
      return !evaluateFeedPredicate(predicate.of, input);
    case "present":
      return evaluateFeedValue(predicate.value, input) !== undefined;
    case "absent":
      return evaluateFeedValue(predicate.value, input) === undefined;
    case "eq":
      return evaluateFeedValue(predicate.left, input) === evaluateFeedValue(predicate.right, input);
    case "ne":
      return evaluateFeedValue(predicate.left, input) !== evaluateFeedValue(predicate.right, input);
    case "gt": {
      const left = evaluateFeedValue(predicate.left, input);
      const right = evaluateFeedValue(predicate.right, input);
      return left !== undefined && right !== undefined && left > right;
    }
    default:
      return predicate satisfies never;
  }
}

/** The actor of every row a write produces: the note's, else the service's. */
export function feedActorOf(note: ChangeNote | undefined): ChangeActor {
  return note?.actor ?? SERVICE_ACTOR;
}

/**
 * The rows one committed write of a job record produces (`FEED_RULES`, evaluated in
 * JavaScript), from the record before it (`undefined`: the write created it), the
 * record after it, and the write's note: of all of `FEED_RULES`, or of the rules
 * given (`feedRulesOf` a write's shape, for a write of that shape, with the values its
 * conditions pin: `feedPinsOf`). Pure. Of `before`
 * it reads only `FEED_BEFORE_FIELDS`. Throws only on a rule that builds a `data` value that is not
 * a scalar (a fault in the rules, never in the records).
 */
export function rowsOfRules(
  before: JobRecord | undefined,
  after: JobRecord,
  note: ChangeNote = {},
  rules: readonly FeedRule[] = FEED_RULES,
  pinned: FeedPins = NO_PINS,
): ChangeDraft[] {
  const input: FeedInput = { before, after, note, pinned };
  const actor = feedActorOf(note);
  const rows: ChangeDraft[] = [];
  for (const rule of rules) {
    if (!evaluateFeedPredicate(rule.when, input)) continue;
    const intentId = rule.intent_id === undefined ? undefined : evaluateFeedValue(rule.intent_id, input);
    if (intentId !== undefined && typeof intentId !== "string") throw new Error(`feed rule ${rule.kind}: intent_id is not a string`);
    let data: Record<string, string | number | boolean> | undefined;
    if (rule.data !== undefined) {
      data = {};
      for (const [key, value] of Object.entries(rule.data)) {
        const v = evaluateFeedValue(value, input);
        if (v === undefined) continue;
        if (typeof v === "object") throw new Error(`feed rule ${rule.kind}: data.${key} is not a scalar`);
        data[key] = v;
      }
    }
    rows.push({
      job_id: after.job_id,
      kind: rule.kind,
      actor,
      ...(intentId === undefined ? {} : { intent_id: intentId }),
      ...(data === undefined ? {} : { data }),
    });
  }
  return rows;
}
