import {
  type AgentUsage,
  type ChangeNote,
  type ChangeQuery,
  changeRowsOf,
  conflictFor,
  type DispatchRecord,
  EVENT_PAGE_MAX_BYTES,
  type EventLogEntry,
  type EvidenceChange,
  evidenceWriteOf,
  type FeedPage,
  invalidCursor,
  type JobChange,
  type JobRecord,
  type JobStore,
  LEASE_FIELDS,
  type Lease,
  type LeaseExpectation,
  type LeaseKind,
  MamError,
  NON_TERMINAL,
  type NotificationIntent,
  type OwedQuery,
  type Page,
  type Status,
  StatusSchema,
  type StoredChangeRow,
  storedFeedPage,
} from "@mam/core";
import Database from "better-sqlite3";
import { migrateSqlite, OWED_DUE, OWED_QUARANTINED } from "./sqlite-migrations.ts";

type WriteOutcome = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly error: unknown };

/** A write waiting for its group's commit. */
interface PendingWrite {
  readonly body: () => unknown;
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * The embedded JobStore: one SQLite file in WAL mode, so readers never block the
 * writer and several processes (`mam serve`, the CLI) can share it.
 *
 * The record is kept whole as JSON in `doc`; `status`, `transition_seq`,
 * `updated_at` and the owed intent are mirrored in columns so the conditions and the
 * indexes can see them. Every state change is ONE `UPDATE ... WHERE ... RETURNING`
 * statement, the SQLite form of a conditional write: there is no read-then-write,
 * so two processes racing from the same seq cannot both commit.
 *
 * The owed intent's columns:
 * - `owed_intent_id`: its id (settling and revising are conditional on it);
 * - `owed_at`: when the sweep is next due to try it (`retry_at`, else `created_at`),
 *   or, once quarantined, when it was quarantined;
 * - `owed_quarantined_id`: the id of the intent that was quarantined. The intent is
 *   quarantined while it equals `owed_intent_id`, so a newer intent committed by a
 *   transition (which knows nothing of quarantine) is never born quarantined;
 * - `owed_revision`: the revised intent, kept here only when SQLite's JSON functions
 *   can no longer rewrite `doc` (a record past their depth limit); the owed listings
 *   read it in place of the doc's copy, so such a record is still counted, backed off
 *   and quarantined instead of stopping the sweep.
 *
 * The change feed is the `changes` table: every write and the rows core's
 * `changeRowsOf` makes of it commit in one `BEGIN IMMEDIATE` transaction (the record
 * before the write is read under the write lock, so the rows describe exactly this
 * write). `cursor` is `INTEGER PRIMARY KEY AUTOINCREMENT`, assigned while the writer
 * holds SQLite's one write lock and never reused: a row with a higher cursor commits
 * after every row with a lower one, so cursor order is commit order and a reader
 * paging after a cursor can never miss a row that commits later. The feed delay is 0.
 *
 * What every store must keep (job ids, limits, which fields a change writes, a valid
 * record on create, the cursor and limit refusals) is core's `guardJobStore`, in
 * front of this adapter; the record cache `mam serve` reads through is
 * `CachedJobStore`, around it. This class only translates to SQL.
 */
export class SqliteJobStore implements JobStore {
  readonly #db: Database.Database;
  readonly #statements = new Map<string, Database.Statement>();
  /** One write in a transaction of its own; nested in `#groupTransaction`, in a savepoint. */
  readonly #each: Database.Transaction<(fn: () => unknown) => unknown>;
  /** A group's writes in one transaction, each in its savepoint, each outcome kept (`#commitGroup`). */
  readonly #groupTransaction: Database.Transaction<(writes: readonly PendingWrite[]) => WriteOutcome[]>;
  /** The writes waiting for the group commit at the end of this turn (`#write`). */
  #group: PendingWrite[] | undefined;
  #dataVersion: Database.Statement | undefined;

