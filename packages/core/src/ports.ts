import type { DispatchRecord, EventLogEntry, JobRecord, NotificationIntent, Status } from "./schemas.ts";

/**
 * A change the engine asks the store to commit, as one conditional write.
 * `set` replaces whole top-level fields; `unset` removes them. The store bumps
 * `transition_seq` by one itself.
 */
export interface JobChange {
  /** Statuses the record must currently have. */
  readonly from: readonly Status[];
  readonly set: Partial<Omit<JobRecord, "job_id" | "transition_seq" | "created_at">>;
  readonly unset?: readonly ("completed_by" | "completed_evidence" | "pending_notification" | "agent_session" | "progress")[];
}

export interface OwedQuery {
  /** Only intents due at or before this instant (ISO-8601). */
  readonly dueBy?: string;
}

export interface Page<T> {
  readonly items: readonly T[];
  /** Opaque; absent on the last page. */
  readonly cursor?: string;
}

/**
 * Where jobs live. Guarantees, for every adapter:
 * - `transition` is one atomic conditional write: it commits only if the stored
 *   `transition_seq` equals `expectedSeq` (skipped when `expectedSeq` is null, the
 *   MAM_ENGINE_CAS=0 rollback path) and the status is in `change.from`; it bumps
 *   `transition_seq` by one. Otherwise it writes nothing and throws
 *   `TransitionConflict` carrying the current record. An unknown job throws
 *   `MamError("job.notFound")`.
 * - bookkeeping (`replaceNotification`, `reviseNotification`, `settleNotification`)
 *   writes only `pending_notification`, never bumps `transition_seq`; revising and
 *   settling are conditional on the exact intent id.
 * - `listOwed` costs the number of owed intents it returns (a sparse index ordered by
 *   when each is next due), not the number of jobs, nor the number owed but not due or
 *   quarantined; `listQuarantined` reads quarantined intents only (their own part of
 *   the index), so neither kind can crowd out the other.
 * - dispatch records are write-once per (job, attempt).
 * Transient failures (throttling, an unreachable store) throw a retryable
 * `MamError("store.unavailable")`; nothing half-written is left visible.
 */
export interface JobStore {
  /** Fails with `job.exists` if the id is taken. */
  create(record: JobRecord): Promise<void>;
  get(jobId: string): Promise<JobRecord | undefined>;
  transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord>;
  /** Bookkeeping: write `intent` as the owed notification, whatever was owed before. `job.notFound` if there is no such job. */
  replaceNotification(jobId: string, intent: NotificationIntent): Promise<void>;
  /**
   * Bookkeeping: write `intent` (the owed intent with new delivery marks: `failures`,
   * `retry_at`, `quarantined_at`, `last_error`) iff the owed intent's id is
   * `intent.id`, and move the job in the owed index accordingly. True if written;
   * false when that intent was settled or superseded meanwhile (then nothing is written).
   */
  reviseNotification(jobId: string, intent: NotificationIntent): Promise<boolean>;
  /** Bookkeeping: clear the owed notification iff its id is `intentId`. True if cleared. */
  settleNotification(jobId: string, intentId: string): Promise<boolean>;
  /** Newest first (by `updated_at`, then `job_id`); all statuses when `status` is absent. */
  list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>>;
  /**
   * Jobs owing a notification that is not quarantined, the soonest due first (due:
   * `retry_at`, else `created_at`); with `dueBy` (an ISO-8601 instant), only those due
   * at or before it.
   */
  listOwed(limit: number, query?: OwedQuery): Promise<readonly JobRecord[]>;
  /** Jobs whose owed notification is quarantined, most recently quarantined first, paged. */
  listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>>;
  /** Write-once: `dispatch.exists` if this attempt was already recorded. */
  recordDispatch(dispatch: DispatchRecord): Promise<void>;
  getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined>;
  /** The dispatch with the highest attempt id. */
  latestDispatch(jobId: string): Promise<DispatchRecord | undefined>;
  /** Append to the job's event log; `entry.id` must be unique within the job. */
  appendEvent(entry: EventLogEntry): Promise<void>;
  /** Oldest first. */
  listEvents(jobId: string, limit: number): Promise<readonly EventLogEntry[]>;
}

/**
 * Where reports and manifests live. A `location` is a folder-like prefix the caller
 * derives (on the service always `reports/<job>/<attempt>`; the CLI may pass an
 * absolute directory, the agent's own tree). Names are handed in by core; an adapter
 * stores bytes under the name it is handed and knows nothing of their format.
 * Guarantees:
 * - `put` is atomic: a reader sees the old object, or the whole new one, never a part.
 * - `promote` moves `from` to `to` so that a reader sees no `to`, or the complete one.
 * - `hash` streams the stored bytes; it never holds a whole object in memory.
 * Locations that would escape the store's root are refused with `report.location`.
 */
export interface ReportStore {
  put(location: string, name: string, body: Uint8Array | AsyncIterable<Uint8Array>): Promise<{ sha256: string; bytes: number }>;
  /** The whole object, for small objects (manifests); undefined when absent. */
  getBytes(location: string, name: string): Promise<Uint8Array | undefined>;
  /** Stream an object; undefined when absent. */
  read(location: string, name: string): Promise<AsyncIterable<Uint8Array> | undefined>;
  exists(location: string, name: string): Promise<boolean>;
  /** Atomic rename. Throws `report.notFound` if `from` is absent. */
  promote(location: string, from: string, to: string): Promise<void>;
  /** SHA-256 (hex) and size of the stored bytes, by streaming; undefined when absent. */
  hash(location: string, name: string): Promise<{ sha256: string; bytes: number } | undefined>;
  /** The absolute address of an object: a file path, or `s3://bucket/key`. */
  describe(location: string, name: string): string;
}

/**
 * Sends a notification. `publish` resolves only once the broker acknowledged the
 * message (QoS 1 PUBACK, or IoT Core's 200); it rejects with `publish.unreachable`,
 * `publish.refused` or `publish.tooLarge` otherwise, within a bounded time.
 */
export interface Publisher {
  publish(topic: string, payload: string): Promise<void>;
  close?(): Promise<void>;
}

export interface Clock {
  now(): Date;
}

export interface Ids {
  /** A new lowercase UUID. */
  uuid(): string;
}

export const systemClock: Clock = { now: () => new Date() };
export const randomIds: Ids = { uuid: () => globalThis.crypto.randomUUID() };
