import type { Clock } from "@mam/core";

/**
 * The one test clock. It starts at a fixed instant and moves only when told:
 * `advance(ms)` moves it on; with `tickMs`, each reading is also `tickMs` after the
 * previous one (1 ms keeps event logs in order without any test reading real time).
 */
export class TestClock implements Clock {
  #t: number;
  readonly #tickMs: number;
  constructor(iso: string, opts: { readonly tickMs?: number } = {}) {
    this.#t = Date.parse(iso);
    if (Number.isNaN(this.#t)) throw new Error(`TestClock: not an instant: ${iso}`);
    this.#tickMs = opts.tickMs ?? 0;
  }
  now(): Date {
    const at = new Date(this.#t);
    this.#t += this.#tickMs;
    return at;
  }
  advance(ms: number): void {
    this.#t += ms;
  }
}

/** A clock whose every reading is 1 ms after the previous one. */
export function tickingClock(start: string): TestClock {
  return new TestClock(start, { tickMs: 1 });
}
