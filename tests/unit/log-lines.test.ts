/**
 * Every log line is made by core's Logger (packages/core/src/logger.ts): no production
 * file (packages/*\/src, functions/, scripts/) builds one by hand — a JSON object with a
 * `level` or a `msg` stringified, or a JSON document handed straight to a log sink —
 * so every line keeps the Logger's closed set of levels and its shape.
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

const ROOT = path.join(import.meta.dirname, "..", "..");
const LOGGER = path.join("packages", "core", "src", "logger.ts");

/**
 * `JSON.stringify({ ..., level: ...` or `msg` (a key or a shorthand, in one object
 * before its first closing brace); a literal `{"level":`; a document stringified
 * straight into a sink (`log(JSON.stringify(...))`, `write(JSON.stringify(...))`).
 */
const HAND_BUILT = [
  /JSON\.stringify\(\s*\{[^}]*?["']?\b(?:level|msg)\b["']?\s*[:,}]/s,
  /["'`]\{\\?"(?:level|msg)\\?"\s*:/,
  /\b(?:log|write)\w*\(\s*JSON\.stringify\(/,
];

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    if (e.name === "node_modules") return [];
    const full = path.join(dir, e.name);
    return e.isDirectory() ? sources(full) : /\.(?:ts|mts|mjs|cjs|js)$/.test(e.name) ? [full] : [];
  });
}

function productionFiles(): string[] {
  return [
    ...readdirSync(path.join(ROOT, "packages")).flatMap((p) => sources(path.join(ROOT, "packages", p, "src"))),
    ...sources(path.join(ROOT, "functions")),
    ...sources(path.join(ROOT, "scripts")),
  ].map((f) => path.relative(ROOT, f));
}

const handBuilt = (text: string): boolean => HAND_BUILT.some((pattern) => pattern.test(text));

describe("log lines", () => {
  it("the patterns catch the hand-built lines they replaced, and not the Logger's calls", () => {
    for (const old of [
      'log(JSON.stringify({ level: "info", msg: "data dir made private", tightened, walked }));',
      'log(\n  JSON.stringify({\n    level: "warn",\n    msg: "stream closed",\n    reason: "write stalled",\n  }),\n);',
      "log: (entry) => log(JSON.stringify({ msg: entry.event, request_id: requestId, ...entry })),",
      "export const logJson = (log: LogSink, entry: Readonly<Record<string, unknown>>): void => log(JSON.stringify(entry));",
      `process.stdout.write('{"level":"info","msg":"up"}\\n');`,
    ])
      expect(handBuilt(old), old).toBe(true);
    for (const fine of [
      'logger.warn("stream closed", { reason: "write stalled", request_id: id });',
      'logEventLine(log, { level: "warn", event: "feed_redrive_failed", reason });',
      'await send({ event: "close", data: JSON.stringify({ reason }) });',
      'const HEADER = base64url(Buffer.from(JSON.stringify({ alg: "HS256", typ: "JWT" })));',
    ])
      expect(handBuilt(fine), fine).toBe(false);
  });

  it("no production file but core's logger builds a log line by hand", () => {
    const files = productionFiles();
    expect(files).toContain(LOGGER);
    expect(files.length).toBeGreaterThan(100);
    // The logger is the one place a line is stringified, and the patterns see it.
    expect(handBuilt(readFileSync(path.join(ROOT, LOGGER), "utf8"))).toBe(true);
    const offenders = files.filter((f) => f !== LOGGER && handBuilt(readFileSync(path.join(ROOT, f), "utf8")));
    expect(offenders).toEqual([]);
  });
});
