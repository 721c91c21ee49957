import fc from "fast-check";

/**
 * Arbitrary and adversarial request bodies for the property suite
 * (tests/api/properties.test.ts): JSON documents built as values, rendered to text by
 * `render`, so a document can hold what JSON.stringify cannot write: an own
 * `__proto__` key, duplicate keys, `-0`, number literals no double holds (`1e999`,
 * 30-digit integers), and nesting thousands of levels deep without recursion.
 */

/** JSON text placed as it is. */
export class Raw {
  constructor(readonly text: string) {}
}

/** An object written with these entries in this order, duplicates included. */
export class Entries {
  constructor(readonly entries: readonly (readonly [string, unknown])[]) {}
}

/** A plain object with these own, enumerable keys, `__proto__` included (assignment would set the prototype instead). */
export function obj(entries: readonly (readonly [string, unknown])[]): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const [k, v] of entries) Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
  return o;
}

/** The JSON text of a document (Raw and Entries as they say; -0 as `-0`; undefined properties left out). */
export function render(v: unknown): string {
  if (v instanceof Raw) return v.text;
  if (v instanceof Entries) return `{${v.entries.map(([k, x]) => `${JSON.stringify(k)}:${render(x)}`).join(",")}}`;
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? "null" : render(x))).join(",")}]`;
  if (typeof v === "number" && Object.is(v, -0)) return "-0";
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    const parts: string[] = [];
    for (const k of Object.keys(o)) if (o[k] !== undefined) parts.push(`${JSON.stringify(k)}:${render(o[k])}`);
    return `{${parts.join(",")}}`;
  }
  if (v === undefined) return "null";
  return JSON.stringify(v);
}

/** Canonical JSON (sorted keys), for comparing what was sent with what is read back whatever order a store keeps keys in. */
export function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`);
    return `{${entries.join(",")}}`;
  }
  return JSON.stringify(value) ?? "undefined";
}

export const utf8 = (s: string): number => Buffer.byteLength(s, "utf8");

// ---- exact sizes and depths

/** Units to fill a string with: 1, 2, 3 and 4 bytes of UTF-8, and characters JSON escapes (2 and 6 bytes of JSON). */
export const FILL_UNITS = ["x", "é", "€", "𝄞", "\n", "\u0001", '"'] as const;

/** A string of exactly `bytes` bytes of UTF-8 (not counting quotes or escapes), mostly `unit`. */
export function textOfBytes(bytes: number, unit: string): string {
  const u = utf8(unit);
  const n = Math.max(0, Math.floor(bytes / u));
  const s = unit.repeat(n) + "x".repeat(Math.max(0, bytes - n * u));
  if (utf8(s) !== bytes) throw new Error(`textOfBytes: ${utf8(s)} != ${bytes}`);
  return s;
}

/** A JSON object whose JSON text (as JSON.stringify writes it) is exactly `bytes` bytes, padded with `unit`. */
export function objectOfBytes(bytes: number, unit: string): Record<string, unknown> {
  const base = utf8(JSON.stringify({ p: "" }));
  const unitJson = utf8(JSON.stringify(unit)) - 2;
  const n = Math.max(0, Math.floor((bytes - base) / unitJson));
  const value = { p: unit.repeat(n) + "x".repeat(Math.max(0, bytes - base - n * unitJson)) };
  if (utf8(JSON.stringify(value)) !== bytes) throw new Error(`objectOfBytes: ${utf8(JSON.stringify(value))} != ${bytes}`);
  return value;
}

/** A value exactly `depth` levels deep (the value itself is one), alternating objects and arrays from `start`. */
export function valueOfDepth(depth: number, start: "object" | "array" | "mixed", leaf: unknown = 1): unknown {
  let v: unknown = leaf;
  for (let i = depth - 1; i >= 0; i--) {
    const kind = start === "mixed" ? (i % 2 === 0 ? "object" : "array") : start;
    v = kind === "object" ? { d: v } : [v];
  }
  return v;
}

