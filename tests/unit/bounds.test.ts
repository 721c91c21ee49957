/**
 * The bounds on free-form values (packages/core/src/bounds.ts) and the schemas that
 * apply them, without a store: depth, size, what a store can keep, and that no check
 * recurses.
 */
import {
  EventDataSchema,
  FREE_FORM_MAX_BYTES,
  FREE_FORM_MAX_DEPTH,
  findJsonBoundsIssue,
  type JsonBounds,
  jsonStringBytes,
  jsonTextDeeperThan,
  ProgressSchema,
  PublishEventRequestSchema,
  RegisterJobSchema,
  SideEffectSchema,
  TransitionRequestSchema,
  utf8Bytes,
  zodIssues,
} from "@mam/core";
import { describe, expect, it } from "vitest";
import * as z from "zod";
import { nestedArrays, nestedArraysText } from "../support/free-form.ts";

const STORED: JsonBounds = { maxBytes: 1 << 20, maxDepth: FREE_FORM_MAX_DEPTH, storable: true };

/** Deterministic pseudo-random JSON values of every kind (no dependency on a property-testing library). */
function randomValues(count: number, seed = 7): unknown[] {
  let state = seed;
  const next = () => {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    return state / 2 ** 31;
  };
  const strings = ["", "a", 'quote " and \\ back', "tab\tnew\nline\u0001\u001f", "café", "☕ 𝄞 emoji 😀", "\u2028\u2029", "x".repeat(300)];
  const numbers = [0, 1, -1, 0.5, 1e-130, -1e-130, 1e125, 2 ** 53 + 2, 123456.789, -7e-7, 1e21];
  const make = (depth: number): unknown => {
    const r = next();
    if (depth >= 6 || r < 0.45) {
      const k = Math.floor(next() * 4);
      if (k === 0) return strings[Math.floor(next() * strings.length)];
      if (k === 1) return numbers[Math.floor(next() * numbers.length)];
      if (k === 2) return next() < 0.5;
      return null;
    }
    const n = Math.floor(next() * 5);
    if (r < 0.7) return Array.from({ length: n }, () => make(depth + 1));
    const o: Record<string, unknown> = {};
    for (let i = 0; i < n; i++) o[`${strings[Math.floor(next() * strings.length)]}${i}`] = make(depth + 1);
    return o;
  };
  return Array.from({ length: count }, () => make(0));
}

