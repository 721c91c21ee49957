/**
 * The feed's rows declared as rules (core's FEED_RULES) and evaluated in JavaScript
 * (`rowsOfRules`, which `changeRowsOf` is) make exactly the rows the imperative
 * `changeRowsOf` made before the rules (its frozen copy, tests/support/feed-oracle.ts):
 * the same rows, in the same order, with the same keys present, on thousands of
 * generated writes reaching every rule. And the rules read of the record before a
 * write only what an adapter captures (`FEED_BEFORE_FIELDS`).
 */
import {
  beforeFieldsOf,
  CHANGE_KINDS,
  type ChangeDraft,
  CREATE_SHAPE,
  changeRowsOf,
  evaluateFeedPredicate,
  FEED_BEFORE_FIELDS,
  FEED_RULES,
  feedRulesOf,
  feedShapeKey,
  type JobRecord,
  rowsOfRules,
} from "@mam/core";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { declaredPins, declaredShape, FEED_CASES_SEED, feedWrite, kindCounts } from "../support/feed-cases.ts";
import { oracleChangeRowsOf } from "../support/feed-oracle.ts";

const RUNS = 5000;

describe("FEED_RULES evaluated in JavaScript", () => {
  it("rowsOfRules makes the oracle's rows on every generated write, and every rule and every kind is reached", () => {
    const rows: ChangeDraft[] = [];
    const fired = FEED_RULES.map(() => 0);
    fc.assert(
      fc.property(feedWrite, ({ before, after, note }) => {
        const expected = oracleChangeRowsOf(before, after, note);
        const actual = rowsOfRules(before, after, note);
        expect(actual).toStrictEqual(expected);
        // Same keys in the same order of the row (data's key order is free; its values are not).
        expect(actual.map((r) => Object.keys(r))).toEqual(expected.map((r) => Object.keys(r)));
        rows.push(...actual);
        FEED_RULES.forEach((rule, i) => {
          if (evaluateFeedPredicate(rule.when, { before, after, note: note ?? {} })) fired[i] = (fired[i] ?? 0) + 1;
        });
      }),
      { numRuns: RUNS, seed: FEED_CASES_SEED },
    );
    const counts = kindCounts(rows, CHANGE_KINDS);
    console.log(
      `feed rules, ${RUNS} writes: rows per kind`,
      counts,
      "writes per rule",
      Object.fromEntries(FEED_RULES.map((r, i) => [`${i}:${r.kind}`, fired[i]])),
    );
    for (const kind of CHANGE_KINDS) expect(counts[kind], kind).toBeGreaterThanOrEqual(1);
    for (const [i, rule] of FEED_RULES.entries()) expect(fired[i], `rule ${i} (${rule.kind})`).toBeGreaterThanOrEqual(1);
  });

  it("changeRowsOf is rowsOfRules: the same rows for the same write, the note defaulting to none", () => {
    fc.assert(
      fc.property(feedWrite, ({ before, after, note }) => {
        expect(changeRowsOf(before, after, note)).toStrictEqual(rowsOfRules(before, after, note));
        if (note === undefined) expect(changeRowsOf(before, after)).toStrictEqual(oracleChangeRowsOf(before, after));
      }),
      { numRuns: 500, seed: FEED_CASES_SEED },
    );
  });

  it("every rule reads of the record before only FEED_BEFORE_FIELDS", () => {
    const read = new Set<string>(beforeFieldsOf(FEED_RULES));
    expect([...read].every((field) => (FEED_BEFORE_FIELDS as readonly string[]).includes(field))).toBe(true);
    expect([...read].sort()).toEqual([...FEED_BEFORE_FIELDS].sort());
  });

  it("a write's shape folds the rules (feedRulesOf): the same rows as all of FEED_RULES, reading of before nothing the write left alone", () => {
    let i = 0;
    const shapes = new Set<string>();
    const pinned = new Set<string>();
    fc.assert(
      fc.property(feedWrite, (w) => {
        const shape = declaredShape(w, i++);
        shapes.add(feedShapeKey(shape));
        const folded = feedRulesOf(shape);
        const { before, after, note } = w;
        expect(rowsOfRules(before, after, note, folded, declaredPins(w)), JSON.stringify(shape)).toStrictEqual(
          rowsOfRules(before, after, note),
        );
        if (shape.intentBefore !== undefined) pinned.add(shape.intentBefore);
        const read = beforeFieldsOf(folded);
        expect(read.filter((f) => shape.untouched.includes(f))).toEqual([]);
        if (shape.writeClass === "create") expect(read).toEqual([]);
      }),
      { numRuns: RUNS, seed: FEED_CASES_SEED },
    );
    expect(shapes.size).toBeGreaterThan(50);
    expect([...pinned].sort()).toEqual(["none", "owed"]);
  });

  it("folding keeps what a shape leaves open: a progress transition is one rule reading nothing before; a settle is intent.published", () => {
    const progressOf = (statusBefore?: string) =>
      feedRulesOf({
        writeClass: "transition",
        untouched: ["evidence_seq", "latest_attempt", "finalized_report", "pending_notification"],
        removed: [],
        ...(statusBefore === undefined ? {} : { statusBefore }),
        statusAfter: "running",
      });
    expect(progressOf().map((r) => r.kind)).toEqual(["job.transitioned"]);
    // Without the status before, claim and progress are told apart by it.
    expect(beforeFieldsOf(progressOf())).toEqual(["status"]);
    const progress = progressOf("running");
    expect(beforeFieldsOf(progress)).toEqual([]);
    expect(progress[0]?.data?.action).toEqual({ op: "literal", value: "progress" });
    expect(progressOf("pending")[0]?.data?.action).toEqual({ op: "literal", value: "claim" });
    const settle = feedRulesOf({
      writeClass: "intent",
      untouched: ["status", "transition_seq", "evidence_seq", "latest_attempt", "finalized_report"],
      removed: ["pending_notification"],
    });
    expect(settle.map((r) => r.kind)).toEqual(["intent.published"]);
    expect(beforeFieldsOf(settle)).toEqual(["pending_notification"]);
    // Its condition (intentIs) pins the intent before: nothing of it is read, its id is the write's own.
    const pinnedSettle = feedRulesOf({
      writeClass: "intent",
      untouched: ["status", "transition_seq", "evidence_seq", "latest_attempt", "finalized_report"],
      removed: ["pending_notification"],
      intentBefore: "owed",
    });
    expect(pinnedSettle).toEqual([
      { kind: "intent.published", when: { op: "all", of: [] }, intent_id: { op: "ref", side: "pinned", path: ["intent_id"] } },
    ]);
    expect(beforeFieldsOf(pinnedSettle)).toEqual([]);
    expect(feedRulesOf(CREATE_SHAPE).map((r) => r.kind)).toEqual(["job.registered"]);
    // Nothing declared but the class: every rule the class can set off, unfolded beyond it.
    expect(feedRulesOf({ writeClass: "transition", untouched: [], removed: [] }).map((r) => r.kind)).toEqual([
      "report.finalized",
      "job.transitioned",
      "intent.superseded",
    ]);
  });

  it("the rows do not change when every other field of the record before is something else", () => {
    fc.assert(
      fc.property(feedWrite, ({ before, after, note }) => {
        if (before === undefined) return;
        const feedOnly = Object.fromEntries(FEED_BEFORE_FIELDS.filter((f) => f in before).map((f) => [f, before[f]]));
        const other = {
          job_id: "elsewhere",
          prompt: "other",
          agent: "x",
          iteration: 99,
          updated_at: "1970-01-01T00:00:00.000Z",
          ...feedOnly,
        } as unknown as JobRecord;
        expect(rowsOfRules(other, after, note)).toStrictEqual(rowsOfRules(before, after, note));
      }),
      { numRuns: 500, seed: FEED_CASES_SEED },
    );
  });
});