/** The text of a value `depth` levels deep, built as text (thousands of levels: no recursion anywhere). */
export function deepText(depth: number, kind: "object" | "array" | "mixed"): Raw {
  const open = kind === "array" ? "[" : kind === "object" ? '{"d":' : '[{"d":';
  const close = kind === "array" ? "]" : kind === "object" ? "}" : "}]";
  const reps = kind === "mixed" ? Math.ceil(depth / 2) : depth;
  return new Raw(`${open.repeat(reps)}0${close.repeat(reps)}`);
}

/** A wide value as text: an array of `n` elements or an object of `n` keys. */
export function wideText(n: number, kind: "object" | "array"): Raw {
  if (kind === "array") return new Raw(`[${Array.from({ length: n }, (_, i) => String(i % 10)).join(",")}]`);
  return new Raw(`{${Array.from({ length: n }, (_, i) => `"k${i}":${i % 10}`).join(",")}}`);
}

/**
 * How a case is made. `clean`: what a well-behaved client may send (a token the
 * route lets in, the case's own job, well-formed fields), free-form values and
 * strings up to and one byte past their limits; most are accepted, so property 3
 * gets exercised. `attack`: everything else.
 */
export type Mode = "clean" | "attack";

// ---- leaves

/** Number literals at and past what every store keeps (DynamoDB: 0 or 1e-130 to below 1e126), and what no double holds. */
export const NUMBER_LITERALS = [
  "0",
  "-0",
  "-0.0",
  "0e0",
  "1",
  "-1",
  "0.1",
  "1E2",
  "1e+2",
  "1e126",
  "-1e126",
  "9.99999999999999e125",
  "9.999999999999999e125",
  "1e-130",
  "-1e-130",
  "1e-131",
  "1e-400",
  "5e-324",
  "1.7976931348623157e308",
  "1e999",
  "-1e999",
  "9007199254740993",
  "-9007199254740993",
  "123456789012345678901234567890",
  "1.0000000000000000000000000001",
] as const;

export const specialNumber: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(...NUMBER_LITERALS).map((t) => new Raw(t)),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.integer(),
  fc.bigInt({ min: -(10n ** 40n), max: 10n ** 40n }).map((n) => new Raw(n.toString())),
);

const loneSurrogate = fc.integer({ min: 0xd800, max: 0xdfff }).map((c) => String.fromCharCode(c));

/** Strings with a lone surrogate somewhere: not Unicode text, though JSON.parse makes them. */
export const loneSurrogateString: fc.Arbitrary<string> = fc
  .tuple(fc.string({ maxLength: 4 }), loneSurrogate, fc.string({ maxLength: 4 }))
  .map(([a, s, b]) => a + s + b);

export const specialString: fc.Arbitrary<string> = fc.oneof(
  fc.string({ unit: "binary", maxLength: 12 }),
  loneSurrogateString,
  fc.constantFrom("", " ", "\u0000", "\uFEFF", "💥", "../../etc/passwd", "%2e%2e", "a\nb", "\\", '"', "null", "true", "0"),
);

/** Object keys: ordinary, empty, refused (`__proto__`, `constructor`), kept (`prototype`), inherited names, lone surrogates, long. */
export const anyKey: fc.Arbitrary<string> = fc.oneof(
  { weight: 6, arbitrary: fc.string({ maxLength: 8 }) },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      "__proto__",
      "constructor",
      "prototype",
      "",
      "toString",
      "hasOwnProperty",
      "valueOf",
      "__defineGetter__",
      "$where",
      "a.b",
      "0",
      "length",
    ),
  },
  { weight: 1, arbitrary: loneSurrogateString },
  { weight: 1, arbitrary: fc.string({ unit: "binary", minLength: 60, maxLength: 70 }) },
);

/** A key a store keeps (what a well-behaved client sends). */
const plainKey = fc.string({ unit: "grapheme", minLength: 1, maxLength: 8 }).filter((k) => k !== "__proto__" && k !== "constructor");

