import { EVENT_PAGE_MAX_BYTES, invalidCursor, JOB_PAGE_MAX_BYTES, utf8Bytes } from "./bounds.ts";
import { conflictFor } from "./conflicts.ts";
import { assertJobId } from "./engine.ts";
import { MamError } from "./errors.ts";
import { type ChangeNote, ChangeNoteSchema, type ChangeQuery, storedFeedPage, storedRowsOf } from "./feed.ts";
import {
  type Activity,
  type AttentionExpectation,
  type AttentionMark,
  type CandidateExpectation,
  type EvidenceChange,
  type EvidenceGuard,
  evidenceWriteOf,
  type FeedPage,
  FIXED_JOB_FIELDS,
  type JobChange,
  type JobListQuery,
  type JobMark,
  type JobStore,
  type LeaseExpectation,
  type ObservationWriteOptions,
  type OwedQuery,
  type Page,
  type StatusCounts,
  UNSETTABLE_JOB_FIELDS,
} from "./ports.ts";
import {
  type CounterField,
  type DerivedKeys,
  type ExpectedSeq,
  fullCounts,
  keysOf,
  NO_CONCURRENCY_CHECK,
  owedPlaceOf,
  type RecordCondition,
  type RecordWrite,
  sortableTime,
} from "./record-write.ts";
import {
  type AgentUsage,
  AgentUsageSchema,
  AttemptId,
  type DispatchRecord,
  DispatchRecordSchema,
  type EventLogEntry,
  IsoTime,
  type JobRecord,
  JobRecordSchema,
  LEASE_FIELDS,
  type Lease,
  type LeaseKind,
  LeaseSchema,
  NON_TERMINAL,
  type NotificationIntent,
  NotificationIntentSchema,
  type ObservationSet,
  ObservationSetSchema,
  type Status,
  zodIssues,
} from "./schemas.ts";

/**
 * The job storage of mam, once: every rule, cursor, cache and commit hook, over a
 * handful of storage primitives an adapter implements (the pattern of Powertools'
 * idempotency `BasePersistenceLayer`: public guarantees over protected primitives;
 * commit hooks as options, as Emmett's event store has them). Its public methods are
 * the `JobStore` port (ports.ts, where each guarantee is stated); an adapter extends
 * this class and implements only the `protected abstract` primitives below, and may
 * assume everything this class checked. No adapter implements the port itself.
 *
 * What lives here, and nowhere else:
 * - the guard: a job id matches `JOB_ID_PATTERN` on every call that names a job
 *   (`input.jobId`, no storage asked); a record is created only if it is a
 *   `JobRecordSchema` record, a dispatch only a `DispatchRecordSchema` one; a limit is
 *   a positive integer; a change writes only the fields it may (`FIXED_JOB_FIELDS`
 *   never, `UNSETTABLE_JOB_FIELDS` only to unset, never both) — core's own bug
 *   otherwise (`internal`, nothing written);
 * - every conditional write, as data (`RecordWrite`, record-write.ts): the expected
 *   sequence or `NO_CONCURRENCY_CHECK`, the status, each evidence condition by name,
 *   the intent, the usage and the lease conditions, the fields set and unset, the
 *   counters bumped and the derived index keys (`keysOf`: recency and the owed place);
 * - the listings' positions and cursors: a position is core's (`[key, job_id]`, the
 *   key a `sortableTime`), wrapped in an envelope naming the listing, so a cursor is
 *   honoured only by the listing that handed it out; page bounds by count and bytes
 *   (`JOB_PAGE_MAX_BYTES`, `EVENT_PAGE_MAX_BYTES`, at least one item);
 * - commit hooks (`onCommitted`): told of every write that committed, after it, with
 *   the record it wrote where it wrote one; a hook never delays or fails the write (it
 *   runs synchronously after the commit, and what it throws is dropped);
 * - the record cache, opt-in (`cache`), only for an adapter that can say cheaply
 *   whether anyone else has written (`dataVersion`): refused on any other.
 *
 * A write method calls its primitive only through `#write`, which empties the cache
 * before and after and tells the hooks; tests/unit/persistence.test.ts lists the
 * write methods by reflection and shows that each one does.
 */
export abstract class JobStoreBase implements JobStore {
  readonly #hooks = new Set<CommitHook>();
  readonly #cache: RecordCache | undefined;

  constructor(options: JobStoreOptions = {}) {
    for (const hook of options.hooks ?? []) this.#hooks.add(hook);
    if (options.cache !== undefined) {
      if (this.dataVersion === undefined) {
        throw new MamError(
          "internal",
          `${new.target.name} offers no dataVersion probe, so it cannot tell when another writer changed a record: a record cache over it would go stale`,
        );
      }
      this.#cache = new RecordCache(options.cache.capacity ?? 1024);
    }
  }

  // ---- the primitives an adapter implements