  /** A database file (made if absent), `:memory:`, or a connection opened by the caller (the store then owns it). */
  constructor(database: string | Database.Database) {
    this.#db = typeof database === "string" ? new Database(database) : database;
    this.#each = this.#db.transaction((fn: () => unknown) => fn());
    this.#groupTransaction = this.#db.transaction((writes: readonly PendingWrite[]) =>
      writes.map((write): WriteOutcome => {
        try {
          return { ok: true, value: this.#each(write.body) };
        } catch (error) {
          return { ok: false, error };
        }
      }),
    );
    this.#db.pragma("busy_timeout = 5000");
    if (!this.#db.memory) {
      this.#db.pragma("journal_mode = WAL");
      // A WAL that grew under a burst shrinks back after the next checkpoint.
      this.#db.pragma("journal_size_limit = 67108864");
      this.#db.pragma("mmap_size = 268435456");
    }
    // The layout, brought to this code's version: one transaction per step, refused
    // (store.version) when the file is newer than this code (sqlite-migrations.ts).
    try {
      migrateSqlite(this.#db);
    } catch (e) {
      this.#db.close();
      throw storeError(e);
    }
  }

  async create(record: JobRecord, note?: ChangeNote): Promise<void> {
    const owed = record.pending_notification;
    const columns = owed === undefined ? undefined : owedColumns(owed);
    await this.#write(() => {
      const result = this.#run(
        `INSERT INTO jobs (job_id, status, transition_seq, created_at, updated_at, owed_intent_id, owed_at, owed_quarantined_id, doc)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO NOTHING`,
        [
          record.job_id,
          record.status,
          record.transition_seq,
          record.created_at,
          record.updated_at,
          owed?.id ?? null,
          columns?.at ?? null,
          columns?.quarantinedId ?? null,
          JSON.stringify(record),
        ],
      );
      if (result.changes === 0) throw new MamError("job.exists", `job ${record.job_id} already exists`);
      this.#recordChanges(undefined, record, note);
    });
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    return this.#read(jobId);
  }

  /**
   * SQLite's `PRAGMA data_version` on this store's connection: it changes whenever
   * another connection (another process, the CLI, another store on the file) has
   * committed since it was last asked, and never for this connection's own commits.
   * Asking is a read transaction that reads no row. `CachedJobStore` keeps its
   * records only while it stands still.
   */
  dataVersion(): number {
    this.#dataVersion ??= this.#db.prepare("PRAGMA data_version").pluck();
    try {
      return this.#dataVersion.get() as number;
    } catch (e) {
      throw storeError(e);
    }
  }

  async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.#update(jobId, expectedSeq, change, true);
  }

  async recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#update(jobId, null, evidenceWriteOf(change), false);
  }

  /** One `UPDATE ... WHERE <the stored counts are prior's>`: no counter bumped, no feed row. */
  async chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    return this.#write(() => {
      const result = this.#run(
        `UPDATE jobs SET doc = json_set(doc, '$.agent_usage', json(?)) WHERE job_id = ?
         AND coalesce(json_extract(doc, '$.agent_usage.events'), 0) = ? AND coalesce(json_extract(doc, '$.agent_usage.bytes'), 0) = ?`,
        [JSON.stringify(next), jobId, prior?.events ?? 0, prior?.bytes ?? 0],
      );
      return this.#wroteOrLost(result.changes, jobId);
    });
  }

  /** A conditional write of the job's row alone: true if it wrote; false if its condition lost; `job.notFound` when there is no row. */
  #wroteOrLost(changes: number, jobId: string): boolean {
    if (changes === 1) return true;
    if (this.#get("SELECT 1 AS one FROM jobs WHERE job_id = ?", [jobId]) === undefined) {
      throw new MamError("job.notFound", `job ${jobId} does not exist`);
    }
    return false;
  }

  /**
   * One `UPDATE ... WHERE <the lease condition>` of the lease's field alone: no counter
   * bumped, no feed row. Free: the field absent, expired (`expires_at <= freeAt`, ISO
   * strings in one format), or an older attempt's, and the job not terminal; held: its id.
   */
  async holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    const path = `$.${LEASE_FIELDS[kind]}`;
    return this.#write(() => {
      const set = lease === null ? `json_remove(doc, '${path}')` : `json_set(doc, '${path}', json(?))`;
      const setArgs = lease === null ? [] : [JSON.stringify(lease)];
      const result =
        "heldBy" in expect
          ? this.#run(`UPDATE jobs SET doc = ${set} WHERE job_id = ? AND json_extract(doc, '${path}.id') = ?`, [
              ...setArgs,
              jobId,
              expect.heldBy,
            ])
          : this.#run(
              `UPDATE jobs SET doc = ${set} WHERE job_id = ? AND json_extract(doc, '$.status') IN (${NON_TERMINAL.map(() => "?").join(", ")})
               AND (json_extract(doc, '${path}.id') IS NULL OR json_extract(doc, '${path}.expires_at') <= ? OR json_extract(doc, '${path}.attempt_id') < ?)`,
              [...setArgs, jobId, ...NON_TERMINAL, expect.freeAt, lease?.attempt_id ?? 0],
            );
      return this.#wroteOrLost(result.changes, jobId);
    });
  }

  /**
   * The feed after `query.after` (a cursor as this store hands it out: the decimal
   * position of a row, `0` before the first), in cursor order; a job's rows by
   * `changes_by_job`. Rows are stepped one at a time and the statement abandoned once
   * the page is full or a row is later than `upTo`.
   */
  async listChanges(query: ChangeQuery): Promise<FeedPage> {
    const after = query.after === undefined ? 0 : decodeFeedPosition(query.after);
    const sql =
      query.jobId === undefined
        ? "SELECT cursor, job_id, at, row FROM changes WHERE cursor > ? ORDER BY cursor LIMIT ?"
        : "SELECT cursor, job_id, at, row FROM changes WHERE job_id = ? AND cursor > ? ORDER BY cursor LIMIT ?";
    const params = query.jobId === undefined ? [after, query.limit] : [query.jobId, after, query.limit];
    const upTo = query.upTo === undefined ? undefined : sortableTime(query.upTo);
    return this.#call(sql, (statement) => {
      // Each row's JSON is handed on as written (parsed only if a caller reads `items`).
      const rows: StoredChangeRow[] = [];
      let position = after;
      for (const r of statement.all(...params) as { cursor: number; job_id: string; at: string; row: string }[]) {
        if (upTo !== undefined && r.at > upTo) break;
        rows.push({ cursor: String(r.cursor), at: r.at, job_id: r.job_id, json: r.row });
        position = r.cursor;
      }
      return storedFeedPage(rows, String(position));
    });
  }

  /** The rows a committed write produces, inserted in its transaction, stamped with SQLite's clock. */
  #recordChanges(before: JobRecord | undefined, after: JobRecord, note: ChangeNote | undefined): void {
    for (const draft of changeRowsOf(before, after, note)) {
      const { job_id, ...row } = draft;
      this.#run("INSERT INTO changes (job_id, at, row) VALUES (?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ?)", [
        job_id,
        JSON.stringify(row),
      ]);
    }
  }

  /**
   * One write and its feed rows, atomic on their own, committed with the writes that
   * arrived beside it (group commit). A write waits for the turn of the event loop
   * its caller is in to end; then every write queued by then runs, in the order they
   * were asked, each inside a savepoint of one `BEGIN IMMEDIATE` transaction (the
   * write lock first, then the reads of what stands), and one COMMIT makes them all
   * durable before any caller is answered:
   *
   * ```
   * turn n:    write a ─┐  write b ─┐  write c ─┐      (each: its conditions, its rows)
   * turn n+1:  BEGIN IMMEDIATE · SAVEPOINT a … RELEASE · SAVEPOINT b … · SAVEPOINT c … · COMMIT
   *            then a, b and c are answered: each its result, or its own refusal
   * ```
   *
   * A write that refuses (a lost CAS, a missing job) or fails rolls back its own
   * savepoint only: the others commit. A COMMIT that fails commits none of them, and
   * each is told so (`store.unavailable` when SQLite was busy). Each write still sees
   * the writes before it in its group, so a conditional write decides on exactly
   * what stands when it runs. Why: a commit in WAL mode costs several page writes and
   * its share of a checkpoint's fsyncs, whatever it holds, and `mam serve` commits
   * intents, settles and feed rows for many jobs at once (bench/notify). A write
   * alone in its turn is its own transaction, without a savepoint; it still waits
   * for the turn to end (bench/transitions, one awaited write after another: about
   * 15% slower a transition).
   */
  #write<T>(body: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (this.#group === undefined) {
        this.#group = [];
        setImmediate(() => this.#commitGroup());
      }
      this.#group.push({ body, resolve: resolve as (value: unknown) => void, reject });
    });
  }

  /** Run and commit the queued writes as one transaction; answer each. */
  #commitGroup(): void {
    const group = this.#group;
    this.#group = undefined;
    if (group === undefined) return;
    let outcomes: readonly WriteOutcome[];
    try {
      if (!this.#db.open) throw new MamError("store.unavailable", "the job database is closed");
      // Alone in its turn, a write is its own transaction, without a savepoint (two
      // statements fewer); its failure is then the transaction's, told below.
      outcomes = group.length === 1 ? [{ ok: true, value: this.#each.immediate(group[0]!.body) }] : this.#groupTransaction.immediate(group);
    } catch (e) {
      for (const write of group) write.reject(storeError(e));
      return;
    }
    group.forEach((write, i) => {
      const outcome = outcomes[i]!;
      if (outcome.ok) write.resolve(outcome.value);
      else write.reject(storeError(outcome.error));
    });
  }

  /**
   * One `UPDATE ... WHERE <every condition> RETURNING`: a transition (bumping
   * `transition_seq`) or an evidence write (not), with the evidence conditions read
   * from the stored document in the same statement.
   */
  #update(jobId: string, expectedSeq: number | null, change: JobChange, bumpTransition: boolean): Promise<JobRecord> {
    // The guard let through only fields a change may write, none both set and unset;
    // each top-level key is also a JSON path here.
    const setPairs = Object.entries(change.set).filter(([, value]) => value !== undefined);
    const unset = change.unset ?? [];
    const evidence = change.evidence ?? {};
    if (evidence.newAttempt !== undefined) setPairs.push(["latest_attempt", evidence.newAttempt]);

    const params: unknown[] = [];
    let doc = "doc";
    if (unset.length > 0) {
      doc = `json_remove(doc${", ?".repeat(unset.length)})`;
      params.push(...unset.map((k) => `$.${k}`));
    }
    const counters: string[] = [];
    if (bumpTransition) counters.push("'$.transition_seq', transition_seq + 1");
    if (evidence.bump) counters.push("'$.evidence_seq', json_extract(doc, '$.evidence_seq') + 1");
    doc = `json_set(${doc}${", ?, json(?)".repeat(setPairs.length)}${counters.map((c) => `, ${c}`).join("")})`;
    for (const [key, value] of setPairs) params.push(`$.${key}`, JSON.stringify(value));

    const assignments = [`doc = ${doc}`];
    if (bumpTransition) assignments.push("transition_seq = transition_seq + 1");
    const set = change.set;
    if (set.status !== undefined) {
      assignments.push("status = ?");
      params.push(set.status);
    }
    if (set.updated_at !== undefined) {
      assignments.push("updated_at = ?");
      params.push(set.updated_at);
    }
    if (set.pending_notification !== undefined) {
      const owed = owedColumns(set.pending_notification);
      assignments.push("owed_intent_id = ?", "owed_at = ?", "owed_quarantined_id = ?");
      params.push(set.pending_notification.id, owed.at, owed.quarantinedId);
    } else if (unset.includes("pending_notification")) {
      assignments.push("owed_intent_id = NULL", "owed_at = NULL");
    }

    let where = "job_id = ?";
    params.push(jobId);
    if (expectedSeq !== null) {
      where += " AND transition_seq = ?";
      params.push(expectedSeq);
    }
    where += ` AND status IN (${change.from.map(() => "?").join(", ")})`;
    params.push(...change.from);
    if (evidence.seq !== undefined) {
      where += " AND json_extract(doc, '$.evidence_seq') = ?";
      params.push(evidence.seq);
    }
    if (evidence.attempt !== undefined) {
      where += " AND json_extract(doc, '$.latest_attempt') = ?";
      params.push(evidence.attempt);
    }
    if (evidence.currentAttempt !== undefined) {
      where += " AND coalesce(json_extract(doc, '$.latest_attempt'), ?) = ?";
      params.push(evidence.currentAttempt, evidence.currentAttempt);
    }
    if (evidence.newAttempt !== undefined) {
      where += " AND coalesce(json_extract(doc, '$.latest_attempt'), 0) < ?";
      params.push(evidence.newAttempt);
    }

    // What the feed needs of the record before the write, captured by the write itself
    // (an assignment's right side reads the old row): no read precedes the write.
    assignments.push(`feed_before = ${FEED_BEFORE}`);
    return this.#write(() => {
      // `.all()`, not `.get()`: a statement stepped only to its first row never
      // finishes, and SQLite then never reaches its WAL auto-checkpoint (measured:
      // 12 KiB of WAL per transition, never reclaimed).
      const row = this.#all<{ doc: string; feed_before: string }>(
        `UPDATE jobs SET ${assignments.join(", ")} WHERE ${where} RETURNING doc, feed_before`,
        params,
      )[0];
      if (row !== undefined) {
        const after = JSON.parse(row.doc) as JobRecord;
        this.#recordChanges(beforeOf(after, row.feed_before), after, change.note);
        return after;
      }
      // Nothing committed. Read what stands now only to say why; the write is over.
      const current = this.#read(jobId);
      if (current === undefined) throw new MamError("job.notFound", `job ${jobId} does not exist`);
      throw conflictFor(current, expectedSeq, change.from, evidence);
    });
  }

  async replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    const owed = owedColumns(intent);
    await this.#write(() => {
      const row = this.#all<{ doc: string; feed_before: string }>(
        `UPDATE jobs SET doc = json_set(doc, '$.pending_notification', json(?)), owed_intent_id = ?, owed_at = ?,
       owed_quarantined_id = ?, owed_revision = NULL, feed_before = ${OWED_BEFORE}
       WHERE job_id = ? RETURNING doc, feed_before`,
        [JSON.stringify(intent), intent.id, owed.at, owed.quarantinedId, jobId],
      )[0];
      if (row === undefined) throw new MamError("job.notFound", `job ${jobId} does not exist`);
      const after = JSON.parse(row.doc) as JobRecord;
      this.#recordChanges(beforeOf(after, row.feed_before), after, note);
    });
  }

  async reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    return this.#write(() => {
      const row = this.#revise(jobId, intent);
      if (row === undefined) return false;
      const after = { ...(JSON.parse(row.doc) as JobRecord), pending_notification: intent };
      this.#recordChanges(beforeOf(after, row.feed_before), after, note);
      return true;
    });
  }

  /** The revise's write; the row it wrote (its doc, and the owed intent before it), or undefined. */
  #revise(jobId: string, intent: NotificationIntent): { doc: string; feed_before: string } | undefined {
    const owed = owedColumns(intent);
    const json = JSON.stringify(intent);
    // One statement each, both conditional on the intent id; which one writes depends
    // on whether SQLite can still rewrite the doc (`json_valid`), never on a read.
    const intoDoc = this.#all<{ doc: string; feed_before: string }>(
      `UPDATE jobs SET doc = json_set(doc, '$.pending_notification', json(?)), owed_at = ?, owed_quarantined_id = ?, owed_revision = NULL,
       feed_before = ${OWED_BEFORE}
       WHERE job_id = ? AND owed_intent_id = ? AND json_valid(doc) RETURNING doc, feed_before`,
      [json, owed.at, owed.quarantinedId, jobId, intent.id],
    )[0];
    if (intoDoc !== undefined) return intoDoc;
    // Rare (a doc past SQLite's JSON depth): the intent before it is read, under the write's lock.
    const before = this.#readOwed(jobId);
    const beside = this.#run(
      `UPDATE jobs SET owed_at = ?, owed_quarantined_id = ?, owed_revision = ?
       WHERE job_id = ? AND owed_intent_id = ? AND NOT json_valid(doc)`,
      [owed.at, owed.quarantinedId, json, jobId, intent.id],
    );
    if (beside.changes !== 1 || before === undefined) return undefined;
    const { pending_notification, ...rest } = before;
    return { doc: JSON.stringify(rest), feed_before: JSON.stringify({ pending_notification: pending_notification ?? null }) };
  }

  async settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#write(() => this.#settle(jobId, intentId, note));
  }

  /** The log line and the settle in one `BEGIN IMMEDIATE` transaction (with the settle's feed row). */
  async settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#write(() => {
      this.#append(entry);
      return this.#settle(entry.job_id, intentId, note);
    });
  }

  #settle(jobId: string, intentId: string, note: ChangeNote | undefined): boolean {
    const row = this.#all<{ doc: string; feed_before: string }>(
      `UPDATE jobs SET doc = json_remove(doc, '$.pending_notification'), owed_intent_id = NULL, owed_at = NULL,
     owed_quarantined_id = NULL, owed_revision = NULL, feed_before = ${OWED_BEFORE}
     WHERE job_id = ? AND owed_intent_id = ? RETURNING doc, feed_before`,
      [jobId, intentId],
    )[0];
    if (row === undefined) return false;
    const after = JSON.parse(row.doc) as JobRecord;
    this.#recordChanges(beforeOf(after, row.feed_before), after, note);
    return true;
  }

  async list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const limit = query.limit;
    const after = query.cursor === undefined ? undefined : decodeCursor(query.cursor);
    // Every listing is served by jobs_by_status (status, updated_at, job_id); the
    // unfiltered one merges one ordered search per status, so the table carries no
    // second index on updated_at for each transition to maintain.
    const statuses = query.status === undefined ? StatusSchema.options : [query.status];
    const params: unknown[] = [];
    const parts = statuses.map((status) => {
      params.push(status);
      if (after !== undefined) params.push(after[0], after[1]);
      return `SELECT doc, updated_at, job_id FROM jobs WHERE status = ?${after === undefined ? "" : " AND (updated_at, job_id) < (?, ?)"}`;
    });
    // One row more than asked tells whether another page exists, so the last page
    // carries no cursor.
    params.push(limit + 1);
    const rows = this.#all<{ doc: string; updated_at: string; job_id: string }>(
      `${parts.join(" UNION ALL ")} ORDER BY updated_at DESC, job_id DESC LIMIT ?`,
      params,
    );
    const items = rows.slice(0, limit).map((r) => JSON.parse(r.doc) as JobRecord);
    const last = rows[limit - 1];
    if (rows.length > limit && last !== undefined) return { items, cursor: encodeCursor(last.updated_at, last.job_id) };
    return { items };
  }

  async listOwed(limit: number, query: OwedQuery = {}): Promise<readonly JobRecord[]> {
    // Served by the partial index jobs_owed_due, in its order: the cost is the number
    // returned, owed and due; quarantined intents are not in that index at all.
    const params: unknown[] = [];
    let due = "";
    if (query.dueBy !== undefined) {
      due = " AND owed_at <= ?";
      params.push(sortableTime(query.dueBy));
    }
    params.push(limit);
    const rows = this.#all<OwedRow>(
      `SELECT doc, owed_intent_id, owed_revision FROM jobs WHERE ${OWED_DUE}${due} ORDER BY owed_at, job_id LIMIT ?`,
      params,
    );
    return rows.map(owedRecord);
  }

  async listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const limit = query.limit;
    const after = query.cursor === undefined ? undefined : decodeCursor(query.cursor);
    const params: unknown[] = [];
    let page = "";
    if (after !== undefined) {
      page = " AND (owed_at, job_id) < (?, ?)";
      params.push(after[0], after[1]);
    }
    params.push(limit + 1);
    // Served by the partial index jobs_owed_quarantined (owed_at is when it was quarantined).
    const rows = this.#all<OwedRow & { owed_at: string; job_id: string }>(
      `SELECT doc, owed_intent_id, owed_revision, owed_at, job_id FROM jobs WHERE ${OWED_QUARANTINED}${page}
       ORDER BY owed_at DESC, job_id DESC LIMIT ?`,
      params,
    );
    const items = rows.slice(0, limit).map(owedRecord);
    const last = rows[limit - 1];
    if (rows.length > limit && last !== undefined) return { items, cursor: encodeCursor(last.owed_at, last.job_id) };
    return { items };
  }

  async recordDispatch(dispatch: DispatchRecord): Promise<void> {
    const result = this.#run(
      "INSERT INTO dispatches (job_id, attempt_id, doc) VALUES (?, ?, ?) ON CONFLICT (job_id, attempt_id) DO NOTHING",
      [dispatch.job_id, dispatch.attempt_id, JSON.stringify(dispatch)],
    );
    if (result.changes === 0) {
      throw new MamError("dispatch.exists", `attempt ${dispatch.attempt_id} of job ${dispatch.job_id} was already dispatched`);
    }
  }

  async getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    const row = this.#get<{ doc: string }>("SELECT doc FROM dispatches WHERE job_id = ? AND attempt_id = ?", [jobId, attemptId]);
    return row === undefined ? undefined : (JSON.parse(row.doc) as DispatchRecord);
  }

  /**
   * Appending an entry whose id the job already has is a no-op: a retried append
   * (the CLI after a lost reply) does no harm, and the first entry stays.
   */
  async appendEvent(entry: EventLogEntry): Promise<void> {
    this.#append(entry);
  }

  #append(entry: EventLogEntry): void {
    this.#run("INSERT INTO events (job_id, id, at, doc) VALUES (?, ?, ?, ?) ON CONFLICT (job_id, id) DO NOTHING", [
      entry.job_id,
      entry.id,
      entry.at,
      JSON.stringify(entry),
    ]);
  }

  /**
   * Rows are stepped one at a time (served by events_by_time) and the statement is
   * abandoned as soon as the page is full, by count or by bytes: a page never
   * materializes more than one row beyond what it returns.
   */
  async listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    const limit = query.limit;
    const after = query.cursor === undefined ? undefined : decodeEventCursor(query.cursor);
    const sql =
      after === undefined
        ? "SELECT at, id, doc FROM events WHERE job_id = ? ORDER BY at, id"
        : "SELECT at, id, doc FROM events WHERE job_id = ? AND (at, id) > (?, ?) ORDER BY at, id";
    const params = after === undefined ? [jobId] : [jobId, after[0], after[1]];
    return this.#call(sql, (statement) => {
      const items: EventLogEntry[] = [];
      let bytes = 0;
      let last: { at: string; id: string } | undefined;
      for (const row of statement.iterate(...params) as IterableIterator<{ at: string; id: string; doc: string }>) {
        const size = Buffer.byteLength(row.doc, "utf8");
        if (items.length === limit || (items.length > 0 && bytes + size > EVENT_PAGE_MAX_BYTES)) {
          // Another entry exists: the page ends here, and says where the next begins.
          return { items, cursor: encodeEventCursor(last!.at, last!.id) };
        }
        items.push(JSON.parse(row.doc) as EventLogEntry);
        bytes += size;
        last = row;
      }
      return { items };
    });
  }

  async close(): Promise<void> {
    // Writes already asked for are committed first.
    this.#commitGroup();
    if (this.#db.open) this.#db.close();
  }

  /** The record with its owed intent as the owed listings read it (a revision kept beside the doc included). */
  #readOwed(jobId: string): JobRecord | undefined {
    const row = this.#get<OwedRow>("SELECT doc, owed_intent_id, owed_revision FROM jobs WHERE job_id = ?", [jobId]);
    return row === undefined ? undefined : owedRecord(row);
  }

  #read(jobId: string): JobRecord | undefined {
    const row = this.#get<{ doc: string }>("SELECT doc FROM jobs WHERE job_id = ?", [jobId]);
    return row === undefined ? undefined : (JSON.parse(row.doc) as JobRecord);
  }

  #statement(sql: string): Database.Statement {
    let statement = this.#statements.get(sql);
    if (statement === undefined) {
      statement = this.#db.prepare(sql);
      this.#statements.set(sql, statement);
    }
    return statement;
  }

  #run(sql: string, params: unknown[]): Database.RunResult {
    return this.#call(sql, (s) => s.run(...params));
  }

  #get<T>(sql: string, params: unknown[]): T | undefined {
    return this.#call(sql, (s) => s.get(...params) as T | undefined);
  }

  #all<T>(sql: string, params: unknown[]): T[] {
    return this.#call(sql, (s) => s.all(...params) as T[]);
  }

  /** Every statement but the data_version probe runs here. */
  #call<T>(sql: string, run: (statement: Database.Statement) => T): T {
    const statement = this.#statement(sql);
    try {
      return run(statement);
    } catch (e) {
      throw storeError(e);
    }
  }
}

