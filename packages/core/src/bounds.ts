import * as z from "zod";
import { MamError } from "./errors.ts";

/**
 * Bounds on free-form values (progress, event data, side-effect references, the
 * prompt, a scenario): nothing the API accepts may make a store fail later.
 *
 * The limits come from the strictest store, counting the nesting each adapter adds
 * around a value:
 * - DynamoDB: 32 levels of nesting in all and 400 KB per item; numbers 0 or of
 *   magnitude 1E-130 to 9.9999999999999999999999999999999999999E+125; no empty
 *   attribute name, at any depth. An agent's event `data` sits two maps deep in its
 *   event item (`data.data`), progress one map deep in the job item.
 * - SQLite: its JSON functions stop at 1,000 levels (a deeper document is
 *   "malformed JSON" to every later `json_set`).
 * - JS: `JSON.stringify` and zod's `z.json()` recurse, and overflow the stack at a
 *   few thousand levels; every check here walks with an explicit stack instead.
 *
 * One depth for every free-form value, 16 levels counting the value itself (`{}` is
 * one level), so the deepest item is 2 + 16 levels: half DynamoDB's 32. One size per
 * field, counted as the UTF-8 bytes of the value's JSON text.
 */
export const FREE_FORM_MAX_DEPTH = 16;

export const FREE_FORM_MAX_BYTES = {
  /** A job's progress: kept in the job record, read on every transition. */
  progress: 8 * 1024,
  /** An agent's event `data`: one event log item each. */
  eventData: 16 * 1024,
  /** One side effect's reference (a commit id, a URL): kept in the manifest. */
  sideEffectReference: 1024,
  /** The job's prompt: kept in the job record. */
  prompt: 64 * 1024,
  /** A scenario: read by the gate and never stored; only its size and depth are checked at the edge. */
  scenario: 256 * 1024,
} as const;

/**
 * How much of an attempt's observations the job record keeps, per source class, so
 * one class filling its share can neither refuse nor evict the other's: at most
 * `count` observations and `bytes` of them (their JSON, UTF-8). Coalesced repeats add
 * nothing. Both classes full, the set stays below 64 KiB of the record (DynamoDB's
 * item is 400 KB; every write of a job item is billed by its size).
 */
export const OBSERVATION_BOUNDS = {
  watcher: { count: 64, bytes: 24 * 1024 },
  agent: { count: 64, bytes: 24 * 1024 },
} as const;

/**
 * A JSON request body nested deeper than this is refused before it is parsed: no
 * schema accepts one (a free-form value of 16 levels lies at most 3 levels inside a
 * body), and nothing downstream ever holds a value deep enough to overflow a stack.
 */
export const JSON_BODY_MAX_DEPTH = 64;

/** The magnitudes DynamoDB stores: 1E-130 up to 9.99…E+125 (38 nines). As doubles, below 1e126. */
export const STORABLE_NUMBER = { minMagnitude: 1e-130, maxMagnitudeExclusive: 1e126 } as const;

/**
 * Keys refused in every stored free-form value, at any depth, because a store would
 * lose or choke on them:
 * - `__proto__`: JSON.parse makes it an own key, but every copy made by assignment
 *   (zod's `z.record`, DynamoDB's marshall and unmarshall) sets the copy's prototype
 *   instead — the key silently vanishes, or its value becomes inherited.
 * - `constructor`: DynamoDB's marshaller decides a value's type by
 *   `value.constructor.name`; an object with its own `constructor` key is refused
 *   ("Unsupported type passed") or taken for a Set, a Map or a String.
 * `prototype` is kept: no store reads it, and alone it pollutes nothing.
 */
export const REFUSED_KEYS: ReadonlySet<string> = new Set(["__proto__", "constructor"]);

export type JsonValue = z.core.util.JSONType;
export type JsonObject = { [key: string]: JsonValue };

export interface JsonBounds {
  /** UTF-8 bytes of the value's JSON text. */
  readonly maxBytes: number;
  /** Levels of arrays and objects, the value's own included. */
  readonly maxDepth: number;
  /**
   * Also refuse what a store cannot keep or would change: numbers outside
   * STORABLE_NUMBER, `__proto__` and empty keys, strings with a lone surrogate.
   * Off for a scenario, which is never stored.
   */
  readonly storable: boolean;
}

export interface JsonBoundsIssue {
  /** Relative to the value checked; `[]` for the value as a whole (its size, its depth). */
  readonly path: readonly (string | number)[];
  readonly message: string;
}

interface Frame {
  readonly value: unknown;
  readonly depth: number;
  readonly parent: Frame | undefined;
  readonly key: string | number | undefined;
}

const LONE_SURROGATE = /\p{Surrogate}/u;

