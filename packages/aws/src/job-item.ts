import type { AttributeValue } from "@aws-sdk/client-dynamodb";
import { unmarshall } from "@aws-sdk/util-dynamodb";
import {
  type ChangeNote,
  ChangeNoteSchema,
  type ChangeRow,
  changeRowsOf,
  type DerivedKeys,
  type EventLogEntry,
  type JobRecord,
  JobRecordSchema,
  keysOf,
  MamError,
  type Status,
  type StatusCountMove,
  StatusSchema,
  sortableTime,
  statusCountMove,
  zodIssues,
} from "@mam/core";
import type * as Lambda from "aws-lambda";
import { JOB_TABLE_DEFINITION } from "./table-definition.ts";

/**
 * How a job and what it owns are laid out as items of the job table (see
 * `job-table.ts` for the keys and indexes), and how an item, a failed condition's
 * item or a stream image reads back as a record: the one place that knows. The store
 * (`dynamo-job-store.ts`) and the stream function (`functions/job-stream.ts`) both
 * read items through here. Light on purpose: no client, so the stream Lambda's
 * bundle takes only the unmarshaller with it.
 */

/** The table's key and index attributes: derived, never part of a record. */
export const KEY_ATTRIBUTES: readonly string[] = JOB_TABLE_DEFINITION.AttributeDefinitions.map((a) => a.AttributeName);

/**
 * The note of the job item's last write (core's `ChangeNote`, as JSON): who made it,
 * for the feed rows the stream function derives from that write. Never part of a record.
 */
export const FEED_NOTE = "feed_note";

/**
 * When the job item's last write was made, by the writer's clock, to the millisecond:
 * the `at` of the feed rows the stream function derives from that write (a stream
 * record's own time, `ApproximateCreationDateTime`, is cut to the second, and on
 * DynamoDB Local to the minute). Never part of a record.
 */
export const FEED_AT = "feed_at";

/**
 * Present (`true`) on a job item the counts per status count (issue 22): every item
 * this code creates, and every item from before the counts once storage step 4 has
 * marked it. The feed writer counts a job under its status only while its item carries
 * the mark (`countMoveOfStreamRecord`), so an item is counted once: by its create's
 * stream record, or by the record of the step's marking write, never by both. Never
 * part of a record.
 */
export const COUNTED = "counted";

/** The partition of the counter items: one item per shard, each holding a number per status. */
export const COUNTS_PK = "COUNTS";
/**
 * How many counter items the counts are spread over: a job's moves always land on its
 * own shard (by its id), so concurrent feed writers on different stream shards rarely
 * contend for one item (a transaction on an item another transaction holds is
 * cancelled, and the stream record retried). A read sums them (one Query).
 */
export const COUNT_SHARDS = 16;

/** The counter item a job's moves are counted on. */
export function countShardOf(jobId: string): { readonly pk: string; readonly sk: string } {
  let h = 0;
  for (let i = 0; i < jobId.length; i++) h = (h * 31 + jobId.charCodeAt(i)) >>> 0;
  return { pk: COUNTS_PK, sk: `SHARD#${String(h % COUNT_SHARDS).padStart(2, "0")}` };
}

/** A counter item's numbers, by status (an attribute per status; absent: 0). */
export function countsOfItem(item: Record<string, unknown>, into: Partial<Record<Status, number>>): void {
  for (const status of StatusSchema.options) {
    const n = item[status];
    if (typeof n === "number") into[status] = (into[status] ?? 0) + n;
  }
}

export const JOB_ITEM_SK = "JOB";
export const ALL_JOBS = "JOBS";
export const OWED = "OWED";
export const QUARANTINED = "OWED#QUARANTINED";
/**
 * The candidate marks' partition of the `feed-by-job` index (an overloaded index: feed
 * rows carry a job id there, a marked job item this value, which no job id can take,
 * since a job id starts with a letter or digit). See job-table.ts.
 */
export const CANDIDATES = "#CANDIDATE";
/** The attention index's one partition. */
export const ATTENTION = "ATTENTION";
export const EVENT_PREFIX = "EVENT#";

export const jobPk = (jobId: string): string => `JOB#${jobId}`;
export const dispatchSk = (attemptId: number): string => `DISPATCH#${String(attemptId).padStart(7, "0")}`;
export const statusPk = (status: Status): string => `STATUS#${status}`;
export const eventSk = (entry: EventLogEntry): string => `${EVENT_PREFIX}${sortableTime(entry.at)}#${entry.id}`;

/** A time as it sorts in a key: core's `sortableTime` (UTC, fixed width), the one every derived key is built with. */
export { sortableTime };

/** Above every `<time>#<job id>` key of that time: `~` sorts after every character a job id may hold. */
export const dueBound = (dueBy: string): string => `${sortableTime(dueBy)}#~`;

