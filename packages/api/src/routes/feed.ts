import { z } from "@hono/zod-openapi";
import {
  CHANGE_KINDS,
  ChangeActorSchema,
  ChangeDataSchema,
  type ChangeRow,
  type FeedPage,
  IsoTime,
  JobId,
  type JobStore,
  MamError,
  storedRowJson,
  storedRowsOf,
} from "@mam/core";
import type { Context, TypedResponse } from "hono";
import { streamSSE } from "hono/streaming";
import { assertLatestAttempt, operatorOrAgent, principalOf } from "../access.ts";
import type { AppEnv } from "../context.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, REQUEST_ID_HEADER } from "../openapi.ts";
import type { Principal } from "../tokens.ts";
import { withHandler } from "./support.ts";

/**
 * The change feed over HTTP: `GET /v1/events` (pages after a cursor) and
 * `GET /v1/events/stream` (the same rows as Server-Sent Events). The rows are the
 * store's (`ChangeFeed`, decided by core's `changeRowsOf`); this module only reads
 * them, confines an agent to its own job, and keeps a stream open.
 */

const FEED_CURSOR_EXAMPLE = "eyJsIjoiZmVlZCIsImMiOiI0MiJ9";

/** A query parameter as a form sends it: an empty one is absent, and of a repeated one the first counts. */
function formValue<S extends z.ZodType>(schema: S) {
  return z.preprocess((v) => {
    const first = Array.isArray(v) ? v[0] : v;
    return first === "" ? undefined : first;
  }, schema);
}

const AfterParam = formValue(z.string().min(1).max(1024).optional()).openapi({
  description: "A cursor this feed handed out (a row's `cursor`, or a page's): the rows after it. Absent: from the beginning.",
  example: FEED_CURSOR_EXAMPLE,
});

const JobFilterParam = formValue(JobId.optional()).openapi({
  description:
    "Only this job's rows (read by the feed's per-job index). An agent token reads its own job's rows whether it names it or not; another job is a 403. Page them with the cursors this listing hands out: on DynamoDB a cursor of the all-jobs feed is a position in another order (docs/notifications.md, Cursors).",
  example: EXAMPLE.jobId,
});

const FromParam = formValue(z.enum(["head"]).optional()).openapi({
  description:
    "`head`: start at the feed's head now, not at the beginning: a page answers no rows and the head's cursor, and `after` that cursor later reads exactly the rows committed since (on DynamoDB, those past the feed's delay). Not with `after` or `job_id` (an agent token starts at its own job's head).",
  example: "head",
});

/** `from=head` is a starting point of its own: with `after` or `job_id` beside it, the request names the one it must drop. */
function headAlone<T extends { from?: "head" | undefined; after?: string | undefined; job_id?: string | undefined }>(
  q: T,
  ctx: z.RefinementCtx,
): void {
  if (q.from === undefined) return;
  if (q.after !== undefined) {
    ctx.addIssue({ code: "custom", path: ["after"], message: "after and from=head cannot be combined: each is where to start; give one" });
  }
  if (q.job_id !== undefined) {
    ctx.addIssue({
      code: "custom",
      path: ["job_id"],
      message: "job_id and from=head cannot be combined: from=head is the whole feed's head",
    });
  }
}

export const FeedQuerySchema = z
  .strictObject({
    after: AfterParam,
    job_id: JobFilterParam,
    from: FromParam,
    limit: formValue(z.coerce.number().int().min(1).max(1000).default(100)).openapi({
      description: "At most this many rows (1-1000, 100 by default).",
      example: 100,
    }),
  })
  .superRefine(headAlone);

export const FeedStreamQuerySchema = z.strictObject({ after: AfterParam, job_id: JobFilterParam, from: FromParam }).superRefine(headAlone);

export const FeedStreamHeadersSchema = z.object({
  "last-event-id": z.string().min(1).max(1024).optional().openapi({
    description: "The last row's cursor the client received (EventSource sends it on reconnecting); wins over `after`.",
    example: FEED_CURSOR_EXAMPLE,
  }),
});

