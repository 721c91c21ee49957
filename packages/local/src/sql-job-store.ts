import {
  type AtomicOutcome,
  type AtomicWrite,
  type ChangeNote,
  CREATE_SHAPE,
  changeRowsOf,
  type DerivedKeys,
  type DispatchRecord,
  type EventLogEntry,
  type FeedPage,
  type FeedQuery,
  type FeedWriteShape,
  feedPinsOf,
  feedShapeOf,
  invalidCursor,
  type JobListing,
  type JobRecord,
  JobStoreBase,
  type JobStoreOptions,
  KeptByParts,
  MamError,
  movesStatusCount,
  type NotificationIntent,
  type Position,
  type RecordCondition,
  type RecordWrite,
  type Status,
  StatusSchema,
  type StoreCapabilities,
  type StoredChangeRow,
  sortableTime,
  storedFeedPage,
  type UpdateOutcome,
} from "@mam/core";
import { SqlBatchError, type SqlDriver, type SqlStatement, type SqlValue, sql } from "./sql-driver.ts";
import { feedBeforeCapture, feedRowStatements } from "./sql-feed-rules.ts";
import { ATTENTION_KEYED, CANDIDATE_MARKED, OWED_DUE, OWED_QUARANTINED } from "./sqlite-migrations.ts";

/**
 * The job store in SQLite's dialect, over the SQL driver seam (`SqlDriver`): every
 * write is ONE batch of statements run atomically with no JavaScript between them, so
 * it runs the same on better-sqlite3 (`SqliteJobStore`, what `mam serve` uses, with
 * its group commit a property of that driver) and on an engine reached only through
 * batches (Cloudflare D1: `npm run test:d1`). The layout is sqlite-migrations.ts's.
 *
 * A conditional write (core's `RecordWrite`) is one
 * `UPDATE jobs SET … WHERE job_id = ? AND <each condition> RETURNING doc`. When the
 * write is one the change feed tells, the same UPDATE captures what the feed compares
 * of the record before it into `feed_before` (an assignment's right side reads the old
 * row) and stamps the write's own token in `write_token`; the feed rows are then
 * `INSERT … SELECT` statements of the same batch (core's feed rules compiled,
 * sql-feed-rules.ts), which insert only where the row carries that token — that is,
 * only if the UPDATE's conditions held. No read precedes a write; a write that lost
 * reads the record afterwards only to say why.
 *
 * The record is kept whole as JSON in `doc`; `status`, `transition_seq`, the recency
 * key (`updated_at`, `sortableTime`) and the owed place (`owed_intent_id`, `owed_at`,
 * `owed_quarantined_id`) are mirrored in columns for the conditions and the indexes:
 * all derived by core (`DerivedKeys`), only stored here. `owed_revision` keeps a
 * revised intent beside a doc SQLite's JSON functions can no longer rewrite (a legacy
 * record past their depth limit), so such a record is still backed off and quarantined
 * instead of stopping the sweep.
 */
export class SqlJobStore extends JobStoreBase {
  protected readonly driver: SqlDriver;
  /** This store's tokens: a random prefix of its own and a count, so no other store or process stamps the same one. */
  readonly #tokenPrefix = `${globalThis.crypto.randomUUID()}.`;
  #tokens = 0;

  constructor(driver: SqlDriver, options: JobStoreOptions = {}) {
    super(options);
    this.driver = driver;
  }

