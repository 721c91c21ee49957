import type { AttributeValue, DynamoDBClient } from "@aws-sdk/client-dynamodb";
import {
  DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  type PutCommandInput,
  QueryCommand,
  type QueryCommandInput,
  type QueryCommandOutput,
  TransactWriteCommand,
  UpdateCommand,
} from "@aws-sdk/lib-dynamodb";
import {
  type AgentUsage,
  type ChangeNote,
  type ChangeQuery,
  type ChangeRow,
  type Clock,
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
} from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import {
  ALL_JOBS,
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
  JOB_ITEM_SK,
  jobItem,
  jobPk,
  jobRecordOfAttributes,
  jobRecordOfItem,
  OWED,
  owedKeys,
  QUARANTINED,
  recencyKey,
  statusPk,
  stripKeys,
} from "./job-item.ts";
import { JOB_TABLE_INDEX } from "./job-table.ts";
import { readSdkFailure, storeFailure } from "./sdk-errors.ts";

export interface DynamoJobStoreOptions {
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
  /** What "now" is for the feed delay; the system clock by default. */
  readonly clock?: Clock;
}

/** The feed delay's default: above the stream function's bounded feed write (2 calls of at most ~10 s each) and clock skew. */
export const DEFAULT_FEED_DELAY_MS = 30_000;

const isConditionalFailure = (err: unknown): boolean => (err as { name?: string } | null)?.name === "ConditionalCheckFailedException";

/** Cursor: the index it pages and the key of the last item returned. */
interface Cursor {
  readonly i: string;
  readonly k: Record<string, string>;
}

function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify(c), "utf8").toString("base64url");
}

function decodeCursor(raw: string, index: string, hashKey: string, hashValue: string): Record<string, string> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(raw, "base64url").toString("utf8"));
  } catch (e) {
    throw invalidCursor(e);
  }
  const c = parsed as Partial<Cursor> | undefined;
  const keyValid =
    c !== undefined &&
    c !== null &&
    c.i === index &&
    typeof c.k === "object" &&
    c.k !== null &&
    Object.values(c.k).every((v) => typeof v === "string") &&
    c.k[hashKey] === hashValue;
  if (!keyValid) throw invalidCursor();
  return c.k as Record<string, string>;
}

/** An event page's cursor: the sort key of the last entry handed out (the partition is the job's own). */
function encodeEventCursor(sk: string): string {
  return Buffer.from(JSON.stringify({ e: sk }), "utf8").toString("base64url");
}

function decodeEventCursor(raw: string): string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(raw, "base64url").toString("utf8"));
  } catch (e) {
    throw invalidCursor(e);
  }
  const sk = (parsed as { e?: unknown } | null)?.e;
  // Within the job's events, so the Query's key condition still holds for it.
  if (typeof sk === "string" && sk.startsWith(EVENT_PREFIX) && sk.length <= 1024) return sk;
  throw invalidCursor();
}

/**
 * The job store on DynamoDB (see `job-table.ts` for the layout).
 *
 * Every state change is one `UpdateItem` whose `ConditionExpression` carries the
 * compare-and-swap (`transition_seq` and status); the owed notification lives in the
 * job item, so a transition and its intent commit together without transactions.
 * A lost race is turned into core's `TransitionConflict` carrying the record it lost
 * to: DynamoDB returns that record with the failure (`ReturnValuesOnConditionCheckFailure`);
 * a peer that does not (dynalite) costs one consistent read after the failure.
 *
 * What every store must keep (job ids safe in a key, limits, which fields a change
 * writes, a valid record on create, the cursor and limit refusals) is core's
 * `guardJobStore`, in front of this adapter; the item layout is `job-item.ts`. This
 * class only translates to DynamoDB requests.
 */
export class DynamoJobStore implements JobStore {
  readonly tableName: string;
  readonly #doc: DynamoDBDocumentClient;
  readonly #feedDelayMs: number;
  readonly #clock: Clock;

