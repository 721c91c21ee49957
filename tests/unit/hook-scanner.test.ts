/**
 * The streaming allowlist scanner of agent hook bodies (issue 21): what it keeps is
 * exactly what JSON.parse of the whole text would give for the allowlisted paths, for
 * any JSON object split into any chunks; everything else is dropped, and a body that
 * is not one JSON object is refused whole.
 */
import {
  HOOK_ALLOWLISTS,
  HOOK_JSON_MAX_DEPTH,
  type HookAllowlist,
  HookJsonError,
  KEPT_ELEMENTS_MAX,
  KEPT_VALUE_MAX_BYTES,
  scanHookJson,
} from "@mam/core";
import fc from "fast-check";
import { describe, expect, it } from "vitest";

const ALLOW = HOOK_ALLOWLISTS["claude-code"];
const enc = new TextEncoder();

/** What the scanner should keep, derived from JSON.parse of the whole text. */
function expected(doc: Record<string, unknown>, allow: HookAllowlist) {
  const scalar = (v: unknown) => v === null || ["string", "number", "boolean"].includes(typeof v);
  const fits = (v: unknown) => typeof v !== "string" || enc.encode(JSON.stringify(v)).length <= KEPT_VALUE_MAX_BYTES;
  const scalars: Record<string, unknown> = {};
  for (const key of allow.scalars) if (key in doc && scalar(doc[key]) && fits(doc[key])) scalars[key] = doc[key];
  const records: Record<string, unknown> = {};
  for (const [key, fields] of Object.entries(allow.records ?? {})) {
    const v = doc[key];
    if (!Array.isArray(v)) continue;
    const items = v.slice(0, KEPT_ELEMENTS_MAX).map((el) => {
      const kept: Record<string, unknown> = {};
      if (typeof el === "object" && el !== null && !Array.isArray(el)) {
        for (const f of fields)
          if (f in el && scalar((el as Record<string, unknown>)[f]) && fits((el as Record<string, unknown>)[f]))
            kept[f] = (el as Record<string, unknown>)[f];
      }
      return kept;
    });
    records[key] = { items, length: v.length };
  }
  const counts: Record<string, number> = {};
  for (const key of allow.counts ?? []) if (Array.isArray(doc[key])) counts[key] = (doc[key] as unknown[]).length;
  return { scalars, records, counts };
}

function chunksOf(bytes: Uint8Array, cuts: number[]): Uint8Array[] {
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Uint8Array[] = [];
  let from = 0;
  for (const p of points) {
    out.push(bytes.subarray(from, p));
    from = p;
  }
  out.push(bytes.subarray(from));
  return out;
}

const value = fc.jsonValue({ maxDepth: 3 });
const task = fc.oneof(fc.record({ type: fc.oneof(fc.string(), value), status: fc.oneof(fc.string(), value), command: fc.string() }), value);
const hookDoc = fc.record(
  {
    hook_event_name: fc.oneof(fc.constantFrom("Stop", "PostToolUse", "SessionStart"), value),
    session_id: fc.oneof(fc.uuid(), value),
    stop_hook_active: fc.oneof(fc.boolean(), value),
    notification_type: fc.string(),
    error: fc.oneof(fc.string(), value),
    tool_response: value,
    tool_input: fc.dictionary(fc.string(), value),
    background_tasks: fc.oneof(fc.array(task, { maxLength: 5 }), value),
    session_crons: fc.oneof(fc.array(value, { maxLength: 4 }), value),
    'weird "key" \u00e9': value,
  },
  { requiredKeys: [] },
);