/** A number every store keeps as it is: 0, or a magnitude from 1e-130 to below 1e126. */
const storableNumber = fc.oneof(
  fc.integer(),
  fc.double({ min: -1e12, max: 1e12, noNaN: true }).filter((x) => x === 0 || Math.abs(x) >= 1e-100),
);

/** Small JSON (depth 3 at most) as a well-behaved client sends it: storable numbers, keys a store keeps. */
const storableJson: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: "small", maxDepth: 3 },
    fc.constant(null),
    fc.boolean(),
    storableNumber,
    fc.string({ unit: "grapheme", maxLength: 12 }),
    fc.array(tie("value"), { maxLength: 4 }),
    fc.array(fc.tuple(plainKey, tie("value")), { maxLength: 4 }).map((e) => obj(e)),
  ),
})).value;

/** Small JSON of any kind (fast-check's: doubles of any magnitude, any key). */
const smallJson: fc.Arbitrary<unknown> = fc.jsonValue({ maxDepth: 3, stringUnit: "grapheme" });

/** A small JSON object with keys `keys`. */
function objectWith(keys: fc.Arbitrary<string>, values: fc.Arbitrary<unknown>): fc.Arbitrary<Record<string, unknown>> {
  return fc.array(fc.tuple(keys, values), { maxLength: 5 }).map((e) => obj(e));
}

/** Put `poison` at a random depth (1..5) inside a small object. */
function poisoned(poison: fc.Arbitrary<readonly [string, unknown]>): fc.Arbitrary<Record<string, unknown>> {
  return fc.tuple(poison, fc.integer({ min: 0, max: 4 }), objectWith(plainKey, smallJson)).map(([[k, v], depth, around]) => {
    let inner: Record<string, unknown> = obj([[k, v]]);
    for (let i = 0; i < depth; i++) inner = i % 2 === 0 ? obj([["n", [inner]]]) : obj([["n", inner]]);
    return obj([...Object.entries(around), ["x", inner]]);
  });
}

/** A value of any type, most of them wrong wherever they are put. */
export const wrongType: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(null, true, false, 0, -1, "", "x", [], {}, [1, "a"], { a: 1 }),
  // Objects whose keys shadow what JS calls on a value (String(v), `${v}`, v.hasOwnProperty(k)).
  fc.constantFrom({ toString: 1 }, { valueOf: {}, toString: {} }, { toJSON: "x" }, { hasOwnProperty: 1 }, obj([["then", 1]]), {
    length: -1,
  }),
  specialNumber,
  specialString,
  smallJson,
);

/** Deeper than the free-form limit (16), and past the body's pre-scan limit (64), up to 2,000 levels. */
export const deepValue: fc.Arbitrary<unknown> = fc
  .tuple(
    fc.oneof(fc.integer({ min: 17, max: 70 }), fc.integer({ min: 17, max: 2000 })),
    fc.constantFrom("object", "array", "mixed") as fc.Arbitrary<"object" | "array" | "mixed">,
  )
  .map(([d, kind]) => deepText(d, kind));

export const wideValue: fc.Arbitrary<unknown> = fc
  .tuple(fc.integer({ min: 100, max: 3000 }), fc.constantFrom("object", "array") as fc.Arbitrary<"object" | "array">)
  .map(([n, kind]) => wideText(n, kind));

/**
 * A free-form JSON object for a field limited to `limit` bytes of JSON and 16
 * levels: most are ordinary; the rest sit at the size and depth limits (one byte
 * either side), far past them, or carry one poisoned member at some depth.
 */