  /** A token no other write stamps (see `write_token`). */
  #token(): string {
    this.#tokens += 1;
    return this.#tokenPrefix + this.#tokens;
  }

  override get capabilities(): StoreCapabilities {
    return { atomicMultiWrite: true, countConsistency: "exact" };
  }

  protected async readRecord(jobId: string): Promise<JobRecord | undefined> {
    const [row] = await this.#query("SELECT doc FROM jobs WHERE job_id = ?", [jobId]);
    return row === undefined ? undefined : parseDoc(row.doc);
  }

  protected async insertRecord(record: JobRecord, keys: Required<DerivedKeys>, note: ChangeNote): Promise<boolean> {
    const token = this.#token();
    const owed = owedColumns(keys.owed);
    const [insert] = await this.#batch([
      sql(
        `INSERT INTO jobs (job_id, status, transition_seq, created_at, updated_at, owed_intent_id, owed_at, owed_quarantined_id,
           candidate_at, attention_at, feed_before, status_before, write_token, doc)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?) ON CONFLICT (job_id) DO NOTHING`,
        record.job_id,
        keys.status,
        record.transition_seq,
        record.created_at,
        keys.recency,
        owed.intentId,
        owed.at,
        owed.quarantinedId,
        keys.candidate,
        keys.attention,
        token,
        JSON.stringify(record),
      ),
      ...feedRowStatements(record.job_id, token, note, CREATE_SHAPE),
      ...countStatements(record.job_id, token),
    ]);
    return (insert?.changes ?? 0) === 1;
  }

  protected async updateRecord(write: RecordWrite): Promise<UpdateOutcome> {
    const token = this.#token();
    const statements = this.#updateStatements(write, token);
    const [update] = await this.#batch(statements);
    const written = update?.rows[0];
    if (written !== undefined) return { written: true, record: parseDoc(written.doc) };
    if (isOwedRevision(write)) return this.#reviseBeside(write, token);
    return { written: false, current: await this.readRecord(write.jobId) };
  }

  /**
   * The write's UPDATE and its feed rows' statements, in batch order. `returning`: the
   * UPDATE returns the record it wrote; a part of an atomic write asks only whether it
   * wrote (its `changes`), so its UPDATE returns nothing.
   */
  #updateStatements(write: RecordWrite, token: string, returning = true): SqlStatement[] {
    const plan = planOf(write);
    const update = {
      sql: returning ? plan.text : plan.countedText,
      params: updateParams(write, plan.setFields, plan.stampsToken ? token : undefined),
    };
    const counts = plan.movesCount ? countStatements(write.jobId, token) : undefined;
    if (plan.shape === undefined || write.feed === undefined) return counts === undefined ? [update] : [update, ...counts];
    const statements = feedRowStatements(write.jobId, token, write.feed, plan.shape, feedPinsOf(write));
    // In front, without a spread: this runs on the relay's settle, on bench/notify's critical path.
    statements.unshift(update);
    if (counts !== undefined) for (const c of counts) statements.push(c);
    return statements;
  }

  /**
   * A revise of a doc SQLite can no longer rewrite (`json_valid` false, past its JSON
   * depth): the revision is kept beside it (`owed_revision`). Such a doc is frozen (no
   * JSON function can change it), so what the feed compares of it is read here, in
   * JavaScript, and the batch is conditional on the owed columns it read still being
   * what they were: the rows it inserts describe exactly the write it made.
   */
  async #reviseBeside(write: RecordWrite, token: string): Promise<UpdateOutcome> {
    const intent = write.set.pending_notification as NotificationIntent;
    const owed = owedColumns(write.keys.owed ?? null);
    for (let attempt = 0; attempt < 8; attempt++) {
      const [row] = await this.#query("SELECT doc, owed_intent_id, owed_revision, json_valid(doc) AS valid FROM jobs WHERE job_id = ?", [
        write.jobId,
      ]);
      if (row === undefined) return { written: false, current: undefined };
      const before = owedRecord(row);
      if (row.valid !== 0 || row.owed_intent_id !== intent.id) return { written: false, current: before };
      const after: JobRecord = { ...before, pending_notification: intent };
      const drafts = changeRowsOf(before, after, write.feed);
      const [update] = await this.#batch([
        sql(
          `UPDATE jobs SET owed_at = ?, owed_quarantined_id = ?, owed_revision = ?, write_token = ?
           WHERE job_id = ? AND owed_intent_id = ? AND NOT json_valid(doc) AND owed_revision IS ?`,
          owed.at,
          owed.quarantinedId,
          JSON.stringify(intent),
          token,
          write.jobId,
          intent.id,
          row.owed_revision ?? null,
        ),
        ...drafts.map(({ job_id, ...rest }) =>
          sql(
            `INSERT INTO changes (job_id, at, row) SELECT job_id, ${NOW}, ? FROM jobs WHERE job_id = ? AND write_token = ?`,
            JSON.stringify(rest),
            job_id,
            token,
          ),
        ),
      ]);
      if ((update?.changes ?? 0) === 1) return { written: true, record: after };
    }
    throw new MamError(
      "store.unavailable",
      `job ${write.jobId}'s owed intent kept changing while it was revised; nothing was written; retry`,
    );
  }

  /**
   * `writes` in one batch. With one record write among them, required, it goes first
   * and each line is inserted only where the row carries that write's token, so a
   * condition that did not hold leaves the whole batch unwritten with no statement
   * more. Otherwise a guard row after each required record write insists that it
   * changed exactly one row (`atomic_guard`'s CHECK), so one whose condition did not
   * hold fails the batch and the driver rolls every part back; an optional one has no
   * guard: its UPDATE writes if its conditions hold, and its RETURNING says whether it
   * did (what `settlePublished` asks: the line, and the settle only while the intent
   * is owed, one batch either way). A line already in the log stays as it is
   * (inserting a line is inserting it once).
   */
  protected override async writeAtomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome> {
    let updates = 0;
    const required: AtomicWrite[] = [];
    for (const w of writes) {
      if (w.kind !== "update") continue;
      updates++;
      if (w.optional !== true) required.push(w);
    }
    const [only] = required;
    // Only a write the feed tells is sure to stamp its token (`#updateStatements`): the lines ask for it.
    if (required.length === 1 && updates === 1 && only?.kind === "update" && only.write.feed !== undefined) {
      const token = this.#token();
      const own = this.#updateStatements(only.write, token, false);
      const statements: SqlStatement[] = [own[0] as SqlStatement];
      for (const w of writes) if (w.kind === "insertEvent") statements.push(insertEventAfter(w.entry, only.write.jobId, token));
      for (let i = 1; i < own.length; i++) statements.push(own[i] as SqlStatement);
      const [result] = await this.#batch(statements);
      return result?.changes === 1 ? { committed: true, held: [] } : { committed: false };
    }
    // Loops, not spreads and rest destructuring: the relay's settle (an optional update
    // beside its line) comes this way, on bench/notify's critical path.
    const statements: SqlStatement[] = [];
    const optional: number[] = [];
    for (const w of writes) {
      if (w.kind === "insertEvent") {
        statements.push(insertEventStatement(w.entry));
        continue;
      }
      const own = this.#updateStatements(w.write, this.#token(), false);
      if (w.optional === true) optional.push(statements.length);
      statements.push(own[0] as SqlStatement);
      if (w.optional !== true) statements.push(GUARD);
      for (let i = 1; i < own.length; i++) statements.push(own[i] as SqlStatement);
    }
    if (required.length > 0) statements.push(sql("DELETE FROM atomic_guard"));
    try {
      const results = await this.#batch(statements);
      return { committed: true, held: optional.map((at) => results[at]?.changes === 1) };
    } catch (e) {
      if (e instanceof SqlBatchError && e.constraint && /atomic_guard|held = 1/.test(e.message)) return { committed: false };
      throw e;
    }
  }

  protected async insertDispatch(dispatch: DispatchRecord): Promise<boolean> {
    const [insert] = await this.#batch([
      sql(
        "INSERT INTO dispatches (job_id, attempt_id, doc) VALUES (?, ?, ?) ON CONFLICT (job_id, attempt_id) DO NOTHING",
        dispatch.job_id,
        dispatch.attempt_id,
        JSON.stringify(dispatch),
      ),
    ]);
    return (insert?.changes ?? 0) === 1;
  }

  protected async readDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    const [row] = await this.#query("SELECT doc FROM dispatches WHERE job_id = ? AND attempt_id = ?", [jobId, attemptId]);
    return row === undefined ? undefined : (JSON.parse(String(row.doc)) as DispatchRecord);
  }

  /** An entry whose id the job already has is a no-op: a retried append does no harm, and the first entry stays. */
  protected async insertEvent(entry: EventLogEntry): Promise<void> {
    await this.#batch([insertEventStatement(entry)]);
  }

  protected async queryEvents(jobId: string, after: Position | undefined, limit: number): Promise<EventLogEntry[]> {
    const rows =
      after === undefined
        ? await this.#query("SELECT doc FROM events WHERE job_id = ? ORDER BY at, id LIMIT ?", [jobId, limit])
        : await this.#query("SELECT doc FROM events WHERE job_id = ? AND (at, id) > (?, ?) ORDER BY at, id LIMIT ?", [
            jobId,
            after[0],
            after[1],
            limit,
          ]);
    return rows.map((r) => JSON.parse(String(r.doc)) as EventLogEntry);
  }

  protected async queryJobs(listing: JobListing, after: Position | undefined, limit: number): Promise<JobRecord[]> {
    if (listing.kind === "quarantined") {
      // Served by the partial index jobs_owed_quarantined (owed_at is when it was quarantined).
      const page = after === undefined ? "" : " AND (owed_at, job_id) < (?, ?)";
      const rows = await this.#query(
        `SELECT doc, owed_intent_id, owed_revision FROM jobs WHERE ${OWED_QUARANTINED}${page} ORDER BY owed_at DESC, job_id DESC LIMIT ?`,
        [...(after ?? []), limit],
      );
      return rows.map(owedRecord);
    }
    // Every listing is served by jobs_by_status (status, updated_at, job_id); the
    // unfiltered one merges one ordered search per status, so the table carries no
    // second index on updated_at for each transition to maintain.
    const statuses = listing.status === undefined ? StatusSchema.options : [listing.status];
    const params: SqlValue[] = [];
    const marked = listing.mark === undefined ? undefined : markSql(listing.mark, listing.dueBy);
    const parts = statuses.map((status) => {
      params.push(status);
      if (after !== undefined) params.push(after[0], after[1]);
      if (marked !== undefined) params.push(...marked.params);
      return `SELECT doc, updated_at, job_id FROM jobs WHERE status = ?${after === undefined ? "" : " AND (updated_at, job_id) < (?, ?)"}${marked === undefined ? "" : ` AND ${marked.sql}`}`;
    });
    params.push(limit);
    const rows = await this.#query(`${parts.join(" UNION ALL ")} ORDER BY updated_at DESC, job_id DESC LIMIT ?`, params);
    return rows.map((r) => parseDoc(r.doc));
  }

  protected async queryOwed(limit: number, dueBy: string | undefined): Promise<JobRecord[]> {
    // Served by the partial index jobs_owed_due, in its order: the cost is the number
    // returned, owed and due; quarantined intents are not in that index at all.
    const rows = await this.#query(
      `SELECT doc, owed_intent_id, owed_revision FROM jobs WHERE ${OWED_DUE}${dueBy === undefined ? "" : " AND owed_at <= ?"}
       ORDER BY owed_at, job_id LIMIT ?`,
      dueBy === undefined ? [limit] : [dueBy, limit],
    );
    return rows.map(owedRecord);
  }

  protected async queryCandidates(limit: number, dueBy: string): Promise<JobRecord[]> {
    // Served by the partial index jobs_candidates, in its order: the cost is the number returned.
    const rows = await this.#query(
      `SELECT doc FROM jobs WHERE ${CANDIDATE_MARKED} AND candidate_at <= ? ORDER BY candidate_at, job_id LIMIT ?`,
      [dueBy, limit],
    );
    return rows.map((r) => parseDoc(r.doc));
  }

  protected async queryAttention(limit: number, dueBy: string): Promise<JobRecord[]> {
    // Served by the partial index jobs_attention, in its order.
    const rows = await this.#query(
      `SELECT doc FROM jobs WHERE ${ATTENTION_KEYED} AND attention_at <= ? ORDER BY attention_at, job_id LIMIT ?`,
      [dueBy, limit],
    );
    return rows.map((r) => parseDoc(r.doc));
  }

  /** The counts per status: `job_counts`, a row per status any write has counted (a handful of rows). */
  protected async queryCounts(): Promise<Partial<Record<Status, number>>> {
    const rows = await this.#query("SELECT status, n FROM job_counts", []);
    const counts: Partial<Record<Status, number>> = {};
    for (const r of rows) counts[String(r.status) as Status] = Number(r.n);
    return counts;
  }

  /**
   * The feed after a position (the decimal cursor of a row, `0` before the first), in
   * cursor order; a job's rows by `changes_by_job`. A row's JSON is handed on as
   * written (parsed only if a caller reads `items`).
   */
  protected async queryFeed(query: FeedQuery): Promise<FeedPage> {
    const after = query.after === undefined ? 0 : decodeFeedPosition(query.after);
    const rows =
      query.jobId === undefined
        ? await this.#query("SELECT cursor, job_id, at, row FROM changes WHERE cursor > ? ORDER BY cursor LIMIT ?", [after, query.limit])
        : await this.#query("SELECT cursor, job_id, at, row FROM changes WHERE job_id = ? AND cursor > ? ORDER BY cursor LIMIT ?", [
            query.jobId,
            after,
            query.limit,
          ]);
    const stored: StoredChangeRow[] = [];
    let position = after;
    for (const r of rows) {
      if (query.upTo !== undefined && String(r.at) > query.upTo) break;
      stored.push({ cursor: String(r.cursor), at: String(r.at), job_id: String(r.job_id), json: String(r.row) });
      position = Number(r.cursor);
    }
    return storedFeedPage(stored, String(position));
  }

  /**
   * The newest row's cursor (0 before the first): cursors are assigned in commit order
   * and never reused, so the rows after it are exactly those committed later. One
   * position for the whole feed and every job's listing (`cursor > ?` either way).
   */
  protected async queryFeedHead(_jobId: string | undefined): Promise<string> {
    const [row] = await this.#query("SELECT coalesce(max(cursor), 0) AS head FROM changes", []);
    return String(row?.head ?? 0);
  }

  /** Releases the driver (and its connection). */
  async close(): Promise<void> {
    await this.driver.close();
  }

  /** Every batch of this store: the engine's "try again" answers as the port's `store.unavailable`. */
  async #batch(statements: readonly SqlStatement[]) {
    try {
      return await this.driver.batch(statements);
    } catch (e) {
      throw sqlStoreError(e);
    }
  }

  async #query(text: string, params: readonly SqlValue[]) {
    try {
      return await this.driver.query(text, params);
    } catch (e) {
      throw sqlStoreError(e);
    }
  }
}