  /** The record, or undefined. */
  protected abstract readRecord(jobId: string): Promise<JobRecord | undefined>;
  /**
   * Insert `record` with its derived `keys` iff no record has its id, with the feed's
   * `job.registered` row when the adapter keeps the feed itself; false if one has.
   */
  protected abstract insertRecord(record: JobRecord, keys: Required<DerivedKeys>, note: ChangeNote): Promise<boolean>;
  /**
   * Run `write` as one conditional write: commit iff the record exists and every
   * condition holds (with its feed rows, when `write.feed` is there and the adapter
   * keeps the feed itself); hand back the record written, or the record as it stands
   * (undefined: none) when nothing was written.
   */
  protected abstract updateRecord(write: RecordWrite): Promise<UpdateOutcome>;
  /** Insert a dispatch iff (job, attempt) has none; false if it has. */
  protected abstract insertDispatch(dispatch: DispatchRecord): Promise<boolean>;
  protected abstract readDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined>;
  /** Insert a log entry iff the job's log has no entry with its id (then: nothing). */
  protected abstract insertEvent(entry: EventLogEntry): Promise<void>;
  /** Up to `limit` of the job's entries after `after`, by (`sortableTime(at)`, id) ascending. */
  protected abstract queryEvents(jobId: string, after: Position | undefined, limit: number): Promise<EventLogEntry[]>;
  /**
   * Up to `limit` records of `listing` before `after`, by (key, job_id) descending:
   * `recent` by `keysOf(record).recency`, only `status`'s when it is given;
   * `quarantined` by the owed place's `at`, quarantined records only.
   */
  protected abstract queryJobs(listing: JobListing, after: Position | undefined, limit: number): Promise<JobRecord[]>;
  /** Up to `limit` records owed and due (not quarantined), by (owed `at`, job_id) ascending; with `dueBy` (sortable), due at or before it. */
  protected abstract queryOwed(limit: number, dueBy: string | undefined): Promise<JobRecord[]>;
  /** Up to `limit` records whose candidate key (`keysOf(record).candidate`) is at or before `dueBy` (sortable), by (key, job_id) ascending. */
  protected abstract queryCandidates(limit: number, dueBy: string): Promise<JobRecord[]>;
  /** The same over the attention key (`keysOf(record).attention`). */
  protected abstract queryAttention(limit: number, dueBy: string): Promise<JobRecord[]>;
  /**
   * The feed after the adapter's own position `after` (absent: from the start): at
   * most `limit` rows, stopping at the first later than `upTo` (sortable); `cursor`
   * the position to go on from (the last row read, or `after`). A position it did not
   * hand out: `invalidCursor()`.
   */
  protected abstract queryFeed(query: FeedQuery): Promise<FeedPage>;
  /**
   * The adapter's own position at the feed's head now (whole feed, or `jobId`'s rows):
   * the position `queryFeed` would hand out after reading every row readable now, so
   * that reading after it later gives exactly the rows that become readable since.
   */
  protected abstract queryFeedHead(jobId: string | undefined): Promise<string>;
  /**
   * The counts per status as the store keeps them (a status it holds none of may be
   * absent): one read. How current they are is `capabilities.countConsistency`.
   */
  protected abstract queryCounts(): Promise<Partial<Record<Status, number>>>;
  /**
   * Optional: `writes` in one atomic write (`AtomicWrite`, `AtomicOutcome`): every
   * required part and the optional updates whose conditions hold, or nothing at all
   * (a required update's condition did not hold). An adapter that offers it says so in
   * `capabilities.atomicMultiWrite`.
   */
  protected writeAtomically?(writes: readonly AtomicWrite[]): Promise<AtomicOutcome>;
  /**
   * Optional: a value that changes whenever a writer other than this store (another
   * process, another connection) may have changed a record, cheap to ask (SQLite's
   * `PRAGMA data_version`). Only with it may the record cache be asked for.
   */
  dataVersion?(): unknown;

  /** What the adapter offers beyond the primitives every adapter has. */
  get capabilities(): StoreCapabilities {
    return { atomicMultiWrite: false, countConsistency: "exact" };
  }

  // ---- commit hooks

  /** Tell `hook` of every write that commits from now on; returns the unsubscribe. */
  onCommitted(hook: CommitHook): () => void {
    this.#hooks.add(hook);
    return () => this.#hooks.delete(hook);
  }

