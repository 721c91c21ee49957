import type { ChangeFeed, ChangeRow } from "@mam/core";

/** One read of the whole feed takes at most this many rows. */
const TAIL_PAGE = 500;
/** Positions kept: a stream further behind reads the store itself. */
const TAIL_KEPT = 5000;

/** What a caught-up stream gets from the tail: its rows since its position, and the position to keep. */
export interface TailRows {
  readonly items: readonly ChangeRow[];
  readonly cursor: string;
  /** The tail's last read was a full page: more rows are there now. */
  readonly more: boolean;
}

/**
 * The newest rows of the whole feed, read once for every open stream. Without it,
 * one commit woke every stream and each read the feed after its own cursor: 64
 * streams, 64 reads per commit. Here a wake-up is one read after the tail's head,
 * shared by every stream that wakes with it (they await the same read), and each
 * stream takes its own rows (an agent's: its job's) from what the tail holds.
 *
 *   commit ─ signal ─┬─ stream a: advance() ─┐
 *                    ├─ stream b: advance() ─┼─ one listChanges(after: head) ─ rows since a's / b's / c's position
 *                    └─ stream c: advance() ─┘
 *
 * A position the tail does not know (a stream resuming from an old cursor, or one
 * behind the kept window) is `undefined`: that stream reads the store itself, as
 * before, until its position is one the tail knows. The tail's head is seeded by
 * the first whole-feed stream that is caught up (its page's cursor is a head).
 * Polls are shared too: without a signal since the last read, a read younger than
 * `freshMs` is not repeated.
 */
export class FeedTail {
  readonly #feed: ChangeFeed;
  readonly #freshMs: number;
  /** Positions in feed order: a row's cursor with its row, or a head (a page's cursor) without. */
  #entries: { readonly cursor: string; readonly row?: ChangeRow }[] = [];
  #base = 0;
  readonly #index = new Map<string, number>();
  #head: string | undefined;
  #more = false;
  #signalled = 0;
  #readUpTo = 0;
  #readAt = 0;
  #reading: Promise<void> | undefined;

  constructor(feed: ChangeFeed, freshMs: number) {
    this.#feed = feed;
    this.#freshMs = freshMs;
  }

  /** This process committed: the next `advance()` reads. */
  signal(): void {
    this.#signalled += 1;
  }

  /** Seed the head from a caught-up whole-feed stream's page cursor (the first one only). */
  seed(cursor: string): void {
    if (this.#head !== undefined) return;
    this.#head = cursor;
    this.#add({ cursor });
  }

  /** Read after the head, once for every caller waiting on it, unless nothing can be new. */
  async advance(): Promise<void> {
    if (this.#head === undefined) return;
    while (this.#reading !== undefined) await this.#reading;
    const fresh = !this.#more && this.#readUpTo >= this.#signalled && Date.now() - this.#readAt < this.#freshMs;
    if (fresh) return;
    this.#reading = this.#read().finally(() => {
      this.#reading = undefined;
    });
    await this.#reading;
  }

  async #read(): Promise<void> {
    const upTo = this.#signalled;
    this.#readAt = Date.now();
    const page = await this.#feed.listChanges({ limit: TAIL_PAGE, after: this.#head! });
    for (const row of page.items) this.#add({ cursor: row.cursor, row });
    if (!this.#index.has(page.cursor)) this.#add({ cursor: page.cursor });
    this.#head = page.cursor;
    this.#more = page.items.length >= TAIL_PAGE;
    this.#readUpTo = upTo;
  }

  /** The rows after `position` that `jobId` (or, absent, everyone) reads; undefined for a position the tail does not know. */
  since(position: string, jobId: string | undefined): TailRows | undefined {
    const at = this.#index.get(position);
    if (at === undefined || this.#head === undefined) return undefined;
    const items: ChangeRow[] = [];
    for (let i = at - this.#base + 1; i < this.#entries.length; i++) {
      const row = this.#entries[i]!.row;
      if (row !== undefined && (jobId === undefined || row.job_id === jobId)) items.push(row);
    }
    return { items, cursor: this.#head, more: this.#more };
  }

  #add(entry: { readonly cursor: string; readonly row?: ChangeRow }): void {
    this.#index.set(entry.cursor, this.#base + this.#entries.length);
    this.#entries.push(entry);
    if (this.#entries.length <= TAIL_KEPT * 2) return;
    const dropped = this.#entries.splice(0, this.#entries.length - TAIL_KEPT);
    this.#base += dropped.length;
    for (const d of dropped) if (this.#index.get(d.cursor)! < this.#base) this.#index.delete(d.cursor);
  }
}