/**
 * SQLite's "try again" answers become the port's retryable `store.unavailable`: busy
 * or locked (another writer), full (the disk, or the database's `max_page_count`:
 * SQLITE_FULL, "database or disk is full", which is how ENOSPC reaches us), a file it
 * could not open (SQLITE_CANTOPEN: EMFILE, ENFILE), and a connection already closed.
 * The batch that failed wrote nothing: the driver rolled it back. Anything else is
 * passed on as it is (a constraint the data broke, a fault).
 */
export function sqlStoreError(e: unknown): unknown {
  const cause = e instanceof SqlBatchError ? e.cause : e;
  const code = String((cause as { code?: unknown } | null)?.code ?? "");
  const message = e instanceof Error ? e.message : String(e);
  if (code.startsWith("SQLITE_BUSY") || code.startsWith("SQLITE_LOCKED") || /database is (locked|busy)/i.test(message)) {
    return new MamError("store.unavailable", `the job database is busy: ${message}`, { cause: e });
  }
  if (code.startsWith("SQLITE_FULL") || /database or disk is full/i.test(message)) {
    return new MamError(
      "store.unavailable",
      "the job database is full (no space left on its disk); nothing was written; retry once space is freed",
      { cause: e },
    );
  }
  if (code.startsWith("SQLITE_CANTOPEN")) {
    return new MamError("store.unavailable", "the job database could not open a file (too many open files?); nothing was written; retry", {
      cause: e,
    });
  }
  if (/database connection is not open/i.test(message)) {
    return new MamError("store.unavailable", "the job database is closed", { cause: e });
  }
  return e;
}

