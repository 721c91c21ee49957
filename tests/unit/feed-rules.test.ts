/**
 * The feed's rows declared as rules (core's FEED_RULES) and evaluated in JavaScript
 * (`rowsOfRules`, which `changeRowsOf` is) make exactly the rows the imperative
 * `changeRowsOf` made before the rules (its frozen copy, tests/support/feed-oracle.ts):
 * the same rows, in the same order, with the same keys present, on thousands of
 * generated writes reaching every rule. And the rules read of the record before a
 * write only what an adapter captures (`FEED_BEFORE_FIELDS`).
 */
import {
  CHANGE_KINDS,
  type ChangeDraft,
  changeRowsOf,
  evaluateFeedPredicate,
  FEED_BEFORE_FIELDS,
  FEED_RULES,
  type FeedPredicate,
  type FeedValue,
  type JobRecord,
  rowsOfRules,
} from "@mam/core";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { FEED_CASES_SEED, feedWrite, kindCounts } from "../support/feed-cases.ts";
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
    const read = new Set<string>();
    const value = (v: FeedValue): void => {
      if (v.op === "ref" && v.side === "before") read.add(v.path[0]);
      if (v.op === "coalesce") v.values.forEach(value);
      if (v.op === "case") {
        for (const c of v.cases) {
          predicate(c.when);
          value(c.value);
        }
        value(v.else);
      }
    };
    const predicate = (p: FeedPredicate): void => {
      if (p.op === "all" || p.op === "any") p.of.forEach(predicate);
      if (p.op === "not") predicate(p.of);
      if (p.op === "present" || p.op === "absent") value(p.value);
      if (p.op === "eq" || p.op === "ne" || p.op === "gt") {
        value(p.left);
        value(p.right);
      }
    };
    for (const rule of FEED_RULES) {
      predicate(rule.when);
      if (rule.intent_id !== undefined) value(rule.intent_id);
      for (const v of Object.values(rule.data ?? {})) value(v);
    }
    expect([...read].every((field) => (FEED_BEFORE_FIELDS as readonly string[]).includes(field))).toBe(true);
    expect([...read].sort()).toEqual([...FEED_BEFORE_FIELDS].sort());
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
