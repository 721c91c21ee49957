import type { AttributeValue, DynamoDBClient } from "@aws-sdk/client-dynamodb";
import {
  DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  QueryCommand,
  type QueryCommandInput,
  type QueryCommandOutput,
  TransactWriteCommand,
  type TransactWriteCommandInput,
  UpdateCommand,
} from "@aws-sdk/lib-dynamodb";
import {
  type AtomicOutcome,
  type AtomicWrite,
  type ChangeNote,
  type ChangeRow,
  type Clock,
  type DerivedKeys,
  type DispatchRecord,
  type EventLogEntry,
  type FeedPage,
  type FeedQuery,
  invalidCursor,
  type JobListing,
  type JobRecord,
  JobStoreBase,
  type JobStoreOptions,
  MamError,
  type Position,
  type RecordCondition,
  type RecordWrite,
  type Status,
  type StoreCapabilities,
  type UpdateOutcome,
} from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import {
  ALL_JOBS,
  ATTENTION,
  CANDIDATES,
  COUNTS_PK,
  countsOfItem,
  dispatchSk,
  dueBound,
  EVENT_PREFIX,
  eventSk,
  FEED_AT,
  FEED_HOURS,
  FEED_NOTE,
  type FeedRowItem,
  feedPk,
  feedWriteOfStreamRecord,
  hourOf,
  indexAttributes,
  JOB_ITEM_SK,
  jobItem,
  jobPk,
  jobRecordOfAttributes,
  jobRecordOfItem,
  OWED,
  QUARANTINED,
  statusPk,
  stripKeys,
} from "./job-item.ts";
import { readSdkFailure, storeFailure } from "./sdk-errors.ts";
import { JOB_TABLE_INDEX } from "./table-definition.ts";

export interface DynamoJobStoreOptions extends JobStoreOptions {
  /** The low-level client; the store wraps it in a document client of its own. */
  readonly client: DynamoDBClient;
  readonly tableName: string;
  /**
   * The change feed hands out only rows written at least this long ago (ms), so a row
   * whose write was still in flight when a reader passed its time is never skipped.
   * It must exceed the longest a feed write can take (the stream function's SDK
   * timeouts bound it: docs/notifications.md). 30 s by default.
   */
  readonly feedDelayMs?: number;
  /** What "now" is for the feed delay and the feed's stamp on each write; the system clock by default. */
  readonly clock?: Clock;
  /**
   * Whether the engine runs `TransactWriteItems` (DynamoDB and DynamoDB Local do;
   * dynalite does not): `capabilities.atomicMultiWrite` follows it, so with it
   * `settlePublished` writes the log line and the settle as one transaction, and
   * without it as two writes, line first. True by default.
   */
  readonly transactions?: boolean;
}

/** The feed delay's default: above the stream function's bounded feed write (2 calls of at most ~10 s each) and clock skew. */
export const DEFAULT_FEED_DELAY_MS = 30_000;

const isConditionalFailure = (err: unknown): boolean => (err as { name?: string } | null)?.name === "ConditionalCheckFailedException";

/**
 * The job store on DynamoDB: core's `JobStoreBase` (every rule, cursor and page bound
 * is there) over this adapter's primitives, each one request. The item layout is
 * `job-item.ts`, the table and its indexes `job-table.ts`.
 *
 * - A record write is one `UpdateItem` whose `ConditionExpression` is the write's
 *   conditions compiled (`conditionExpression`), its `UpdateExpression` the fields,
 *   counters and index keys it moves (`updateExpression`). The owed notification lives
 *   in the job item, so a transition and its intent commit together. A lost write
 *   hands back the record it lost to: DynamoDB returns it with the failure
 *   (`ReturnValuesOnConditionCheckFailure: ALL_OLD`); a peer that does not (dynalite)
 *   costs one consistent read after the failure.
 * - A write the feed tells (`write.feed`) leaves its note (`FEED_NOTE`, removed when
 *   empty: the service's own) and this store's time (`FEED_AT`) on the item, from
 *   which the stream function derives its rows (`writeStreamChanges`); a write the
 *   feed does not tell (`chargeUsage`, `holdLease`) leaves both as they were, and its
 *   stream record yields no row.
 * - `writeAtomically` is one `TransactWriteItems` (when `transactions`): all of its
 *   parts or none; where only a part that may fail alone failed (a line already
 *   there, an optional update whose condition did not hold) it is sent again without
 *   that part (at most `ATOMIC_ROUNDS` requests). An engine without transactions
 *   answers `store.unsupported`, nothing written.
 * - Every SDK failure that is not a lost condition is `storeFailure`'s:
 *   `store.unavailable` when it may pass, `internal` otherwise.
 */
