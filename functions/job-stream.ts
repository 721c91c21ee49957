/**
 * Reading the job table's stream: which records carry an intent to publish, and
 * the job record inside one.
 *
 * A record owes a publish when its write committed an intent: the new image is a
 * job item (`sk = JOB`) whose `pending_notification` is not the one the old image
 * already had. Everything else is a no-op success:
 * - a REMOVE, or a write without a new image;
 * - a dispatch or event-log item (the notifier's own `published` lines among them);
 * - a settle (the new image owes nothing);
 * - a write that kept an intent already owed (a transition without `notify`): the
 *   write that committed it had its own record, and the sweep covers it if that
 *   one failed for good.
 * Seeing a record twice does no harm: a second publish is a duplicate consumers drop
 * by intent id, and settling is conditional on that id.
 */
import type { AttributeValue } from "@aws-sdk/client-dynamodb";
import { unmarshall } from "@aws-sdk/util-dynamodb";
import { JOB_TABLE_DEFINITION } from "@mam/aws/job-table";
import { flushRecord, type JobRecord, JobRecordSchema, MamError, zodIssues } from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import type { NotifierDeps } from "./compose.ts";
import { type LogSink, logJson } from "./log.ts";

const JOB_ITEM_SK = "JOB";

/** The table's key and index attributes: derived, never part of a record. */
const TABLE_ATTRIBUTES: readonly string[] = JOB_TABLE_DEFINITION.AttributeDefinitions.map((a) => a.AttributeName);

type StreamImage = NonNullable<NonNullable<DynamoDBRecord["dynamodb"]>["NewImage"]>;

function intentId(image: StreamImage | undefined): string | undefined {
  return image?.pending_notification?.M?.id?.S;
}

/** The job record whose intent this stream record committed, or undefined when it owes nothing. */
export function owedJobRecord(record: DynamoDBRecord): JobRecord | undefined {
  if (record.eventName === "REMOVE") return undefined;
  const image = record.dynamodb?.NewImage;
  if (image?.sk?.S !== JOB_ITEM_SK) return undefined;
  const owed = intentId(image);
  if (owed === undefined || owed === intentId(record.dynamodb?.OldImage)) return undefined;

  // Stream images are DynamoDB JSON, the shape unmarshall reads (a job item has no binary attributes).
  const item = unmarshall(image as Record<string, AttributeValue>, { wrapNumbers: (v: string) => Number(v) });
  for (const attribute of TABLE_ATTRIBUTES) delete item[attribute];
  const parsed = JobRecordSchema.safeParse(item);
  if (!parsed.success) {
    // Not retryable by waiting; failing it sends it, after the bounded retries, to the on-failure queue.
    throw new MamError("internal", `stream record ${record.dynamodb?.SequenceNumber ?? "?"} holds a job item that is not a job record`, {
      issues: zodIssues(parsed.error, "NewImage"),
    });
  }
  return parsed.data;
}

/** Publish and settle the intent a stream record committed; throws if the publish failed. */
export async function flushStreamRecord(deps: NotifierDeps, record: DynamoDBRecord, log: LogSink): Promise<void> {
  const job = owedJobRecord(record);
  if (job === undefined) return;
  const result = await flushRecord(deps, job);
  if (result.outcome !== "failed") return;
  logJson(log, {
    event: "stream_publish_failed",
    job_id: job.job_id,
    intent_id: result.intent.id,
    sequence_number: record.dynamodb?.SequenceNumber ?? null,
    code: result.error.code,
    message: result.error.message,
  });
  throw result.error;
}