/**
 * What `changeRowsOf` reads of the record before a transition or an evidence write,
 * as the write's own assignment computes it from the old row (into `feed_before`,
 * handed back by RETURNING).
 */
const FEED_BEFORE = `json_object('status', status, 'transition_seq', transition_seq,
  'evidence_seq', coalesce(json_extract(doc, '$.evidence_seq'), 0), 'latest_attempt', json_extract(doc, '$.latest_attempt'),
  'finalized_report', json_extract(doc, '$.finalized_report'), 'pending_notification', json_extract(doc, '$.pending_notification'))`;

/** What a bookkeeping write's rows compare: the owed intent before it (a revision kept beside the doc included). */
const OWED_BEFORE = `json_object('pending_notification', json(coalesce(owed_revision, json_extract(doc, '$.pending_notification'))))`;

/** The record before a write, as far as the feed reads it: `after` with the old values of what `changeRowsOf` compares. */
function beforeOf(after: JobRecord, captured: string): JobRecord {
  const old = JSON.parse(captured) as Record<string, unknown>;
  const before: Record<string, unknown> = { ...after };
  for (const [field, value] of Object.entries(old)) {
    if (value === null) delete before[field];
    else before[field] = value;
  }
  return before as JobRecord;
}

/** A feed position as this store hands it out: a row's cursor, or 0 before the first. */
function decodeFeedPosition(position: string): number {
  if (!/^(0|[1-9][0-9]{0,15})$/.test(position)) throw invalidCursor();
  const n = Number(position);
  if (!Number.isSafeInteger(n)) throw invalidCursor();
  return n;
}