export const ChangeRowWire = z
  .strictObject({
    cursor: z.string().min(1).max(1024).describe("Opaque: pass it as `after` (or `Last-Event-ID`) to read what follows this row."),
    at: IsoTime.describe("When the change committed."),
    job_id: JobId,
    kind: z.enum(CHANGE_KINDS),
    actor: ChangeActorSchema.clone().describe("Who caused the change: its token's id (`jti`) when a token did, never the token."),
    intent_id: z
      .string()
      .min(1)
      .max(128)
      .optional()
      .describe("The intent the change carries, publishes, fails, supersedes or quarantines."),
    data: ChangeDataSchema.clone().optional().describe("Small, kind-specific facts (docs/notifications.md)."),
  })
  .openapi("ChangeRow", { description: "One committed change." });

export const ChangePageSchema = z
  .strictObject({
    items: z.array(ChangeRowWire),
    cursor: z.string().min(1).describe("Opaque: pass it as `after` to continue; present even when `items` is empty."),
  })
  .openapi("ChangePage");

const ROW_EXAMPLE = {
  cursor: FEED_CURSOR_EXAMPLE,
  at: "2026-11-20T10:02:41.000Z",
  job_id: EXAMPLE.jobId,
  kind: "job.transitioned",
  actor: { type: "agent", token_id: "5b8f6a43-0e39-4d5e-8a0c-2f1c4b9d7e10" },
  intent_id: "9d1c2b3a-4e5f-4a6b-8c7d-0e1f2a3b4c5d",
  data: { action: "completed", status: "completed", transition_seq: 2 },
} as const;

const BAD_CURSOR = exampleProblem(
  "input.invalid",
  "after is not a cursor this feed handed out; start without one, or pass a row's or a page's cursor",
  {
    issues: [{ path: "query.after", message: "not a cursor this feed handed out" }],
  },
);

export const listChangesRoute = withHandler(
  defineRoute(
    operatorOrAgent("read", "self"),
    {
      operationId: "listChanges",
      method: "get",
      path: "/v1/events",
      tags: ["events"],
      summary: "The change feed: every committed change, oldest first, after a cursor",
      description:
        "One row per committed change of any job (registered, transitioned, dispatched, report staged or finalized, intent published, failed, superseded, quarantined or released). " +
        "An operator token with the `read` scope reads every job's rows; an agent token reads only its own job's. " +
        "The page's `cursor` is always present: pass it as `after` to continue (an empty page means nothing newer yet). " +
        "`from=head` answers no rows and the feed's head as `cursor`, to follow the feed from now without reading its past. " +
        "A cursor this feed did not hand out is a 400 naming `query.after`.",
      request: { query: FeedQuerySchema },
      responses: { 200: jsonAnswer("One page of the feed.", ChangePageSchema, { items: [ROW_EXAMPLE], cursor: FEED_CURSOR_EXAMPLE }) },
    },
    [BAD_CURSOR],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const q = c.req.valid("query");
    if (q.from === "head") return c.json({ items: [], cursor: await deps.jobs.feedHead(scopeOf(principalOf(c), undefined)) }, 200);
    const page = await deps.jobs.listChanges({
      limit: q.limit,
      ...(q.after === undefined ? {} : { after: q.after }),
      ...scopeOf(principalOf(c), q.job_id),
    });
    const stored = storedRowsOf(page);
    if (stored === undefined) return c.json({ items: page.items.map(wireRow), cursor: page.cursor }, 200);
    // The store's rows as it wrote them (from core's drafts), spliced into the page unparsed: the same JSON `c.json` would send.
    let body = '{"items":[';
    for (let i = 0; i < stored.length; i++) body += i === 0 ? storedRowJson(stored[i]!) : `,${storedRowJson(stored[i]!)}`;
    body += `],"cursor":${JSON.stringify(page.cursor)}}`;
    return serializedJson<z.infer<typeof ChangePageSchema>>(c, body);
  },
);

