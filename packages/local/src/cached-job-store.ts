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

export interface CachedJobStoreOptions {
  /**
   * A value that changes whenever a writer other than this decorator may have
   * changed a job: for SQLite, `SqliteJobStore.dataVersion` (another connection's
   * commit). Asked before every answer `get` gives; a change empties the cache.
   */
  readonly version: () => unknown;
  /** Records kept; past this, the oldest read goes first. Default 1,024. */
  readonly capacity?: number;
}

/**
 * A read cache around a JobStore: `get` answers from the records it already read
 * while nothing can have changed them since. Nothing else is cached (listings, the
 * sweep's reads, dispatches and events always reach the store).
 *
 * "Nothing can have changed them" has two halves:
 * - another writer (another process, the CLI, another connection to the same file):
 *   `version()`, asked before every answer, changed — the cache empties. It is asked
 *   every time, never once per event-loop turn: a request read from its socket after
 *   such a check could otherwise miss a commit its client saw before sending it;
 * - a write through this decorator: the cache empties when the write starts and again
 *   when it ends, and a read that was in flight across a write does not keep what it
 *   read (a generation count).
 * Every write must therefore go through the decorator; a write to the same store
 * around it (which `version()` does not see, when it is the same connection) would
 * leave the cache stale.
 *
 *   get(A) -> version v1 ... read A -> kept (v1, generation g)
 *   transition(A) -> cache emptied, g+1 ... committed ... cache emptied, g+2
 *   get(A) -> version v1, nothing kept -> read A again
 *   (another process commits: version v2) get(A) -> cache emptied -> read A again
 *
 * A kept record is frozen: every caller shares it, so none can change it for another.
 */
export class CachedJobStore implements JobStore {
  readonly #inner: JobStore;
  readonly #version: () => unknown;
  readonly #capacity: number;
  readonly #records = new Map<string, JobRecord>();
  #seenVersion: unknown;
  #generation = 0;

  constructor(inner: JobStore, options: CachedJobStoreOptions) {
    this.#inner = inner;
    this.#version = options.version;
    this.#capacity = options.capacity ?? 1024;
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    const version = this.#version();
    if (version !== this.#seenVersion) {
      this.#records.clear();
      this.#seenVersion = version;
    }
    const cached = this.#records.get(jobId);
    if (cached !== undefined) return cached;
    // Read after the version was taken: a commit landing in between makes the record
    // newer than the version, and the next look clears it.
    const generation = this.#generation;
    const record = await this.#inner.get(jobId);
    if (record === undefined || generation !== this.#generation || version !== this.#seenVersion) return record;
    if (this.#records.size >= this.#capacity) this.#records.delete(this.#records.keys().next().value as string);
    const frozen = deepFreeze(record);
    this.#records.set(jobId, frozen);
    return frozen;
  }

  /** Run a write with the cache emptied before it starts and after it ends, whatever its outcome. */
  async #write<T>(write: () => Promise<T>): Promise<T> {
    this.#forget();
    try {
      return await write();
    } finally {
      this.#forget();
    }
  }

  #forget(): void {
    this.#records.clear();
    this.#generation += 1;
  }

  create(record: JobRecord): Promise<void> {
    return this.#write(() => this.#inner.create(record));
  }
  transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.#write(() => this.#inner.transition(jobId, expectedSeq, change));
  }
  recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#write(() => this.#inner.recordEvidence(jobId, change));
  }
  replaceNotification(jobId: string, intent: NotificationIntent): Promise<void> {
    return this.#write(() => this.#inner.replaceNotification(jobId, intent));
  }
  reviseNotification(jobId: string, intent: NotificationIntent): Promise<boolean> {
    return this.#write(() => this.#inner.reviseNotification(jobId, intent));
  }
  settleNotification(jobId: string, intentId: string): Promise<boolean> {
    return this.#write(() => this.#inner.settleNotification(jobId, intentId));
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
  // Dispatches and the event log are not job records: writing them leaves the cache as it is.
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

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
