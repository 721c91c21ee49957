import { JSON_BODY_MAX_DEPTH, jsonTextDeeperThan, MamError } from "@mam/core";
import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";

/**
 * Request bodies, bounded before they are buffered: a declared Content-Length over
 * the limit is refused without reading a byte; a body without one (chunked) is
 * counted while it streams and abandoned the moment it passes the limit.
 */

/** The route a report too large for a request body goes by instead (`upload` in a 413's problem). */
export const REPORT_UPLOAD_PATH = "/v1/jobs/{job_id}/attempts/{attempt}/report/upload";

/**
 * The refusal of a body over its limit: the limit, and where a report too large for
 * any request body goes instead (`upload`: the path of the upload route, the
 * request's own when it is known).
 */
export function tooLarge(limit: number, what: string, upload: string | null = REPORT_UPLOAD_PATH): MamError {
  return new MamError(
    "input.tooLarge",
    upload === null
      ? `the ${what} is larger than the limit of ${limit} bytes`
      : `the ${what} is larger than the limit of ${limit} bytes; a larger report goes by an upload: POST ${upload}`,
    {
      issues: [{ path: "body", message: `at most ${limit} bytes` }],
      details: upload === null ? { limit } : { limit, upload },
    },
  );
}

/**
 * An agent hook's body (`POST /v1/hooks/{agent}`): never buffered. The route reads it
 * chunk by chunk through core's allowlist scanner, which keeps a few fields and drops
 * the rest as it passes (a `PostToolUse` carries the tool's whole output), so a large
 * event meets no JSON body limit; `limit` (HOOK_BODY_MAX_BYTES) only bounds the
 * reading. A declared Content-Length over it is refused before a byte is read.
 */
export function hookBody<E extends { Variables: UploadVariables }>(limit: number): MiddlewareHandler<E> {
  return async (c, next) => {
    const header = c.req.header("content-length");
    const declared = header !== undefined && /^\d{1,16}$/.test(header.trim()) ? Number(header.trim()) : undefined;
    if (declared !== undefined && declared > limit) throw tooLarge(limit, "hook event", null);
    (c as unknown as Context<{ Variables: UploadVariables }>).set(
      "upload",
      new Upload(c.req.raw.body, limit, { declaredLength: declared, uploadPath: null, what: "hook event" }),
    );
    await next();
  };
}

/** Every media type the routes' media-type check lets through as JSON (`application/json`, `application/*+json`). */
const JSON_MEDIA_TYPE = /^application\/([a-z-.]+\+)?json/i;

/**
 * A JSON route's body, before the route's validator reads it: Hono's `bodyLimit`
 * (413; it buffers a chunked body, which at this limit is fine), then the text is
 * checked to be UTF-8 and nested at most JSON_BODY_MAX_DEPTH deep, before
 * anything parses it (a deep body is refused without being built). Hono keeps the
 * bytes read, and the validator's `c.req.json()` parses them from there.
 * A body that is not `application/json` is left to the route's media-type check (415).
 */
const UTF8 = new TextDecoder("utf-8", { fatal: true });

export function jsonBody(limit: number): MiddlewareHandler[] {
  return [
    bodyLimit({
      maxSize: limit,
      onError: () => {
        throw tooLarge(limit, "JSON body");
      },
    }),
    async (c, next) => {
      if (c.req.raw.body !== null && JSON_MEDIA_TYPE.test(c.req.header("content-type") ?? "")) {
        const bytes = new Uint8Array(await c.req.arrayBuffer());
        if (jsonTextDeeperThan(bytes, JSON_BODY_MAX_DEPTH)) throw malformed(`the body is nested deeper than ${JSON_BODY_MAX_DEPTH} levels`);
        try {
          UTF8.decode(bytes);
        } catch {
          throw malformed("the body is not UTF-8");
        }
      }
      await next();
    },
  ];
}