  /**
   * Every write method's one way to its primitive: the cache emptied before it starts
   * and again when it ends (whatever its outcome), the hooks told once it committed.
   * `committed` says, of the primitive's answer, whether it wrote (and what record).
   */
  async #write<T>(method: WriteMethod, jobId: string, run: () => Promise<T>, committed: (value: T) => CommitOutcome): Promise<T> {
    this.#cache?.forget();
    let value: T;
    try {
      value = await run();
    } finally {
      this.#cache?.forget();
    }
    const outcome = committed(value);
    if (outcome.committed && this.#hooks.size > 0) {
      const commit: Commit = { method, jobId, ...(outcome.record === undefined ? {} : { record: outcome.record }) };
      for (const hook of this.#hooks) {
        try {
          hook(commit);
        } catch {
          // A hook never fails the write it observes: the write committed.
        }
      }
    }
    return value;
  }

  // ---- the port: job records

  async create(record: JobRecord, note?: ChangeNote): Promise<void> {
    assertJobId(record.job_id);
    const parsed = JobRecordSchema.safeParse(record);
    if (!parsed.success) {
      throw new MamError("input.invalid", `job record ${record.job_id} is not valid`, { issues: zodIssues(parsed.error, "record") });
    }
    const valid = parsed.data as JobRecord;
    const checked = checkNote(note) ?? {};
    await this.#write(
      "create",
      valid.job_id,
      async () => {
        if (!(await this.insertRecord(valid, keysOf(valid), checked))) {
          throw new MamError("job.exists", `job ${valid.job_id} already exists`);
        }
      },
      () => ({ committed: true, record: valid }),
    );
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    assertJobId(jobId);
    const cache = this.#cache;
    if (cache === undefined) return this.readRecord(jobId);
    return cache.get(jobId, this.dataVersion?.(), () => this.readRecord(jobId));
  }

  async transition(jobId: string, expectedSeq: ExpectedSeq, change: JobChange): Promise<JobRecord> {
    assertJobId(jobId);
    const checked = checkChange(change);
    // Every transition is activity, at its updated_at, unless the change says more (the attention key a claim sets).
    const activity = change.activity ?? (checked.set.updated_at === undefined ? undefined : { at: checked.set.updated_at });
    const write = withActivity(
      withCandidate(changeWriteOf(jobId, expectedSeq, checked, ["transition_seq"]), checked.candidate),
      activity && checkActivity(activity),
    );
    return this.#conflictingWrite("transition", write, expectedSeq, checked);
  }

  async recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    assertJobId(jobId);
    const evidence = checkEvidenceChange(change);
    const checked = checkChange(evidenceWriteOf(evidence));
    const changed = withCandidate(changeWriteOf(jobId, NO_CONCURRENCY_CHECK, checked, []), evidence.candidate);
    const write = withActivity(withDeadline(changed, evidence.deadline, change.guard.newAttempt !== undefined), evidence.activity);
    return this.#conflictingWrite("recordEvidence", write, NO_CONCURRENCY_CHECK, checked);
  }

  /** A transition or an evidence write: the record written, or the conflict naming why not. */
  async #conflictingWrite(method: WriteMethod, write: RecordWrite, expectedSeq: ExpectedSeq, change: JobChange): Promise<JobRecord> {
    const outcome = await this.#write(
      method,
      write.jobId,
      () => this.updateRecord(write),
      (o) => (o.written ? { committed: true, record: o.record } : { committed: false }),
    );
    if (outcome.written) return outcome.record;
    if (outcome.current === undefined) throw notFound(write.jobId);
    throw conflictFor(outcome.current, expectedSeq, change.from, change.evidence);
  }

  async list(query: JobListQuery): Promise<Page<JobRecord>> {
    const limit = checkLimit(query.limit);
    if (query.mark !== undefined) {
      // The marks are on running jobs: a status listing, filtered.
      const listing = `jobs/running/${query.mark}`;
      const after = query.cursor === undefined ? undefined : unwrapPosition(listing, query.cursor);
      const dueBy = query.mark === "candidate" ? { dueBy: sortableTime(checkDueTime(query.dueBy ?? "")) } : {};
      const records = await this.queryJobs({ kind: "recent", status: "running", mark: query.mark, ...dueBy }, after, limit + 1);
      return jobPage(listing, records, limit, (r) => sortableTime(r.updated_at));
    }
    const listing = query.status === undefined ? "jobs" : `jobs/${query.status}`;
    const after = query.cursor === undefined ? undefined : unwrapPosition(listing, query.cursor);
    const records = await this.queryJobs(
      { kind: "recent", ...(query.status === undefined ? {} : { status: query.status }) },
      after,
      limit + 1,
    );
    return jobPage(listing, records, limit, (r) => sortableTime(r.updated_at));
  }

  async countByStatus(): Promise<StatusCounts> {
    return { counts: fullCounts(await this.queryCounts()), consistency: this.capabilities.countConsistency };
  }

  async chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    assertJobId(jobId);
    const usage = checkCharge(prior, next);
    return this.#boolWrite("chargeUsage", {
      jobId,
      conditions: [{ kind: "usageIs", events: prior?.events ?? 0, bytes: prior?.bytes ?? 0 }],
      set: { agent_usage: usage },
      unset: [],
      bump: [],
      keys: {},
    });
  }

  async holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    assertJobId(jobId);
    const checked = checkLease(kind, lease, expect);
    const field = LEASE_FIELDS[kind];
    const conditions: RecordCondition[] =
      "heldBy" in expect
        ? [{ kind: "leaseHeldBy", field, id: expect.heldBy }]
        : [
            { kind: "statusIn", statuses: NON_TERMINAL },
            { kind: "leaseFree", field, at: expect.freeAt, attempt: checked?.attempt_id ?? 0 },
          ];
    return this.#boolWrite("holdLease", {
      jobId,
      conditions,
      set: checked === null ? {} : { [field]: checked },
      unset: checked === null ? [field] : [],
      bump: [],
      keys: {},
    });
  }

  async writeObservations(
    jobId: string,
    expectedRev: number,
    next: ObservationSet,
    opts: ObservationWriteOptions,
  ): Promise<JobRecord | undefined> {
    assertJobId(jobId);
    const set = checkObservations(expectedRev, next);
    const write: RecordWrite = {
      jobId,
      conditions: [
        { kind: "statusIn", statuses: NON_TERMINAL },
        { kind: "latestAttemptIs", attempt: set.attempt_id },
        { kind: "observationsRevIs", rev: expectedRev },
      ],
      set: { observations: set },
      unset: [],
      bump: opts.bump ? ["evidence_seq"] : [],
      keys: {},
      // A coalesced repeat tells the feed nothing (no row): only a write that bumps does.
      ...(opts.bump ? { feed: checkNote(opts.note) ?? {} } : {}),
    };
    const written = withActivity(withCandidate(write, opts.candidate), opts.activity && checkActivity(opts.activity));
    const outcome = await this.#write(
      "writeObservations",
      jobId,
      () => this.updateRecord(written),
      (o) => (o.written ? { committed: true, record: o.record } : { committed: false }),
    );
    if (outcome.written) return outcome.record;
    if (outcome.current === undefined) throw notFound(jobId);
    return undefined;
  }

  async clearCandidate(jobId: string, expect: CandidateExpectation): Promise<boolean> {
    assertJobId(jobId);
    // A mark: no sequence, no feed row, no activity.
    return this.#boolWrite("clearCandidate", {
      jobId,
      conditions: readConditions(expect, NON_TERMINAL),
      set: {},
      unset: ["candidate_at"],
      bump: [],
      keys: { candidate: null },
    });
  }

  async postponeCandidate(jobId: string, read: string, to: string): Promise<boolean> {
    assertJobId(jobId);
    const at = checkDueTime(to);
    // A mark: no sequence, no feed row, no activity; only the mark the sweep read moves.
    return this.#boolWrite(
      "postponeCandidate",
      {
        jobId,
        conditions: [
          { kind: "statusIn", statuses: NON_TERMINAL },
          { kind: "candidateIs", at: checkDueTime(read) },
        ],
        set: { candidate_at: at },
        unset: [],
        bump: [],
        keys: { candidate: sortableTime(at) },
      },
      "false",
    );
  }

  async listCandidates(limit: number, query: { readonly dueBy: string }): Promise<readonly JobRecord[]> {
    checkLimit(limit);
    return this.queryCandidates(limit, sortableTime(checkDueTime(query.dueBy)));
  }

  async markAttention(jobId: string, mark: AttentionMark): Promise<boolean> {
    assertJobId(jobId);
    const at = checkDueTime(mark.at);
    if (mark.kind !== "stale" && mark.kind !== "overdue") throw new MamError("internal", `no attention mark ${String(mark.kind)}`);
    const intent = NotificationIntentSchema.safeParse(mark.intent);
    if (!intent.success)
      throw new MamError("internal", "an attention mark's intent is not valid", { issues: zodIssues(intent.error, "intent") });
    const attention = mark.attention === null ? null : checkDueTime(mark.attention);
    return this.#boolWrite("markAttention", {
      jobId,
      conditions: [
        ...readConditions(mark.expect, [mark.expect.status]),
        ...attentionKeyCondition(mark.expect),
        mark.replaces === null ? { kind: "noIntent" } : { kind: "intentIs", id: mark.replaces },
      ],
      set: {
        [mark.kind === "stale" ? "stale_since" : "overdue_since"]: at,
        pending_notification: intent.data,
        ...(attention === null ? {} : { attention_at: attention }),
      },
      unset: attention === null ? ["attention_at"] : [],
      bump: [],
      keys: { owed: owedPlaceOf(intent.data as NotificationIntent), attention: attention === null ? null : sortableTime(attention) },
      feed: { ...(checkNote(mark.note) ?? {}), marked: { mark: mark.kind } },
    });
  }

  async rekeyAttention(jobId: string, expect: AttentionExpectation, attention: string | null): Promise<boolean> {
    assertJobId(jobId);
    const at = attention === null ? null : checkDueTime(attention);
    // A mark: no sequence, no feed row, no activity.
    return this.#boolWrite("rekeyAttention", {
      jobId,
      conditions: [...readConditions(expect, NON_TERMINAL), ...attentionKeyCondition(expect)],
      set: at === null ? {} : { attention_at: at },
      unset: at === null ? ["attention_at"] : [],
      bump: [],
      keys: { attention: at === null ? null : sortableTime(at) },
    });
  }

  async listAttention(limit: number, query: { readonly dueBy: string }): Promise<readonly JobRecord[]> {
    checkLimit(limit);
    return this.queryAttention(limit, sortableTime(checkDueTime(query.dueBy)));
  }

  /** A write that answers whether it wrote: false when its condition lost, `job.notFound` when there is no record. */
  async #boolWrite(method: WriteMethod, write: RecordWrite, missing: "notFound" | "false" = "notFound"): Promise<boolean> {
    const outcome = await this.#write(
      method,
      write.jobId,
      () => this.updateRecord(write),
      (o) => (o.written ? { committed: true, record: o.record } : { committed: false }),
    );
    if (outcome.written) return true;
    if (outcome.current === undefined && missing === "notFound") throw notFound(write.jobId);
    return false;
  }

  // ---- dispatches and the event log

  async recordDispatch(dispatch: DispatchRecord): Promise<void> {
    assertJobId(dispatch.job_id);
    const parsed = DispatchRecordSchema.safeParse(dispatch);
    if (!parsed.success) {
      throw new MamError("input.invalid", `dispatch of job ${dispatch.job_id} is not valid`, {
        issues: zodIssues(parsed.error, "dispatch"),
      });
    }
    const valid = parsed.data as DispatchRecord;
    await this.#write(
      "recordDispatch",
      valid.job_id,
      async () => {
        if (!(await this.insertDispatch(valid))) {
          throw new MamError("dispatch.exists", `attempt ${valid.attempt_id} of job ${valid.job_id} was already dispatched`);
        }
      },
      () => ({ committed: true }),
    );
  }

  async getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    assertJobId(jobId);
    // No such attempt can have been recorded (recordDispatch refuses it): nothing to ask.
    if (!AttemptId.safeParse(attemptId).success) return undefined;
    return this.readDispatch(jobId, attemptId);
  }

  async appendEvent(entry: EventLogEntry): Promise<void> {
    assertJobId(entry.job_id);
    await this.#write(
      "appendEvent",
      entry.job_id,
      () => this.insertEvent(entry),
      () => ({ committed: true }),
    );
  }

  async listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    assertJobId(jobId);
    const limit = checkLimit(query.limit);
    const listing = `events/${jobId}`;
    const after = query.cursor === undefined ? undefined : unwrapPosition(listing, query.cursor);
    const entries = await this.queryEvents(jobId, after, limit + 1);
    const fit = withinBytes(entries.slice(0, limit), EVENT_PAGE_MAX_BYTES);
    const items = entries.slice(0, fit);
    const last = items[items.length - 1];
    if (entries.length > fit && last !== undefined) {
      return { items, cursor: wrapPosition(listing, [sortableTime(last.at), last.id]) };
    }
    return { items };
  }

  // ---- owed notifications

  async replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    assertJobId(jobId);
    await this.#boolWrite("replaceNotification", {
      jobId,
      conditions: [],
      set: { pending_notification: intent },
      unset: [],
      bump: [],
      keys: { owed: owedPlaceOf(intent) },
      feed: checkNote(note) ?? {},
    });
  }

  async reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    assertJobId(jobId);
    return this.#boolWrite(
      "reviseNotification",
      {
        jobId,
        conditions: [{ kind: "intentIs", id: intent.id }],
        set: { pending_notification: intent },
        unset: [],
        bump: [],
        keys: { owed: owedPlaceOf(intent) },
        feed: checkNote(note) ?? {},
      },
      "false",
    );
  }

  async settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    assertJobId(jobId);
    return this.#boolWrite("settleNotification", settleWriteOf(jobId, intentId, checkNote(note)), "false");
  }

  /**
   * The line and the settle in one atomic write where the adapter has one
   * (`writeAtomically`, the settle an optional part: the line is written whether or
   * not the intent is still owed, the settle only if it is); where there is none, the
   * line (a no-op if it is there) and then the settle alone. Never a settle without
   * its line.
   */
  async settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    assertJobId(entry.job_id);
    const settle = settleWriteOf(entry.job_id, intentId, checkNote(note));
    const atomic = this.writeAtomically;
    if (this.capabilities.atomicMultiWrite && atomic !== undefined) {
      const outcome = await this.#write(
        "settlePublished",
        entry.job_id,
        () =>
          atomic.call(this, [
            { kind: "insertEvent", entry },
            { kind: "update", write: settle, optional: true },
          ]),
        (o) => ({ committed: o.committed }),
      );
      // With no required update, the write always commits (an adapter's own bug otherwise).
      if (!outcome.committed) throw new MamError("internal", `the atomic write of job ${entry.job_id}'s published line did not commit`);
      return outcome.held[0] === true;
    }
    await this.#write(
      "settlePublished",
      entry.job_id,
      () => this.insertEvent(entry),
      () => ({ committed: true }),
    );
    return this.#boolWrite("settlePublished", settle, "false");
  }

  async listOwed(limit: number, query: OwedQuery = {}): Promise<readonly JobRecord[]> {
    checkLimit(limit);
    return this.queryOwed(limit, query.dueBy === undefined ? undefined : sortableTime(query.dueBy));
  }

  async listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const limit = checkLimit(query.limit);
    const listing = "quarantined";
    const after = query.cursor === undefined ? undefined : unwrapPosition(listing, query.cursor);
    const records = await this.queryJobs({ kind: "quarantined" }, after, limit + 1);
    return jobPage(listing, records, limit, (r) => sortableTime(r.pending_notification?.quarantined_at ?? ""));
  }

  // ---- the change feed

  async listChanges(query: ChangeQuery): Promise<FeedPage> {
    checkLimit(query.limit);
    if (query.jobId !== undefined) assertJobId(query.jobId);
    const after = query.after === undefined ? undefined : unwrapFeedCursor(query.after);
    let page: FeedPage;
    try {
      page = await this.queryFeed({
        limit: query.limit,
        ...(after === undefined ? {} : { after }),
        ...(query.jobId === undefined ? {} : { jobId: query.jobId }),
        ...(query.upTo === undefined ? {} : { upTo: sortableTime(query.upTo) }),
      });
    } catch (e) {
      // A position forged inside a well-formed envelope: the adapter's refusal, named as the feed names it.
      if (e instanceof MamError && e.code === "input.invalid" && e.issues.some((i) => i.path === "query.cursor"))
        throw feedCursorRefusal(e);
      throw e;
    }
    // Rows as the store keeps them stay so (parsed only if read); each row's cursor is the envelope of its position.
    const stored = storedRowsOf(page);
    if (stored !== undefined) {
      return storedFeedPage(
        stored.map((r) => ({ cursor: wrapFeedPosition(r.cursor), at: r.at, job_id: r.job_id, json: r.json })),
        wrapFeedPosition(page.cursor),
      );
    }
    return { items: page.items.map((row) => ({ ...row, cursor: wrapFeedPosition(row.cursor) })), cursor: wrapFeedPosition(page.cursor) };
  }

  async feedHead(query: Pick<ChangeQuery, "jobId"> = {}): Promise<string> {
    if (query.jobId !== undefined) assertJobId(query.jobId);
    return wrapFeedPosition(await this.queryFeedHead(query.jobId));
  }
}