export function freeForm(limit: number, mode: Mode): fc.Arbitrary<unknown> {
  const sized = fc
    .tuple(fc.integer({ min: -3, max: 3 }), fc.constantFrom(...FILL_UNITS))
    .map(([delta, unit]) => objectOfBytes(limit + delta, unit));
  const atDepth = fc
    .tuple(fc.integer({ min: 14, max: 18 }), fc.constantFrom("object", "mixed") as fc.Arbitrary<"object" | "mixed">)
    .map(([d, kind]) => valueOfDepth(d, kind));
  const poison = fc.oneof(
    fc.tuple(fc.constantFrom("__proto__", "constructor", "prototype", ""), smallJson),
    fc.tuple(plainKey, specialNumber),
    fc.tuple(plainKey, loneSurrogateString),
    fc.tuple(loneSurrogateString, fc.constant(1)),
  );
  const ordinary = objectWith(plainKey, storableJson);
  if (mode === "clean") {
    return fc.oneof({ weight: 6, arbitrary: ordinary }, { weight: 2, arbitrary: sized }, { weight: 2, arbitrary: atDepth });
  }
  return fc.oneof(
    { weight: 4, arbitrary: ordinary },
    { weight: 2, arbitrary: objectWith(anyKey, fc.oneof(smallJson, specialNumber, specialString)) },
    { weight: 2, arbitrary: sized },
    { weight: 2, arbitrary: atDepth },
    { weight: 1, arbitrary: deepValue },
    { weight: 1, arbitrary: wideValue },
    { weight: 2, arbitrary: poisoned(poison) },
    { weight: 1, arbitrary: wrongType },
  );
}

/** A string field limited to `maxBytes` bytes of UTF-8: ordinary, at the limit (a byte or two either side), or poisoned. */
export function boundedString(maxBytes: number, ordinary: fc.Arbitrary<string>, mode: Mode): fc.Arbitrary<unknown> {
  const atLimit = fc.tuple(fc.integer({ min: -2, max: 2 }), fc.constantFrom(...FILL_UNITS)).map(([d, u]) => textOfBytes(maxBytes + d, u));
  if (mode === "clean") return fc.oneof({ weight: 6, arbitrary: ordinary }, { weight: 2, arbitrary: atLimit });
  return fc.oneof(
    { weight: 3, arbitrary: ordinary },
    { weight: 2, arbitrary: atLimit },
    { weight: 1, arbitrary: loneSurrogateString },
    { weight: 1, arbitrary: wrongType },
  );
}

// ---- a body as a record of fields

export interface FieldSpec {
  readonly name: string;
  readonly valid: fc.Arbitrary<unknown>;
  readonly bad: fc.Arbitrary<unknown>;
  /** Weight of leaving the field out, against 12 for a valid value and 1 for a bad one (1 unless told). */
  readonly absent?: number;
}

/**
 * A JSON object with these fields. `clean`: each field valid or absent. `attack`:
 * each valid most of the time, sometimes absent, sometimes adversarial; and
 * sometimes an unknown or prototype-named field more, or a field written twice.
 */
export function bodyOf(fields: readonly FieldSpec[], mode: Mode): fc.Arbitrary<unknown> {
  const absent = Symbol("absent");
  const field = ({ name, valid, bad, absent: absentWeight }: FieldSpec) =>
    fc
      .oneof({ weight: 12, arbitrary: valid }, { weight: absentWeight ?? 1, arbitrary: fc.constant(absent) }, { weight: 1, arbitrary: bad })
      .map((v) => [name, v] as const);
  const extra = fc.oneof(
    { weight: 20, arbitrary: fc.constant([] as (readonly [string, unknown])[]) },
    { weight: 1, arbitrary: fc.array(fc.tuple(anyKey, wrongType), { minLength: 1, maxLength: 2 }) },
  );
  const clean = ({ name, valid, absent: absentWeight }: FieldSpec) =>
    fc
      .oneof({ weight: 12, arbitrary: valid }, { weight: absentWeight ?? 1, arbitrary: fc.constant(absent) })
      .map((v) => [name, v] as const);
  const wellFormed = fc
    .tuple(...fields.map(clean))
    .map((entries) => obj(entries.filter(([, v]) => v !== absent) as (readonly [string, unknown])[]));
  const mixed = fc.tuple(fc.tuple(...fields.map(field)), extra, fc.integer({ min: 0, max: 40 })).map(([entries, more, dup]) => {
    const present = entries.filter(([, v]) => v !== absent) as (readonly [string, unknown])[];
    const all = [...present, ...more];
    // One time in forty, the first field is written twice, the last value second (JSON.parse keeps the last).
    if (dup === 0 && all.length > 0) return new Entries([...all, [all[0]![0], all[all.length - 1]![1]]]);
    return obj(all);
  });
  return mode === "clean" ? wellFormed : mixed;
}