// ---- compiling a conditional write

/** SQLite's clock, as the feed stamps a row's commit time. */
const NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/** A guard row after an atomic part: `changes()` is what the part before it changed, and the CHECK wants exactly one. */
const GUARD = sql("INSERT INTO atomic_guard (held) VALUES (changes())");

/** One condition, as a WHERE term over the stored row (the record in `doc`, its mirrored columns); its values pushed to `params`, in the term's order. */
function conditionSql(c: RecordCondition, params: SqlValue[]): string {
  switch (c.kind) {
    case "transitionSeqIs":
      params.push(c.seq);
      return "transition_seq = ?";
    case "statusIn":
      if (c.statuses.length === 0) return "0";
      for (const status of c.statuses) params.push(status);
      return `status IN (${c.statuses.map(() => "?").join(", ")})`;
    case "evidenceSeqIs":
      params.push(c.seq);
      return "coalesce(json_extract(doc, '$.evidence_seq'), 0) = ?";
    case "latestAttemptIs":
      params.push(c.attempt);
      return "json_extract(doc, '$.latest_attempt') = ?";
    case "latestAttemptAbsentOrIs":
      params.push(c.attempt, c.attempt);
      return "coalesce(json_extract(doc, '$.latest_attempt'), ?) = ?";
    case "latestAttemptBelow":
      params.push(c.attempt);
      return "coalesce(json_extract(doc, '$.latest_attempt'), 0) < ?";
    case "observationsRevIs":
      params.push(c.rev);
      return "coalesce(json_extract(doc, '$.observations.rev'), 0) = ?";
    case "candidateIs":
      params.push(c.at);
      return "json_extract(doc, '$.candidate_at') = ?";
    case "attentionIs":
      params.push(c.at);
      return "json_extract(doc, '$.attention_at') = ?";
    case "intentIs":
      params.push(c.id);
      return "owed_intent_id = ?";
    case "noIntent":
      return "owed_intent_id IS NULL";
    case "usageIs":
      params.push(c.events, c.bytes);
      return "coalesce(json_extract(doc, '$.agent_usage.events'), 0) = ? AND coalesce(json_extract(doc, '$.agent_usage.bytes'), 0) = ?";
    case "leaseHeldBy":
      params.push(c.id);
      return `json_extract(doc, '$.${leasePath(c.field)}.id') = ?`;
    case "leaseFree": {
      const path = leasePath(c.field);
      params.push(c.at, c.attempt);
      return `(json_extract(doc, '$.${path}.id') IS NULL OR json_extract(doc, '$.${path}.expires_at') <= ? OR json_extract(doc, '$.${path}.attempt_id') < ?)`;
    }
    default:
      return c satisfies never;
  }
}