/**
 * The index attributes of core's derived keys (`DerivedKeys`; a key absent is not
 * moved): the status index's partition, both listings' sort key (`<recency>#<job id>`:
 * newest first by `updated_at`, then the job id), and the owed index's: under `OWED`
 * by when the intent is next due, or, once quarantined, under a partition of its own by
 * when it was quarantined, so the sweep's Query never reads it (`<at>#<job id>`). An
 * owed place of `null` removes both owed attributes. A candidate mark sits under
 * `CANDIDATES` in the `feed-by-job` index, by when it is due (`<due>#<job id>`); `null`
 * removes it.
 */
export function indexAttributes(jobId: string, keys: DerivedKeys): { set: Record<string, string>; remove: string[] } {
  const set: Record<string, string> = {};
  const remove: string[] = [];
  if (keys.status !== undefined) set.gsi1pk = statusPk(keys.status);
  if (keys.recency !== undefined) set.gsi1sk = set.gsi2sk = `${keys.recency}#${jobId}`;
  if (keys.owed === null) remove.push("owed_pk", "owed_at");
  else if (keys.owed !== undefined) {
    set.owed_pk = keys.owed.part === "due" ? OWED : QUARANTINED;
    set.owed_at = `${keys.owed.at}#${jobId}`;
  }
  if (keys.attention === null) remove.push("attn_pk", "attn_at");
  else if (keys.attention !== undefined) {
    set.attn_pk = ATTENTION;
    set.attn_at = `${keys.attention}#${jobId}`;
  }
  if (keys.candidate === null) remove.push("feed_job", "feed_job_sk");
  else if (keys.candidate !== undefined) {
    set.feed_job = CANDIDATES;
    set.feed_job_sk = `${keys.candidate}#${jobId}`;
  }
  return { set, remove };
}

/** The job record as an item: the record's own attributes, its keys and its index attributes. */
export function jobItem(record: JobRecord, keys: Required<DerivedKeys> = keysOf(record)): Record<string, unknown> {
  return {
    ...record,
    pk: jobPk(record.job_id),
    sk: JOB_ITEM_SK,
    gsi2pk: ALL_JOBS,
    ...indexAttributes(record.job_id, keys).set,
    [COUNTED]: true,
  };
}

/** An item without its key and index attributes. */
export function stripKeys<T>(item: Record<string, unknown>): T {
  const out: Record<string, unknown> = { ...item };
  for (const k of KEY_ATTRIBUTES) delete out[k];
  delete out[FEED_NOTE];
  delete out[FEED_AT];
  delete out[COUNTED];
  return out as T;
}

/**
 * A job item (as the document client reads it) as a record. An item written before
 * `evidence_seq` existed has none: it reads as 0, and the first evidence write sets it
 * (`if_not_exists`).
 */
export function jobRecordOfItem(item: Record<string, unknown>): JobRecord {
  const record = stripKeys<JobRecord>(item);
  return record.evidence_seq === undefined ? { ...record, evidence_seq: 0 } : record;
}

/** Numbers keep JSON's (double) meaning, as the store's document client reads them. */
const UNMARSHALL = { wrapNumbers: (v: string) => Number(v) };

/**
 * A job item in DynamoDB's low-level attribute-value shape (what a failed condition
 * returns with `ReturnValuesOnConditionCheckFailure: ALL_OLD`, which the document
 * client leaves untranslated) as a record; undefined when there is none.
 */
export function jobRecordOfAttributes(item: Record<string, AttributeValue> | undefined): JobRecord | undefined {
  if (item === undefined || Object.keys(item).length === 0) return undefined;
  return jobRecordOfItem(unmarshall(item, UNMARSHALL));
}

type StreamImage = Readonly<Record<string, Lambda.AttributeValue>>;

/** Whether a stream image is a job record's item (not a dispatch's, not an event-log line's). */
export function isJobImage(image: StreamImage | undefined): boolean {
  return image?.sk?.S === JOB_ITEM_SK;
}

/** The id of the intent a job item's image owes, read without decoding the rest. */
export function owedIntentIdOfImage(image: StreamImage | undefined): string | undefined {
  return image?.pending_notification?.M?.id?.S;
}

/**
 * A stream record's new image of a job item (DynamoDB JSON) as the job record it
 * holds, checked against `JobRecordSchema`; `internal` naming the fields when it is
 * not a job record (waiting will not help; the stream's failure handling takes it).
 * `where` names the image in the refusal (e.g. the stream record's sequence number).
 */
export function jobRecordOfNewImage(image: StreamImage, where: string): JobRecord {
  // Stream images are DynamoDB JSON, the shape unmarshall reads (a job item has no binary attributes).
  const item = stripKeys<Record<string, unknown>>(unmarshall(image as Record<string, AttributeValue>, UNMARSHALL));
  const parsed = JobRecordSchema.safeParse(item);
  if (!parsed.success) {
    throw new MamError("internal", `${where} holds a job item that is not a job record`, { issues: zodIssues(parsed.error, "NewImage") });
  }
  return parsed.data;
}

// ---- the change feed, derived from the stream

