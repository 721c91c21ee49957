/**
 * A streaming reader of an agent hook's JSON that keeps only what an allowlist names
 * and drops the rest as it passes: a Claude Code `PostToolUse` carries the tool's
 * whole input and output (megabytes, at times), and mam stores none of it, so the
 * body is never buffered and never meets a body limit. Memory is bounded by the
 * allowlist (each kept value at most `KEPT_VALUE_MAX_BYTES` of JSON text), not by
 * the payload; the nesting depth by `HOOK_JSON_MAX_DEPTH`.
 *
 * What it keeps, by path from the top-level object:
 * - `scalars`: top-level keys whose value is a string, number, boolean or null;
 * - `records`: top-level keys holding an array of objects, of which only the named
 *   scalar fields of each element are kept (at most `KEPT_ELEMENTS_MAX` elements,
 *   and the element count);
 * - `counts`: top-level keys holding an array, of which only the length is kept.
 * A kept key whose value has another shape is dropped as if it were absent. The
 * scanner checks the whole text is one well-formed JSON object (RFC 8259 grammar;
 * numbers and literals by their token), so malformed input is refused, never half-read.
 */

export interface HookAllowlist {
  readonly scalars: readonly string[];
  readonly records?: Readonly<Record<string, readonly string[]>>;
  readonly counts?: readonly string[];
}

/** What was kept: each kept scalar decoded; each record array's kept fields and length; each counted array's length. */
export interface ScannedHook {
  readonly scalars: Readonly<Record<string, string | number | boolean | null>>;
  readonly records: Readonly<
    Record<string, { readonly items: readonly Readonly<Record<string, string | number | boolean | null>>[]; readonly length: number }>
  >;
  readonly counts: Readonly<Record<string, number>>;
  /** Bytes read. */
  readonly bytes: number;
}

export const HOOK_JSON_MAX_DEPTH = 512;
/** The most bytes of one hook event mam reads (streamed, never held): past it, 413. */
export const HOOK_BODY_MAX_BYTES = 64 * 1024 * 1024;
/** The most JSON text of one kept value: longer, and the value is dropped (as if absent). */
export const KEPT_VALUE_MAX_BYTES = 4096;
/** The most elements of a record array kept (the count goes on). */
export const KEPT_ELEMENTS_MAX = 64;
const KEY_MAX_BYTES = 128;
const LITERAL_MAX_BYTES = 512;

export class HookJsonError extends Error {}

type Frame =
  | {
      readonly type: "object";
      state: "key-or-end" | "key" | "colon" | "value" | "comma-or-end";
      key: string | undefined;
      readonly path: readonly (string | number)[];
    }
  | {
      readonly type: "array";
      state: "value-or-end" | "value" | "comma-or-end";
      index: number;
      readonly path: readonly (string | number)[];
    };

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);

/**
 * Every path the allowlist can keep is at most three steps (a key; a key, an index, a
 * field): below that, one shared path that keeps nothing, so a value deep down costs
 * no copy of its whole path (a body of small values 500 levels down would otherwise
 * cost a 500-step copy per value: work per byte growing with the depth).
 */
const TOO_DEEP_TO_KEEP: readonly (string | number)[] = ["", -1, "", ""];

function childPath(path: readonly (string | number)[], step: string | number): readonly (string | number)[] {
  return path.length >= 3 ? TOO_DEEP_TO_KEEP : [...path, step];
}
const LITERAL_CHAR = /[0-9a-zA-Z.+-]/;
const NUMBER = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$/;

/** Scan a whole hook body, chunk by chunk. Throws `HookJsonError` for anything that is not one JSON object. */
export async function scanHookJson(
  chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  allowlist: HookAllowlist,
): Promise<ScannedHook> {
  const scanner = new HookScanner(allowlist);
  for await (const chunk of chunks) scanner.feed(chunk);
  return scanner.end();
}

export class HookScanner {
  readonly #allow: HookAllowlist;
  readonly #stack: Frame[] = [];
  #started = false;
  #done = false;
  #bytes = 0;
  // The token being read: a string (key or value) or a literal (number, true, false, null).
  #token: "none" | "string" | "literal" = "none";
  #escape = false;
  #unicode = 0;
  /** The raw text of the token, while it is kept (a key, or a kept value); undefined when it is skipped. */
  #raw: number[] | undefined;
  #rawOverflow = false;
  #tokenIsKey = false;
  #literalLength = 0;
  readonly #scalars: Record<string, string | number | boolean | null> = {};
  readonly #records: Record<string, { items: Record<string, string | number | boolean | null>[]; length: number }> = {};
  readonly #counts: Record<string, number> = {};

  constructor(allowlist: HookAllowlist) {
    this.#allow = allowlist;
  }