// ---- the primitives' vocabulary

/** A listing's position: the key of the last item handed out (a `sortableTime`) and its id. */
export type Position = readonly [key: string, id: string];

/**
 * Which records a job listing reads: `recent`, `status`'s only when given, and with
 * `mark` only the running jobs carrying it (`stale`: `stale_since`; `overdue`:
 * `overdue_since`; `candidate`: a `candidate_at` at or before `dueBy`, sortable) —
 * a filter over the status's records, in the same order.
 */
export type JobListing =
  | {
      readonly kind: "recent";
      readonly status?: Status;
      readonly mark?: JobMark;
      readonly dueBy?: string;
    }
  | { readonly kind: "quarantined" };

/** What `queryFeed` is asked: `after` the adapter's own position, `upTo` sortable. */
export interface FeedQuery {
  readonly after?: string;
  readonly limit: number;
  readonly jobId?: string;
  readonly upTo?: string;
}

export type UpdateOutcome =
  | { readonly written: true; readonly record: JobRecord }
  | { readonly written: false; readonly current: JobRecord | undefined };

/**
 * One part of an atomic multi-write: a conditional record write, or a log entry
 * inserted once (a line already in the log is left as it is, and counts as written).
 * The required record writes' conditions decide: all of them hold and every part is
 * written, or nothing is. An `optional` record write is written, in the same commit,
 * only if its own conditions hold, and its failing fails nothing else (what
 * `settlePublished` asks: the line always, the settle only while the intent is owed).
 */
