import {
  type AgentUsage,
  type ChangeNote,
  type EventLogEntry,
  type EvidenceChange,
  ForwardingJobStore,
  type JobChange,
  type JobRecord,
  type JobStore,
  type Lease,
  type LeaseExpectation,
  type LeaseKind,
  type NotificationIntent,
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
export class CachedJobStore extends ForwardingJobStore {
  readonly #version: () => unknown;
  readonly #capacity: number;
  readonly #records = new Map<string, JobRecord>();
  #seenVersion: unknown;
  #generation = 0;

  constructor(inner: JobStore, options: CachedJobStoreOptions) {
    super(inner);
    this.#version = options.version;
    this.#capacity = options.capacity ?? 1024;
  }

  override async get(jobId: string): Promise<JobRecord | undefined> {
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
    const record = await this.inner.get(jobId);
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

  override create(record: JobRecord, note?: ChangeNote): Promise<void> {
    return this.#write(() => this.inner.create(record, note));
  }
  override transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.#write(() => this.inner.transition(jobId, expectedSeq, change));
  }
  override recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#write(() => this.inner.recordEvidence(jobId, change));
  }
  override chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    return this.#write(() => this.inner.chargeUsage(jobId, prior, next));
  }
  override holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    return this.#write(() => this.inner.holdLease(jobId, kind, lease, expect));
  }
  override replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    return this.#write(() => this.inner.replaceNotification(jobId, intent, note));
  }
  override reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    return this.#write(() => this.inner.reviseNotification(jobId, intent, note));
  }
  override settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#write(() => this.inner.settleNotification(jobId, intentId, note));
  }
  override settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#write(() => this.inner.settlePublished(entry, intentId, note));
  }
  // Reads other than `get` (the change feed included), dispatches and the event log
  // pass through: dispatches and log lines are not job records, so writing them
  // leaves the cache as it is.
}

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