/** A marked listing's filter (`carriesMark`'s meaning) as a WHERE term: over the status index's rows, a filter. */
function markSql(mark: "stale" | "overdue" | "candidate", dueBy: string | undefined): { sql: string; params: SqlValue[] } {
  switch (mark) {
    case "stale":
      return { sql: "json_extract(doc, '$.stale_since') IS NOT NULL", params: [] };
    case "overdue":
      return { sql: "json_extract(doc, '$.overdue_since') IS NOT NULL", params: [] };
    case "candidate":
      return { sql: "candidate_at IS NOT NULL AND candidate_at <= ?", params: [dueBy ?? ""] };
    default:
      return mark satisfies never;
  }
}

/** A lease field as it is spelled into a JSON path: only the two the schema has. */
function leasePath(field: string): string {
  if (field !== "upload_in_flight" && field !== "finalize_in_progress") throw new MamError("internal", `no lease field ${field}`);
  return field;
}

/**
 * A top-level field name as it is spelled into a JSON path, written into the UPDATE's
 * text (a plan is per form, and the form names its fields): only what the base let
 * through (a schema field, letters and `_`), so the path is a safe SQL literal.
 */
const FIELD_NAME = /^[a-z_]+$/;

function fieldPath(field: string): string {
  if (!FIELD_NAME.test(field)) throw new MamError("internal", `no record field ${field}`);
  return `$.${field}`;
}