  feed(chunk: Uint8Array): void {
    if (this.#done && chunk.some((b) => !WS.has(b))) throw new HookJsonError("text after the JSON object");
    this.#bytes += chunk.byteLength;
    for (let i = 0; i < chunk.length; i++) this.#byte(chunk[i] as number);
  }

  end(): ScannedHook {
    if (this.#token === "literal") this.#endLiteral();
    if (!this.#done) throw new HookJsonError(this.#started ? "the JSON ends before its object closes" : "the body is empty");
    return { scalars: this.#scalars, records: this.#records, counts: this.#counts, bytes: this.#bytes };
  }

  #byte(b: number): void {
    if (this.#token === "string") {
      this.#stringByte(b);
      return;
    }
    if (this.#token === "literal") {
      if (b < 0x80 && LITERAL_CHAR.test(String.fromCharCode(b))) {
        if (++this.#literalLength > LITERAL_MAX_BYTES) throw new HookJsonError("a number or literal is too long");
        this.#raw?.push(b);
        return;
      }
      this.#endLiteral();
    }
    if (WS.has(b)) return;
    if (this.#done) throw new HookJsonError("text after the JSON object");
    const top = this.#stack[this.#stack.length - 1];
    if (top === undefined) {
      if (b !== 0x7b) throw new HookJsonError("a hook event is a JSON object");
      this.#started = true;
      this.#push({ type: "object", state: "key-or-end", key: undefined, path: [] });
      return;
    }
    if (top.type === "object") {
      this.#objectByte(top, b);
      return;
    }
    this.#arrayByte(top, b);
    return;
  }

  #objectByte(top: Frame & { type: "object" }, b: number): void {
    switch (top.state) {
      case "key-or-end":
      case "key":
        if (b === 0x7d && top.state === "key-or-end") {
          this.#pop();
          return;
        }
        if (b !== 0x22) throw new HookJsonError("an object key must be a string");
        this.#startString(true, true);
        return;
      case "colon":
        if (b !== 0x3a) throw new HookJsonError("expected ':' after an object key");
        top.state = "value";
        return;
      case "value":
        top.state = "comma-or-end";
        this.#startValue(b, childPath(top.path, top.key ?? ""));
        return;
      case "comma-or-end":
        if (b === 0x2c) {
          top.state = "key";
          top.key = undefined;
          return;
        }
        if (b === 0x7d) {
          this.#pop();
          return;
        }
        throw new HookJsonError("expected ',' or '}' in an object");
    }
  }

  #arrayByte(top: Frame & { type: "array" }, b: number): void {
    switch (top.state) {
      case "value-or-end":
      case "value":
        if (b === 0x5d && top.state === "value-or-end") {
          this.#pop();
          return;
        }
        top.state = "comma-or-end";
        this.#countElement(top);
        this.#startValue(b, childPath(top.path, top.index));
        return;
      case "comma-or-end":
        if (b === 0x2c) {
          top.state = "value";
          top.index++;
          return;
        }
        if (b === 0x5d) {
          this.#pop();
          return;
        }
        throw new HookJsonError("expected ',' or ']' in an array");
    }
  }

  #countElement(top: Frame & { type: "array" }): void {
    if (top.path.length !== 1) return;
    const key = top.path[0] as string;
    if (this.#allow.counts?.includes(key)) this.#counts[key] = top.index + 1;
    const record = ownRecord(this.#records, key);
    if (record !== undefined) record.length = top.index + 1;
  }

  #startValue(b: number, path: readonly (string | number)[]): void {
    const kept = this.#keeps(path);
    if (b === 0x7b) {
      this.#push({ type: "object", state: "key-or-end", key: undefined, path });
      return;
    }
    if (b === 0x5b) {
      if (path.length === 1) {
        const key = path[0] as string;
        if (this.#allow.counts?.includes(key)) this.#counts[key] = 0;
        if (recordFields(this.#allow, key) !== undefined) this.#records[key] = { items: [], length: 0 };
      }
      this.#push({ type: "array", state: "value-or-end", index: 0, path });
      return;
    }
    this.#valuePath = path;
    if (b === 0x22) {
      this.#startString(false, kept);
      return;
    }
    if (b < 0x80 && LITERAL_CHAR.test(String.fromCharCode(b))) {
      // Every literal is read whole (it is short) and checked, kept or not: a malformed body is refused whole.
      this.#token = "literal";
      this.#literalLength = 1;
      this.#literalKept = kept;
      this.#raw = [b];
      return;
    }
    throw new HookJsonError("an unexpected character");
  }

  #valuePath: readonly (string | number)[] = [];
  #literalKept = false;

  /** Whether the scalar at `path` is one the allowlist keeps. */
  #keeps(path: readonly (string | number)[]): boolean {
    if (path.length === 1) return this.#allow.scalars.includes(path[0] as string);
    if (path.length === 3 && typeof path[1] === "number" && path[1] < KEPT_ELEMENTS_MAX) {
      return recordFields(this.#allow, path[0] as string)?.includes(path[2] as string) === true;
    }
    return false;
  }

  #startString(isKey: boolean, kept: boolean): void {
    this.#token = "string";
    this.#tokenIsKey = isKey;
    this.#escape = false;
    this.#unicode = 0;
    this.#rawOverflow = false;
    this.#raw = kept ? [0x22] : undefined;
  }

  #stringByte(b: number): void {
    if (b < 0x20) throw new HookJsonError("a control character inside a string");
    if (this.#raw !== undefined && !this.#rawOverflow) {
      this.#raw.push(b);
      if (this.#raw.length > (this.#tokenIsKey ? KEY_MAX_BYTES : KEPT_VALUE_MAX_BYTES)) this.#rawOverflow = true;
    }
    if (this.#unicode > 0) {
      if (!/[0-9a-fA-F]/.test(String.fromCharCode(b))) throw new HookJsonError("a bad \\u escape");
      this.#unicode--;
      return;
    }
    if (this.#escape) {
      this.#escape = false;
      if (b === 0x75) this.#unicode = 4;
      else if (!'"\\/bfnrt'.includes(String.fromCharCode(b))) throw new HookJsonError("a bad escape in a string");
      return;
    }
    if (b === 0x5c) {
      this.#escape = true;
      return;
    }
    if (b === 0x22) this.#endString();
  }

  #endString(): void {
    this.#token = "none";
    const raw = this.#raw;
    this.#raw = undefined;
    const top = this.#stack[this.#stack.length - 1];
    if (this.#tokenIsKey) {
      if (top?.type !== "object") throw new HookJsonError("a key outside an object");
      top.key = raw === undefined || this.#rawOverflow ? "" : String(decode(raw));
      top.state = "colon";
      return;
    }
    if (raw !== undefined && !this.#rawOverflow) this.#keep(decode(raw));
  }

  #endLiteral(): void {
    this.#token = "none";
    const raw = this.#raw;
    this.#raw = undefined;
    const text = String.fromCharCode(...(raw ?? []));
    if (!(text === "true" || text === "false" || text === "null" || NUMBER.test(text)))
      throw new HookJsonError("a number or literal that is not JSON");
    if (this.#literalKept) this.#keep(JSON.parse(text) as number | boolean | null);
  }

  #keep(value: string | number | boolean | null): void {
    const path = this.#valuePath;
    if (path.length === 1) {
      this.#scalars[path[0] as string] = value;
      return;
    }
    const record = ownRecord(this.#records, path[0] as string);
    if (record === undefined) return;
    const index = path[1] as number;
    while (record.items.length <= index) record.items.push({});
    (record.items[index] as Record<string, unknown>)[path[2] as string] = value;
  }

  #push(frame: Frame): void {
    if (this.#stack.length >= HOOK_JSON_MAX_DEPTH) throw new HookJsonError(`nested deeper than ${HOOK_JSON_MAX_DEPTH} levels`);
    this.#stack.push(frame);
  }

  #pop(): void {
    const frame = this.#stack.pop();
    // An element of a record array that was not an object: no fields of it are kept.
    if (frame?.type === "array" && frame.path.length === 1) {
      const record = ownRecord(this.#records, frame.path[0] as string);
      if (record !== undefined) {
        record.length = frame.state === "value-or-end" ? 0 : frame.index + 1;
        while (record.items.length < Math.min(record.length, KEPT_ELEMENTS_MAX)) record.items.push({});
      }
      const key = frame.path[0] as string;
      if (this.#allow.counts?.includes(key)) this.#counts[key] = frame.state === "value-or-end" ? 0 : frame.index + 1;
    }
    if (this.#stack.length === 0) this.#done = true;
  }
}

/**
 * The fields an allowlisted record array keeps, by the allowlist's own keys only: a
 * body's key is any string, and one named like an inherited property (`constructor`,
 * `__proto__`) is no record of the allowlist.
 */
function recordFields(allow: HookAllowlist, key: string): readonly string[] | undefined {
  return allow.records !== undefined && Object.hasOwn(allow.records, key) ? allow.records[key] : undefined;
}

function ownRecord<T>(records: Record<string, T>, key: string): T | undefined {
  return Object.hasOwn(records, key) ? records[key] : undefined;
}

const UTF8 = new TextDecoder("utf-8", { fatal: true });

/** A kept string's JSON text (quotes and escapes included), decoded. */
function decode(raw: readonly number[]): string {
  let text: string;
  try {
    text = UTF8.decode(Uint8Array.from(raw));
  } catch {
    throw new HookJsonError("a string is not UTF-8");
  }
  return JSON.parse(text) as string;
}