export type AtomicWrite =
  | { readonly kind: "update"; readonly write: RecordWrite; readonly optional?: boolean }
  | { readonly kind: "insertEvent"; readonly entry: EventLogEntry };

/**
 * What an atomic multi-write did: nothing (`committed: false`, a required update's
 * condition did not hold), or every required part, and of the optional updates, in
 * order, whether each was written (`held`).
 */
export type AtomicOutcome = { readonly committed: false } | { readonly committed: true; readonly held: readonly boolean[] };

export interface StoreCapabilities {
  /** `writeAtomically` is there and commits several items as one (SQLite, memory, DynamoDB's TransactWriteItems). */
  readonly atomicMultiWrite: boolean;
  /**
   * How current `countByStatus` is: `exact` where the counts are written in each
   * write's own transaction, `eventual` where they are derived after it (DynamoDB's
   * feed writer).
   */
  readonly countConsistency: "exact" | "eventual";
}

/** The base's write methods, each of which tells the hooks and empties the cache (`#write`). */
export const WRITE_METHODS = [
  "create",
  "transition",
  "recordEvidence",
  "chargeUsage",
  "holdLease",
  "writeObservations",
  "clearCandidate",
  "postponeCandidate",
  "markAttention",
  "rekeyAttention",
  "recordDispatch",
  "appendEvent",
  "replaceNotification",
  "reviseNotification",
  "settleNotification",
  "settlePublished",
] as const satisfies readonly (keyof JobStore)[];
export type WriteMethod = (typeof WRITE_METHODS)[number];

/** A committed write, as a hook is told of it: which method, which job, and the record it wrote when it wrote one. */
export interface Commit {
  readonly method: WriteMethod;
  readonly jobId: string;
  readonly record?: JobRecord;
}
export type CommitHook = (commit: Commit) => void;

type CommitOutcome = { readonly committed: boolean; readonly record?: JobRecord };

export interface JobStoreOptions {
  /** Told of every committed write (`onCommitted`). */
  readonly hooks?: readonly CommitHook[];
  /** A record cache for `get`, only over an adapter with `dataVersion` (refused otherwise). */
  readonly cache?: { readonly capacity?: number };
}

// ---- the guard's rules

/** Top-level fields a transition may write: every field of the record but the fixed ones. */
const SETTABLE: ReadonlySet<string> = new Set(
  Object.keys(JobRecordSchema.shape).filter((k) => !(FIXED_JOB_FIELDS as readonly string[]).includes(k)),
);
const UNSETTABLE: ReadonlySet<string> = new Set(UNSETTABLE_JOB_FIELDS);
/** What an evidence write may set besides its counters. */
const EVIDENCE_SETTABLE: ReadonlySet<string> = new Set(["finalized_report"]);