function pathOf(frame: Frame | undefined, last?: string | number): (string | number)[] {
  const path: (string | number)[] = last === undefined ? [] : [last];
  for (let f = frame; f !== undefined && f.key !== undefined; f = f.parent) path.unshift(f.key);
  return path;
}

function isPlainObject(v: object): boolean {
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/**
 * The first way `value` breaks `bounds`, or undefined. Iterative (an explicit
 * stack), and it stops as soon as the byte budget is spent, so its cost is bounded by
 * `maxBytes` and `maxDepth` whatever it is handed: a 100,000-level value is refused
 * after 17 steps, a 1 MiB array after its first 8 KiB.
 */
export function findJsonBoundsIssue(value: unknown, bounds: JsonBounds): JsonBoundsIssue | undefined {
  const { maxBytes, maxDepth, storable } = bounds;
  let bytes = 0;
  const tooLarge = (): JsonBoundsIssue => ({ path: [], message: `more than ${maxBytes} bytes of JSON` });
  const stack: Frame[] = [{ value, depth: 0, parent: undefined, key: undefined }];
  for (let frame = stack.pop(); frame !== undefined; frame = stack.pop()) {
    const v = frame.value;
    if (v === null) {
      bytes += 4;
    } else if (typeof v === "boolean") {
      bytes += v ? 4 : 5;
    } else if (typeof v === "number") {
      if (!Number.isFinite(v)) {
        if (storable) return { path: pathOf(frame), message: "not a finite number" };
        bytes += 4; // JSON.stringify writes it as null
      } else {
        const magnitude = Math.abs(v);
        if (
          storable &&
          magnitude !== 0 &&
          (magnitude < STORABLE_NUMBER.minMagnitude || magnitude >= STORABLE_NUMBER.maxMagnitudeExclusive)
        ) {
          return { path: pathOf(frame), message: "a number out of the storable range: 0, or a magnitude from 1e-130 to below 1e126" };
        }
        bytes += String(v).length;
      }
    } else if (typeof v === "string") {
      if (storable && LONE_SURROGATE.test(v)) return { path: pathOf(frame), message: "a string with a lone surrogate (not Unicode text)" };
      bytes += jsonStringBytes(v, maxBytes - bytes);
    } else if (typeof v === "object") {
      const depth = frame.depth + 1;
      if (depth > maxDepth) return { path: [], message: `nested deeper than ${maxDepth} levels` };
      if (Array.isArray(v)) {
        bytes += v.length === 0 ? 2 : v.length + 1; // brackets and commas
        if (bytes > maxBytes) return tooLarge();
        for (let i = v.length - 1; i >= 0; i--) stack.push({ value: v[i], depth, parent: frame, key: i });
      } else {
        if (!isPlainObject(v)) return { path: pathOf(frame), message: "not a JSON value" };
        const keys = Object.keys(v);
        bytes += keys.length === 0 ? 2 : 2 * keys.length + 1; // braces, colons and commas
        for (const key of keys) {
          if (storable) {
            if (REFUSED_KEYS.has(key)) return { path: pathOf(frame, key), message: `the key ${JSON.stringify(key)} is not allowed` };
            // Named at the object that holds it: an empty segment would vanish from a dotted path.
            if (key === "") return { path: pathOf(frame), message: "an empty key cannot be stored" };
            if (LONE_SURROGATE.test(key)) return { path: pathOf(frame), message: "a key with a lone surrogate (not Unicode text)" };
          }
          bytes += jsonStringBytes(key, maxBytes - bytes);
          if (bytes > maxBytes) return tooLarge();
        }
        for (let i = keys.length - 1; i >= 0; i--) {
          const key = keys[i]!;
          stack.push({ value: (v as Record<string, unknown>)[key], depth, parent: frame, key });
        }
      }
    } else {
      // undefined, a function, a symbol, a bigint: nothing JSON.parse makes.
      return { path: pathOf(frame), message: "not a JSON value" };
    }
    if (bytes > maxBytes) return tooLarge();
  }
  return undefined;
}

/**
 * The UTF-8 length of `s` as JSON.stringify writes it (quotes and escapes
 * included); once past `budget` it stops counting and answers `budget + 1`.
 */
export function jsonStringBytes(s: string, budget = Number.POSITIVE_INFINITY): number {
  // Every code unit takes at least one byte: a string longer than the budget is over it.
  if (s.length + 2 > budget) return budget + 1;
  let n = 2;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22 || c === 0x5c) n += 2;
    else if (c < 0x20) n += c === 0x08 || c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d ? 2 : 6;
    else if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i += 1;
    } else if (c >= 0xd800 && c <= 0xdfff)
      n += 6; // a lone surrogate, written \udXXX
    else n += 3;
  }
  return n;
}

/** The UTF-8 length of `s` itself (no quotes, no escapes). */
export function utf8Bytes(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i += 1;
    } else n += 3;
  }
  return n;
}