/**
 * What a write's form decides, kept by form (a store's writes have a few dozen): its
 * UPDATE's text, its feed shape, whether it moves the counts and stamps its token (so
 * the text and the statements beside it are decided once, together). The form is
 * what these depend on: the fields it sets (and the status it sets), unsets and bumps,
 * the keys it moves (and the status key's value), whether the feed tells it, and its
 * conditions (the status a `statusIn` of one pins). The values are bound each time
 * (`updateParams`).
 */
interface WritePlan {
  readonly text: string;
  /** The same UPDATE without `RETURNING`, for a part of an atomic write (which reads only its `changes`). */
  readonly countedText: string;
  readonly setFields: readonly string[];
  readonly shape: FeedWriteShape | undefined;
  /** Core's `movesStatusCount`: the count statements follow the UPDATE, which keeps `status_before`. */
  readonly movesCount: boolean;
  /** The UPDATE stamps the write's token: the feed or count statements select on it. */
  readonly stampsToken: boolean;
}

const PLANS = new KeptByParts<WritePlan>();
const END = KeptByParts.END;

function planOf(write: RecordWrite): WritePlan {
  const setFields = Object.keys(write.set);
  const keys = write.keys;
  const status = write.set.status;
  const form: unknown[] = [...write.unset, END, ...setFields, END, typeof status === "string" ? status : END, ...write.bump, END];
  form.push(
    keys.status ?? END,
    (keys.recency === undefined ? 0 : 2) |
      (keys.owed === undefined ? 0 : 4) |
      (keys.candidate === undefined ? 0 : 8) |
      (keys.attention === undefined ? 0 : 16) |
      (write.feed === undefined ? 0 : write.feed.marked === undefined ? 32 : 64),
  );
  // Each condition's parts: its kind, then the one value its text depends on, if any.
  for (const c of write.conditions) {
    form.push(c.kind);
    if (c.kind === "statusIn") form.push(c.statuses.length === 1 ? c.statuses[0] : c.statuses.length);
    else if (c.kind === "leaseHeldBy" || c.kind === "leaseFree") form.push(c.field);
  }
  return PLANS.get(form, () => {
    const shape = write.feed === undefined ? undefined : feedShapeOf(write);
    const movesCount = movesStatusCount(write);
    // The feed's rows select on the token, and so do the count statements.
    const stampsToken = shape !== undefined || movesCount;
    const counted = updateText(write, setFields, { shape, movesCount, stampsToken });
    return { text: `${counted} RETURNING doc`, countedText: counted, setFields, shape, movesCount, stampsToken };
  });
}

