import {
  type ChangeNote,
  type EventLogEntry,
  type EvidenceChange,
  ForwardingJobStore,
  type JobChange,
  type JobRecord,
  type JobStore,
  type NotificationIntent,
} from "@mam/core";

/**
 * The embedded stand-in for DynamoDB Streams: a JobStore decorator that sees every
 * committed write and hands each record that now owes a notification to `onOwed`,
 * right after the commit. It never delays or fails the write it observes — a
 * relay that misses something (a crash, a write from another process such as the
 * CLI) leaves the intent owed in the store, where the sweep finds it.
 *
 *   transition() --commit--> record owes intent --> onOwed(record) --> flush --> settle
 *                                      \--(missed)--> sweep timer --> flush --> settle
 */
export class ChangeRelay extends ForwardingJobStore {
  readonly #onOwed: (record: JobRecord) => void;
  readonly #committed = new Set<() => void>();

  constructor(inner: JobStore, onOwed: (record: JobRecord) => void) {
    super(inner);
    this.#onOwed = onOwed;
  }

  /**
   * Call `listener` after every write through this relay that may have added feed
   * rows (it is a signal, not the rows: a listener reads the feed after its cursor).
   * Writes by another process are not seen here. Returns the unsubscribe.
   */
  onCommitted(listener: () => void): () => void {
    this.#committed.add(listener);
    return () => this.#committed.delete(listener);
  }

  #signal(): void {
    for (const listener of this.#committed) listener();
  }

  /** Run a write and signal once it is over, committed or not (a refused write signals nothing new, harmlessly). */
  async #signalled<T>(write: Promise<T>): Promise<T> {
    try {
      return await write;
    } finally {
      if (this.#committed.size > 0) this.#signal();
    }
  }

  override create(record: JobRecord, note?: ChangeNote): Promise<void> {
    return this.#signalled(this.inner.create(record, note));
  }
  override recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#signalled(this.inner.recordEvidence(jobId, change));
  }
  override reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    return this.#signalled(this.inner.reviseNotification(jobId, intent, note));
  }
  override settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#signalled(this.inner.settleNotification(jobId, intentId, note));
  }
  override settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#signalled(this.inner.settlePublished(entry, intentId, note));
  }

  #observe(record: JobRecord | undefined): void {
    if (record?.pending_notification) this.#onOwed(record);
  }

  override async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    const record = await this.#signalled(this.inner.transition(jobId, expectedSeq, change));
    this.#observe(record);
    return record;
  }

  override async replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    await this.#signalled(this.inner.replaceNotification(jobId, intent, note));
    this.#observe(await this.inner.get(jobId));
  }

  // Not observed: `reviseNotification` keeps the intent it marks (a failure recorded, a
  // backoff, a quarantine, a release), and handing it to `onOwed` would re-send at once
  // what the sweep just decided to wait for. The sweep picks it up when it is due.
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
