import { FREE_FORM_MAX_DEPTH, findJsonBoundsIssue, type JsonObject, type JsonValue } from "@mam/core";

/**
 * Free-form values at and past the bounds (packages/core/src/bounds.ts), built
 * without recursion so a test can make one of any depth.
 */

/** `levels` arrays, one inside the other, around `leaf` (`[[[leaf]]]` is 3 levels). */
export function nestedArrays(levels: number, leaf: JsonValue = 1): JsonValue {
  let v: JsonValue = leaf;
  for (let i = 0; i < levels; i++) v = [v];
  return v;
}

/** The JSON text of `nestedArrays(levels)`, built as text (JSON.stringify would overflow the stack). */
export function nestedArraysText(levels: number): string {
  return `${"[".repeat(levels)}1${"]".repeat(levels)}`;
}

/**
 * A JSON object of exactly `bytes` bytes of JSON and exactly `depth` levels (the
 * object itself is one): a chain of objects down to an array holding a padding
 * string, with a few values of every kind at the top.
 */
export function maxFreeForm(bytes: number, depth = FREE_FORM_MAX_DEPTH): JsonObject {
  const build = (pad: string): JsonObject => {
    let inner: JsonValue = [pad];
    for (let i = 0; i < depth - 2; i++) inner = { d: inner };
    return {
      n: 1e125,
      tiny: -1e-130,
      zero: 0,
      ok: true,
      none: null,
      text: "café ☕ 𝄞",
      prototype: { kept: true },
      chain: inner,
    };
  };
  const base = Buffer.byteLength(JSON.stringify(build("")));
  const value = build("x".repeat(bytes - base));
  const actual = Buffer.byteLength(JSON.stringify(value));
  if (actual !== bytes) throw new Error(`maxFreeForm: built ${actual} bytes, wanted ${bytes}`);
  const issue = findJsonBoundsIssue(value, { maxBytes: bytes, maxDepth: depth, storable: true });
  if (issue !== undefined) throw new Error(`maxFreeForm: out of bounds: ${issue.message}`);
  if (findJsonBoundsIssue(value, { maxBytes: bytes, maxDepth: depth - 1, storable: true }) === undefined) {
    throw new Error(`maxFreeForm: not ${depth} levels deep`);
  }
  return value;
}
