import type { ChangeNote, ChangeQuery, ChangeRow } from "./feed.ts";
import type { ExpectedSeq, StatusCountsOf } from "./record-write.ts";
import {
  type AgentUsage,
  type DispatchRecord,
  type EventLogEntry,
  type JobRecord,
  type Lease,
  type LeaseKind,
  NON_TERMINAL,
  type NotificationIntent,
  type ObservationSet,
  type Status,
} from "./schemas.ts";

/**
 * Fields no change writes: the job's identity, its two counters (the store bumps them),
 * its birth, what its agents sent (`chargeUsage` alone writes that), and the upload in
 * flight and finalize in progress (`holdLease` alone writes those), and the
 * observations (`writeObservations` alone).
 */
export const FIXED_JOB_FIELDS = [
  "job_id",
  "transition_seq",
  "evidence_seq",
  "created_at",
  "agent_usage",
  "upload_in_flight",
  "finalize_in_progress",
  "observations",
  "candidate_at",
  "activity_at",
  "deadline_at",
  "stale_since",
  "overdue_since",
  "attention_at",
] as const;
/** The optional fields a change may remove (`JobChange.unset`). */
export const UNSETTABLE_JOB_FIELDS = ["completed_by", "completed_evidence", "pending_notification", "agent_session", "progress"] as const;
export type UnsettableJobField = (typeof UNSETTABLE_JOB_FIELDS)[number];

/**
 * A change the engine asks the store to commit, as one conditional write.
 * `set` replaces whole top-level fields; `unset` removes them; a field is named in
 * one of the two, never both (`JobStoreBase` refuses it). The store bumps
 * `transition_seq` by one itself.
 */
export interface JobChange {
  /** Statuses the record must currently have. */
  readonly from: readonly Status[];
  readonly set: Partial<Omit<JobRecord, (typeof FIXED_JOB_FIELDS)[number]>>;
  readonly unset?: readonly UnsettableJobField[];
  /** Conditions on the job's evidence, checked in the same write (and bumping `evidence_seq` when asked). */
  readonly evidence?: EvidenceGuard;
  /** Who made the change, for the change feed (`ChangeFeed`); the service's own when absent. */
  readonly note?: ChangeNote;
  /** The activity the change is (issue 20, part 4): `activity_at` set, the stale mark cleared, the attention key left. */
  readonly activity?: Activity;
  /**
   * A candidate mark the same write sets (`candidate_at`, a due time): a claim, or an
   * operator's change of what the gate reads, that may be what a quiescent job lacked.
   * Never with a terminal status.
   */
  readonly candidate?: string;
}

/**
 * An activity a write records (issue 20, part 4): when it happened (`activity_at`; the
 * base clears the stale mark in the same write) and, where the write sets it, when the
 * sweep should next look at the job for staleness or its deadline (`attention_at`, the
 * attention index's key; null: never; absent: left as it is — the sweep moves it as it
 * looks, so an activity need not).
 */
export interface Activity {
  readonly at: string;
  readonly attention?: string | null;
}

/**
 * What a write requires of the job's evidence. Every field is a condition of the one
 * conditional write; none is checked by a read before it.
 */
export interface EvidenceGuard {
  /** `evidence_seq` must still be this: the evidence the writer verified has not moved. */
  readonly seq?: number;
  /** `latest_attempt` must be this attempt (a report write, a completion on it). */
  readonly attempt?: number;
  /** `latest_attempt` must be absent or this attempt: the attempt an agent acts for is not superseded. */
  readonly currentAttempt?: number;
  /** `latest_attempt` must be absent or below this one, which becomes the latest (a dispatch). */
  readonly newAttempt?: number;
  /**
   * `observations.rev` (none: 0) must still be this: no observation, a coalesced
   * repeat included, landed since the scenario was built from them.
   */
  readonly observationsRev?: number;
  /** Bump `evidence_seq` by one. */
  readonly bump?: boolean;
}