export const FEED_HOURS = "FEEDHOURS";
export const feedPk = (hour: string): string => `FEED#${hour}`;
/** The hour a feed row is filed under: `2026-11-20T10`. */
export const hourOf = (iso: string): string => iso.slice(0, 13);
const paddedSeq = (sequenceNumber: string): string => sequenceNumber.padStart(40, "0");

/** What one stream record adds to the feed: its rows, the hour they are filed under, and the record's idempotency marker. */
export interface FeedWrite {
  readonly hour: { readonly pk: string; readonly sk: string };
  /** Written only if absent, in the rows' transaction: a replayed record writes nothing new. */
  readonly marker: { readonly pk: string; readonly sk: string };
  readonly rows: readonly FeedRowItem[];
  /** The counts' move of the record's write, on the job's counter item; absent: none. */
  readonly counts?: { readonly key: { readonly pk: string; readonly sk: string }; readonly move: StatusCountMove };
}

export interface FeedRowItem {
  readonly pk: string;
  readonly sk: string;
  readonly feed_job: string;
  readonly feed_job_sk: string;
  /** When the stream function wrote it: the global feed's order, and what the feed delay is counted from. */
  readonly written_at: string;
  readonly row: Omit<ChangeRow, "cursor">;
}

/**
 * The feed rows a stream record's write produces (core's `changeRowsOf` on its old and
 * new images, with the note the write left on the item), filed at `writtenAt`; undefined
 * when the record adds nothing (a REMOVE, an item that is not a job record, a write the
 * feed does not tell). Pure: the same record gives the same rows and the same keys but
 * for `writtenAt`, and the same marker, whatever the time.
 */
export function feedWriteOfStreamRecord(record: Lambda.DynamoDBRecord, writtenAt: string): FeedWrite | undefined {
  if (record.eventName === "REMOVE") return undefined;
  const image = record.dynamodb?.NewImage;
  if (image === undefined || !isJobImage(image)) return undefined;
  const sequence = record.dynamodb?.SequenceNumber;
  if (sequence === undefined || !/^[0-9]{1,40}$/.test(sequence)) {
    throw new MamError("internal", `a stream record of a job item has no usable SequenceNumber (${String(sequence)})`);
  }
  const where = `stream record ${sequence}`;
  const after = jobRecordOfNewImage(image, where);
  const old = record.dynamodb?.OldImage;
  const before = old !== undefined && isJobImage(old) ? jobRecordOfNewImage(old, `${where} (old image)`) : undefined;
  const drafts = changeRowsOf(before, after, noteOfImage(image));
  const move = statusCountMove(countedStatusOf(old, before), countedStatusOf(image, after));
  const moves = move.leave !== undefined || move.enter !== undefined;
  if (drafts.length === 0 && !moves) return undefined;
  const at = feedAtOf(image, old, record.dynamodb?.ApproximateCreationDateTime, writtenAt);
  const seq = paddedSeq(sequence);
  const hour = hourOf(writtenAt);
  return {
    hour: { pk: FEED_HOURS, sk: hour },
    marker: { pk: `FEEDREC#${after.job_id}`, sk: seq },
    rows: drafts.map((draft, n) => ({
      pk: feedPk(hour),
      sk: `${writtenAt}#${seq}#${n}`,
      feed_job: draft.job_id,
      feed_job_sk: `${seq}#${n}`,
      written_at: writtenAt,
      row: { ...draft, at },
    })),
    ...(moves ? { counts: { key: countShardOf(after.job_id), move } } : {}),
  };
}

/** The status a job item's image is counted under: its status while it carries the mark (`COUNTED`), else none. */
function countedStatusOf(image: StreamImage | undefined, record: JobRecord | undefined): Status | undefined {
  if (image === undefined || record === undefined || image[COUNTED]?.BOOL !== true) return undefined;
  return record.status;
}

/**
 * The time a write's rows carry: the writer's stamp (`FEED_AT`), never before the stamp
 * of the write it followed (the old image's), so a job's rows never go back in time when
 * two writers' clocks differ; an item written before the stamp existed takes the stream
 * record's approximate time, else when the row is filed.
 */
function feedAtOf(image: StreamImage, old: StreamImage | undefined, created: number | undefined, writtenAt: string): string {
  const stamp = validTime(image[FEED_AT]?.S);
  const previous = validTime(old?.[FEED_AT]?.S);
  if (stamp !== undefined) return previous !== undefined && previous > stamp ? previous : stamp;
  return typeof created === "number" ? new Date(created * 1000).toISOString() : writtenAt;
}

const validTime = (s: string | undefined): string | undefined => {
  if (s === undefined) return undefined;
  const t = Date.parse(s);
  return Number.isNaN(t) ? undefined : new Date(t).toISOString();
};

/** The note a write left on the item; none (the service's own) when absent or unreadable. */
function noteOfImage(image: StreamImage): ChangeNote | undefined {
  const text = image[FEED_NOTE]?.S;
  if (text === undefined) return undefined;
  try {
    const parsed = ChangeNoteSchema.safeParse(JSON.parse(text));
    return parsed.success ? (parsed.data as ChangeNote) : undefined;
  } catch {
    return undefined;
  }
}