export const streamChangesRoute = withHandler(
  defineRoute(
    operatorOrAgent("read", "self"),
    {
      operationId: "streamChanges",
      method: "get",
      path: "/v1/events/stream",
      tags: ["events"],
      summary: "The change feed as Server-Sent Events, resuming after Last-Event-ID",
      description:
        "The rows of `GET /v1/events` as they commit: `id:` is the row's cursor, `event:` its kind, `data:` the row's JSON. " +
        "Resumes after `Last-Event-ID` (else `after`; else, with `from=head`, at the feed's head, with no backlog; else from the beginning); `job_id` narrows it to one job's rows. Once the backlog has been sent, one " +
        "`event: head` (`id:` and `data: {cursor}` its cursor) says the stream has caught up; later rows follow as they commit. The stream closes when the token expires, when an agent's attempt is " +
        "retired by a newer dispatch, and when the service stops; where responses cannot stream (AWS Lambda behind HTTP API), or past the " +
        "service's bound on open streams, the answer is the rows available now with a `retry:` and the stream ends, so an EventSource reconnects with Last-Event-ID. " +
        "A token past its own bound on open streams (an agent's job and attempt: 4; an operator token: 16) is a 429 `stream.tooMany` naming the bound. " +
        "HEAD answers the headers only. A stream whose writes do not complete within the service's bound (a reader that stopped reading) is closed. " +
        "Tokens travel in the Authorization header only (EventSource polyfills send it).",
      request: { query: FeedStreamQuerySchema, headers: FeedStreamHeadersSchema },
      responses: {
        200: {
          description: "A stream of change rows (text/event-stream).",
          headers: REQUEST_ID_HEADER,
          content: {
            "text/event-stream": {
              schema: z.string(),
              example: `id: ${FEED_CURSOR_EXAMPLE}\nevent: job.transitioned\ndata: ${JSON.stringify(ROW_EXAMPLE)}\n\n`,
            },
          },
        },
      },
    },
    [BAD_CURSOR, exampleProblem("stream.tooMany")],
  ),
  async (c) => {
    const { deps, logger, changeStreams } = c.var.services;
    const options = changeStreams.settings;
    const principal = principalOf(c);
    const headerCursor = c.req.valid("header")["last-event-id"];
    const query = c.req.valid("query");
    const after = headerCursor ?? query.after;
    const scope = scopeOf(principal, query.job_id);
    // From the head (unless a reconnect names where it left off): no backlog, the head at once.
    const fromHead = query.from === "head" && headerCursor === undefined;
    // The first page is read before the answer starts, so a bad cursor is a 400, not a broken stream.
    const first: FeedPage = fromHead
      ? { items: [], cursor: await deps.jobs.feedHead(scope) }
      : await deps.jobs.listChanges({ limit: STREAM_PAGE, ...(after === undefined ? {} : { after }), ...scope });
    // HEAD: the GET's headers and nothing else. Hono answers HEAD with the GET's
    // response minus its body, dropped without being cancelled: a stream opened for
    // it would wait in its first write for ever, holding its slot.
    if (c.req.method === "HEAD") return c.body(null, 200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const head = fromHead ? first.cursor : undefined;
    if (options.streaming === false) return answerNow(c, first.items, options.retryMs, head);
    const slot = changeStreams.slots.take(principal, options);
    const tail = changeStreams.tail();
    if (slot === undefined) return answerNow(c, first.items, options.retryMs, head);
    const wake = new Wake();
    const stopWaking: ((() => void) | undefined)[] = [];
    const freed = () => {
      slot.release();
      for (const stop of stopWaking.splice(0)) stop?.();
    };
    // The slot is freed however the stream ends: its loop returning, the client going
    // away (Node closes the response), or the body never being read at all.
    stopWaking.push(on(c.req.raw.signal, freed));
    try {
      return streamSSE(
        c,
        async (stream) => {
          stopWaking.push(
            options.onCommitted?.(() => wake.ring()),
            on(options.shutdown, () => wake.ring()),
            on(c.req.raw.signal, () => wake.ring()),
          );
          stream.onAbort(() => {
            wake.ring();
            freed();
          });
          // Each write must complete within the bound, or the stream is closed: a reader
          // that stopped reading (or a body nobody reads) fills the socket's buffers and
          // then holds a write, its slot and its memory for ever.
          //
          //   write ──(reader reads)──> done
          //         └─(writeTimeoutMs, or shutdown)──> abort the stream, destroy the connection, free the slot
          const send = async (message: { id?: string; event: string; data: string; retry?: number }): Promise<boolean> => {
            const stalled = await withinBound(stream.writeSSE(message), options.writeTimeoutMs, options.shutdown);
            if (stalled) {
              stream.abort();
              closeConnection(c);
              if (!isAborted(options.shutdown)) {
                logger.warn("stream closed", {
                  reason: "write stalled",
                  request_id: c.get("requestId"),
                  detail: `a write did not complete within ${options.writeTimeoutMs} ms (the reader stopped reading)`,
                });
              }
            }
            return !stalled;
          };
          const ends = Date.now() + options.maxStreamMs;
          try {
            if (!(await send({ event: "open", data: "{}", retry: options.retryMs }))) return;
            // Caught up, a stream takes its rows from the tail (one read per wake-up for
            // every stream); behind it, or at a position the tail does not know, it reads
            // the store itself. An agent's attempt is asked of the store only when a
            // dispatch of its job went by (the one change that retires an attempt).
            let page: { readonly items: readonly ChangeRow[]; readonly cursor: string; readonly more?: boolean } = first;
            let askAttempt = true;
            let caughtUp = false;
            for (;;) {
              for (const row of page.items) {
                if (!(await send({ id: row.cursor, event: row.kind, data: JSON.stringify(wireRow(row)) }))) return;
                if (row.kind === "dispatch.recorded") askAttempt = true;
              }
              const cursor = page.cursor;
              const more = page.more ?? page.items.length >= STREAM_PAGE;
              if (page.more === undefined && !more && scope.jobId === undefined) tail.seed(cursor);
              // Once, when the backlog has been sent: a client can show "caught up".
              if (!more && !caughtUp) {
                caughtUp = true;
                // With `id:` its cursor, so a reconnect before the next row resumes here (a stream from the head would otherwise start at a later head).
                if (!(await send({ id: cursor, event: "head", data: JSON.stringify({ cursor }) }))) return;
              }
              if (stream.aborted || stream.closed || isAborted(options.shutdown) || Date.now() >= ends) return;
              const reason = await closeReason(deps.jobs, deps.clock.now(), principal, askAttempt);
              askAttempt = false;
              if (reason !== undefined) {
                await send({ event: "close", data: JSON.stringify({ reason }) });
                return;
              }
              if (!more) await wake.wait(options.pollMs);
              if (stream.aborted || stream.closed || isAborted(options.shutdown)) return;
              await tail.advance();
              page = tail.since(cursor, scope.jobId) ?? (await deps.jobs.listChanges({ limit: STREAM_PAGE, after: cursor, ...scope }));
            }
          } finally {
            freed();
          }
        },
        async () => {
          // A read that failed mid-stream ends the stream; the client reconnects with Last-Event-ID.
          freed();
        },
      );
    } catch (e) {
      freed();
      throw e;
    }
  },
);

/** The rows a principal asks for and may read: an agent's own job (another is a 403); an operator's, every job or the one it names. */
function scopeOf(principal: Principal, jobId: string | undefined): { jobId?: string } {
  if (principal.kind === "agent") {
    if (jobId !== undefined && jobId !== principal.jobId) {
      throw new MamError(
        "auth.forbidden",
        `this agent token is bound to job ${principal.jobId}, not ${jobId}: it reads its own job's rows`,
      );
    }
    return { jobId: principal.jobId };
  }
  return jobId === undefined ? {} : { jobId };
}

/** One stream's page of rows per read. */
const STREAM_PAGE = 100;

/**
 * True when `write` did not complete within `ms` (or `shutdown` came first). Hono's
 * stream write never rejects: a write into a stream nobody reads simply never resolves.
 */
async function withinBound(write: Promise<unknown>, ms: number, shutdown: AbortSignal | undefined): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let stop: (() => void) | undefined;
  try {
    return await Promise.race([
      write.then(() => false),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), ms);
        stop = on(shutdown, () => resolve(true));
        if (isAborted(shutdown)) resolve(true);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    stop?.();
  }
}