interface OwedRow {
  readonly doc: string;
  readonly owed_intent_id: string | null;
  readonly owed_revision: string | null;
}

/** The record of an owed row, with the revised intent kept beside the doc when the doc could not take it. */
function owedRecord(row: OwedRow): JobRecord {
  const record = JSON.parse(row.doc) as JobRecord;
  if (row.owed_revision === null) return record;
  const revised = JSON.parse(row.owed_revision) as NotificationIntent;
  return revised.id === row.owed_intent_id ? { ...record, pending_notification: revised } : record;
}

/** Where an intent sits in the owed index: when it is next due, or when it was quarantined. */
function owedColumns(intent: NotificationIntent): { at: string; quarantinedId: string | null } {
  if (intent.quarantined_at !== undefined) return { at: sortableTime(intent.quarantined_at), quarantinedId: intent.id };
  return { at: sortableTime(intent.retry_at ?? intent.created_at), quarantinedId: null };
}

/** A time as it compares in a column: UTC, fixed width (`toISOString`). */
function sortableTime(iso: string): string {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? iso : new Date(t).toISOString();
}

function encodeCursor(updatedAt: string, jobId: string): string {
  return Buffer.from(JSON.stringify([updatedAt, jobId])).toString("base64url");
}

function decodeCursor(cursor: string): [string, string] {
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8"));
  } catch (e) {
    throw invalidCursor(e);
  }
  if (Array.isArray(value) && value.length === 2 && typeof value[0] === "string" && typeof value[1] === "string") {
    return [value[0], value[1]];
  }
  throw invalidCursor();
}