/** An evidence write: bumps `evidence_seq`, never `transition_seq`; the job must not be terminal. */
export interface EvidenceChange {
  readonly guard: Omit<EvidenceGuard, "bump">;
  readonly set?: Partial<Pick<JobRecord, "finalized_report">>;
  /** A dispatch's (with `guard.newAttempt`): the new attempt's deadline; absent, it has none. */
  readonly deadline?: string;
  /** Who made the change and what it staged, for the change feed; the service's own when absent. */
  readonly note?: ChangeNote;
  /** A candidate mark the same write sets (`candidate_at`, a due time): a finalize that may complete a quiescent job. */
  readonly candidate?: string;
  /** The activity the write is (every evidence write is one). */
  readonly activity?: Activity;
}

/**
 * An evidence write as the conditional write an adapter runs for it: the job not
 * terminal, the guard's conditions, `evidence_seq` bumped (never `transition_seq`).
 * Adapters that implement both writes with one update path call this, so the
 * translation lives once.
 */
export function evidenceWriteOf(change: EvidenceChange): JobChange {
  return {
    from: NON_TERMINAL,
    set: change.set ?? {},
    evidence: { ...change.guard, bump: true },
    ...(change.note ? { note: change.note } : {}),
  };
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
 * Where jobs live, by role — the job records, their dispatches, their event log and
 * their owed notifications — each adapter implementing all four over one table or
 * one database. Guarantees, for every adapter:
 * - `transition` is one atomic conditional write: it commits only if the stored
 *   `transition_seq` equals `expectedSeq` (skipped when it is `NO_CONCURRENCY_CHECK`,
 *   the MAM_ENGINE_CAS=0 rollback path) and the status is in `change.from`; it bumps
 *   `transition_seq` by one. Otherwise it writes nothing and throws
 *   `TransitionConflict` carrying the current record. An unknown job throws
 *   `MamError("job.notFound")`.
 * - `recordEvidence` is one atomic conditional write too: it commits only if the job
 *   is not terminal and `change.guard` holds, bumps `evidence_seq` (never
 *   `transition_seq`), and otherwise writes nothing and throws the conflict
 *   (`conflictFor`) carrying the current record. A transition with `change.evidence`
 *   checks (and bumps, when asked) the same conditions in its own single write.
 * - bookkeeping (`replaceNotification`, `reviseNotification`, `settleNotification`,
 *   `settlePublished`)
 *   writes only `pending_notification`, never bumps `transition_seq`; revising and
 *   settling are conditional on the exact intent id.
 * - `listOwed` costs the number of owed intents it returns (a sparse index ordered by
 *   when each is next due), not the number of jobs, nor the number owed but not due or
 *   quarantined; `listQuarantined` reads quarantined intents only (their own part of
 *   the index), so neither kind can crowd out the other.
 * - dispatch records are write-once per (job, attempt).
 * Transient failures (throttling, an unreachable store) throw a retryable
 * `MamError("store.unavailable")`; nothing half-written is left visible.
 *
 * The rules every store keeps whatever it stores in — a job id matches
 * `JOB_ID_PATTERN` before any store is asked (`input.jobId`), a record is a
 * `JobRecordSchema` record when it is created, a limit is a positive integer, a change
 * writes only the fields it may and never sets and unsets one field, a cursor is
 * honoured only by the listing that handed it out (`invalidCursor` otherwise) — live
 * once, in `JobStoreBase` (persistence.ts), the one class that implements this port:
 * every adapter extends it and implements only its storage primitives, and may assume
 * what the base checked.
 */
export interface JobStore extends JobRecords, DispatchRecords, JobEventLog, OwedNotifications, ChangeFeed {}

/** The counts per status and how current they are (`JobRecords.countByStatus`). */
export interface StatusCounts {
  readonly counts: StatusCountsOf;
  readonly consistency: "exact" | "eventual";
}

/** A feed page: `cursor` is always there, to continue from (even after an empty page). */
export interface FeedPage extends Page<ChangeRow> {
  readonly cursor: string;
}

/**
 * The change feed: one row per committed change of a job (core's `changeRowsOf`
 * decides which), read in pages after a cursor. Guarantees, for every adapter:
 * - a write and its rows commit together, or neither does (SQLite: one transaction;
 *   DynamoDB: derived from the table's stream, idempotently, so a replayed stream
 *   record writes nothing new);
 * - one job's rows come in the order its writes committed;
 * - a reader paging with cursors never skips a row: a row that becomes readable
 *   later than a row after it (a late commit) is never handed out behind its cursor.
 *   SQLite hands out rows in commit order (writers are serialized); DynamoDB reads
 *   only rows older than its feed delay (docs/notifications.md);
 * - `jobId` reads one job's rows by an index, never by filtering the whole feed;
 * - the cursor of a page is always present, and a cursor this feed did not hand out
 *   is `invalidCursor()` naming `query.after` (the guard checks the envelope).
 */
export interface ChangeFeed {
  listChanges(query: ChangeQuery): Promise<FeedPage>;
  /**
   * The feed's head now, as a cursor: `listChanges({ after: head })` later hands out
   * exactly the rows that become readable after this call — none from before it, and
   * none that becomes readable later skipped. It is the position at the feed's read
   * horizon: SQLite's newest row; on DynamoDB the last row at or before now minus the
   * feed delay, so a row still in flight is read when it appears. With `jobId`, the
   * head of that job's rows, for its own listing (`listChanges({ jobId })`). Reads no
   * row; the cursor is an ordinary one of this feed, as a page's is.
   */
  feedHead(query?: Pick<ChangeQuery, "jobId">): Promise<string>;
}

/**
 * The job records themselves: created once, read, listed, and changed only by the two
 * conditional writes. A transition commits its owed intent (and its evidence guards)
 * in the same one write, so this role writes `pending_notification` too.
 */
export interface JobRecords {
  /** Fails with `job.exists` if the id is taken. */
  create(record: JobRecord, note?: ChangeNote): Promise<void>;
  get(jobId: string): Promise<JobRecord | undefined>;
  transition(jobId: string, expectedSeq: ExpectedSeq, change: JobChange): Promise<JobRecord>;
  /** The evidence write: see the guarantees above. */
  recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord>;
  /**
   * Newest first (by `updated_at`, then `job_id`); all statuses when `status` is
   * absent. With `mark`, only the running jobs carrying it (`stale`, `overdue`; or
   * `candidate`: due at or before `dueBy`), read as the running listing filtered — its
   * cost is the number of running jobs read, not of those listed (docs/adapters.md).
   */
  list(query: JobListQuery): Promise<Page<JobRecord>>;
  /**
   * How many jobs each status holds (issue 22), kept through the store's writes by
   * the rule of `statusCountMove` (record-write.ts): a create counts its status, a
   * status-changing write moves one from the status it left to the one it entered, a
   * lost write counts nothing. `consistency` says how current it is: `exact` where
   * the counts are written in the write's own transaction (SQLite, D1, memory);
   * `eventual` where they are derived after it (DynamoDB: the feed writer, from the
   * stream, under each record's marker — late by the stream's delay, never counted
   * twice). One read, whatever the number of jobs.
   */
  countByStatus(): Promise<StatusCounts>;
  /**
   * Quota bookkeeping (issue 17): write `next` as the job's `agent_usage` iff the
   * stored one still counts exactly `prior`'s events and bytes (absent: 0 and 0).
   * Both only grow and every charge grows one of them, so equal counts mean no other
   * charge landed between the caller's read and this write. One conditional write;
   * it never bumps `transition_seq` or `evidence_seq`, adds no change-feed row and
   * owes no notification. True if written; false when another charge landed first
   * (nothing written). `job.notFound` if there is no such job.
   */
  chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean>;
  /**
   * Lease bookkeeping (issue 17): write `lease` as the job's lease of `kind`
   * (`upload_in_flight`, `finalize_in_progress`), or remove it when `lease` is null,
   * iff `expect` holds of the stored one:
   * - `{ freeAt }`: there is none, or it expired (`expires_at <= freeAt`), or it is an
   *   older attempt's than `lease.attempt_id` — and the job is not terminal;
   * - `{ heldBy }`: it is the lease with that id (a release, or a hand-over).
   * One conditional write; it never bumps `transition_seq` or `evidence_seq`, adds no
   * change-feed row and owes no notification. True if written; false when the
   * condition did not hold (nothing written). `job.notFound` if there is no such job.
   */
  holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean>;
  /**
   * Observation bookkeeping (`recordObservation`): write `next` as the job's
   * `observations` iff the job is not terminal, its latest attempt is
   * `next.attempt_id`, and the stored set's `rev` is `expectedRev` (none: 0), which
   * `next.rev` follows by one. One conditional write; it never bumps
   * `transition_seq`; it bumps `evidence_seq` and adds the feed rows of `opts.note`
   * only with `opts.bump` (a new observation or an overflow: what the gate reads
   * changed), never for a coalesced repeat. The record written; undefined when a
   * condition did not hold (nothing written). `job.notFound` if there is no such job.
   */
  writeObservations(
    jobId: string,
    expectedRev: number,
    next: ObservationSet,
    opts: ObservationWriteOptions,
  ): Promise<JobRecord | undefined>;
  /**
   * A mark (issue 20): remove the job's candidate mark (`candidate_at`) iff the job is
   * not terminal and its `evidence_seq`, observation set's `rev` (none: 0) and
   * `transition_seq` are still `expect`'s — what the sweep read before a hold — so an
   * observation, a finalize or a claim landing meanwhile keeps the job due. One conditional write; it bumps no sequence,
   * adds no change-feed row, owes no notification and is no activity. True if
   * removed; false when a condition did not hold (nothing written). `job.notFound` if
   * there is no such job.
   */
  clearCandidate(jobId: string, expect: CandidateExpectation): Promise<boolean>;
  /**
   * A mark: move the job's candidate mark from `read` (its `candidate_at` as the sweep
   * read it) to `to`, iff the job is not terminal and the mark is still `read` — so a
   * mark an evidence write moved meanwhile stays as it set it. What the sweep does with
   * a candidate it could not clear (its evidence moved while the gate held, or the
   * evaluation failed): it goes behind the others, due again a settle window later,
   * instead of heading every pass. True if moved; false otherwise (nothing written).
   */
  postponeCandidate(jobId: string, read: string, to: string): Promise<boolean>;
  /**
   * Jobs marked candidates due at or before `dueBy` (ISO-8601), the oldest due first:
   * a sparse index read by due time, so the cost is the number returned, not the
   * number of jobs nor of candidates not yet due.
   */
  listCandidates(limit: number, query: { readonly dueBy: string }): Promise<readonly JobRecord[]>;
  /**
   * A mark (issue 20, part 4): mark the job stale or overdue (`stale_since` /
   * `overdue_since` at `mark.at`), owe `mark.intent` (replacing any owed intent, as a
   * transition's does), leave the attention key at `mark.attention`, and tell the feed
   * (`job.stale` / `job.overdue`), iff the job's status, `transition_seq`,
   * `evidence_seq` and observation set's `rev` are still what the sweep read — so any
   * activity meanwhile wins. It bumps no sequence. True if written; false when a
   * condition did not hold (nothing written). `job.notFound` if there is no such job.
   */
  markAttention(jobId: string, mark: AttentionMark): Promise<boolean>;
  /**
   * A mark: move the attention key (when the sweep next looks) to `attention` (null:
   * out of the index) iff the job is not terminal and its sequences and observation
   * rev are `expect`'s. No sequence, no feed row, no activity. True if written.
   */
  rekeyAttention(jobId: string, expect: AttentionExpectation, attention: string | null): Promise<boolean>;
  /** Jobs whose attention key is at or before `dueBy` (ISO-8601), the oldest first: the attention index, read by due time. */
  listAttention(limit: number, query: { readonly dueBy: string }): Promise<readonly JobRecord[]>;
}

/** What the sweep read of a job before it marks it or moves its attention key. */
export interface AttentionExpectation extends CandidateExpectation {
  readonly status: Status;
  /**
   * The attention key read (`attention_at`, as stored): a mark and a rekey hold only while
   * it is still there, so two sweeps (or an index read lagging a mark) never mark one
   * stale period twice (a mark moves no sequence). Absent: not compared.
   */
  readonly attention?: string;
}

/** A stale or overdue mark, as the sweep writes it. */
export interface AttentionMark {
  readonly kind: "stale" | "overdue";
  readonly at: string;
  readonly expect: AttentionExpectation;
  readonly attention: string | null;
  readonly intent: NotificationIntent;
  /**
   * The owed intent the sweep read, which `intent` replaces (an earlier mark's of the
   * same kind), or null: none owed. The mark holds only while that is still so, so an
   * intent owed meanwhile (an operator's) is never superseded unsent.
   */
  readonly replaces: string | null;
  readonly note?: ChangeNote;
}

/** A mark a listing may ask for. */
export type JobMark = "stale" | "overdue" | "candidate";

export interface JobListQuery {
  readonly status?: Status;
  readonly limit: number;
  readonly cursor?: string;
  /** Only running jobs with this mark (`status` is then ignored). */
  readonly mark?: JobMark;
  /** With `mark: "candidate"`: due at or before this instant (ISO-8601). */
  readonly dueBy?: string;
}

/**
 * What `clearCandidate` requires of the record: the evidence the sweep evaluated, and
 * its `transition_seq` (a claim or an operator's opt-in marks the job in its own write,
 * and moves no evidence).
 */
export interface CandidateExpectation {
  readonly evidenceSeq: number;
  readonly observationsRev: number;
  readonly transitionSeq: number;
}

/** What a `writeObservations` call asks besides the set: whether it bumps `evidence_seq` (and tells the feed, by `note`). */
export interface ObservationWriteOptions {
  readonly bump: boolean;
  readonly note?: ChangeNote;
  /**
   * The candidate mark the same write leaves (`candidate_at`): a due time, `null` to
   * remove it (a `working`, an overflow), absent to leave it as it is (a repeat that
   * did not make the span cover the settle window).
   */
  readonly candidate?: string | null;
  /** The activity the write is: a new observation, a `working` sighted again (absent: none, as for an idle repeat). */
  readonly activity?: Activity;
}

/** What `holdLease` requires of the stored lease: free (by the clock's `freeAt`), or the one with id `heldBy`. */
export type LeaseExpectation = { readonly freeAt: string } | { readonly heldBy: string };

/** Dispatch records: write-once per (job, attempt). */
export interface DispatchRecords {
  /** Write-once: `dispatch.exists` if this attempt was already recorded. */
  recordDispatch(dispatch: DispatchRecord): Promise<void>;
  getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined>;
}

/** The job's event log: append-only, idempotent by entry id. */
export interface JobEventLog {
  /** Append to the job's event log; `entry.id` must be unique within the job. */
  appendEvent(entry: EventLogEntry): Promise<void>;
  /**
   * Oldest first, one page: at most `limit` entries, and no more than
   * `EVENT_PAGE_MAX_BYTES` of them (their JSON, UTF-8) — at least one entry whatever
   * its size — so a read costs its page, whatever the log holds. `cursor` is the
   * previous page's, opaque; one this listing did not hand out is `input.invalid`
   * naming `query.cursor` (`invalidCursor`). An unknown job has an empty log.
   */
  listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>>;
}

/** Each job's owed notification: bookkeeping (never a state change) and the owed index. */
export interface OwedNotifications {
  /** Bookkeeping: write `intent` as the owed notification, whatever was owed before. `job.notFound` if there is no such job. */
  replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void>;
  /**
   * Bookkeeping: write `intent` (the owed intent with new delivery marks: `failures`,
   * `retry_at`, `quarantined_at`, `last_error`) iff the owed intent's id is
   * `intent.id`, and move the job in the owed index accordingly. True if written;
   * false when that intent was settled or superseded meanwhile (then nothing is written).
   */
  reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean>;
  /** Bookkeeping: clear the owed notification iff its id is `intentId`. True if cleared. */
  settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean>;
  /**
   * Bookkeeping after a send both topics acknowledged: append `entry` (its
   * `published` log line) to the job's event log, as `appendEvent` does, and clear
   * the owed notification iff its id is `intentId`, as `settleNotification` does.
   * True if cleared. The line is appended whether or not the intent was still owed
   * (settled or superseded meanwhile: false). Where the store has transactions
   * (SQLite, memory) both are one write: never a line without its settle, nor a
   * settle without its line. DynamoDB keeps two writes, the line first and then the
   * settle conditional on the intent id (dynalite, its test peer, has no
   * transactions): a crash between them leaves the line logged and the intent owed,
   * which the sweep sends again (a subscriber drops the duplicate by id).
   */
  settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean>;
  /**
   * Jobs owing a notification that is not quarantined, the soonest due first (due:
   * `retry_at`, else `created_at`); with `dueBy` (an ISO-8601 instant), only those due
   * at or before it.
   */
  listOwed(limit: number, query?: OwedQuery): Promise<readonly JobRecord[]>;
  /** Jobs whose owed notification is quarantined, most recently quarantined first, paged. */
  listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>>;
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
 * - `delete` is idempotent: an absent object is not an error.
 * - `copyOnce` is a write-once, verified copy (content-addressed evidence): the
 *   target is created only if absent, and only with bytes that hash to the digest
 *   the caller holds; an existing target is never replaced.
 * - Objects are private to the service: where the store is a file system, files are
 *   created 0600 (pinned copies 0400) and directories 0700.
 * - No message names a server path: an object in the store's own tree is named by
 *   `describe` (a URI in the store's namespace), never by where it lies on a disk.
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
  /** Remove an object. Absent is not an error: deleting twice is deleting once. */
  delete(location: string, name: string): Promise<void>;
  /**
   * Write-once copy of `from`'s bytes to `to`, for evidence a completion pins. The
   * source is always read, and must hash (SHA-256, hex) to `sha256`:
   * - source absent: `report.notFound`; its bytes hash otherwise (it changed after
   *   the caller hashed it): `report.changed`. Nothing is written in either case.
   * - target absent: it is created atomically with exactly those bytes
   *   (`created: true`); two concurrent calls create it once.
   * - target present: it is left untouched. `created: false` if its own bytes hash to
   *   `sha256`; `report.changed` if they do not (the target is not the evidence).
   */
  copyOnce(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
    sha256: string,
  ): Promise<{ bytes: number; created: boolean }>;
  /**
   * An object nothing references any more: a pinned copy (`evidence/<sha256>`) that
   * core's rule (`retireIfUnreferenced`, services.ts) found named by no completion
   * and no current finalize. Core decides; the store only carries it out, its way:
   * - the file store (and the memory store) remove it;
   * - S3 tags it (`mam-retired=true`, PutObjectTagging) and a bucket lifecycle rule
   *   expires tagged objects, noncurrent versions included: the IAM deny on deleting
   *   pinned evidence stays, so no function can remove evidence itself.
   * Until the object is gone it reads as before. A `copyOnce` onto a retired object
   * that still exists pins it again (S3: its tags are cleared), so the same bytes
   * finalized again are never left marked for expiry. Absent is not an error:
   * retiring twice is retiring once.
   */
  retire(location: string, name: string): Promise<void>;
  /**
   * The absolute address of an object, as a manifest records it (B-16): for an
   * absolute location (the CLI, the agent's own tree) its file path; for a location
   * in the store's own tree a URI in the store's namespace (`s3://bucket/key`,
   * `mam-file:///reports/<job>/<attempt>/<name>`), never a server's file path.
   */
  describe(location: string, name: string): string;
  /**
   * Optional: an address the caller may send the bytes of `name` to directly, around
   * the service (S3: a presigned PUT), good for `expiresInSeconds`. The store binds
   * what it can of the declaration into the address (S3 signs the content length and
   * `x-amz-checksum-sha256`; a stand-in may ignore them): the service never trusts
   * that, and hashes what arrived before anything is pinned (`prepareFinalize`). It
   * writes nothing and knows nothing of jobs: who may ask, and for which name, is
   * core's (`requestReportUpload`). A store without it takes uploads through the
   * service's own report route.
   */
  uploadUrl?(location: string, name: string, declared: UploadDeclared): Promise<UploadTarget>;
  /**
   * Optional: an address the caller can fetch the whole object from, without the
   * service (S3: a presigned GET answered as an attachment, so a browser saves it and
   * never renders it), good for `expiresInSeconds`; undefined when the object is
   * absent. A store without it serves reads through the service only.
   */
  downloadUrl?(
    location: string,
    name: string,
    expiresInSeconds: number,
  ): Promise<{ readonly url: string; readonly expiresAt: Date } | undefined>;
  /**
   * Optional: replace `to` atomically with the current bytes of `from`, inside the
   * store (S3: CopyObject), without the bytes passing through the caller; a reader
   * sees the old `to` or the whole copy. `report.notFound` if `from` is absent. Core
   * uses it to write a live report from its pinned copy when the copy is larger than
   * the store takes in one `put`; without it, `read` then `put`.
   */
  copy?(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
  ): Promise<void>;
}

/** What an uploader declares before sending a report around the service. */
export interface UploadDeclared {
  /** SHA-256 of the bytes, 64 lowercase hex digits. */
  readonly sha256: string;
  readonly bytes: number;
  readonly expiresInSeconds: number;
}

/** Where to send the bytes: one request, with exactly these headers. */
export interface UploadTarget {
  readonly url: string;
  readonly method: "PUT";
  readonly headers: Readonly<Record<string, string>>;
  /** When the address stops being good. */
  readonly expiresAt: Date;
}

/**
 * Sends a notification. `publish` resolves only once the broker has taken the
 * message: queued it for every persistent session and handed it to the connected
 * subscribers (an in-process broker's callback, an MQTT QoS 2 PUBCOMP, IoT Core's
 * 200; never a QoS 1 PUBACK, which aedes sends before either). It rejects with
 * `publish.unreachable`, `publish.refused` or `publish.tooLarge` otherwise, within a
 * bounded time.
 */
export interface Publisher {
  publish(topic: string, payload: string): Promise<void>;
  close?(): Promise<void>;
}

export interface Clock {
  now(): Date;
}

/**
 * The free space on the disk that holds a store with a disk to starve (the embedded
 * data dir: its database, reports and broker sessions). `freeBytes` answers what an
 * unprivileged writer may still use there (statfs's `bavail * bsize`), read when it is
 * asked; it writes nothing, and throws `store.unavailable` when the disk cannot be
 * asked. Absent where the stores have no disk of ours to fill (DynamoDB, S3).
 */
export interface DiskSpace {
  freeBytes(): Promise<number>;
}

export interface Ids {
  /** A new lowercase UUID. */
  uuid(): string;
}

export const systemClock: Clock = { now: () => new Date() };
export const randomIds: Ids = { uuid: () => globalThis.crypto.randomUUID() };
