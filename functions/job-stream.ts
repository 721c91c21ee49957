/**
 * Reading the job table's stream, for its two consumers, each on an event source
 * mapping of its own (serverless.yml): the feed writer writes the change feed's rows
 * each job item's write produced (`DynamoJobStore.writeStreamChanges`); the stream
 * publisher publishes the intent a record committed. Neither waits on the other.
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

import type { AwsNotifierDeps } from "@mam/aws/deps";
import { isJobImage, jobRecordOfNewImage, owedIntentIdOfImage } from "@mam/aws/job-item";
import { flushRecord, type JobRecord, type Logger, logEvent, MamError } from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";

/** The job record whose intent this stream record committed, or undefined when it owes nothing. */
export function owedJobRecord(record: DynamoDBRecord): JobRecord | undefined {
  if (record.eventName === "REMOVE") return undefined;
  const image = record.dynamodb?.NewImage;
  if (image === undefined || !isJobImage(image)) return undefined;
  const owed = owedIntentIdOfImage(image);
  if (owed === undefined || owed === owedIntentIdOfImage(record.dynamodb?.OldImage)) return undefined;
  // The item layout is packages/aws's to read; a job item that is not a job record is
  // not retryable by waiting: failing it sends it, after the bounded retries, to the
  // on-failure queue.
  return jobRecordOfNewImage(image, `stream record ${record.dynamodb?.SequenceNumber ?? "?"}`);
}

/** The change feed's rows of a stream record (idempotent: a replayed record writes nothing new); throws if the write failed. */
export async function writeFeedRecord(deps: AwsNotifierDeps, record: DynamoDBRecord): Promise<void> {
  if (deps.feed === undefined) throw new MamError("internal", "the feed writer was composed without the feed's store");
  await deps.feed.writeStreamChanges(record);
}

/** Publish and settle the intent a stream record committed; throws if that failed, so the record is retried. */
export async function flushStreamRecord(deps: AwsNotifierDeps, record: DynamoDBRecord, logger: Logger): Promise<void> {
  const job = owedJobRecord(record);
  if (job === undefined) return;
  const result = await flushRecord(deps, job);
  if (result.outcome !== "failed") return;
  logEvent(logger, {
    level: "warn",
    event: "stream_publish_failed",
    job_id: job.job_id,
    intent_id: result.intent.id,
    sequence_number: record.dynamodb?.SequenceNumber ?? null,
    code: result.error.code,
    message: result.error.message,
  });
  throw result.error;
}