/** Requests an atomic write may take: the first, and one more per part that failed alone (a line, an optional update). */
const ATOMIC_ROUNDS = 3;

export class DynamoJobStore extends JobStoreBase {
  readonly tableName: string;
  readonly #doc: DynamoDBDocumentClient;
  readonly #feedDelayMs: number;
  readonly #clock: Clock;
  readonly #transactions: boolean;

  /**
   * The document client shares the low-level client's config object, translation
   * options included (lib-dynamodb stores them there): do not build a differently
   * configured document client from the same low-level client.
   */
  constructor(opts: DynamoJobStoreOptions) {
    super(opts);
    this.tableName = opts.tableName;
    this.#feedDelayMs = opts.feedDelayMs ?? DEFAULT_FEED_DELAY_MS;
    this.#clock = opts.clock ?? { now: () => new Date() };
    this.#transactions = opts.transactions ?? true;
    this.#doc = DynamoDBDocumentClient.from(opts.client, {
      // progress is free-form JSON: numbers keep JSON's (double) meaning both ways.
      marshallOptions: { removeUndefinedValues: true, allowImpreciseNumbers: true },
      unmarshallOptions: { wrapNumbers: (v: string) => Number(v) },
    });
  }

  override get capabilities(): StoreCapabilities {
    return { atomicMultiWrite: this.#transactions, countConsistency: "eventual" };
  }

  // ---- records

  protected async readRecord(jobId: string): Promise<JobRecord | undefined> {
    try {
      const out = await this.#doc.send(
        new GetCommand({ TableName: this.tableName, Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK }, ConsistentRead: true }),
      );
      return out.Item === undefined ? undefined : jobRecordOfItem(out.Item);
    } catch (err) {
      throw storeFailure(err, `get job ${jobId}`);
    }
  }

  protected async insertRecord(record: JobRecord, keys: Required<DerivedKeys>, note: ChangeNote): Promise<boolean> {
    const item: Record<string, unknown> = {
      ...jobItem(record, keys),
      [FEED_AT]: this.#clock.now().toISOString(),
      ...(Object.keys(note).length === 0 ? {} : { [FEED_NOTE]: JSON.stringify(note) }),
    };
    return this.#putOnce(item, `create job ${record.job_id}`);
  }

  protected async updateRecord(write: RecordWrite): Promise<UpdateOutcome> {
    const { jobId } = write;
    try {
      const out = await this.#doc.send(
        new UpdateCommand({ ...this.#update(write), ReturnValues: "ALL_NEW", ReturnValuesOnConditionCheckFailure: "ALL_OLD" }),
      );
      return { written: true, record: jobRecordOfItem(out.Attributes ?? {}) };
    } catch (err) {
      if (!isConditionalFailure(err)) throw storeFailure(err, `update job ${jobId}`);
      // DynamoDB hands back the record the write lost to (low-level shape: the
      // document client does not translate error payloads). dynalite does not, so
      // read it: the record as it stands now, which is what a caller retries from.
      return { written: false, current: recordFromConditionFailure(err) ?? (await this.readRecord(jobId)) };
    }
  }

  /** `write` as one `UpdateItem`'s key and expressions (for `UpdateCommand` and a transaction's `Update` alike). */
  #update(write: RecordWrite) {
    const expr = new Expressions();
    const conditions = ["attribute_exists(pk)", ...write.conditions.map((c) => conditionExpression(c, expr))];
    const update = updateExpression(write, expr, write.feed === undefined ? undefined : this.#clock.now().toISOString());
    return {
      TableName: this.tableName,
      Key: { pk: jobPk(write.jobId), sk: JOB_ITEM_SK },
      UpdateExpression: update,
      ConditionExpression: conditions.join(" AND "),
      ...expr.attributes(),
    };
  }

  // ---- dispatches and the event log

  protected async insertDispatch(dispatch: DispatchRecord): Promise<boolean> {
    const item = { ...dispatch, pk: jobPk(dispatch.job_id), sk: dispatchSk(dispatch.attempt_id) };
    return this.#putOnce(item, `record dispatch ${dispatch.attempt_id} of job ${dispatch.job_id}`);
  }

  protected async readDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    try {
      const out = await this.#doc.send(
        new GetCommand({ TableName: this.tableName, Key: { pk: jobPk(jobId), sk: dispatchSk(attemptId) }, ConsistentRead: true }),
      );
      return out.Item === undefined ? undefined : stripKeys<DispatchRecord>(out.Item);
    } catch (err) {
      throw storeFailure(err, `get dispatch ${attemptId} of job ${jobId}`);
    }
  }

  /** Write-once per (time, id): the same entry twice (a retried request, a replayed stream record) leaves the first line. */
  protected async insertEvent(entry: EventLogEntry): Promise<void> {
    await this.#putOnce(eventItem(entry), `append an event to job ${entry.job_id}`);
  }

  /** One Query on the job's partition (`pk` and the `EVENT#` prefix), its own pages only until `limit` entries are in hand. */
  protected async queryEvents(jobId: string, after: Position | undefined, limit: number): Promise<EventLogEntry[]> {
    const pk = jobPk(jobId);
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        KeyConditionExpression: "pk = :pk AND begins_with(sk, :prefix)",
        ExpressionAttributeValues: { ":pk": pk, ":prefix": EVENT_PREFIX },
        ScanIndexForward: true,
        ConsistentRead: true,
        ...(after === undefined ? {} : { ExclusiveStartKey: { pk, sk: `${EVENT_PREFIX}${after[0]}#${after[1]}` } }),
      },
      limit,
      `list events of job ${jobId}`,
    );
    return items.map((i) => stripKeys<EventLogEntry>(i));
  }

  // ---- the listings

  /**
   * One Query on the listing's index, newest first: `all` (every job) or `by-status`
   * by recency, `owed` under the quarantined partition by when it was quarantined. A
   * position is the index's sort key (`<key>#<job id>`), and ExclusiveStartKey names
   * the table key with it, as a GSI's must.
   */
  protected async queryJobs(listing: JobListing, after: Position | undefined, limit: number): Promise<JobRecord[]> {
    const [index, hash, range, hashValue] =
      listing.kind === "quarantined"
        ? [JOB_TABLE_INDEX.owed, "owed_pk", "owed_at", QUARANTINED]
        : listing.status === undefined
          ? [JOB_TABLE_INDEX.all, "gsi2pk", "gsi2sk", ALL_JOBS]
          : [JOB_TABLE_INDEX.byStatus, "gsi1pk", "gsi1sk", statusPk(listing.status)];
    const start =
      after === undefined ? undefined : { pk: jobPk(after[1]), sk: JOB_ITEM_SK, [hash]: hashValue, [range]: `${after[0]}#${after[1]}` };
    // A marked listing: the status's records, filtered (`carriesMark`'s meaning); a filter reads what it skips.
    const mark = listing.kind === "recent" && listing.mark !== undefined ? markFilter(listing.mark, listing.dueBy) : undefined;
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        IndexName: index,
        KeyConditionExpression: "#h = :h",
        ExpressionAttributeNames: { "#h": hash, ...(mark === undefined ? {} : mark.names) },
        ExpressionAttributeValues: { ":h": hashValue, ...(mark === undefined ? {} : mark.values) },
        ...(mark === undefined ? {} : { FilterExpression: mark.filter }),
        ScanIndexForward: false,
        ...(start === undefined ? {} : { ExclusiveStartKey: start }),
      },
      limit,
      listing.kind === "quarantined" ? "list quarantined notifications" : "list jobs",
    );
    return items.map((i) => jobRecordOfItem(i));
  }

  /**
   * The key condition bounds the read to what is due: intents backing off sort after
   * it and are never read, quarantined ones live under another partition key.
   */
  protected async queryOwed(limit: number, dueBy: string | undefined): Promise<JobRecord[]> {
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        IndexName: JOB_TABLE_INDEX.owed,
        KeyConditionExpression: dueBy === undefined ? "owed_pk = :owed" : "owed_pk = :owed AND owed_at <= :due",
        ExpressionAttributeValues: { ":owed": OWED, ...(dueBy === undefined ? {} : { ":due": dueBound(dueBy) }) },
        ScanIndexForward: true,
      },
      limit,
      "list owed notifications",
    );
    return items.map((i) => jobRecordOfItem(i));
  }

  protected async queryCandidates(limit: number, dueBy: string): Promise<JobRecord[]> {
    return this.#queryDue(JOB_TABLE_INDEX.feedByJob, ["feed_job", CANDIDATES], "feed_job_sk", dueBy, limit, "list due candidates");
  }

  protected async queryAttention(limit: number, dueBy: string): Promise<JobRecord[]> {
    return this.#queryDue(JOB_TABLE_INDEX.attention, ["attn_pk", ATTENTION], "attn_at", dueBy, limit, "list jobs due for attention");
  }

  /** A sparse index's partition read by due time (`<due>#<job_id>` keys at or before `dueBy`), the oldest first. */
  async #queryDue(
    index: string,
    [hash, value]: readonly [string, string],
    range: string,
    dueBy: string,
    limit: number,
    what: string,
  ): Promise<JobRecord[]> {
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        IndexName: index,
        KeyConditionExpression: "#h = :h AND #r <= :due",
        ExpressionAttributeNames: { "#h": hash, "#r": range },
        ExpressionAttributeValues: { ":h": value, ":due": dueBound(dueBy) },
        ScanIndexForward: true,
      },
      limit,
      what,
    );
    return items.map((i) => jobRecordOfItem(i));
  }

  // ---- the change feed

  /**
   * The feed, as the stream function wrote it (`writeStreamChanges`): only rows written
   * at or before now minus the feed delay (and `upTo`). The whole feed is read hour by
   * hour in `(written_at, stream sequence)` order (`FEEDHOURS` names the hours holding
   * rows); one job's rows by the `feed-by-job` index, in stream order. Never a Scan.
   */
  protected async queryFeed(query: FeedQuery): Promise<FeedPage> {
    let upTo = new Date(this.#clock.now().getTime() - this.#feedDelayMs).toISOString();
    if (query.upTo !== undefined && query.upTo < upTo) upTo = query.upTo;
    const from = query.after === undefined ? START : decodeFeedPosition(query.after);
    const items: ChangeRow[] = [];
    let position = from;
    const take = (item: Record<string, unknown>): boolean => {
      const row = item as unknown as FeedRowItem;
      if (row.written_at > upTo) return false;
      position = { h: hourOf(row.written_at), s: row.sk, j: row.feed_job_sk };
      items.push({ ...row.row, cursor: encodeFeedPosition(position) } as ChangeRow);
      return items.length < query.limit;
    };
    if (query.jobId !== undefined) {
      await this.#queryEach(
        {
          TableName: this.tableName,
          IndexName: JOB_TABLE_INDEX.feedByJob,
          KeyConditionExpression: from.j === "" ? "feed_job = :j" : "feed_job = :j AND feed_job_sk > :after",
          ExpressionAttributeValues: { ":j": query.jobId, ...(from.j === "" ? {} : { ":after": from.j }) },
          ScanIndexForward: true,
        },
        take,
        "read a job's change feed",
      );
      return { items, cursor: encodeFeedPosition(position) };
    }
    const hours: string[] = [];
    await this.#queryEach(
      {
        TableName: this.tableName,
        KeyConditionExpression: "pk = :p AND sk BETWEEN :from AND :to",
        // A key value is never empty: "0000" sorts before every hour.
        ExpressionAttributeValues: { ":p": FEED_HOURS, ":from": from.h === "" ? "0000" : from.h, ":to": hourOf(upTo) },
        ScanIndexForward: true,
        ConsistentRead: true,
      },
      (item) => {
        hours.push(String(item.sk));
        return true;
      },
      "read the change feed's hours",
    );
    for (const hour of hours) {
      const more = await this.#queryEach(
        {
          TableName: this.tableName,
          KeyConditionExpression: "pk = :p AND sk <= :upTo",
          ExpressionAttributeValues: { ":p": feedPk(hour), ":upTo": `${upTo}#~` },
          ScanIndexForward: true,
          ConsistentRead: true,
          ...(hour === from.h && from.s !== "" ? { ExclusiveStartKey: { pk: feedPk(hour), sk: from.s } } : {}),
        },
        take,
        "read the change feed",
      );
      if (!more) break;
    }
    return { items, cursor: encodeFeedPosition(position) };
  }

  /**
   * The position at the feed's read horizon (now minus the feed delay), where a read
   * from it later picks up exactly the rows past the horizon: every row at or before it
   * is already written (that is what the delay promises), and every row written later
   * is filed after it. The whole feed: the last row at or before the horizon in the
   * horizon's hour (one Query, descending, `Limit` 1), or, when that hour holds none
   * yet, the start of that hour (no row of an earlier hour can still appear). A
   * position is a real item's key, never a made-up one: the read from it starts after
   * that item (`ExclusiveStartKey`), or at the hour's first item. One job's rows: its
   * last row at or before the horizon, read by `feed-by-job` from the newest back (the
   * rows past the horizon are the last delay's only); none: the job's start.
   *
   *   rows:   …──r1──r2──|──r3 (in flight)──r4──> written_at
   *                   horizon = now − feedDelayMs
   *   head = r2's position; after=head later reads r3, r4, …
   */
  protected async queryFeedHead(jobId: string | undefined): Promise<string> {
    const horizon = new Date(this.#clock.now().getTime() - this.#feedDelayMs).toISOString();
    const positionOf = (row: FeedRowItem): FeedPosition => ({ h: hourOf(row.written_at), s: row.sk, j: row.feed_job_sk });
    if (jobId !== undefined) {
      let head = START;
      await this.#queryEach(
        {
          TableName: this.tableName,
          IndexName: JOB_TABLE_INDEX.feedByJob,
          KeyConditionExpression: "feed_job = :j",
          ExpressionAttributeValues: { ":j": jobId },
          ScanIndexForward: false,
        },
        (item) => {
          const row = item as unknown as FeedRowItem;
          if (row.written_at > horizon) return true;
          head = positionOf(row);
          return false;
        },
        "read the head of a job's change feed",
      );
      return encodeFeedPosition(head);
    }
    const hour = hourOf(horizon);
    const [last] = await this.#queryUpTo(
      {
        TableName: this.tableName,
        KeyConditionExpression: "pk = :p AND sk <= :upTo",
        ExpressionAttributeValues: { ":p": feedPk(hour), ":upTo": `${horizon}#~` },
        ScanIndexForward: false,
        ConsistentRead: true,
      },
      1,
      "read the change feed's head",
    );
    return encodeFeedPosition(last === undefined ? { h: hour, s: "", j: "" } : positionOf(last as unknown as FeedRowItem));
  }

  /**
   * The stream function's half of the feed: the rows one stream record's write produced
   * (`feedWriteOfStreamRecord`), filed now, written with the record's marker in one
   * transaction that only commits if the marker is absent: a replayed record writes
   * nothing new. Returns how many rows were written.
   */
  async writeStreamChanges(record: DynamoDBRecord): Promise<number> {
    const write = feedWriteOfStreamRecord(record, this.#clock.now().toISOString());
    if (write === undefined) return 0;
    try {
      if (write.rows.length > 0) await this.#doc.send(new PutCommand({ TableName: this.tableName, Item: write.hour }));
      await this.#doc.send(
        new TransactWriteCommand({
          TransactItems: [
            { Put: { TableName: this.tableName, Item: write.marker, ConditionExpression: "attribute_not_exists(pk)" } },
            ...write.rows.map((row) => ({ Put: { TableName: this.tableName, Item: row } })),
            // The counts move under the same marker: a replayed record moves nothing.
            ...(write.counts === undefined ? [] : [{ Update: this.#countUpdate(write.counts.key, write.counts.move) }]),
          ],
        }),
      );
      return write.rows.length;
    } catch (err) {
      const reasons = (err as { CancellationReasons?: { Code?: string }[] }).CancellationReasons;
      if (readSdkFailure(err).name === "TransactionCanceledException" && reasons?.[0]?.Code === "ConditionalCheckFailed") return 0;
      // A DynamoDB without transactions (dynalite, the npm test peer, which has no stream
      // either) cannot keep the feed: nothing is written, and publishing goes on.
      if (readSdkFailure(err).name === "UnknownOperationException") return 0;
      throw storeFailure(err, `write the change feed rows of stream record ${record.dynamodb?.SequenceNumber ?? "?"}`);
    }
  }

  /** One counter item's move: `ADD` −1 to the status left, +1 to the one entered (an absent number counts from 0). */
  #countUpdate(key: { pk: string; sk: string }, move: { leave?: Status; enter?: Status }) {
    const parts: string[] = [];
    const names: Record<string, string> = {};
    const values: Record<string, number> = {};
    if (move.leave !== undefined) {
      parts.push("#l :l");
      names["#l"] = move.leave;
      values[":l"] = -1;
    }
    if (move.enter !== undefined) {
      parts.push("#e :e");
      names["#e"] = move.enter;
      values[":e"] = 1;
    }
    return {
      TableName: this.tableName,
      Key: key,
      UpdateExpression: `ADD ${parts.join(", ")}`,
      ExpressionAttributeNames: names,
      ExpressionAttributeValues: values,
    };
  }

  /** The counter items (one Query on their partition, at most `COUNT_SHARDS` small items), summed. */
  protected async queryCounts(): Promise<Partial<Record<Status, number>>> {
    const counts: Partial<Record<Status, number>> = {};
    await this.#queryEach(
      {
        TableName: this.tableName,
        KeyConditionExpression: "pk = :p",
        ExpressionAttributeValues: { ":p": COUNTS_PK },
        ConsistentRead: true,
      },
      (item) => {
        countsOfItem(item, counts);
        return true;
      },
      "read the counts per status",
    );
    return counts;
  }

  // ---- the atomic multi-write

  /**
   * One `TransactWriteItems`: a log line is a `Put` only if absent, a record write an
   * `Update` with its compiled condition (and its feed stamp, as `updateRecord`'s).
   * False when a condition did not hold (`TransactionCanceledException` with a
   * `ConditionalCheckFailed` reason): nothing written. Without `transactions`, or on an
   * engine that does not know the operation (dynalite): `store.unsupported`, nothing
   * written.
   */
  protected override async writeAtomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome> {
    if (!this.#transactions) throw unsupported("the store was built with transactions: false (an engine without them, such as dynalite)");
    // A failed condition cancels the whole transaction, so the parts that may fail
    // alone (a line already there, an optional update that does not hold) are found
    // from the cancellation reasons and the rest is sent again without them.
    let parts = writes.map((write, index) => ({ write, index }));
    const held = new Map<number, boolean>();
    for (let round = 0; round < ATOMIC_ROUNDS && parts.length > 0; round++) {
      const items: NonNullable<TransactWriteCommandInput["TransactItems"]> = parts.map(({ write: w }) =>
        w.kind === "insertEvent"
          ? { Put: { TableName: this.tableName, Item: eventItem(w.entry), ConditionExpression: "attribute_not_exists(pk)" } }
          : { Update: this.#update(w.write) },
      );
      try {
        await this.#doc.send(new TransactWriteCommand({ TransactItems: items }));
        for (const { write, index } of parts) if (write.kind === "update" && write.optional === true) held.set(index, true);
        parts = [];
        break;
      } catch (err) {
        const f = readSdkFailure(err);
        if (f.name === "UnknownOperationException") {
          throw unsupported(
            `this DynamoDB engine answers ${f.name}: it has no transactions (dynalite has none); build the store with transactions: false`,
            err,
          );
        }
        const reasons = (err as { CancellationReasons?: { Code?: string }[] }).CancellationReasons ?? [];
        if (f.name === "TransactionCanceledException" && reasons.some((r) => r.Code === "ConditionalCheckFailed")) {
          const failed = parts.filter((_, i) => reasons[i]?.Code === "ConditionalCheckFailed");
          if (failed.some(({ write }) => write.kind === "update" && write.optional !== true)) return { committed: false };
          // A line that is there is written; an optional update that does not hold is left out.
          for (const { write, index } of failed) if (write.kind === "update") held.set(index, false);
          parts = parts.filter((p) => !failed.includes(p));
          continue;
        }
        if (f.name === "TransactionCanceledException" && reasons.some((r) => r.Code === "TransactionConflict")) {
          throw new MamError("store.unavailable", "an atomic write lost to a concurrent transaction on the same items", { cause: err });
        }
        throw storeFailure(err, `write ${items.length} items atomically`);
      }
    }
    if (parts.length > 0) {
      throw new MamError("store.unavailable", `an atomic write of ${writes.length} parts kept losing conditions to other writers; retry`);
    }
    const optional = writes.flatMap((w, index) => (w.kind === "update" && w.optional === true ? [index] : []));
    return { committed: true, held: optional.map((index) => held.get(index) === true) };
  }

  // ---- requests

  /** A conditional put that never overwrites: false if the item is there. */
  async #putOnce(item: Record<string, unknown>, what: string): Promise<boolean> {
    try {
      await this.#doc.send(new PutCommand({ TableName: this.tableName, Item: item, ConditionExpression: "attribute_not_exists(pk)" }));
      return true;
    } catch (err) {
      if (isConditionalFailure(err)) return false;
      throw storeFailure(err, what);
    }
  }

  /** Query page by page, handing each item to `take` until it says stop; false if it stopped. */
  async #queryEach(input: QueryCommandInput, take: (item: Record<string, unknown>) => boolean, what: string): Promise<boolean> {
    let start = input.ExclusiveStartKey;
    for (;;) {
      let out: QueryCommandOutput;
      try {
        out = await this.#doc.send(new QueryCommand({ ...input, ...(start === undefined ? {} : { ExclusiveStartKey: start }) }));
      } catch (err) {
        throw storeFailure(err, what);
      }
      for (const item of out.Items ?? []) if (!take(item)) return false;
      start = out.LastEvaluatedKey;
      if (start === undefined) return true;
    }
  }

  /**
   * Query until `want` items are in hand or the partition is exhausted (a single Query
   * stops at 1 MB, so `Limit` alone does not promise them), asking each page for no
   * more than are still wanted. A start key the engine refuses is not a position this
   * store handed out: `invalidCursor()`.
   */
  async #queryUpTo(input: QueryCommandInput, want: number, what: string): Promise<Record<string, unknown>[]> {
    const items: Record<string, unknown>[] = [];
    let start = input.ExclusiveStartKey;
    do {
      let out: QueryCommandOutput;
      try {
        out = await this.#doc.send(
          new QueryCommand({ ...input, Limit: want - items.length, ...(start === undefined ? {} : { ExclusiveStartKey: start }) }),
        );
      } catch (err) {
        if (readSdkFailure(err).name === "ValidationException" && input.ExclusiveStartKey !== undefined) throw invalidCursor(err);
        throw storeFailure(err, what);
      }
      items.push(...(out.Items ?? []));
      start = out.LastEvaluatedKey;
    } while (start !== undefined && items.length < want);
    return items;
  }
}