/**
 * Close the connection under a stalled stream, where the runtime gives us one:
 * @hono/node-server's bindings carry Node's response (`c.env.outgoing`). Its socket
 * holds the bytes the reader never took; ending the response would wait for them.
 */
function closeConnection(c: Context<AppEnv>): void {
  const outgoing = (c.env as { outgoing?: { destroy?: () => void } } | undefined)?.outgoing;
  outgoing?.destroy?.();
}

/** Why an open stream must end now: its token expired, or its agent's attempt was retired. */
async function closeReason(jobs: Pick<JobStore, "get">, now: Date, principal: Principal, askAttempt: boolean): Promise<string | undefined> {
  if (principal.expiresAt !== undefined && now.getTime() >= Date.parse(principal.expiresAt)) return "the token expired";
  if (principal.kind !== "agent" || !askAttempt) return undefined;
  try {
    assertLatestAttempt(principal, (await jobs.get(principal.jobId))?.latest_attempt);
  } catch (e) {
    return e instanceof Error ? e.message : "the attempt was retired";
  }
  return undefined;
}

/**
 * The rows available now as one SSE body, with `retry:`, ending the stream: an
 * EventSource reconnects after it with Last-Event-ID. From the head, the head itself
 * (`id:` its cursor), so the reconnect resumes there rather than at a later head.
 */