// ---- the request body as bytes

export interface BodyBytes {
  readonly bytes: Uint8Array;
  readonly contentType: string | undefined;
  readonly contentLength?: string;
  /** How the body was made, for a failure's report. */
  readonly shape: string;
}

const encoder = new TextEncoder();

/**
 * A JSON body as bytes: mostly the document's text as application/json; sometimes
 * padded with whitespace to the JSON body limit (a byte or two either side); and,
 * to attack, not an object at all, not JSON, not UTF-8, deeper than anything
 * accepts, under another Content-Type, or with a Content-Length that lies.
 */
export function jsonBody(doc: fc.Arbitrary<unknown>, bodyLimit: number, mode: Mode): fc.Arbitrary<BodyBytes> {
  const json = "application/json";
  const plain = doc.map((d): BodyBytes => ({ bytes: encoder.encode(render(d)), contentType: json, shape: "document" }));
  const padded = fc.tuple(doc, fc.integer({ min: -2, max: 1 })).map(([d, delta]): BodyBytes => {
    const text = render(d);
    const pad = Math.max(0, bodyLimit + delta - utf8(text));
    return { bytes: encoder.encode(text + " ".repeat(pad)), contentType: json, shape: `padded to ${bodyLimit + delta} bytes` };
  });
  const notObject = fc
    .oneof(wrongType, deepValue, wideValue)
    .map((v): BodyBytes => ({ bytes: encoder.encode(render(v)), contentType: json, shape: "not an object" }));
  const notJson = fc
    .oneof(
      fc.constantFrom("", " ", "{", "}", "{]", "nul", "{'a':1}", '{"a":1,}', "\u0000", "[".repeat(100_000), '{"a":'.repeat(70)),
      fc.string({ maxLength: 40 }),
    )
    .map((t): BodyBytes => ({ bytes: encoder.encode(t), contentType: json, shape: "not JSON" }));
  const notUtf8 = fc
    .tuple(doc, fc.constantFrom([0xff], [0xc3, 0x28], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xc0, 0xaf]), fc.nat())
    .map(([d, bad, at]): BodyBytes => {
      const text = encoder.encode(render(d));
      // Inside the first string value when there is one, so the bytes are not simply a syntax error.
      const quote = text.indexOf(0x22, text.indexOf(0x3a));
      const i = quote > 0 ? quote + 1 : at % (text.length + 1);
      return { bytes: new Uint8Array([...text.slice(0, i), ...bad, ...text.slice(i)]), contentType: json, shape: "not UTF-8" };
    });
  const otherType = fc
    .tuple(
      doc,
      fc.constantFrom(
        undefined,
        "text/plain",
        "application/jsonx",
        "application/json; charset=latin1",
        "APPLICATION/JSON",
        "multipart/form-data",
        "",
      ),
    )
    .map(([d, type]): BodyBytes => ({ bytes: encoder.encode(render(d)), contentType: type, shape: `content-type ${String(type)}` }));
  const lyingLength = fc.tuple(doc, fc.constantFrom("0", "1", "-1", "abc", "99999999999999999", String(bodyLimit + 1), "1e3", " 12 ")).map(
    ([d, length]): BodyBytes => ({
      bytes: encoder.encode(render(d)),
      contentType: json,
      contentLength: length,
      shape: `content-length ${length}`,
    }),
  );
  if (mode === "clean") return fc.oneof({ weight: 12, arbitrary: plain }, { weight: 1, arbitrary: padded });
  return fc.oneof(
    { weight: 8, arbitrary: plain },
    { weight: 1, arbitrary: padded },
    { weight: 1, arbitrary: notObject },
    { weight: 1, arbitrary: notJson },
    { weight: 1, arbitrary: notUtf8 },
    { weight: 1, arbitrary: otherType },
    { weight: 1, arbitrary: lyingLength },
  );
}