/**
 * The job record DynamoDB returns with a failed condition
 * (`ReturnValuesOnConditionCheckFailure: ALL_OLD`), in the low-level attribute-value
 * shape (the document client leaves error payloads untranslated); undefined when the
 * failure carries none (the item does not exist, or the peer does not return it).
 */
export function recordFromConditionFailure(err: unknown): JobRecord | undefined {
  return jobRecordOfAttributes((err as { Item?: Record<string, AttributeValue> } | null)?.Item);
}

/** A marked listing's filter as a FilterExpression (`carriesMark`'s meaning). */
function markFilter(
  mark: "stale" | "overdue" | "candidate",
  dueBy: string | undefined,
): { filter: string; names: Record<string, string>; values: Record<string, unknown> } {
  switch (mark) {
    case "stale":
      return { filter: "attribute_exists(#m)", names: { "#m": "stale_since" }, values: {} };
    case "overdue":
      return { filter: "attribute_exists(#m)", names: { "#m": "overdue_since" }, values: {} };
    case "candidate":
      return { filter: "#m <= :due", names: { "#m": "candidate_at" }, values: { ":due": dueBy ?? "" } };
    default:
      return mark satisfies never;
  }
}

function unsupported(why: string, cause?: unknown): MamError {
  return new MamError("store.unsupported", `TransactWriteItems cannot run here: ${why}; nothing was written`, {
    ...(cause === undefined ? {} : { cause }),
  });
}