/** The UPDATE's parameters, in the order `updateText` places them. */
function updateParams(write: RecordWrite, setFields: readonly string[], token: string | undefined): SqlValue[] {
  const params: SqlValue[] = [];
  // The fields' paths are in the text (its form names the fields): only their values are bound.
  for (const field of setFields) params.push(JSON.stringify(write.set[field]));
  const keys = write.keys;
  if (keys.status !== undefined) params.push(keys.status);
  if (keys.recency !== undefined) params.push(keys.recency);
  if (keys.owed !== undefined) {
    const owed = owedColumns(keys.owed);
    params.push(owed.intentId, owed.at, owed.quarantinedId);
  }
  if (keys.candidate !== undefined) params.push(keys.candidate);
  if (keys.attention !== undefined) params.push(keys.attention);
  if (token !== undefined) params.push(token);
  params.push(write.jobId);
  for (const condition of write.conditions) conditionSql(condition, params);
  return params;
}

function updateText(
  write: RecordWrite,
  setFields: readonly string[],
  plan: Pick<WritePlan, "shape" | "movesCount" | "stampsToken">,
): string {
  const shape = plan.shape;
  let doc = "doc";
  if (write.unset.length > 0) doc = `json_remove(doc${write.unset.map((field) => `, '${fieldPath(field)}'`).join("")})`;
  const counters = write.bump.map((counter) =>
    counter === "transition_seq"
      ? "'$.transition_seq', transition_seq + 1"
      : "'$.evidence_seq', coalesce(json_extract(doc, '$.evidence_seq'), 0) + 1",
  );
  if (setFields.length > 0 || counters.length > 0) {
    doc = `json_set(${doc}${setFields.map((field) => `, '${fieldPath(field)}', json(?)`).join("")}${counters.map((c) => `, ${c}`).join("")})`;
  }
  const assignments = [`doc = ${doc}`];
  if (write.bump.includes("transition_seq")) assignments.push("transition_seq = transition_seq + 1");
  if (write.keys.status !== undefined) assignments.push("status = ?");
  if (write.keys.recency !== undefined) assignments.push("updated_at = ?");
  if (write.keys.owed !== undefined)
    assignments.push("owed_intent_id = ?", "owed_at = ?", "owed_quarantined_id = ?", "owed_revision = NULL");
  if (write.keys.candidate !== undefined) assignments.push("candidate_at = ?");
  if (write.keys.attention !== undefined) assignments.push("attention_at = ?");
  if (shape !== undefined) {
    const capture = feedBeforeCapture(shape);
    if (capture !== undefined) assignments.push(`feed_before = ${capture}`);
  }
  // The right side reads the old row: the status this write leaves, for its count statements.
  if (plan.movesCount) assignments.push("status_before = status");
  if (plan.stampsToken) assignments.push("write_token = ?");
  let where = "job_id = ?";
  // The text only: the values are bound each time (`updateParams`).
  for (const condition of write.conditions) where += ` AND ${conditionSql(condition, [])}`;
  // A revise also runs where the doc can be rewritten only: one past SQLite's JSON
  // depth takes its revision beside it (`#reviseBeside`).
  if (isOwedRevision(write)) where += " AND json_valid(doc)";
  return `UPDATE jobs SET ${assignments.join(", ")} WHERE ${where}`;
}