/** An observation set is core's own: a valid `ObservationSet` whose `rev` follows the one it expects. Otherwise `internal`. */
function checkObservations(expectedRev: number, next: ObservationSet): ObservationSet {
  const parsed = ObservationSetSchema.safeParse(next);
  if (!parsed.success) {
    throw new MamError("internal", "an observation set is not valid", { issues: zodIssues(parsed.error, "observations") });
  }
  if (!Number.isSafeInteger(expectedRev) || expectedRev < 0 || parsed.data.rev !== expectedRev + 1) {
    throw new MamError("internal", `an observation set's rev must follow the one it expects (${expectedRev})`);
  }
  return parsed.data as ObservationSet;
}

/** The refusal of a limit that is not a positive integer: the same on every store. */
export function invalidLimit(limit: unknown): MamError {
  return new MamError("input.invalid", `limit must be a positive integer, not ${String(limit)}`, {
    issues: [{ path: "query.limit", message: "a positive integer" }],
  });
}

function checkLimit(limit: number): number {
  if (!Number.isSafeInteger(limit) || limit < 1) throw invalidLimit(limit);
  return limit;
}

function notFound(jobId: string): MamError {
  return new MamError("job.notFound", `job ${jobId} does not exist`);
}

function checkChange(change: JobChange): JobChange {
  const set: Record<string, unknown> = {};
  for (const [field, value] of Object.entries(change.set)) {
    if (value === undefined) continue;
    if (!SETTABLE.has(field)) throw new MamError("internal", `a change may not set ${field}`);
    set[field] = value;
  }
  const unset = [...new Set(change.unset ?? [])];
  for (const field of unset) {
    if (!UNSETTABLE.has(field)) throw new MamError("internal", `a change may not unset ${field}`);
    if (field in set) throw new MamError("internal", `a change may not both set and unset ${field}`);
  }
  if (change.candidate !== undefined && typeof set.status === "string" && !NON_TERMINAL.includes(set.status as Status)) {
    throw new MamError("internal", "a terminal write removes the candidate mark; it sets none");
  }
  return {
    from: change.from,
    set: set as JobChange["set"],
    ...(unset.length === 0 ? {} : { unset }),
    ...(change.evidence === undefined ? {} : { evidence: change.evidence }),
    ...(change.note === undefined ? {} : { note: checkNote(change.note) as ChangeNote }),
    ...(change.candidate === undefined ? {} : { candidate: checkDueTime(change.candidate) }),
  };
}

/** A note is core's own: one that is not a `ChangeNote` is core's bug (`internal`), and nothing is written. */
function checkNote(note: ChangeNote | undefined): ChangeNote | undefined {
  if (note === undefined) return undefined;
  const parsed = ChangeNoteSchema.safeParse(note);
  if (!parsed.success) throw new MamError("internal", "a change note is not valid", { issues: zodIssues(parsed.error, "note") });
  return parsed.data as ChangeNote;
}

function checkEvidenceChange(change: EvidenceChange): EvidenceChange {
  const note = {
    ...(change.note === undefined ? {} : { note: change.note }),
    ...(change.candidate === undefined ? {} : { candidate: change.candidate }),
    ...(change.activity === undefined ? {} : { activity: checkActivity(change.activity) }),
    ...(change.deadline === undefined ? {} : { deadline: checkDueTime(change.deadline) }),
  };
  if (change.set === undefined) return { guard: change.guard, ...note };
  const set: Record<string, unknown> = {};
  for (const [field, value] of Object.entries(change.set)) {
    if (value === undefined) continue;
    if (!EVIDENCE_SETTABLE.has(field)) throw new MamError("internal", `an evidence write may not set ${field}`);
    set[field] = value;
  }
  return { guard: change.guard, set: set as NonNullable<EvidenceChange["set"]>, ...note };
}

/**
 * A charge is core's own: `next` a valid `agent_usage` whose counts only grow from
 * `prior`'s, one of them strictly (the condition compares the counts, so a charge that
 * grew neither could not tell itself from no charge). Otherwise `internal`.
 */
function checkCharge(prior: AgentUsage | undefined, next: AgentUsage): AgentUsage {
  const parsed = AgentUsageSchema.safeParse(next);
  if (!parsed.success) throw new MamError("internal", "a usage charge is not valid", { issues: zodIssues(parsed.error, "usage") });
  const from = { events: prior?.events ?? 0, bytes: prior?.bytes ?? 0 };
  if (next.events < from.events || next.bytes < from.bytes || (next.events === from.events && next.bytes === from.bytes)) {
    throw new MamError("internal", "a usage charge must grow the counts it was read at");
  }
  return parsed.data as AgentUsage;
}