const eventItem = (entry: EventLogEntry): Record<string, unknown> => ({ ...entry, pk: jobPk(entry.job_id), sk: eventSk(entry) });

// ---- conditional writes, compiled

/** An expression's placeholders: `#field` for each attribute named, `:vN` for each value, only those used. */
class Expressions {
  readonly #names: Record<string, string> = {};
  readonly #values: Record<string, unknown> = {};

  /** A top-level attribute (a record field, a key attribute: `[a-z0-9_]` names). */
  name(attribute: string): string {
    this.#names[`#${attribute}`] = attribute;
    return `#${attribute}`;
  }

  value(v: unknown): string {
    const placeholder = `:v${Object.keys(this.#values).length}`;
    this.#values[placeholder] = v;
    return placeholder;
  }

  attributes(): { ExpressionAttributeNames?: Record<string, string>; ExpressionAttributeValues?: Record<string, unknown> } {
    return {
      ...(Object.keys(this.#names).length === 0 ? {} : { ExpressionAttributeNames: this.#names }),
      ...(Object.keys(this.#values).length === 0 ? {} : { ExpressionAttributeValues: this.#values }),
    };
  }
}

/** One condition as a `ConditionExpression` part, meaning what record-write.ts's `conditionHolds` says it means. */
function conditionExpression(c: RecordCondition, x: Expressions): string {
  const absentOr = (attribute: string, test: string): string => `(attribute_not_exists(${x.name(attribute)}) OR ${test})`;
  switch (c.kind) {
    case "transitionSeqIs":
      return `${x.name("transition_seq")} = ${x.value(c.seq)}`;
    case "statusIn":
      // No status allows it: a condition no existing item meets (and `IN ()` is no expression).
      if (c.statuses.length === 0) return "attribute_not_exists(pk)";
      return `${x.name("status")} IN (${c.statuses.map((s) => x.value(s)).join(", ")})`;
    case "evidenceSeqIs": {
      // An item from before evidence_seq existed is at 0.
      const is = `${x.name("evidence_seq")} = ${x.value(c.seq)}`;
      return c.seq === 0 ? absentOr("evidence_seq", is) : is;
    }
    case "latestAttemptIs":
      return `${x.name("latest_attempt")} = ${x.value(c.attempt)}`;
    case "latestAttemptAbsentOrIs":
      return absentOr("latest_attempt", `${x.name("latest_attempt")} = ${x.value(c.attempt)}`);
    case "latestAttemptBelow": {
      // Absent counts 0, which is below every attempt id (they start at 1) but not below 0.
      const below = `${x.name("latest_attempt")} < ${x.value(c.attempt)}`;
      return c.attempt > 0 ? absentOr("latest_attempt", below) : below;
    }
    case "observationsRevIs": {
      // No observations yet: rev 0.
      const is = `${x.name("observations")}.rev = ${x.value(c.rev)}`;
      return c.rev === 0 ? absentOr("observations", is) : is;
    }
    case "candidateIs":
      return `${x.name("candidate_at")} = ${x.value(c.at)}`;
    case "attentionIs":
      return `${x.name("attention_at")} = ${x.value(c.at)}`;
    case "intentIs":
      return `${x.name("pending_notification")}.id = ${x.value(c.id)}`;
    case "noIntent":
      return `attribute_not_exists(${x.name("pending_notification")})`;
    case "usageIs": {
      const usage = x.name("agent_usage");
      const counted = `(${usage}.events = ${x.value(c.events)} AND ${usage}.bytes = ${x.value(c.bytes)})`;
      return c.events === 0 && c.bytes === 0 ? absentOr("agent_usage", counted) : counted;
    }
    case "leaseHeldBy":
      return `${x.name(c.field)}.id = ${x.value(c.id)}`;
    case "leaseFree": {
      const lease = x.name(c.field);
      return absentOr(c.field, `${lease}.expires_at <= ${x.value(c.at)} OR ${lease}.attempt_id < ${x.value(c.attempt)}`);
    }
    default:
      return c satisfies never;
  }
}

/**
 * What `write` changes, as an `UpdateExpression`: the fields set and unset, each counter
 * bumped (absent counts 0), the index attributes of the derived keys it moves, and,
 * for a write the feed tells (`feedAt` given), the feed's stamp and note.
 */
function updateExpression(write: RecordWrite, x: Expressions, feedAt: string | undefined): string {
  const sets: string[] = [];
  const removes: string[] = [];
  for (const [field, value] of Object.entries(write.set)) sets.push(`${x.name(field)} = ${x.value(value)}`);
  for (const field of write.unset) removes.push(x.name(field));
  for (const counter of write.bump) {
    const c = x.name(counter);
    sets.push(`${c} = if_not_exists(${c}, ${x.value(0)}) + ${x.value(1)}`);
  }
  const keys = indexAttributes(write.jobId, write.keys);
  for (const [attribute, value] of Object.entries(keys.set)) sets.push(`${x.name(attribute)} = ${x.value(value)}`);
  for (const attribute of keys.remove) removes.push(x.name(attribute));
  if (feedAt !== undefined) {
    sets.push(`${x.name(FEED_AT)} = ${x.value(feedAt)}`);
    const note = write.feed ?? {};
    if (Object.keys(note).length === 0) removes.push(x.name(FEED_NOTE));
    else sets.push(`${x.name(FEED_NOTE)} = ${x.value(JSON.stringify(note))}`);
  }
  return [sets.length > 0 ? `SET ${sets.join(", ")}` : "", removes.length > 0 ? `REMOVE ${removes.join(", ")}` : ""].join(" ").trim();
}

// ---- the feed's own positions

/** A feed position: the hour and sort key of the last row read (whole feed), and its key in its job's rows. */
interface FeedPosition {
  readonly h: string;
  readonly s: string;
  readonly j: string;
}

const START: FeedPosition = { h: "", s: "", j: "" };

function encodeFeedPosition(p: FeedPosition): string {
  return JSON.stringify([p.h, p.s, p.j]);
}

function decodeFeedPosition(raw: string): FeedPosition {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (e) {
    throw invalidCursor(e);
  }
  if (!Array.isArray(value) || value.length !== 3 || !value.every((v) => typeof v === "string" && v.length <= 256)) throw invalidCursor();
  const [h, s, j] = value as [string, string, string];
  // Within the keys this feed writes, so every Query's key condition still holds for it.
  if ((h !== "" && !/^\d{4}-\d{2}-\d{2}T\d{2}$/.test(h)) || (s !== "" && !s.startsWith(h)) || (j !== "" && !/^\d{40}#\d+$/.test(j))) {
    throw invalidCursor();
  }
  return { h, s, j };
}