function addBoundsIssue(value: unknown, bounds: JsonBounds, ctx: z.RefinementCtx): void {
  const issue = findJsonBoundsIssue(value, bounds);
  if (issue !== undefined) ctx.addIssue({ code: "custom", message: issue.message, path: [...issue.path] });
}

function documented(bounds: JsonBounds, what: string): Record<string, unknown> {
  return {
    description: `${what}: at most ${bounds.maxBytes} bytes of JSON, nested at most ${bounds.maxDepth} levels${
      bounds.storable ? "; numbers 0 or of magnitude 1e-130 to below 1e126; no `__proto__`, `constructor` or empty key" : ""
    }`,
    "x-max-bytes": bounds.maxBytes,
    "x-max-depth": bounds.maxDepth,
  };
}

/**
 * A free-form JSON object within `bounds`. The value is passed through as it came
 * (zod's `z.record` would copy it, silently dropping a `__proto__` key), and checked
 * without recursion, so no depth can overflow a stack.
 */
export function boundedJsonObject(bounds: JsonBounds, what = "a free-form JSON object"): z.ZodType<JsonObject> {
  return z
    .custom<JsonObject>((v) => typeof v === "object" && v !== null && !Array.isArray(v), { message: "expected a JSON object" })
    .superRefine((v, ctx) => addBoundsIssue(v, bounds, ctx))
    .meta({ type: "object", additionalProperties: true, ...documented(bounds, what) });
}

/** Any JSON value within `bounds`; as `boundedJsonObject`, checked without recursion. */
export function boundedJson(bounds: JsonBounds, what = "a free-form JSON value"): z.ZodType<JsonValue> {
  return z
    .custom<JsonValue>((v) => v !== undefined, { message: "expected a JSON value" })
    .superRefine((v, ctx) => addBoundsIssue(v, bounds, ctx))
    .meta(documented(bounds, what));
}

/** A string of at most `maxBytes` UTF-8 bytes, and Unicode text (no lone surrogate), so every store keeps it as it is. */
export function boundedText(maxBytes: number): z.ZodString {
  return z
    .string()
    .max(maxBytes) // every UTF-16 code unit is at least one byte: a cheap first cut
    .refine((s) => utf8Bytes(s) <= maxBytes, { message: `more than ${maxBytes} bytes of UTF-8` })
    .refine((s) => !LONE_SURROGATE.test(s), { message: "a string with a lone surrogate (not Unicode text)" });
}

/**
 * Whether a JSON text nests deeper than `maxDepth`, by counting brackets outside
 * strings: one pass, no allocation, so a body of a million `[` is refused in about a
 * millisecond instead of being built into a million arrays (V8's JSON.parse is
 * iterative, but it takes ~200 ms and ~30 MB for that). Works on UTF-8 bytes: the
 * bytes it looks for never occur inside a multi-byte sequence. Malformed text is left
 * for JSON.parse to refuse.
 */
export function jsonTextDeeperThan(text: Uint8Array, maxDepth: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === 0x5c) i += 1;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      depth += 1;
      if (depth > maxDepth) return true;
    } else if (c === 0x5d || c === 0x7d) depth -= 1;
  }
  return false;
}

// ---- paged reads

/**
 * An event page holds at most this many bytes of entries (their JSON, UTF-8), and
 * always at least one entry: a read costs its page, whatever the log holds.
 */
export const EVENT_PAGE_MAX_BYTES = 1024 * 1024;

/**
 * A page of job records (`list`, `listQuarantined`) holds at most this many bytes of
 * records (their JSON, UTF-8), and always at least one record: kept by
 * `JobStoreBase`, under every adapter. A record is itself bounded (its prompt
 * 64 KiB of text, its progress 8 KiB of JSON, every other field by its schema), at
 * most JOB_RECORD_MAX_JSON_BYTES of JSON, so a page is never more than the larger of
 * the two: far under what one answer may carry anywhere (a Lambda's 6 MB).
 */
export const JOB_PAGE_MAX_BYTES = 1024 * 1024;

/**
 * The most JSON one job record can take, from JobRecordSchema's bounds, every string
 * at its longest and every character at its costliest as JSON (a control character
 * is 6 bytes, `\u0001`; any UTF-16 code unit at most 6). Derived, field by field, in
 * docs/decisions.md ("Reports larger than a Lambda payload"); a test builds such a
 * record and holds it under this.
 */
export const JOB_RECORD_MAX_JSON_BYTES = 480 * 1024;

/** The refusal of a cursor a listing did not hand out: the same on every store. */
export function invalidCursor(cause?: unknown): MamError {
  return new MamError("input.invalid", "the cursor is not one this listing handed out", {
    issues: [{ path: "query.cursor", message: "not a cursor of this listing" }],
    ...(cause === undefined ? {} : { cause }),
  });
}