  /**
   * The document client shares the low-level client's config object, translation
   * options included (lib-dynamodb stores them there): do not build a differently
   * configured document client from the same low-level client.
   */
  constructor(opts: DynamoJobStoreOptions) {
    this.tableName = opts.tableName;
    this.#feedDelayMs = opts.feedDelayMs ?? DEFAULT_FEED_DELAY_MS;
    this.#clock = opts.clock ?? { now: () => new Date() };
    this.#doc = DynamoDBDocumentClient.from(opts.client, {
      // progress is free-form JSON: numbers keep JSON's (double) meaning both ways.
      marshallOptions: { removeUndefinedValues: true, allowImpreciseNumbers: true },
      unmarshallOptions: { wrapNumbers: (v: string) => Number(v) },
    });
  }

  /**
   * The feed, as the stream function wrote it (`writeStreamChanges`): only rows written
   * at or before now minus the feed delay. The whole feed is read hour by hour in
   * `(written_at, stream sequence)` order (`FEEDHOURS` names the hours holding rows);
   * one job's rows by the `feed-by-job` index, in stream order. Never a Scan.
   */
  async listChanges(query: ChangeQuery): Promise<FeedPage> {
    let upTo = new Date(this.#clock.now().getTime() - this.#feedDelayMs).toISOString();
    if (query.upTo !== undefined && sortableTimeOf(query.upTo) < upTo) upTo = sortableTimeOf(query.upTo);
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
    } else {
      const lastHour = hourOf(upTo);
      const hours: string[] = [];
      await this.#queryEach(
        {
          TableName: this.tableName,
          KeyConditionExpression: "pk = :p AND sk BETWEEN :from AND :to",
          // A key value is never empty: "0000" sorts before every hour.
          ExpressionAttributeValues: { ":p": FEED_HOURS, ":from": from.h === "" ? "0000" : from.h, ":to": lastHour },
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
    }
    return { items, cursor: encodeFeedPosition(position) };
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
      await this.#doc.send(new PutCommand({ TableName: this.tableName, Item: write.hour }));
      await this.#doc.send(
        new TransactWriteCommand({
          TransactItems: [
            { Put: { TableName: this.tableName, Item: write.marker, ConditionExpression: "attribute_not_exists(pk)" } },
            ...write.rows.map((row) => ({ Put: { TableName: this.tableName, Item: row } })),
          ],
        }),
      );
      return write.rows.length;
    } catch (err) {
      const reasons = (err as { name?: string; CancellationReasons?: { Code?: string }[] }).CancellationReasons;
      if ((err as { name?: string }).name === "TransactionCanceledException" && reasons?.[0]?.Code === "ConditionalCheckFailed") return 0;
      // A DynamoDB without transactions (dynalite, the npm test peer, which has no stream
      // either) cannot keep the feed: nothing is written, and publishing goes on.
      if ((err as { name?: string }).name === "UnknownOperationException") return 0;
      throw storeFailure(err, `write the change feed rows of stream record ${record.dynamodb?.SequenceNumber ?? "?"}`);
    }
  }

  /**
   * Every job write leaves, for the stream function, its note on the item (or removes
   * the last one: the service's own) and its time by this store's clock (`FEED_AT`).
   */
  #noteUpdate(note: ChangeNote | undefined, values: Record<string, unknown>, sets: string[], removes: string[]): void {
    values[":feedAt"] = this.#clock.now().toISOString();
    sets.push(`${FEED_AT} = :feedAt`);
    if (note === undefined) {
      removes.push(FEED_NOTE);
      return;
    }
    values[":feedNote"] = JSON.stringify(note);
    sets.push(`${FEED_NOTE} = :feedNote`);
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

  async create(record: JobRecord, note?: ChangeNote): Promise<void> {
    const item = jobItem(record);
    item[FEED_AT] = this.#clock.now().toISOString();
    if (note !== undefined) item[FEED_NOTE] = JSON.stringify(note);
    await this.#putOnce(item, () => new MamError("job.exists", `job ${record.job_id} already exists`), "create job");
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    return this.#read(jobId);
  }

  async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.#update(jobId, expectedSeq, change, true);
  }

  async recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#update(jobId, null, evidenceWriteOf(change), false);
  }

  /**
   * A write of the job item alone whose condition may lose: false when it lost to the
   * item as it stands (DynamoDB hands that item back with the failure; dynalite does
   * not, so it is read), `job.notFound` when there is no item, else the store's failure.
   */
  async #lostOrMissing(err: unknown, jobId: string, what: string): Promise<false> {
    if (!isConditionalFailure(err)) throw storeFailure(err, what);
    if ((recordFromConditionFailure(err) ?? (await this.#read(jobId))) === undefined) throw notFound(jobId);
    return false;
  }

  /**
   * One `UpdateItem` of the lease's attribute alone (SET or REMOVE), conditional on it:
   * free (absent, `expires_at <= :freeAt` as ISO strings of one format, or an older
   * attempt's, on a job that is not terminal) or held by `:id`. Like `chargeUsage`, it
   * leaves the feed's note and time as they are: no feed row, no new intent.
   */
  async holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    const field = LEASE_FIELDS[kind];
    const names: Record<string, string> = { "#lease": field };
    const values: Record<string, unknown> = lease === null ? {} : { ":lease": lease };
    let condition: string;
    if ("heldBy" in expect) {
      condition = "#lease.id = :id";
      values[":id"] = expect.heldBy;
    } else {
      names["#status"] = "status";
      const statuses = NON_TERMINAL.map((s, i) => {
        values[`:s${i}`] = s;
        return `:s${i}`;
      });
      values[":freeAt"] = expect.freeAt;
      values[":attempt"] = lease?.attempt_id ?? 0;
      condition = `#status IN (${statuses.join(", ")}) AND (attribute_not_exists(#lease) OR #lease.expires_at <= :freeAt OR #lease.attempt_id < :attempt)`;
    }
    try {
      await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: lease === null ? "REMOVE #lease" : "SET #lease = :lease",
          ReturnValuesOnConditionCheckFailure: "ALL_OLD",
          ConditionExpression: `attribute_exists(pk) AND (${condition})`,
          ExpressionAttributeNames: names,
          ...(Object.keys(values).length === 0 ? {} : { ExpressionAttributeValues: values }),
        }),
      );
      return true;
    } catch (err) {
      return this.#lostOrMissing(err, jobId, `hold the ${kind} lease of job ${jobId}`);
    }
  }

  /**
   * One `UpdateItem` of `agent_usage` alone, conditional on the stored counts (an item
   * without it counts 0 and 0). It leaves the feed's note and time as they are: the
   * change feed has no row for it, and the stream function sees no new intent in it.
   */
  async chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    const events = prior?.events ?? 0;
    const bytes = prior?.bytes ?? 0;
    const counted = "agent_usage.events = :events AND agent_usage.bytes = :bytes";
    try {
      await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: "SET agent_usage = :next",
          ReturnValuesOnConditionCheckFailure: "ALL_OLD",
          ConditionExpression: `attribute_exists(pk) AND (${events === 0 && bytes === 0 ? `attribute_not_exists(agent_usage) OR (${counted})` : counted})`,
          ExpressionAttributeValues: { ":next": next, ":events": events, ":bytes": bytes },
        }),
      );
      return true;
    } catch (err) {
      return this.#lostOrMissing(err, jobId, `charge the usage of job ${jobId}`);
    }
  }

  /**
   * One `UpdateItem` whose condition carries every requirement: a transition (bumping
   * `transition_seq`) or an evidence write (not), with the evidence conditions on the
   * same item.
   */
  async #update(jobId: string, expectedSeq: number | null, change: JobChange, bumpTransition: boolean): Promise<JobRecord> {
    const evidence = change.evidence ?? {};
    if (change.from.length === 0) {
      // No status allows it: nothing to write; say why against the current record.
      const current = await this.#read(jobId);
      if (current === undefined) throw notFound(jobId);
      throw conflictFor(current, expectedSeq, change.from, evidence);
    }

    const names: Record<string, string> = { "#status": "status" };
    const values: Record<string, unknown> = {};
    const sets: string[] = [];
    const removes: string[] = [];
    const unset = new Set<string>(change.unset ?? []);
    if (bumpTransition || evidence.bump) values[":one"] = 1;
    if (bumpTransition) sets.push("transition_seq = transition_seq + :one");
    if (evidence.bump) {
      values[":zero"] = 0;
      sets.push("evidence_seq = if_not_exists(evidence_seq, :zero) + :one");
    }

    let n = 0;
    const fields: [string, unknown][] = Object.entries(change.set);
    if (evidence.newAttempt !== undefined) fields.push(["latest_attempt", evidence.newAttempt]);
    // The guard let through only fields a change may write, none both set and unset.
    for (const [field, value] of fields) {
      if (value === undefined) continue;
      names[`#f${n}`] = field;
      values[`:v${n}`] = value;
      sets.push(`#f${n} = :v${n}`);
      n += 1;
    }
    for (const field of unset) {
      names[`#f${n}`] = field;
      removes.push(`#f${n}`);
      n += 1;
    }

    // Keep the index attributes in step with the fields they are derived from.
    const set = change.set;
    if (set.status !== undefined) {
      values[":gsi1pk"] = statusPk(set.status);
      sets.push("gsi1pk = :gsi1pk");
    }
    if (set.updated_at !== undefined) {
      values[":recency"] = recencyKey(set.updated_at, jobId);
      sets.push("gsi1sk = :recency", "gsi2sk = :recency");
    }
    if (set.pending_notification !== undefined) {
      const keys = owedKeys(set.pending_notification, jobId);
      values[":owed"] = keys.owed_pk;
      values[":owedAt"] = keys.owed_at;
      sets.push("owed_pk = :owed", "owed_at = :owedAt");
    } else if (unset.has("pending_notification")) {
      removes.push("owed_pk", "owed_at");
    }
    this.#noteUpdate(change.note, values, sets, removes);

    const conditions = ["attribute_exists(pk)"];
    if (expectedSeq !== null) {
      values[":expected"] = expectedSeq;
      conditions.push("transition_seq = :expected");
    }
    const fromKeys = change.from.map((s, i) => {
      values[`:s${i}`] = s;
      return `:s${i}`;
    });
    conditions.push(`#status IN (${fromKeys.join(", ")})`);
    if (evidence.seq !== undefined) {
      values[":evidenceSeq"] = evidence.seq;
      // An item from before evidence_seq existed is at 0.
      conditions.push(
        evidence.seq === 0 ? "(attribute_not_exists(evidence_seq) OR evidence_seq = :evidenceSeq)" : "evidence_seq = :evidenceSeq",
      );
    }
    if (evidence.attempt !== undefined) {
      values[":attempt"] = evidence.attempt;
      conditions.push("latest_attempt = :attempt");
    }
    if (evidence.currentAttempt !== undefined) {
      values[":currentAttempt"] = evidence.currentAttempt;
      conditions.push("(attribute_not_exists(latest_attempt) OR latest_attempt = :currentAttempt)");
    }
    if (evidence.newAttempt !== undefined) {
      values[":newAttempt"] = evidence.newAttempt;
      conditions.push("(attribute_not_exists(latest_attempt) OR latest_attempt < :newAttempt)");
    }

    let updateExpression = `SET ${sets.join(", ")}`;
    if (removes.length > 0) updateExpression += ` REMOVE ${removes.join(", ")}`;

    try {
      const out = await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: updateExpression,
          ConditionExpression: conditions.join(" AND "),
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values,
          ReturnValues: "ALL_NEW",
          ReturnValuesOnConditionCheckFailure: "ALL_OLD",
        }),
      );
      return jobRecordOfItem(out.Attributes ?? {});
    } catch (err) {
      if (!isConditionalFailure(err)) throw storeFailure(err, `update job ${jobId}`);
      // DynamoDB hands back the record the write lost to (low-level shape: the
      // document client does not translate error payloads). dynalite does not, so
      // read it: the record as it stands now, which is what a caller retries from.
      const current = recordFromConditionFailure(err) ?? (await this.#read(jobId));
      if (current === undefined) throw notFound(jobId);
      throw conflictFor(current, expectedSeq, change.from, evidence);
    }
  }

  async replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    if (!(await this.#writeIntent(jobId, intent, "replace", "attribute_exists(pk)", {}, note))) throw notFound(jobId);
  }

  async reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    // Only the intent the sweep (or the operator) read: a newer one, or none, is left alone.
    return this.#writeIntent(jobId, intent, "revise", "pending_notification.id = :id", { ":id": intent.id }, note);
  }

  /** Bookkeeping: write `intent` as the owed notification, and its place in the owed index, if `condition` holds. */
  async #writeIntent(
    jobId: string,
    intent: NotificationIntent,
    what: string,
    condition: string,
    values: Record<string, unknown> = {},
    note?: ChangeNote,
  ): Promise<boolean> {
    const keys = owedKeys(intent, jobId);
    const sets = ["pending_notification = :intent", "owed_pk = :owed", "owed_at = :owedAt"];
    const removes: string[] = [];
    const noteValues: Record<string, unknown> = {};
    this.#noteUpdate(note, noteValues, sets, removes);
    try {
      await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: `SET ${sets.join(", ")}${removes.length > 0 ? ` REMOVE ${removes.join(", ")}` : ""}`,
          ConditionExpression: condition,
          ExpressionAttributeValues: { ":intent": intent, ":owed": keys.owed_pk, ":owedAt": keys.owed_at, ...values, ...noteValues },
        }),
      );
      return true;
    } catch (err) {
      if (isConditionalFailure(err)) return false;
      throw storeFailure(err, `${what} the notification of job ${jobId}`);
    }
  }

  /**
   * Two writes, not one transaction (dynalite, the test peer, has no
   * TransactWriteItems): the log line first, then the settle, conditional on the
   * intent id as `settleNotification`'s. A crash between leaves the line logged and
   * the intent owed; the sweep sends it again and the subscriber drops the duplicate.
   */
  async settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    await this.appendEvent(entry);
    return this.settleNotification(entry.job_id, intentId, note);
  }

  async settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    const sets: string[] = [];
    const removes = ["pending_notification", "owed_pk", "owed_at"];
    const values: Record<string, unknown> = { ":id": intentId };
    this.#noteUpdate(note, values, sets, removes);
    try {
      await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: `${sets.length > 0 ? `SET ${sets.join(", ")} ` : ""}REMOVE ${removes.join(", ")}`,
          // Only the intent that was sent: a newer one written meanwhile stays owed.
          ConditionExpression: "pending_notification.id = :id",
          ExpressionAttributeValues: values,
        }),
      );
      return true;
    } catch (err) {
      if (isConditionalFailure(err)) return false;
      throw storeFailure(err, `settle the notification of job ${jobId}`);
    }
  }

  async list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const limit = query.limit;
    const byStatus = query.status !== undefined;
    const index = byStatus ? JOB_TABLE_INDEX.byStatus : JOB_TABLE_INDEX.all;
    const [hashKey, rangeKey] = byStatus ? ["gsi1pk", "gsi1sk"] : ["gsi2pk", "gsi2sk"];
    const hashValue = query.status !== undefined ? statusPk(query.status) : ALL_JOBS;
    const startKey = query.cursor !== undefined ? decodeCursor(query.cursor, index, hashKey, hashValue) : undefined;

    // Ask for one more than a page: the cursor is then exact (absent on the last page)
    // instead of DynamoDB's "maybe more" LastEvaluatedKey.
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        IndexName: index,
        KeyConditionExpression: "#h = :h",
        ExpressionAttributeNames: { "#h": hashKey },
        ExpressionAttributeValues: { ":h": hashValue },
        ScanIndexForward: false,
        ...(startKey !== undefined ? { ExclusiveStartKey: startKey } : {}),
      },
      limit + 1,
      "list jobs",
    );
    return jobPage(items, limit, index, hashKey, rangeKey);
  }

  async listOwed(limit: number, query: OwedQuery = {}): Promise<readonly JobRecord[]> {
    // The key condition bounds the read to what is due: intents backing off sort after
    // it and are never read, quarantined ones live under another partition key.
    const due = query.dueBy === undefined ? {} : { ":due": dueBound(query.dueBy) };
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        IndexName: JOB_TABLE_INDEX.owed,
        KeyConditionExpression: query.dueBy === undefined ? "owed_pk = :owed" : "owed_pk = :owed AND owed_at <= :due",
        ExpressionAttributeValues: { ":owed": OWED, ...due },
        ScanIndexForward: true,
      },
      limit,
      "list owed notifications",
    );
    return items.map((i) => jobRecordOfItem(i));
  }

  async listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const limit = query.limit;
    const index = JOB_TABLE_INDEX.owed;
    const startKey = query.cursor !== undefined ? decodeCursor(query.cursor, index, "owed_pk", QUARANTINED) : undefined;
    const items = await this.#queryUpTo(
      {
        TableName: this.tableName,
        IndexName: index,
        KeyConditionExpression: "owed_pk = :q",
        ExpressionAttributeValues: { ":q": QUARANTINED },
        ScanIndexForward: false,
        ...(startKey !== undefined ? { ExclusiveStartKey: startKey } : {}),
      },
      limit + 1,
      "list quarantined notifications",
    );
    return jobPage(items, limit, index, "owed_pk", "owed_at");
  }

  async recordDispatch(dispatch: DispatchRecord): Promise<void> {
    await this.#putOnce(
      { ...dispatch, pk: jobPk(dispatch.job_id), sk: dispatchSk(dispatch.attempt_id) },
      () => new MamError("dispatch.exists", `attempt ${dispatch.attempt_id} of job ${dispatch.job_id} was already dispatched`),
      "record dispatch",
    );
  }

  async getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    try {
      const out = await this.#doc.send(
        new GetCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: dispatchSk(attemptId) },
          ConsistentRead: true,
        }),
      );
      return out.Item === undefined ? undefined : stripKeys<DispatchRecord>(out.Item);
    } catch (err) {
      throw storeFailure(err, `get dispatch ${attemptId} of job ${jobId}`);
    }
  }

  async appendEvent(entry: EventLogEntry): Promise<void> {
    // Write-once per (time, id): appending the same entry twice (a retried request,
    // a replayed stream record) leaves one line, and never rewrites the first.
    await this.#putOnce({ ...entry, pk: jobPk(entry.job_id), sk: eventSk(entry) }, () => undefined, "append event");
  }

  /**
   * One Query on the job's partition (key condition `pk` and the `EVENT#` prefix),
   * followed by DynamoDB's own pages (each at most 1 MB) only until this page is
   * full, by count or by bytes. The cursor is the sort key of the last entry handed
   * out, used as the next Query's ExclusiveStartKey under the same partition.
   */
  async listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    const limit = query.limit;
    const after = query.cursor === undefined ? undefined : decodeEventCursor(query.cursor);
    const pk = jobPk(jobId);
    const items: EventLogEntry[] = [];
    let bytes = 0;
    let lastSk: string | undefined;
    let startKey: Record<string, unknown> | undefined = after === undefined ? undefined : { pk, sk: after };
    do {
      let out: QueryCommandOutput;
      try {
        out = await this.#doc.send(
          new QueryCommand({
            TableName: this.tableName,
            KeyConditionExpression: "pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues: { ":pk": pk, ":prefix": EVENT_PREFIX },
            ScanIndexForward: true,
            ConsistentRead: true,
            // One more than the page needs: if it comes, the page has a next one.
            Limit: limit + 1 - items.length,
            ...(startKey === undefined ? {} : { ExclusiveStartKey: startKey }),
          }),
        );
      } catch (err) {
        if (readSdkFailure(err).name === "ValidationException" && after !== undefined) throw invalidCursor(err);
        throw storeFailure(err, `list events of job ${jobId}`);
      }
      for (const item of out.Items ?? []) {
        const entry = stripKeys<EventLogEntry>(item);
        const size = Buffer.byteLength(JSON.stringify(entry), "utf8");
        if (items.length === limit || (items.length > 0 && bytes + size > EVENT_PAGE_MAX_BYTES)) {
          return { items, cursor: encodeEventCursor(lastSk!) };
        }
        items.push(entry);
        bytes += size;
        lastSk = String(item.sk);
      }
      startKey = out.LastEvaluatedKey;
    } while (startKey !== undefined);
    return { items };
  }

  async #read(jobId: string): Promise<JobRecord | undefined> {
    try {
      const out = await this.#doc.send(
        new GetCommand({ TableName: this.tableName, Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK }, ConsistentRead: true }),
      );
      return out.Item === undefined ? undefined : jobRecordOfItem(out.Item);
    } catch (err) {
      throw storeFailure(err, `get job ${jobId}`);
    }
  }

  /** A conditional put that never overwrites; `taken` says what an existing item means. */
  async #putOnce(item: Record<string, unknown>, taken: () => MamError | undefined, what: string): Promise<void> {
    const input: PutCommandInput = {
      TableName: this.tableName,
      Item: item,
      ConditionExpression: "attribute_not_exists(pk)",
    };
    try {
      await this.#doc.send(new PutCommand(input));
    } catch (err) {
      if (isConditionalFailure(err)) {
        const e = taken();
        if (e !== undefined) throw e;
        return;
      }
      throw storeFailure(err, what);
    }
  }

  /**
   * Query until `want` items are in hand or the partition is exhausted: a single
   * Query stops at 1 MB, so `Limit` alone does not promise `want` items.
   */
  async #queryUpTo(input: QueryCommandInput, want: number, what: string): Promise<Record<string, unknown>[]> {
    const items: Record<string, unknown>[] = [];
    let startKey = input.ExclusiveStartKey;
    do {
      let out: QueryCommandOutput;
      try {
        out = await this.#doc.send(
          new QueryCommand({
            ...input,
            Limit: want - items.length,
            ...(startKey !== undefined ? { ExclusiveStartKey: startKey } : {}),
          }),
        );
      } catch (err) {
        if (readSdkFailure(err).name === "ValidationException" && input.ExclusiveStartKey !== undefined) throw invalidCursor(err);
        throw storeFailure(err, what);
      }
      items.push(...(out.Items ?? []));
      startKey = out.LastEvaluatedKey;
    } while (startKey !== undefined && items.length < want);
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

/**
 * A page of job records out of `limit + 1` items read from an index: the cursor (the
 * last item's table and index keys) only when another page exists.
 */
function jobPage(items: Record<string, unknown>[], limit: number, index: string, hashKey: string, rangeKey: string): Page<JobRecord> {
  const page = items.slice(0, limit);
  const last = page[page.length - 1];
  const records = page.map((i) => jobRecordOfItem(i));
  if (items.length <= limit || last === undefined) return { items: records };
  const key = { pk: String(last.pk), sk: String(last.sk), [hashKey]: String(last[hashKey]), [rangeKey]: String(last[rangeKey]) };
  return { items: records, cursor: encodeCursor({ i: index, k: key }) };
}

function notFound(jobId: string): MamError {
  return new MamError("job.notFound", `no job ${jobId}`);
}

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

function sortableTimeOf(iso: string): string {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? iso : new Date(t).toISOString();
}