/** An event page's cursor: the (at, id) of the last entry handed out, tagged so a job listing's cursor is not taken for one. */
function encodeEventCursor(at: string, id: string): string {
  return Buffer.from(JSON.stringify({ e: [at, id] })).toString("base64url");
}

function decodeEventCursor(cursor: string): [string, string] {
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8"));
  } catch (e) {
    throw invalidCursor(e);
  }
  const e = (value as { e?: unknown } | null)?.e;
  if (Array.isArray(e) && e.length === 2 && typeof e[0] === "string" && typeof e[1] === "string") return [e[0], e[1]];
  throw invalidCursor();
}

/**
 * SQLite's "try again" answers become the port's retryable store.unavailable: busy
 * or locked (another writer), full (the disk, or the database's `max_page_count`:
 * SQLITE_FULL, "database or disk is full", which is how ENOSPC reaches us), and a
 * file it could not open (SQLITE_CANTOPEN: EMFILE, ENFILE). The statement that
 * failed wrote nothing: SQLite rolls it (and its transaction) back.
 */
function storeError(e: unknown): unknown {
  const code = (e as { code?: unknown }).code;
  if (typeof code !== "string") return e;
  if (code.startsWith("SQLITE_BUSY") || code.startsWith("SQLITE_LOCKED")) {
    return new MamError("store.unavailable", `the job database is busy: ${(e as Error).message}`, { cause: e });
  }
  if (code.startsWith("SQLITE_FULL")) {
    return new MamError(
      "store.unavailable",
      "the job database is full (no space left on its disk); nothing was written; retry once space is freed",
      {
        cause: e,
      },
    );
  }
  if (code.startsWith("SQLITE_CANTOPEN")) {
    return new MamError("store.unavailable", "the job database could not open a file (too many open files?); nothing was written; retry", {
      cause: e,
    });
  }
  return e;
}