/** Why a body that passed `jsonBody` is not JSON after all: asked only when the validator could not parse it. */
export async function notJson(text: Promise<string>): Promise<MamError> {
  try {
    JSON.parse(await text);
    return malformed("the body is not valid JSON");
  } catch (e) {
    return malformed(`the body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function malformed(message: string): MamError {
  return new MamError("input.invalid", message, { issues: [{ path: "body", message }] });
}

/**
 * The report upload's limit, as it streams: Hono's `bodyLimit` would buffer a
 * chunked body, and a report is hashed and stored while it arrives. A declared
 * Content-Length over `ceiling` (the most any request may carry: the limit, or the
 * largest upload a declaration may allow where uploads come through this route) is
 * refused (413) before a byte is read; otherwise the route gets the body as an
 * `Upload`, counted chunk by chunk against `limit` unless the route allows more.
 */
/** The context variable `reportBody` sets (part of the app's `AppEnv`). */
export interface UploadVariables {
  upload?: Upload;
}

export function reportBody<E extends { Variables: UploadVariables }>(limit: number, ceiling = limit): MiddlewareHandler<E> {
  return async (c, next) => {
    const header = c.req.header("content-length");
    let declared: number | undefined;
    if (header !== undefined) {
      if (!/^\d{1,16}$/.test(header.trim())) {
        throw new MamError("input.invalid", "Content-Length is not a byte count", {
          issues: [{ path: "header.content-length", message: "not a non-negative integer" }],
        });
      }
      declared = Number(header.trim());
      if (declared > Math.max(limit, ceiling)) throw tooLarge(limit, "report", `${c.req.path}/upload`);
    }
    // E's variables include UploadVariables (the bound says so); Hono's `set` is typed on E alone.
    (c as unknown as Context<{ Variables: UploadVariables }>).set(
      "upload",
      new Upload(c.req.raw.body, limit, { declaredLength: declared, uploadPath: `${c.req.path}/upload` }),
    );
    await next();
  };
}

/** A request body handed on chunk by chunk, abandoned (and the peer's upload cancelled) once it passes its limit. */
export class Upload {
  readonly #body: ReadableStream<Uint8Array> | null;
  #limit: number;
  readonly #declaredLength: number | undefined;
  readonly #uploadPath: string | null;
  readonly #what: string;
  #exceeded = false;

  constructor(
    body: ReadableStream<Uint8Array> | null,
    limit: number,
    opts: { readonly declaredLength?: number | undefined; readonly uploadPath?: string | null; readonly what?: string } = {},
  ) {
    this.#body = body;
    this.#limit = limit;
    this.#declaredLength = opts.declaredLength;
    this.#uploadPath = opts.uploadPath === undefined ? REPORT_UPLOAD_PATH : opts.uploadPath;
    this.#what = opts.what ?? "report";
  }

  /** The most this body can be: its declared Content-Length, else the limit (what an agent's upload reserves of its quota). */
  get atMostBytes(): number {
    return Math.min(this.#declaredLength ?? this.#limit, this.#limit);
  }

  /** Take up to `bytes` (an upload's declared size, within the middleware's ceiling) instead of the limit. */
  allow(bytes: number): void {
    this.#limit = Math.max(this.#limit, bytes);
  }

  /**
   * `consume` gets the body's chunks (or no bytes, for a request without a body).
   * A declared Content-Length over the limit is refused before `consume` runs; past
   * the limit this throws 413, whatever `consume` made of the stream's error (a store
   * may wrap it in its own).
   */
  async pipeTo<T>(consume: (body: AsyncIterable<Uint8Array> | Uint8Array) => Promise<T>): Promise<T> {
    if (this.#declaredLength !== undefined && this.#declaredLength > this.#limit) throw this.#tooLarge();
    if (this.#body === null) return consume(new Uint8Array());
    const chunks = this.#chunks(this.#body);
    try {
      return await consume(chunks);
    } catch (e) {
      if (this.#exceeded) throw this.#tooLarge();
      throw e;
    } finally {
      await chunks.return(undefined);
    }
  }

  #tooLarge(): MamError {
    return tooLarge(this.#limit, this.#what, this.#uploadPath);
  }

  async *#chunks(body: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
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
        if (total > this.#limit) {
          this.#exceeded = true;
          throw this.#tooLarge();
        }
        yield value;
      }
    } finally {
      // Stop the peer's upload when we gave up early (over the limit, or the consumer stopped).
      if (!finished) await reader.cancel().catch(() => {});
      reader.releaseLock();
    }
  }
}