function answerNow(c: Context<AppEnv>, rows: readonly ChangeRow[], retryMs: number, head?: string): Response {
  let body = `retry: ${retryMs}\n\n`;
  for (const row of rows) body += `id: ${row.cursor}\nevent: ${row.kind}\ndata: ${JSON.stringify(wireRow(row))}\n\n`;
  if (head !== undefined) body += `id: ${head}\nevent: head\ndata: ${JSON.stringify({ cursor: head })}\n\n`;
  return c.body(body, 200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
}

/**
 * An answer whose JSON is already text: what `c.json(value, 200)` would send, typed as
 * that answer (Hono types a `c.body` answer as text). The caller vouches that `json`
 * is the JSON of a `T`; the API suites validate every answer against the document.
 */
const UTF8 = new TextEncoder();

function serializedJson<T>(c: Context<AppEnv>, json: string): TypedResponse<T, 200, "json"> {
  // Encoded once here: a string body is measured (`Buffer.byteLength`) and then encoded again as it is written.
  return c.body(UTF8.encode(json), 200, { "content-type": "application/json" }) as Response as unknown as TypedResponse<T, 200, "json">;
}

/** The row as the wire names its fields, in a stable order. */
function wireRow(row: ChangeRow): ChangeRow {
  return {
    cursor: row.cursor,
    at: row.at,
    job_id: row.job_id,
    kind: row.kind,
    actor: row.actor,
    ...(row.intent_id === undefined ? {} : { intent_id: row.intent_id }),
    ...(row.data === undefined ? {} : { data: row.data }),
  };
}

/** Read each time: an abort lands while the stream awaits. */
const isAborted = (signal: AbortSignal | undefined): boolean => signal?.aborted === true;

function on(signal: AbortSignal | undefined, listener: () => void): (() => void) | undefined {
  if (signal === undefined) return undefined;
  signal.addEventListener("abort", listener, { once: true });
  return () => signal.removeEventListener("abort", listener);
}

/** A wake-up: `ring()` ends the current (or the next) `wait`; a wait also ends after `ms`. */
class Wake {
  #rung = false;
  #resolve: (() => void) | undefined;

  ring(): void {
    this.#rung = true;
    this.#resolve?.();
  }

  async wait(ms: number): Promise<void> {
    if (this.#rung) {
      this.#rung = false;
      return;
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    await new Promise<void>((resolve) => {
      this.#resolve = resolve;
      timer = setTimeout(resolve, ms);
    });
    clearTimeout(timer);
    this.#resolve = undefined;
    this.#rung = false;
  }
}
