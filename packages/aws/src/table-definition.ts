/**
 * The job table, one table for everything a job owns:
 *
 * | item           | pk          | sk                         |
 * |----------------|-------------|----------------------------|
 * | job record     | `JOB#<id>`  | `JOB`                      |
 * | dispatch       | `JOB#<id>`  | `DISPATCH#<attempt, 7 digits>` |
 * | event log line | `JOB#<id>`  | `EVENT#<at>#<event id>`    |
 *
 * Indexes (all project ALL, so a listing is one Query and no follow-up reads):
 * - `by-status` (`gsi1pk = STATUS#<status>`, `gsi1sk = <updated_at>#<job_id>`):
 *   dashboards, newest first within a status.
 * - `all` (`gsi2pk = JOBS`, `gsi2sk = <updated_at>#<job_id>`): the unfiltered
 *   listing, newest first. One partition key for every job: simple and exactly
 *   ordered; its cost is one GSI partition's write rate (about 1000 writes/s), far
 *   above what a job registry sees. Only job records carry it, so dispatches and
 *   events never appear in a listing.
 * - `owed` (`owed_pk = OWED`, `owed_at = <next due>#<job_id>`): sparse — the two
 *   attributes exist only while `pending_notification` does, so the recovery sweep
 *   reads the jobs owing a notification and nothing else. An intent is next due at
 *   its `retry_at` (after a failure of its own), else at its `created_at`; the sweep
 *   reads `owed_at <= now`, soonest due first, so an intent backing off is not read.
 *   A quarantined intent moves to `owed_pk = OWED#QUARANTINED`
 *   (`owed_at = <quarantined_at>#<job_id>`): listed for operators, never read by the
 *   sweep, and unable to crowd out the others.
 *
 * The change feed (derived from the stream by the stream function, `job-item.ts`'s
 * `feedWriteOfStreamRecord`):
 *
 * | item              | pk                 | sk                                        |
 * |-------------------|--------------------|-------------------------------------------|
 * | feed row          | `FEED#<hour>`      | `<written_at>#<stream seq, 40 digits>#<n>` |
 * | hours with rows   | `FEEDHOURS`        | `<hour>` (`2026-11-20T10`)                 |
 * | record seen       | `FEEDREC#<job id>` | `<stream seq, 40 digits>`                  |
 *
 * - `feed-by-job` (`feed_job = <job id>`, `feed_job_sk = <stream seq>#<n>`): sparse,
 *   feed rows: one job's rows in stream order, for an agent's own feed; and, in a
 *   partition no job id can name (`feed_job = #CANDIDATE`, `feed_job_sk = <due>#<job_id>`),
 *   the job records marked candidates (an overloaded index; docs/adapters.md).
 * - `attention` (`attn_pk = ATTENTION`, `attn_at = <next look>#<job_id>`): sparse, the
 *   job records the sweep is to look at again for staleness or a deadline (issue 20).
 * The global feed is read hour by hour (`FEEDHOURS` says which hours hold rows), by
 * key, never by Scan.
 *
 * Times in sort keys are normalised to UTC `toISOString()` form (fixed width), so the
 * string order is the time order whatever offset the record was written with.
 *
 * The stream (new and old images) feeds the notifier. The shape below is what
 * CloudFormation's `AWS::DynamoDB::Table` takes (its `StreamSpecification` has no
 * `StreamEnabled`); `createJobTable` adds what the CreateTable API needs on top.
 */
export const JOB_TABLE_INDEX = {
  byStatus: "by-status",
  all: "all",
  owed: "owed",
  feedByJob: "feed-by-job",
  attention: "attention",
} as const;

export const JOB_TABLE_DEFINITION = {
  BillingMode: "PAY_PER_REQUEST",
  AttributeDefinitions: [
    { AttributeName: "pk", AttributeType: "S" },
    { AttributeName: "sk", AttributeType: "S" },
    { AttributeName: "gsi1pk", AttributeType: "S" },
    { AttributeName: "gsi1sk", AttributeType: "S" },
    { AttributeName: "gsi2pk", AttributeType: "S" },
    { AttributeName: "gsi2sk", AttributeType: "S" },
    { AttributeName: "owed_pk", AttributeType: "S" },
    { AttributeName: "owed_at", AttributeType: "S" },
    { AttributeName: "feed_job", AttributeType: "S" },
    { AttributeName: "feed_job_sk", AttributeType: "S" },
    { AttributeName: "attn_pk", AttributeType: "S" },
    { AttributeName: "attn_at", AttributeType: "S" },
  ],
  KeySchema: [
    { AttributeName: "pk", KeyType: "HASH" },
    { AttributeName: "sk", KeyType: "RANGE" },
  ],
  GlobalSecondaryIndexes: [
    {
      IndexName: JOB_TABLE_INDEX.byStatus,
      KeySchema: [
        { AttributeName: "gsi1pk", KeyType: "HASH" },
        { AttributeName: "gsi1sk", KeyType: "RANGE" },
      ],
      Projection: { ProjectionType: "ALL" },
    },
    {
      IndexName: JOB_TABLE_INDEX.all,
      KeySchema: [
        { AttributeName: "gsi2pk", KeyType: "HASH" },
        { AttributeName: "gsi2sk", KeyType: "RANGE" },
      ],
      Projection: { ProjectionType: "ALL" },
    },
    {
      IndexName: JOB_TABLE_INDEX.owed,
      KeySchema: [
        { AttributeName: "owed_pk", KeyType: "HASH" },
        { AttributeName: "owed_at", KeyType: "RANGE" },
      ],
      Projection: { ProjectionType: "ALL" },
    },
    {
      IndexName: JOB_TABLE_INDEX.feedByJob,
      KeySchema: [
        { AttributeName: "feed_job", KeyType: "HASH" },
        { AttributeName: "feed_job_sk", KeyType: "RANGE" },
      ],
      Projection: { ProjectionType: "ALL" },
    },
    {
      IndexName: JOB_TABLE_INDEX.attention,
      KeySchema: [
        { AttributeName: "attn_pk", KeyType: "HASH" },
        { AttributeName: "attn_at", KeyType: "RANGE" },
      ],
      Projection: { ProjectionType: "ALL" },
    },
  ],
  StreamSpecification: { StreamViewType: "NEW_AND_OLD_IMAGES" },
} as const;