/**
 * The counts per status (`statusCountMove`, core), moved in the write's own batch: −1
 * to the status the row left and +1 to the one it holds, only where the row carries
 * the write's token (the write committed) and the two differ. A create leaves none
 * (`status_before` NULL). A lost race stamps nothing, so counts nothing.
 */
function countStatements(jobId: string, token: string): SqlStatement[] {
  return [
    sql(
      `INSERT INTO job_counts (status, n) SELECT j.status_before, -1 FROM jobs j
       WHERE j.job_id = ? AND j.write_token = ? AND j.status_before IS NOT NULL AND j.status_before IS NOT j.status
       ON CONFLICT (status) DO UPDATE SET n = n + excluded.n`,
      jobId,
      token,
    ),
    sql(
      `INSERT INTO job_counts (status, n) SELECT j.status, 1 FROM jobs j
       WHERE j.job_id = ? AND j.write_token = ? AND j.status_before IS NOT j.status
       ON CONFLICT (status) DO UPDATE SET n = n + excluded.n`,
      jobId,
      token,
    ),
  ];
}

/** A revise: the one write that may land beside a doc SQLite cannot rewrite. */
function isOwedRevision(write: RecordWrite): boolean {
  return (
    write.set.pending_notification !== undefined &&
    write.conditions.length === 1 &&
    write.conditions[0]?.kind === "intentIs" &&
    write.bump.length === 0
  );
}

/** A log line inserted once, only if the row of `jobId` carries `token` (the batch's record write committed). */
function insertEventAfter(entry: EventLogEntry, jobId: string, token: string): SqlStatement {
  return sql(
    `INSERT INTO events (job_id, id, at, doc) SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM jobs WHERE job_id = ? AND write_token = ?)
     ON CONFLICT (job_id, id) DO NOTHING`,
    entry.job_id,
    entry.id,
    sortableTime(entry.at),
    JSON.stringify(entry),
    jobId,
    token,
  );
}

function insertEventStatement(entry: EventLogEntry): SqlStatement {
  return sql(
    "INSERT INTO events (job_id, id, at, doc) VALUES (?, ?, ?, ?) ON CONFLICT (job_id, id) DO NOTHING",
    entry.job_id,
    entry.id,
    sortableTime(entry.at),
    JSON.stringify(entry),
  );
}

/** The owed place as its columns: none (all null), due, or quarantined (the quarantined id is the intent's own). */
function owedColumns(place: DerivedKeys["owed"] | null): { intentId: string | null; at: string | null; quarantinedId: string | null } {
  if (place === null || place === undefined) return { intentId: null, at: null, quarantinedId: null };
  return { intentId: place.intentId, at: place.at, quarantinedId: place.part === "quarantined" ? place.intentId : null };
}

function parseDoc(doc: SqlValue | undefined): JobRecord {
  return JSON.parse(String(doc)) as JobRecord;
}

/** The record of an owed row, with the revised intent kept beside the doc when the doc could not take it. */
function owedRecord(row: Record<string, SqlValue>): JobRecord {
  const record = parseDoc(row.doc);
  if (row.owed_revision === null || row.owed_revision === undefined) return record;
  const revised = JSON.parse(String(row.owed_revision)) as NotificationIntent;
  return revised.id === row.owed_intent_id ? { ...record, pending_notification: revised } : record;
}

/** A feed position as this store hands it out: a row's cursor, or 0 before the first. */
function decodeFeedPosition(position: string): number {
  if (!/^(0|[1-9][0-9]{0,15})$/.test(position)) throw invalidCursor();
  const n = Number(position);
  if (!Number.isSafeInteger(n)) throw invalidCursor();
  return n;
}