// ---- path parameters

/** Path segments that are not job ids (each URL-encoded as a client would, or sent raw). */
export const badJobIdSegment: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(
    "-starts-with-dash",
    "_x",
    "a".repeat(65),
    "..",
    ".",
    "%2e%2e",
    "a%2Fb",
    "a%00b",
    "%F0%9F%92%A5",
    "%ED%A0%80",
    "%",
    "a b",
    "JOB%23x",
    "job.id",
    "ü",
    "__proto__",
    "constructor",
  ),
  fc.string({ unit: "binary", minLength: 1, maxLength: 70 }).map((s) => encodeURIComponent(s)),
);

/** Attempt segments: valid numbers of attempts that do or do not exist, and what is not an attempt number. */
export const badAttemptSegment: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(
    "0",
    "-1",
    "01",
    "1.0",
    "1e0",
    "+1",
    " 1",
    "1%20",
    "0x1",
    "1000001",
    "9999999",
    "99999999999999999999",
    "NaN",
    "abc",
    "%31",
    "１",
  ),
  fc.integer({ min: 1, max: 1_000_000 }).map(String),
);

/** Number-like query values: in range, at its edges, and not numbers at all. */
export const numberLikeQuery = (max: number): fc.Arbitrary<string> =>
  fc.oneof(
    { weight: 4, arbitrary: fc.integer({ min: 1, max }).map(String) },
    {
      weight: 3,
      arbitrary: fc.constantFrom(
        "0",
        "-1",
        String(max),
        String(max + 1),
        "1.5",
        "1e2",
        " 5",
        "5 ",
        "0x10",
        "abc",
        "",
        "NaN",
        "Infinity",
        "99999999999999999999",
        "-0",
        "0001",
      ),
    },
  );

/** Cursors: random text, base64url of random JSON, and (given a real one) a real cursor with one field changed. */
export function cursorArb(real: string | undefined): fc.Arbitrary<string> {
  const json = fc.oneof(smallJson, fc.constant({ e: 1 }), fc.constant({ i: "x", k: {} }), fc.constant(["", ""]));
  const arbs: fc.Arbitrary<string>[] = [
    fc.string({ maxLength: 40 }),
    json.map((v) => Buffer.from(JSON.stringify(v)).toString("base64url")),
    fc.constantFrom("", "=", "!!!", "a".repeat(1025), "%00"),
  ];
  if (real !== undefined) {
    arbs.push(fc.constant(real), fc.constant(real));
    arbs.push(
      fc.tuple(fc.nat(), fc.oneof(wrongType, specialString, fc.string({ unit: "binary", maxLength: 30 }))).map(([at, v]) => {
        // A real cursor's JSON with one string value replaced (by another string, or another type): a forger's start.
        const decoded: unknown = JSON.parse(Buffer.from(real, "base64url").toString("utf8"));
        const text = JSON.stringify(decoded);
        const values = [...text.matchAll(/"(?:[^"\\]|\\.)*"(?!\s*:)/g)];
        const m = values[at % Math.max(1, values.length)];
        const forged = m === undefined ? text : text.slice(0, m.index) + render(v) + text.slice(m.index + m[0].length);
        return Buffer.from(forged).toString("base64url");
      }),
    );
    arbs.push(fc.nat({ max: real.length }).map((n) => real.slice(0, n)));
  }
  return fc.oneof(...arbs);
}
