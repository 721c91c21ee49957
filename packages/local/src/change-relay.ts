import { ForwardingJobStore, type JobChange, type JobRecord, type JobStore, type NotificationIntent } from "@mam/core";

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

  constructor(inner: JobStore, onOwed: (record: JobRecord) => void) {
    super(inner);
    this.#onOwed = onOwed;
  }

  #observe(record: JobRecord | undefined): void {
    if (record?.pending_notification) this.#onOwed(record);
  }

  override async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    const record = await this.inner.transition(jobId, expectedSeq, change);
    this.#observe(record);
    return record;
  }

  override async replaceNotification(jobId: string, intent: NotificationIntent): Promise<void> {
    await this.inner.replaceNotification(jobId, intent);
    this.#observe(await this.inner.get(jobId));
  }

  // Not observed: `reviseNotification` keeps the intent it marks (a failure recorded, a
  // backoff, a quarantine, a release), and handing it to `onOwed` would re-send at once
  // what the sweep just decided to wait for. The sweep picks it up when it is due.
}

/**
 * Runs flushes one at a time, in commit order, so the relay never has two sends
 * of the same job in flight; `drain()` waits for what is queued (shutdown).
 */
export class SerialQueue {
  #tail: Promise<void> = Promise.resolve();
  #closed = false;

  push(task: () => Promise<void>): void {
    if (this.#closed) return;
    this.#tail = this.#tail.then(task).catch(() => undefined);
  }

  async drain(): Promise<void> {
    this.#closed = true;
    await this.#tail;
  }
}
