import type { AttributeValue, DynamoDBClient } from "@aws-sdk/client-dynamodb";
import {
  DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  type PutCommandInput,
  QueryCommand,
  type QueryCommandInput,
  type QueryCommandOutput,
  UpdateCommand,
} from "@aws-sdk/lib-dynamodb";
import {
  type ChangeQuery,
  conflictFor,
  type DispatchRecord,
  EVENT_PAGE_MAX_BYTES,
  type EventLogEntry,
  type EvidenceChange,
  type FeedPage,
  invalidCursor,
  type JobChange,
  type JobRecord,
  type JobStore,
  MamError,
  NON_TERMINAL,
  type NotificationIntent,
  type OwedQuery,
  type Page,
  type Status,
} from "@mam/core";
import {
  ALL_JOBS,
  dispatchSk,
  dueBound,
  EVENT_PREFIX,
  eventSk,
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
}

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

  /**
   * The document client shares the low-level client's config object, translation
   * options included (lib-dynamodb stores them there): do not build a differently
   * configured document client from the same low-level client.
   */
  constructor(opts: DynamoJobStoreOptions) {
    this.tableName = opts.tableName;
    this.#doc = DynamoDBDocumentClient.from(opts.client, {
      // progress is free-form JSON: numbers keep JSON's (double) meaning both ways.
      marshallOptions: { removeUndefinedValues: true, allowImpreciseNumbers: true },
      unmarshallOptions: { wrapNumbers: (v: string) => Number(v) },
    });
  }

  async listChanges(_query: ChangeQuery): Promise<FeedPage> {
    throw new MamError("internal", "the DynamoDB change feed is not built yet");
  }

  async create(record: JobRecord): Promise<void> {
    await this.#putOnce(jobItem(record), () => new MamError("job.exists", `job ${record.job_id} already exists`), "create job");
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    return this.#read(jobId);
  }

  async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.#update(jobId, expectedSeq, change, true);
  }

  async recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#update(jobId, null, { from: NON_TERMINAL, set: change.set ?? {}, evidence: { ...change.guard, bump: true } }, false);
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

  async replaceNotification(jobId: string, intent: NotificationIntent): Promise<void> {
    if (!(await this.#writeIntent(jobId, intent, "replace", "attribute_exists(pk)"))) throw notFound(jobId);
  }

  async reviseNotification(jobId: string, intent: NotificationIntent): Promise<boolean> {
    // Only the intent the sweep (or the operator) read: a newer one, or none, is left alone.
    return this.#writeIntent(jobId, intent, "revise", "pending_notification.id = :id", { ":id": intent.id });
  }

  /** Bookkeeping: write `intent` as the owed notification, and its place in the owed index, if `condition` holds. */
  async #writeIntent(
    jobId: string,
    intent: NotificationIntent,
    what: string,
    condition: string,
    values: Record<string, unknown> = {},
  ): Promise<boolean> {
    const keys = owedKeys(intent, jobId);
    try {
      await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: "SET pending_notification = :intent, owed_pk = :owed, owed_at = :owedAt",
          ConditionExpression: condition,
          ExpressionAttributeValues: { ":intent": intent, ":owed": keys.owed_pk, ":owedAt": keys.owed_at, ...values },
        }),
      );
      return true;
    } catch (err) {
      if (isConditionalFailure(err)) return false;
      throw storeFailure(err, `${what} the notification of job ${jobId}`);
    }
  }

  async settleNotification(jobId: string, intentId: string): Promise<boolean> {
    try {
      await this.#doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: jobPk(jobId), sk: JOB_ITEM_SK },
          UpdateExpression: "REMOVE pending_notification, owed_pk, owed_at",
          // Only the intent that was sent: a newer one written meanwhile stays owed.
          ConditionExpression: "pending_notification.id = :id",
          ExpressionAttributeValues: { ":id": intentId },
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