/** A lease write is core's own: a known kind, a valid lease or null, an expectation that is a time or an id. Otherwise `internal`. */
function checkLease(kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Lease | null {
  if (!Object.hasOwn(LEASE_FIELDS, kind)) throw new MamError("internal", `no lease of kind ${String(kind)}`);
  const byId = "heldBy" in expect && typeof expect.heldBy === "string" && expect.heldBy !== "";
  const byTime = "freeAt" in expect && IsoTime.safeParse(expect.freeAt).success;
  if (!byId && !byTime) throw new MamError("internal", "a lease write expects a free lease at a time, or the one held by an id");
  if (lease === null) {
    if (!byId) throw new MamError("internal", "a lease is released only by its id");
    return null;
  }
  const parsed = LeaseSchema.safeParse(lease);
  if (!parsed.success) throw new MamError("internal", "a lease is not valid", { issues: zodIssues(parsed.error, "lease") });
  return parsed.data as Lease;
}

// ---- conditional writes as data

/** The conditions of a change's evidence guard, by name. */
function evidenceConditions(evidence: EvidenceGuard): RecordCondition[] {
  const conditions: RecordCondition[] = [];
  if (evidence.seq !== undefined) conditions.push({ kind: "evidenceSeqIs", seq: evidence.seq });
  if (evidence.attempt !== undefined) conditions.push({ kind: "latestAttemptIs", attempt: evidence.attempt });
  if (evidence.currentAttempt !== undefined) conditions.push({ kind: "latestAttemptAbsentOrIs", attempt: evidence.currentAttempt });
  if (evidence.newAttempt !== undefined) conditions.push({ kind: "latestAttemptBelow", attempt: evidence.newAttempt });
  if (evidence.observationsRev !== undefined) conditions.push({ kind: "observationsRevIs", rev: evidence.observationsRev });
  return conditions;
}

/** A transition or an evidence write (a checked change) as one conditional write. */
function changeWriteOf(jobId: string, expectedSeq: ExpectedSeq, change: JobChange, bump: CounterField[]): RecordWrite {
  const evidence = change.evidence ?? {};
  const set: Record<string, unknown> = { ...change.set };
  if (evidence.newAttempt !== undefined) set.latest_attempt = evidence.newAttempt;
  const unset = change.unset ?? [];
  const keys: { -readonly [K in keyof DerivedKeys]: DerivedKeys[K] } = {};
  if (change.set.status !== undefined) keys.status = change.set.status;
  if (change.set.updated_at !== undefined) keys.recency = sortableTime(change.set.updated_at);
  if (change.set.pending_notification !== undefined) keys.owed = owedPlaceOf(change.set.pending_notification);
  else if (unset.includes("pending_notification")) keys.owed = null;
  // Every terminal write and every new dispatch removes the candidate mark in the same
  // write: a terminal job is never evaluated, and a new attempt has observed nothing yet.
  const terminal = change.set.status !== undefined && !NON_TERMINAL.includes(change.set.status);
  const dispatched = evidence.newAttempt !== undefined;
  const removed = new Set<string>(unset);
  if (terminal || dispatched) {
    removed.add("candidate_at");
    removed.add("overdue_since");
    keys.candidate = null;
  }
  if (terminal) {
    for (const field of ["stale_since", "attention_at"]) removed.add(field);
    keys.attention = null;
  }
  // A new attempt's deadline is its dispatch's (`withDeadline`): none if it gave none.
  if (dispatched) removed.add("deadline_at");
  const unsetAll = [...removed];
  return {
    jobId,
    conditions: [
      ...(expectedSeq === NO_CONCURRENCY_CHECK ? [] : [{ kind: "transitionSeqIs", seq: expectedSeq } as const]),
      { kind: "statusIn", statuses: change.from },
      ...evidenceConditions(evidence),
    ],
    set,
    unset: unsetAll,
    bump: evidence.bump ? [...bump, "evidence_seq"] : bump,
    keys,
    feed: change.note ?? {},
  };
}

/**
 * `write` also recording `activity` (when there is one): `activity_at` set, the stale
 * mark cleared, the attention key moved where the activity says — a terminal write,
 * which removes every mark and the key itself, records only `activity_at`.
 */
function withActivity(write: RecordWrite, activity: Activity | undefined): RecordWrite {
  if (activity === undefined) return write;
  // A terminal write removed every mark and the key itself: it records only when.
  if (write.keys.attention === null && write.unset.includes("attention_at"))
    return { ...write, set: { ...write.set, activity_at: activity.at } };
  const set: Record<string, unknown> = { ...write.set, activity_at: activity.at };
  const unset = new Set(write.unset);
  unset.add("stale_since");
  if (activity.attention === undefined) return { ...write, set, unset: [...unset] };
  if (activity.attention === null) unset.add("attention_at");
  else {
    set.attention_at = activity.attention;
    unset.delete("attention_at");
  }
  return {
    ...write,
    set,
    unset: [...unset],
    keys: { ...write.keys, attention: activity.attention === null ? null : sortableTime(activity.attention) },
  };
}

/** An activity is core's own: ISO-8601 instants. Otherwise `internal`. */
function checkActivity(activity: Activity): Activity {
  checkDueTime(activity.at);
  if (activity.attention !== undefined && activity.attention !== null) checkDueTime(activity.attention);
  return activity;
}

/**
 * What a mark requires of the record: the status among `statuses`, and the sequences
 * and observation rev the sweep read (`readOf`), so any write that moved the job since
 * wins. Otherwise `internal` (core's own bug), before any storage is asked.
 */
function readConditions(expect: CandidateExpectation, statuses: readonly Status[]): RecordCondition[] {
  const { transitionSeq, evidenceSeq, observationsRev } = expect;
  if (![transitionSeq, evidenceSeq, observationsRev].every((n) => Number.isSafeInteger(n) && n >= 0)) {
    throw new MamError("internal", "a mark is written only against the sequences and observation rev it was read at");
  }
  return [
    { kind: "statusIn", statuses },
    { kind: "transitionSeqIs", seq: transitionSeq },
    { kind: "evidenceSeqIs", seq: evidenceSeq },
    { kind: "observationsRevIs", rev: observationsRev },
  ];
}

/** An attention mark's or rekey's: the attention key is still the one read, when it was read. */
function attentionKeyCondition(expect: AttentionExpectation): RecordCondition[] {
  return expect.attention === undefined ? [] : [{ kind: "attentionIs", at: checkDueTime(expect.attention) }];
}

/** A dispatch's `write` also setting the new attempt's deadline, when it has one (only a dispatch may). */
function withDeadline(write: RecordWrite, deadline: string | undefined, dispatch: boolean): RecordWrite {
  if (deadline === undefined) return write;
  if (!dispatch) throw new MamError("internal", "only a dispatch sets a deadline");
  return { ...write, set: { ...write.set, deadline_at: deadline }, unset: write.unset.filter((f) => f !== "deadline_at") };
}

/** `write` also setting the candidate mark at `due`, or removing it (`null`); `undefined` leaves it as it is. */
function withCandidate(write: RecordWrite, due: string | null | undefined): RecordWrite {
  if (due === undefined) return write;
  if (due === null) {
    const unset = write.unset.includes("candidate_at") ? write.unset : [...write.unset, "candidate_at"];
    return { ...write, unset, keys: { ...write.keys, candidate: null } };
  }
  const at = checkDueTime(due);
  return {
    ...write,
    set: { ...write.set, candidate_at: at },
    unset: write.unset.filter((f) => f !== "candidate_at"),
    keys: { ...write.keys, candidate: sortableTime(at) },
  };
}

/** A due time is core's own: an ISO-8601 instant. Otherwise `internal`. */
function checkDueTime(at: string): string {
  if (!IsoTime.safeParse(at).success) throw new MamError("internal", `a due time must be an ISO-8601 instant, not ${String(at)}`);
  return at;
}

function settleWriteOf(jobId: string, intentId: string, note: ChangeNote | undefined): RecordWrite {
  return {
    jobId,
    conditions: [{ kind: "intentIs", id: intentId }],
    set: {},
    unset: ["pending_notification"],
    bump: [],
    keys: { owed: null },
    feed: note ?? {},
  };
}

// ---- cursors: a position in an envelope naming the listing it belongs to

function toBase64Url(text: string): string {
  return Buffer.from(text, "utf8").toString("base64url");
}

function fromBase64Url(encoded: string): string {
  if (!/^[A-Za-z0-9_-]*$/.test(encoded)) throw invalidCursor();
  return new TextDecoder("utf-8", { fatal: true }).decode(Buffer.from(encoded, "base64url"));
}

function wrap(listing: string, position: string): string {
  return toBase64Url(JSON.stringify({ l: listing, c: position }));
}

/** The position inside a cursor this listing handed out; `invalidCursor()` for anything else. */
function unwrap(listing: string, cursor: string): string {
  let envelope: unknown;
  try {
    envelope = JSON.parse(fromBase64Url(cursor));
  } catch (e) {
    throw invalidCursor(e);
  }
  const { l, c } = (typeof envelope === "object" && envelope !== null ? envelope : {}) as { l?: unknown; c?: unknown };
  if (l !== listing || typeof c !== "string" || c === "") throw invalidCursor();
  return c;
}

function wrapPosition(listing: string, position: Position): string {
  return wrap(listing, JSON.stringify(position));
}

function unwrapPosition(listing: string, cursor: string): Position {
  const inner = unwrap(listing, cursor);
  let value: unknown;
  try {
    value = JSON.parse(inner);
  } catch (e) {
    throw invalidCursor(e);
  }
  if (Array.isArray(value) && value.length === 2 && typeof value[0] === "string" && typeof value[1] === "string")
    return [value[0], value[1]];
  throw invalidCursor();
}

/** One listing for the whole feed and each job's part of it: a position is the same row either way. */
const FEED_LISTING = "feed";

function unwrapFeedCursor(cursor: string): string {
  try {
    return unwrap(FEED_LISTING, cursor);
  } catch (e) {
    throw feedCursorRefusal(e);
  }
}

function feedCursorRefusal(cause: unknown): MamError {
  return new MamError(
    "input.invalid",
    "after is not a cursor this feed handed out; start without one, or pass a row's or a page's cursor",
    {
      issues: [{ path: "query.after", message: "not a cursor this feed handed out" }],
      cause,
    },
  );
}

/** A feed position's cursor: the same envelope as every listing's, its JSON built by hand (one a row, so it counts). */
const FEED_ENVELOPE_HEAD = `{"l":${JSON.stringify(FEED_LISTING)},"c":`;
const wrapFeedPosition = (position: string): string => toBase64Url(`${FEED_ENVELOPE_HEAD}${JSON.stringify(position)}}`);

// ---- page bounds

/** How many of `items`, from the first, fit in `maxBytes` of JSON: at least one. */
function withinBytes(items: readonly unknown[], maxBytes: number): number {
  let bytes = 0;
  for (let i = 0; i < items.length; i++) {
    bytes += utf8Bytes(JSON.stringify(items[i]));
    if (bytes > maxBytes) return Math.max(i, 1);
  }
  return items.length;
}

/** How many of `records`, from the first, fit in `JOB_PAGE_MAX_BYTES` of JSON: at least one. */
export function recordsWithinPageBytes(records: readonly JobRecord[], maxBytes = JOB_PAGE_MAX_BYTES): number {
  return withinBytes(records, maxBytes);
}

/** A page of at most `limit` records (of `limit + 1` read) and `JOB_PAGE_MAX_BYTES`, its cursor after the last one kept. */
function jobPage(listing: string, records: readonly JobRecord[], limit: number, key: (r: JobRecord) => string): Page<JobRecord> {
  const fit = recordsWithinPageBytes(records.slice(0, limit));
  const items = records.slice(0, fit);
  const last = items[items.length - 1];
  if (records.length > fit && last !== undefined) return { items, cursor: wrapPosition(listing, [key(last), last.job_id]) };
  return { items };
}

// ---- the record cache

/**
 * `get`'s cache: records kept while nothing can have changed them. Another writer:
 * the adapter's `dataVersion`, asked before every answer, changed (the cache empties;
 * asked every time, never once per turn: a request read after such a check could
 * otherwise miss a commit its client saw). A write through the store: the cache
 * empties when it starts and when it ends, and a read in flight across a write does
 * not keep what it read (a generation count). A kept record is frozen: every caller
 * shares it.
 */
class RecordCache {
  readonly #capacity: number;
  readonly #records = new Map<string, JobRecord>();
  #seenVersion: unknown;
  #generation = 0;

  constructor(capacity: number) {
    this.#capacity = capacity;
  }

  async get(jobId: string, version: unknown, read: () => Promise<JobRecord | undefined>): Promise<JobRecord | undefined> {
    if (version !== this.#seenVersion) {
      this.#records.clear();
      this.#seenVersion = version;
    }
    const cached = this.#records.get(jobId);
    if (cached !== undefined) return cached;
    // Read after the version was taken: a commit landing in between makes the record
    // newer than the version, and the next look clears it.
    const generation = this.#generation;
    const record = await read();
    if (record === undefined || generation !== this.#generation || version !== this.#seenVersion) return record;
    if (this.#records.size >= this.#capacity) this.#records.delete(this.#records.keys().next().value as string);
    const frozen = deepFreeze(record);
    this.#records.set(jobId, frozen);
    return frozen;
  }

  forget(): void {
    // Asked twice a write: most find nothing kept (`clear` allocates even then).
    if (this.#records.size > 0) this.#records.clear();
    this.#generation += 1;
  }
}

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