describe("free-form bounds", () => {
  it("the byte count is exactly the UTF-8 length of JSON.stringify, for 500 values of every kind", () => {
    for (const value of randomValues(500)) {
      const bytes = Buffer.byteLength(JSON.stringify(value));
      expect(findJsonBoundsIssue(value, { ...STORED, maxBytes: bytes }), JSON.stringify(value)).toBeUndefined();
      expect(findJsonBoundsIssue(value, { ...STORED, maxBytes: bytes - 1 })).toEqual({
        path: [],
        message: `more than ${bytes - 1} bytes of JSON`,
      });
    }
    for (const s of ["", "plain", '"\\', "\b\f\n\r\t\u0000\u007f", "é☕𝄞", "\ud800", "a\udc00b"]) {
      expect(jsonStringBytes(s)).toBe(Buffer.byteLength(JSON.stringify(s)));
      if (!/\p{Surrogate}/u.test(s)) expect(utf8Bytes(s)).toBe(Buffer.byteLength(s));
    }
  });

  it("depth counts the value itself: 16 levels pass, 17 are refused naming the value as a whole", () => {
    expect(findJsonBoundsIssue(nestedArrays(16), STORED)).toBeUndefined();
    expect(findJsonBoundsIssue({ a: nestedArrays(15) }, STORED)).toBeUndefined();
    expect(findJsonBoundsIssue({ a: nestedArrays(16) }, STORED)).toEqual({ path: [], message: "nested deeper than 16 levels" });
    expect(findJsonBoundsIssue(1, { ...STORED, maxDepth: 0 })).toBeUndefined();
    expect(findJsonBoundsIssue([], { ...STORED, maxDepth: 0 })).toEqual({ path: [], message: "nested deeper than 0 levels" });
  });

  it("a value nested 100,000 levels deep is refused without recursion, where z.json() overflows the stack; 300,000 levels are walked whole when allowed", () => {
    const deep = JSON.parse(nestedArraysText(100_000));
    expect(() => z.json().safeParse(deep)).toThrow(RangeError);
    expect(() => JSON.stringify(deep)).toThrow(RangeError);
    expect(findJsonBoundsIssue(deep, STORED)).toEqual({ path: [], message: "nested deeper than 16 levels" });
    expect(
      findJsonBoundsIssue(nestedArrays(300_000), { maxBytes: Number.POSITIVE_INFINITY, maxDepth: 300_000, storable: true }),
    ).toBeUndefined();
    const issues = TransitionRequestSchema.safeParse({ action: "progress", expected_seq: 1, fields: { progress: { a: deep } } });
    expect(issues.success).toBe(false);
    expect(zodIssues(issues.error!, "body")).toEqual([{ path: "body.fields.progress", message: "nested deeper than 16 levels" }]);
  });

  it("the check's cost is bounded by its budget: a 1,000,000-element array is refused reading none of its elements", () => {
    let reads = 0;
    const huge = new Proxy(new Array<number>(1_000_000).fill(1), {
      get(target, prop, receiver) {
        if (typeof prop === "string" && /^\d+$/.test(prop)) reads += 1;
        return Reflect.get(target, prop, receiver);
      },
    });
    expect(findJsonBoundsIssue({ huge }, { ...STORED, maxBytes: 8192 })).toEqual({ path: [], message: "more than 8192 bytes of JSON" });
    expect(reads).toBe(0);
  });

  it("numbers: 0 and magnitudes from 1e-130 to below 1e126 pass; 1e126 (written 1e+126), 1e-131, NaN and ±Infinity are refused where they are", () => {
    for (const n of [0, -0, 1e-130, -1e-130, 9.99999999999999e125, -9.99999999999999e125, 2 ** 60, 0.1]) {
      expect(findJsonBoundsIssue({ n }, STORED), String(n)).toBeUndefined();
    }
    for (const n of [1e126, -1e126, 1e300, 1e-131, -1e-200, 5e-324]) {
      expect(findJsonBoundsIssue({ a: [0, n] }, STORED), String(n)).toEqual({
        path: ["a", 1],
        message: "a number out of the storable range: 0, or a magnitude from 1e-130 to below 1e126",
      });
    }
    for (const n of [Number.NaN, Number.POSITIVE_INFINITY, JSON.parse("-1e999") as number]) {
      expect(findJsonBoundsIssue({ n }, STORED)).toEqual({ path: ["n"], message: "not a finite number" });
    }
  });

  it("a __proto__ key from JSON.parse is refused at its path, where zod's z.record would drop it silently", () => {
    const parsed = JSON.parse('{"ok":1,"x":{"__proto__":{"polluted":true}}}');
    const dropped = z.record(z.string(), z.json()).parse(parsed) as { x: object };
    expect(Object.keys(dropped.x)).toEqual([]); // what zod alone would have stored
    expect(findJsonBoundsIssue(parsed, STORED)).toEqual({ path: ["x", "__proto__"], message: 'the key "__proto__" is not allowed' });
    const r = ProgressSchema.safeParse(parsed);
    expect(zodIssues(r.error!, "body.fields.progress")).toEqual([
      { path: "body.fields.progress.x.__proto__", message: 'the key "__proto__" is not allowed' },
    ]);
    expect(({} as { polluted?: unknown }).polluted).toBeUndefined();
  });

  it("a constructor key and an empty key are refused (DynamoDB's marshaller and DynamoDB itself refuse them); prototype is kept", () => {
    expect(findJsonBoundsIssue({ a: { constructor: { name: "Set" } } }, STORED)).toEqual({
      path: ["a", "constructor"],
      message: 'the key "constructor" is not allowed',
    });
    expect(findJsonBoundsIssue({ a: [{ "": 1 }] }, STORED)).toEqual({ path: ["a", 0], message: "an empty key cannot be stored" });
    expect(findJsonBoundsIssue({ prototype: { prototype: 1 }, toString: "s" }, STORED)).toBeUndefined();
  });

  it("strings and keys with a lone surrogate are refused; astral characters are kept", () => {
    expect(findJsonBoundsIssue({ s: ["ok 𝄞", "bad \ud83d"] }, STORED)).toEqual({
      path: ["s", 1],
      message: "a string with a lone surrogate (not Unicode text)",
    });
    expect(findJsonBoundsIssue({ o: { "\udc00": 1 } }, STORED)).toEqual({
      path: ["o"],
      message: "a key with a lone surrogate (not Unicode text)",
    });
    expect(findJsonBoundsIssue({ "😀": "😀" }, STORED)).toBeUndefined();
  });

  it("anything JSON.parse cannot make is refused: undefined, functions, bigints, dates, class instances, holes", () => {
    class Thing {}
    for (const [value, path] of [
      [{ a: undefined }, ["a"]],
      [{ f: () => 1 }, ["f"]],
      [{ b: 1n }, ["b"]],
      [{ d: new Date(0) }, ["d"]],
      [{ t: new Thing() }, ["t"]],
      [{ m: new Map() }, ["m"]],
      [{ h: new Array(3) }, ["h", 0]],
    ] as [unknown, (string | number)[]][]) {
      expect(findJsonBoundsIssue(value, STORED)).toEqual({ path, message: "not a JSON value" });
    }
    expect(findJsonBoundsIssue(Object.assign(Object.create(null), { a: 1 }), STORED)).toBeUndefined();
  });

  it("a scenario's bounds (storable: false) check only its size and depth", () => {
    const scenarioBounds: JsonBounds = { maxBytes: FREE_FORM_MAX_BYTES.scenario, maxDepth: FREE_FORM_MAX_DEPTH, storable: false };
    const odd = JSON.parse('{"__proto__":1,"constructor":2,"":3,"n":1e-300,"s":"\\ud800","inf":1e999}');
    expect(findJsonBoundsIssue(odd, scenarioBounds)).toBeUndefined();
    expect(findJsonBoundsIssue({ deep: nestedArrays(16) }, scenarioBounds)).toEqual({ path: [], message: "nested deeper than 16 levels" });
  });

  it("the schemas apply the limits: progress 8 KiB (keys of 64 characters), event data 16 KiB, reference 1 KiB and prompt 64 KiB of UTF-8", () => {
    const of = (bytes: number) => ({ s: "x".repeat(bytes - 8) }); // {"s":"…"} is 8 bytes around the string
    expect(ProgressSchema.safeParse(of(8192)).success).toBe(true);
    expect(ProgressSchema.safeParse(of(8193)).error?.issues).toMatchObject([{ path: [], message: "more than 8192 bytes of JSON" }]);
    expect(ProgressSchema.safeParse({ ["k".repeat(65)]: 1 }).error?.issues).toMatchObject([
      { message: "a progress key is at most 64 characters" },
    ]);
    expect(ProgressSchema.safeParse([1]).error?.issues).toMatchObject([{ message: "expected a JSON object" }]);
    expect(EventDataSchema.safeParse(of(16384)).success).toBe(true);
    expect(EventDataSchema.safeParse(of(16385)).success).toBe(false);
    expect(PublishEventRequestSchema.safeParse({ event: "progress", data: of(16385) }).success).toBe(false);
    const reference = (s: string) => SideEffectSchema.safeParse({ kind: "commit", reference: s });
    expect(reference("é".repeat(512)).success).toBe(true);
    expect(reference("é".repeat(513)).error?.issues).toMatchObject([{ path: ["reference"], message: "more than 1024 bytes of UTF-8" }]);
    expect(reference("\ud800").success).toBe(false);
    const register = (prompt: string) => RegisterJobSchema.safeParse({ prompt, agent: "codex" });
    expect(register("☕".repeat(Math.floor(65536 / 3)) + "x").success).toBe(true);
    expect(register("☕".repeat(Math.floor(65536 / 3)) + "xx").error?.issues).toMatchObject([
      { path: ["prompt"], message: "more than 65536 bytes of UTF-8" },
    ]);
    // The value is passed through, not copied.
    const value = { a: [1, { b: 2 }] };
    expect(ProgressSchema.parse(value)).toBe(value);
  });

  it("jsonTextDeeperThan counts brackets outside strings only, escapes included, in one pass over the bytes", () => {
    const deeper = (text: string, max: number) => jsonTextDeeperThan(Buffer.from(text), max);
    expect(deeper("[[1]]", 2)).toBe(false);
    expect(deeper("[[[1]]]", 2)).toBe(true);
    expect(deeper('{"a":{"b":1}}', 2)).toBe(false);
    expect(deeper('{"a":{"b":{"c":1}}}', 2)).toBe(true);
    expect(deeper('["[[[[", "\\"[[[["]', 1)).toBe(false);
    expect(deeper('["\\\\", [[1]]]', 2)).toBe(true);
    expect(deeper("[[1],[2],[3]]", 2)).toBe(false);
    expect(deeper('"☕[[[[[["', 0)).toBe(false);
    expect(deeper("[".repeat(1 << 20), 64)).toBe(true);
  });
});
