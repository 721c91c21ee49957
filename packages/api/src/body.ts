import { type FieldIssue, JSON_BODY_MAX_DEPTH, jsonTextDeeperThan, MamError, zodIssues } from "@mam/core";
import { ZodError, type z } from "zod";

/**
 * Request bodies, bounded before they are buffered: a declared Content-Length over
 * the limit is refused without reading a byte, and a body without one (chunked) is
 * counted while it streams and abandoned the moment it passes the limit.
 */

export function tooLarge(limit: number, what: string): MamError {
  return new MamError("input.tooLarge", `the ${what} is larger than the limit of ${limit} bytes`, {
    issues: [{ path: "body", message: `at most ${limit} bytes` }],
    details: { limit },
  });
}

/** Refuse a declared length over the limit; a malformed Content-Length is a 400. */
export function checkDeclaredLength(header: string | undefined, limit: number, what: string): void {
  if (header === undefined) return;
  if (!/^\d{1,16}$/.test(header.trim())) {
    throw new MamError("input.invalid", "Content-Length is not a byte count", {
      issues: [{ path: "header.content-length", message: "not a non-negative integer" }],
    });
  }
  if (Number(header.trim()) > limit) throw tooLarge(limit, what);
}

/** Stream `body`, counting bytes; throws `input.tooLarge` as soon as the count passes `limit`. */
export async function* limitedChunks(
  body: ReadableStream<Uint8Array> | null,
  limit: number,
  what: string,
  onExceeded: () => void = () => {},
): AsyncGenerator<Uint8Array> {
  if (body === null) return;
  const reader = body.getReader();
  let total = 0;
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        finished = true;
        return;
      }
      total += value.byteLength;
      if (total > limit) {
        onExceeded();
        throw tooLarge(limit, what);
      }
      yield value;
    }
  } finally {
    // Stop the peer's upload when we gave up early (over the limit, or the consumer stopped).
    if (!finished) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

async function readAll(body: ReadableStream<Uint8Array> | null, limit: number, what: string): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let total = 0;
  for await (const chunk of limitedChunks(body, limit, what)) {
    chunks.push(chunk);
    total += chunk.byteLength;
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

const JSON_MEDIA_TYPE = /^application\/json\s*(;.*)?$/i;

export function isJsonContentType(header: string | undefined): boolean {
  return header !== undefined && JSON_MEDIA_TYPE.test(header.trim());
}

/**
 * Read a JSON body: 415 unless it is `application/json`, 413 over the limit, 400
 * (naming `body`) when it is not UTF-8 JSON. `optional`: a request with no body at
 * all (no Content-Type, nothing to read) yields `undefined`.
 */
export async function readJsonBody(req: Request, limit: number, opts: { optional?: boolean } = {}): Promise<unknown> {
  const contentType = req.headers.get("content-type") ?? undefined;
  const declared = req.headers.get("content-length") ?? undefined;
  if (opts.optional && contentType === undefined && (req.body === null || declared === "0")) return undefined;
  if (!isJsonContentType(contentType)) {
    throw new MamError(
      "input.unsupportedMediaType",
      `this route takes application/json, not ${contentType === undefined ? "a body without a Content-Type" : JSON.stringify(contentType)}`,
      { issues: [{ path: "header.content-type", message: "must be application/json" }] },
    );
  }
  checkDeclaredLength(declared, limit, "JSON body");
  const bytes = await readAll(req.body, limit, "JSON body");
  // Before JSON.parse: a deep body is refused without being built (bounds.ts).
  if (jsonTextDeeperThan(bytes, JSON_BODY_MAX_DEPTH)) throw malformed(`the body is nested deeper than ${JSON_BODY_MAX_DEPTH} levels`);
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw malformed("the body is not UTF-8");
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw malformed(`the body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function malformed(message: string): MamError {
  return new MamError("input.invalid", message, { issues: [{ path: "body", message }] });
}

/**
 * Validate a parsed value with one of core's (or the wire's) zod schemas. Issues
 * name each bad field under `where` (`body`, `query`, `path`). Problems that lie
 * wholly inside `side_effects` are side-effect errors (`input.sideEffect`), the
 * code the CLI gives them too.
 */
export function validate<S extends z.ZodType>(schema: S, value: unknown, where: "body" | "query" | "path"): z.output<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issues = fieldIssues(r.error, where);
  const sideEffect = r.error.issues.every((i) => {
    const at = i.path.indexOf("side_effects");
    return at >= 0 && i.path.length > at + 1;
  });
  const code = sideEffect
    ? "input.sideEffect"
    : where === "path" && r.error.issues.some((i) => i.path[0] === "job_id")
      ? "input.jobId"
      : "input.invalid";
  const summary = issues.map((i) => `${i.path}: ${i.message}`).join("; ");
  return fail(code, `invalid ${where}: ${summary}`, issues);
}

/**
 * core's `zodIssues`, except that an unknown field is named by its own path
 * (`body.extra`) rather than by the object that holds it.
 */
function fieldIssues(err: z.ZodError, where: string): FieldIssue[] {
  return err.issues.flatMap((i) => {
    if (i.code !== "unrecognized_keys") return zodIssues(new ZodError([i]), where);
    const at = [where, ...i.path.map(String)].join(".");
    return i.keys.map((k) => ({ path: `${at}.${k}`, message: "unknown field" }));
  });
}

function fail(code: "input.invalid" | "input.sideEffect" | "input.jobId", message: string, issues: FieldIssue[]): never {
  throw new MamError(code, message, { issues });
}
