import type { CommitHook, JobRecord } from "@mam/core";

/**
 * The embedded stand-in for DynamoDB Streams: a commit hook (`JobStoreBase`'s
 * `onCommitted`) that hands each record a committed write left owing a notification
 * to `onOwed`, right after the commit. Like every hook it never delays or fails the
 * write it observes — a relay that misses something (a crash, a write from another
 * process such as the CLI) leaves the intent owed in the store, where the sweep
 * finds it.
 *
 *   transition() --commit--> record owes intent --> onOwed(record) --> flush --> settle
 *                                      \--(missed)--> sweep timer --> flush --> settle
 *
 * Observed: transitions, `replaceNotification` and the sweep's `markAttention` (the
 * intents they commit: a stale or overdue job's notification goes out at once). Not
 * observed: `reviseNotification`, which keeps the intent it marks (a failure recorded,
 * a backoff, a quarantine, a release): handing it to `onOwed` would re-send at once
 * what the sweep just decided to wait for. The sweep picks it up when it is due.
 */
export function changeRelay(onOwed: (record: JobRecord) => void): CommitHook {
  return (commit) => {
    if (commit.method !== "transition" && commit.method !== "replaceNotification" && commit.method !== "markAttention") return;
    if (commit.record?.pending_notification !== undefined) onOwed(commit.record);
  };
}

/**
 * Runs the relay's flushes: one at a time per job, in commit order (never two sends
 * of one job in flight, so a job's intents go out in the order they were committed),
 * and up to `maxInFlight` jobs at once, so one slow acknowledgement does not hold up
 * every other job's notification. Order across jobs is not kept: it never was a
 * promise (a subscriber drops duplicates and reads each job's `seq`).
 *
 *   job a:  flush a1 ──> flush a2 ──> ...        (serial)
 *   job b:  flush b1 ──> ...                     (beside a, up to maxInFlight jobs)
 *
 * `idle()` resolves once everything pushed so far has run; `drain()` refuses new
 * work and waits for what is queued (shutdown).
 */
export class JobFlushQueue {
  readonly #tails = new Map<string, Promise<void>>();
  readonly #pending = new Set<Promise<void>>();
  readonly #slots: (() => void)[] = [];
  readonly #maxInFlight: number;
  #running = 0;
  #closed = false;

  constructor(maxInFlight = 32) {
    if (!Number.isInteger(maxInFlight) || maxInFlight < 1)
      throw new RangeError(`maxInFlight must be a positive integer, not ${maxInFlight}`);
    this.#maxInFlight = maxInFlight;
  }

  push(jobId: string, task: () => Promise<void>): void {
    if (this.#closed) return;
    const run = (this.#tails.get(jobId) ?? Promise.resolve()).then(() => this.#inSlot(task)).catch(() => undefined);
    this.#tails.set(jobId, run);
    this.#pending.add(run);
    void run.then(() => {
      this.#pending.delete(run);
      if (this.#tails.get(jobId) === run) this.#tails.delete(jobId);
    });
  }

  async #inSlot(task: () => Promise<void>): Promise<void> {
    if (this.#running >= this.#maxInFlight) await new Promise<void>((resolve) => this.#slots.push(resolve));
    this.#running++;
    try {
      await task();
    } finally {
      this.#running--;
      this.#slots.shift()?.();
    }
  }

  /** Resolves once every flush pushed before (or while) waiting has run. */
  async idle(): Promise<void> {
    while (this.#pending.size > 0) await Promise.all([...this.#pending]);
  }

  async drain(): Promise<void> {
    this.#closed = true;
    await this.idle();
  }
}
