import type { Principal } from "./tokens.ts";

/** The most tokens tracked at once; past it the longest idle is forgotten (it starts again with a full bucket). */
const TRACKED_MAX = 10_000;

/**
 * A token bucket per read token (an operator token whose only scope is `read`, as
 * `mam token create --scope read` mints for a dashboard), in this process's memory:
 * `perMinute` requests a minute, bursts of a sixth of that. Per process, so per
 * function instance on AWS (docs/deploy.md: with the function's reserved concurrency,
 * the most one token can make is the rate times the instances). A polling page (every
 * 10 s) spends 6 a minute; the bound is for a tab or a script gone wrong, so one token
 * cannot starve the others.
 */
export class ReadTokenRates {
  readonly #perMinute: number;
  readonly #buckets = new Map<string, { tokens: number; at: number }>();

  constructor(perMinute: number) {
    this.#perMinute = perMinute;
  }

  /** Take one request for `tokenId` at `now` (ms); false when its bucket is empty (nothing taken). */
  take(tokenId: string, now: number): boolean {
    if (this.#perMinute === 0) return true;
    const capacity = Math.max(1, this.#perMinute / 6);
    const bucket = this.#buckets.get(tokenId) ?? { tokens: capacity, at: now };
    this.#buckets.delete(tokenId);
    // Only time that moves on refills, and the bucket's time never moves back: a wall
    // clock stepped back (NTP) would otherwise drain the bucket below zero, a 429 for
    // every read token until the clock caught up; and back where it was, no refill twice.
    if (now > bucket.at) {
      bucket.tokens = Math.min(capacity, bucket.tokens + ((now - bucket.at) * this.#perMinute) / 60_000);
      bucket.at = now;
    }
    const ok = bucket.tokens >= 1;
    if (ok) bucket.tokens -= 1;
    // Re-inserted last: the Map's order is recency, so the first key is the longest idle.
    this.#buckets.set(tokenId, bucket);
    if (this.#buckets.size > TRACKED_MAX) this.#buckets.delete(this.#buckets.keys().next().value as string);
    return ok;
  }
}

/** Whether a principal is a read token: an operator token whose every scope is `read`. */
export const isReadToken = (p: Principal): boolean => p.kind === "operator" && p.scopes.length > 0 && p.scopes.every((s) => s === "read");
