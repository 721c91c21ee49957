import type {
  DispatchRecord,
  EventLogEntry,
  EvidenceChange,
  JobChange,
  JobRecord,
  JobStore,
  NotificationIntent,
  OwedQuery,
  Page,
  Status,
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
export class ChangeRelay implements JobStore {
  readonly #inner: JobStore;
  readonly #onOwed: (record: JobRecord) => void;

  constructor(inner: JobStore, onOwed: (record: JobRecord) => void) {
    this.#inner = inner;
    this.#onOwed = onOwed;
  }

  #observe(record: JobRecord | undefined): void {
    if (record?.pending_notification) this.#onOwed(record);
  }

  async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    const record = await this.#inner.transition(jobId, expectedSeq, change);
    this.#observe(record);
    return record;
  }

  recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#inner.recordEvidence(jobId, change);
  }

  async replaceNotification(jobId: string, intent: NotificationIntent): Promise<void> {
    await this.#inner.replaceNotification(jobId, intent);
    this.#observe(await this.#inner.get(jobId));
  }

  create(record: JobRecord): Promise<void> {
    return this.#inner.create(record);
  }
  get(jobId: string): Promise<JobRecord | undefined> {
    return this.#inner.get(jobId);
  }
  /**
   * Not observed: a revision keeps the intent it marks (a failure recorded, a backoff,
   * a quarantine, a release), and handing it to `onOwed` would re-send at once what
   * the sweep just decided to wait for. The sweep picks it up when it is due.
   */
  reviseNotification(jobId: string, intent: NotificationIntent): Promise<boolean> {
    return this.#inner.reviseNotification(jobId, intent);
  }
  settleNotification(jobId: string, intentId: string): Promise<boolean> {
    return this.#inner.settleNotification(jobId, intentId);
  }
  list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    return this.#inner.list(query);
  }
  listOwed(limit: number, query?: OwedQuery): Promise<readonly JobRecord[]> {
    return this.#inner.listOwed(limit, query);
  }
  listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    return this.#inner.listQuarantined(query);
  }
  recordDispatch(dispatch: DispatchRecord): Promise<void> {
    return this.#inner.recordDispatch(dispatch);
  }
  getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    return this.#inner.getDispatch(jobId, attemptId);
  }
  appendEvent(entry: EventLogEntry): Promise<void> {
    return this.#inner.appendEvent(entry);
  }
  listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    return this.#inner.listEvents(jobId, query);
  }
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