describe("the hook body scanner (issue 21)", () => {
  it("keeps exactly the allowlisted paths JSON.parse finds, for any object cut into any chunks", async () => {
    await fc.assert(
      fc.asyncProperty(hookDoc, fc.array(fc.nat(), { maxLength: 6 }), fc.boolean(), async (doc, cuts, pretty) => {
        const text = JSON.stringify(doc, null, pretty ? 2 : undefined);
        const scanned = await scanHookJson(chunksOf(enc.encode(text), cuts), ALLOW);
        const want = expected(JSON.parse(text) as Record<string, unknown>, ALLOW);
        expect({ scalars: scanned.scalars, records: scanned.records, counts: scanned.counts }).toEqual(want);
      }),
      { numRuns: 300 },
    );
  });

  it("refuses whatever JSON.parse refuses (or is not one object), and accepts what it accepts", async () => {
    const samples = [
      '{"a":1',
      '{"a":}',
      "[1]",
      '"x"',
      "",
      '{"a":1} {"b":2}',
      '{"a":tru}',
      '{"a":01}',
      '{"a":"\\x"}',
      '{"a":1,}',
      "{a:1}",
      '{"a":"\u0001"}',
      '{"a":[1,]}',
      '{"a":1}  ',
      ' {"a":-1.5e3}',
    ];
    for (const text of samples) {
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
      const isObject = typeof parsed === "object" && parsed !== null && !Array.isArray(parsed);
      const run = scanHookJson([enc.encode(text)], ALLOW);
      if (isObject) await expect(run, text).resolves.toBeDefined();
      else await expect(run, text).rejects.toBeInstanceOf(HookJsonError);
    }
  });

  it("reads a 64 MiB tool response chunk by chunk, keeping a few bytes of it", async () => {
    const head = enc.encode('{"session_id":"s-1","hook_event_name":"PostToolUse","tool_response":{"output":"');
    const tail = enc.encode('"},"background_tasks":[],"session_crons":[]}');
    const filler = new Uint8Array(1024 * 1024).fill(0x61);
    function* body() {
      yield head;
      for (let i = 0; i < 64; i++) yield filler;
      yield tail;
    }
    const before = process.memoryUsage().heapUsed;
    const scanned = await scanHookJson(body(), ALLOW);
    expect(scanned.scalars).toEqual({ session_id: "s-1", hook_event_name: "PostToolUse" });
    expect(scanned.records.background_tasks).toEqual({ items: [], length: 0 });
    expect(scanned.counts.session_crons).toBe(0);
    expect(scanned.bytes).toBe(head.length + tail.length + 64 * filler.length);
    // Nothing of the 64 MiB was kept (a generous bound: the filler is reused, never copied).
    expect(process.memoryUsage().heapUsed - before).toBeLessThan(32 * 1024 * 1024);
  });

  it("reads a key named like a property every object inherits (constructor, __proto__, toString) as any other key: dropped, never a crash", async () => {
    for (const key of ["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"]) {
      const text = `{"hook_event_name":"Stop","session_id":"s-1",${JSON.stringify(key)}:[{"type":"x","status":1},2],"background_tasks":[],"session_crons":[]}`;
      const scanned = await scanHookJson([enc.encode(text)], ALLOW);
      expect({ scalars: scanned.scalars, records: scanned.records, counts: scanned.counts }, key).toEqual(
        expected(JSON.parse(text) as Record<string, unknown>, ALLOW),
      );
      expect(Object.keys(scanned.records), key).toEqual(["background_tasks"]);
      expect(Object.getPrototypeOf(scanned.records), key).toBe(Object.prototype);
    }
  });

  it("reads a deeply nested body as fast as a flat one of the same size: the work per byte does not grow with the depth", async () => {
    // The same values, once in one array and once at the bottom of HOOK_JSON_MAX_DEPTH - 2 arrays.
    const values = "0,".repeat(400_000);
    const depth = HOOK_JSON_MAX_DEPTH - 2;
    const flat = enc.encode(`{"tool_response":[${values}0],"p":${"[".repeat(depth)}${"]".repeat(depth)}}`);
    const deep = enc.encode(`{"tool_response":${"[".repeat(depth)}${values}0${"]".repeat(depth)}}`);
    expect(Math.abs(deep.length - flat.length)).toBeLessThan(10);
    const time = async (body: Uint8Array) => {
      const started = performance.now();
      await scanHookJson([body], ALLOW);
      return performance.now() - started;
    };
    await time(flat);
    await time(deep);
    const flatMs = Math.min(await time(flat), await time(flat));
    const deepMs = Math.min(await time(deep), await time(deep));
    expect(deepMs / flatMs, `deep ${deepMs.toFixed(0)} ms, flat ${flatMs.toFixed(0)} ms`).toBeLessThan(3);
  });

  it("refuses a body nested deeper than its bound without building it", async () => {
    await expect(scanHookJson([enc.encode(`{"a":${"[".repeat(10_000)}`)], ALLOW)).rejects.toThrow(/nested deeper/);
  });
});
