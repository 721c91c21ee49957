import { createParser } from "eventsource-parser";
import { type Api, ApiError, type ChangeRow, fetchWithToken, ok } from "./api.ts";

/**
 * The page's view of the change feed, one per signed-in page.
 *
 * On `mam serve` (`stream`): `GET /v1/events/stream` read with fetch and an SSE
 * parser, so the token travels in the Authorization header (an EventSource cannot
 * send one); it starts at the feed's head (`from=head`: what happened before the
 * page opened is in the listings it reads) and resumes after a drop with
 * `Last-Event-ID`, so no row is missed across a restart of the service.
 *
 *   connect ── open ── rows… ── head ("caught up") ── rows as they commit ── drop
 *      ^                                                                      |
 *      └────────── wait 1 s, 2 s, 4 s … 10 s, then Last-Event-ID ────────────┘
 *
 * On AWS (`poll`): API Gateway ends a request at 30 s and the feed hands out rows
 * only once they are older than its delay, so the page polls `GET /v1/events?after=`
 * every 10 s instead: "updates every 10 s, up to 40 s late".
 */
export type FeedMode = "stream" | "poll";

export type FeedState =
  | { readonly kind: "connecting"; readonly since: number }
  | { readonly kind: "live"; readonly caughtUp: boolean; readonly at: number }
  | { readonly kind: "down"; readonly reason: string; readonly retryAt: number };

export const POLL_MS = 10_000;
const MAX_BACKOFF_MS = 10_000;

export class LiveFeed {
  readonly #api: Api;
  readonly #token: string;
  readonly mode: FeedMode;
  readonly #rows = new Set<(row: ChangeRow) => void>();
  readonly #states = new Set<(state: FeedState) => void>();
  readonly #unauthorized: () => void;
  #state: FeedState = { kind: "connecting", since: Date.now() };
  #cursor: string | undefined;
  #abort = new AbortController();
  #stopped = false;
  #failures = 0;

  constructor(api: Api, token: string, mode: FeedMode, onUnauthorized: () => void) {
    this.#api = api;
    this.#token = token;
    this.mode = mode;
    this.#unauthorized = onUnauthorized;
  }

  get state(): FeedState {
    return this.#state;
  }

  onRow(listener: (row: ChangeRow) => void): () => void {
    this.#rows.add(listener);
    return () => this.#rows.delete(listener);
  }

  onState(listener: (state: FeedState) => void): () => void {
    this.#states.add(listener);
    return () => this.#states.delete(listener);
  }

  start(): void {
    void (this.mode === "stream" ? this.#streamLoop() : this.#pollLoop());
  }

  stop(): void {
    this.#stopped = true;
    this.#abort.abort();
  }

  #set(state: FeedState): void {
    this.#state = state;
    for (const l of this.#states) l(state);
  }

  #emit(row: ChangeRow): void {
    this.#cursor = row.cursor;
    for (const l of this.#rows) l(row);
  }

  /** Waits `ms` unless the feed stops first; leaves no listener behind (one per wait, for the page's life, on AWS every 10 s). */
  #wait(ms: number): Promise<void> {
    const signal = this.#abort.signal;
    return new Promise((resolve) => {
      const stopped = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        signal.removeEventListener("abort", stopped);
        resolve();
      }, ms);
      signal.addEventListener("abort", stopped, { once: true });
    });
  }

  #refused(e: unknown): boolean {
    if (e instanceof ApiError && e.status === 401) {
      this.stop();
      this.#unauthorized();
      return true;
    }
    return false;
  }

  async #down(e: unknown): Promise<void> {
    this.#failures += 1;
    const limited = e instanceof ApiError && e.retryAfterSeconds !== undefined ? e.retryAfterSeconds * 1000 : 0;
    const wait = Math.max(limited, Math.min(MAX_BACKOFF_MS, 1000 * 2 ** (this.#failures - 1)));
    const reason = e instanceof Error ? e.message : "the stream ended";
    this.#set({ kind: "down", reason, retryAt: Date.now() + wait });
    await this.#wait(wait);
  }

  async #streamLoop(): Promise<void> {
    while (!this.#stopped) {
      this.#set({ kind: "connecting", since: Date.now() });
      try {
        const headers: Record<string, string> = { accept: "text/event-stream" };
        if (this.#cursor !== undefined) headers["last-event-id"] = this.#cursor;
        const query = this.#cursor === undefined ? "?from=head" : "";
        const response = await fetchWithToken(this.#token, `v1/events/stream${query}`, { headers, signal: this.#abort.signal });
        await this.#readStream(response);
        if (this.#stopped) return;
        await this.#down(new Error("the stream ended; reconnecting"));
      } catch (e) {
        if (this.#stopped || this.#refused(e)) return;
        await this.#down(e);
      }
    }
  }

  async #readStream(response: Response): Promise<void> {
    const body = response.body;
    if (body === null) throw new Error("the stream answered with no body");
    const parser = createParser({
      onEvent: (event) => {
        if (event.event === "open") {
          this.#set({ kind: "live", caughtUp: false, at: Date.now() });
        } else if (event.event === "head") {
          this.#failures = 0;
          this.#set({ kind: "live", caughtUp: true, at: Date.now() });
        } else if (event.event === "close") {
          // the service ends the stream (its lifetime, a restart): the loop reconnects
        } else {
          this.#emit(JSON.parse(event.data) as ChangeRow);
        }
      },
    });
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      parser.feed(value);
    }
  }

  async #pollLoop(): Promise<void> {
    while (!this.#stopped) {
      try {
        let after = this.#cursor ?? (await ok(this.#api.GET("/v1/events", { params: { query: { from: "head" } } }))).cursor;
        this.#cursor = after;
        // Read until a page comes back short: then the page has what the feed hands out now.
        for (;;) {
          const page = await ok(this.#api.GET("/v1/events", { params: { query: { after, limit: 500 } } }));
          for (const row of page.items) this.#emit(row);
          after = page.cursor;
          this.#cursor = after;
          if (page.items.length < 500) break;
        }
        this.#failures = 0;
        this.#set({ kind: "live", caughtUp: true, at: Date.now() });
        await this.#wait(POLL_MS);
      } catch (e) {
        if (this.#stopped || this.#refused(e)) return;
        await this.#down(e);
      }
    }
  }
}
