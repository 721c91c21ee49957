import type { AttributeValue } from "@aws-sdk/client-dynamodb";
import { marshall } from "@aws-sdk/util-dynamodb";
import { countShardOf, feedWriteOfStreamRecord, jobItem } from "@mam/aws";
import { type ChangeNote, type JobRecord, movesStatusCount, type RecordWrite, type Status, statusCountMove } from "@mam/core";
import type { DynamoDBRecord } from "aws-lambda";
import { describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";

// The DynamoDB feed's derivation: a pure function of a Lambda stream record (its old and
// new images, and the note the write left on the item). Here on constructed records, in
// npm test with Node alone; end to end on DynamoDB Local's real stream in tests/engine/feed.test.ts.

const WRITTEN_AT = "2026-11-20T10:15:00.000Z";

function image(record: JobRecord, note?: ChangeNote) {
  const item = { ...jobItem(record), ...(note === undefined ? {} : { feed_note: JSON.stringify(note) }) };
  return marshall(item, { removeUndefinedValues: true }) as Record<string, AttributeValue>;
}

function streamRecord(
  before: JobRecord | undefined,
  after: JobRecord | undefined,
  opts: { note?: ChangeNote; seq?: string; name?: DynamoDBRecord["eventName"] } = {},
): DynamoDBRecord {
  return {
    eventID: "e-1",
    eventName: opts.name ?? (before === undefined ? "INSERT" : after === undefined ? "REMOVE" : "MODIFY"),
    dynamodb: {
      ApproximateCreationDateTime: Date.parse("2026-11-20T10:14:58Z") / 1000,
      SequenceNumber: opts.seq ?? "4421584500000000017450439091",
      ...(before === undefined ? {} : { OldImage: image(before) as never }),
      ...(after === undefined ? {} : { NewImage: image(after, opts.note) as never }),
      StreamViewType: "NEW_AND_OLD_IMAGES",
    },
  } as DynamoDBRecord;
}

describe("feedWriteOfStreamRecord (DynamoDB's feed, derived from the stream)", () => {
  const agent: ChangeNote = { actor: { type: "agent", token_id: "jti-7" } };

  it("an INSERT of a job item is job.registered, filed under the hour it is written, keyed by the stream record", () => {
    const write = feedWriteOfStreamRecord(streamRecord(undefined, job("s-1"), { note: agent }), WRITTEN_AT);
    expect(write?.hour).toEqual({ pk: "FEEDHOURS", sk: "2026-11-20T10" });
    expect(write?.marker).toEqual({ pk: "FEEDREC#s-1", sk: "4421584500000000017450439091".padStart(40, "0") });
    expect(write?.rows).toEqual([
      {
        pk: "FEED#2026-11-20T10",
        sk: `${WRITTEN_AT}#${"4421584500000000017450439091".padStart(40, "0")}#0`,
        feed_job: "s-1",
        feed_job_sk: `${"4421584500000000017450439091".padStart(40, "0")}#0`,
        written_at: WRITTEN_AT,
        row: { job_id: "s-1", kind: "job.registered", actor: agent.actor, data: { status: "pending" }, at: "2026-11-20T10:14:58.000Z" },
      },
    ]);
  });

  it("a MODIFY superseding an owed intent gives the transition and the supersede, numbered in the record", () => {
    const before = job("s-2", {
      status: "running",
      transition_seq: 1,
      pending_notification: { id: "old", event: "progress", seq: 1, created_at: WRITTEN_AT },
    });
    const after = {
      ...before,
      status: "completed" as const,
      transition_seq: 2,
      pending_notification: { id: "new", event: "completed", seq: 2, created_at: WRITTEN_AT },
    };
    const rows = feedWriteOfStreamRecord(streamRecord(before, after), WRITTEN_AT)?.rows ?? [];
    expect(rows.map((r) => [r.row.kind, r.row.intent_id, r.row.data, r.feed_job_sk.slice(-2)])).toEqual([
      ["job.transitioned", "new", { action: "completed", status: "completed", transition_seq: 2 }, "#0"],
      ["intent.superseded", "old", { by: "new" }, "#1"],
    ]);
    expect(rows.every((r) => r.row.actor.type === "service")).toBe(true);
  });

  it("issue 17: a MODIFY whose note declares an upload is report.upload_declared, by the note's actor, with what was declared", () => {
    const before = job("s-d", { status: "running", transition_seq: 1, latest_attempt: 1, evidence_seq: 1 });
    const after = { ...before, evidence_seq: 2 };
    const note: ChangeNote = { ...agent, declared: { sha256: "e".repeat(64), bytes: 41_943_040 } };
    const rows = feedWriteOfStreamRecord(streamRecord(before, after, { note }), WRITTEN_AT)?.rows ?? [];
    expect(rows.map((r) => [r.row.kind, r.row.actor, r.row.data])).toEqual([
      ["report.upload_declared", agent.actor, { attempt_id: 1, sha256: "e".repeat(64), bytes: 41_943_040 }],
    ]);
  });

  it("a replayed record derives the same marker and the same per-job keys, whenever it is written", () => {
    const record = streamRecord(job("s-3"), job("s-3", { status: "running", transition_seq: 1 }));
    const first = feedWriteOfStreamRecord(record, WRITTEN_AT);
    const replay = feedWriteOfStreamRecord(record, "2026-11-20T11:00:00.000Z");
    expect(replay?.marker).toEqual(first?.marker);
    expect(replay?.rows.map((r) => [r.feed_job_sk, r.row])).toEqual(first?.rows.map((r) => [r.feed_job_sk, r.row]));
  });

  it("adds nothing for a REMOVE, a dispatch or event-log item, or a write the feed does not tell", () => {
    expect(feedWriteOfStreamRecord(streamRecord(job("s-4"), undefined), WRITTEN_AT)).toBeUndefined();
    const dispatchItem = marshall({ pk: "JOB#s-4", sk: "DISPATCH#0000001", job_id: "s-4", attempt_id: 1 });
    const dispatch = { eventName: "INSERT", dynamodb: { SequenceNumber: "1", NewImage: dispatchItem } } as unknown as DynamoDBRecord;
    expect(feedWriteOfStreamRecord(dispatch, WRITTEN_AT)).toBeUndefined();
    expect(feedWriteOfStreamRecord(streamRecord(job("s-4"), job("s-4")), WRITTEN_AT)).toBeUndefined();
  });

  it("refuses a job record's image without a sequence number (internal), rather than keying rows by nothing", () => {
    const record = streamRecord(undefined, job("s-5"));
    delete (record.dynamodb as { SequenceNumber?: string }).SequenceNumber;
    expect(() => feedWriteOfStreamRecord(record, WRITTEN_AT)).toThrow(expect.objectContaining({ code: "internal" }));
  });
});

describe("the counts' move of a stream record (issue 22: the feed writer counts under the record's marker)", () => {
  /** A record's image as an item from before the counts (no `counted` mark), or as marked. */
  const uncounted = (record: JobRecord) => {
    const { counted: _c, ...item } = jobItem(record) as Record<string, unknown>;
    return marshall(item, { removeUndefinedValues: true }) as Record<string, AttributeValue>;
  };
  const withImages = (old: Record<string, AttributeValue> | undefined, next: Record<string, AttributeValue>): DynamoDBRecord =>
    ({
      eventID: "e-2",
      eventName: old === undefined ? "INSERT" : "MODIFY",
      dynamodb: {
        ApproximateCreationDateTime: Date.parse("2026-11-20T10:14:58Z") / 1000,
        SequenceNumber: "4421584500000000017450439092",
        ...(old === undefined ? {} : { OldImage: old as never }),
        NewImage: next as never,
        StreamViewType: "NEW_AND_OLD_IMAGES",
      },
    }) as DynamoDBRecord;
  const running = job("k-1", { status: "running", transition_seq: 1 });
  const completed = job("k-1", { status: "completed", transition_seq: 2 });

  it("a create of this code's (marked) counts +1 to its status, on the job's own counter item, beside the marker", () => {
    const write = feedWriteOfStreamRecord(streamRecord(undefined, job("k-1")), WRITTEN_AT);
    expect(write?.counts).toEqual({ key: countShardOf("k-1"), move: { enter: "pending" } });
    expect(write?.counts?.key).toEqual({ pk: "COUNTS", sk: expect.stringMatching(/^SHARD#\d\d$/) });
  });

  it("a status change of a marked item moves one from the old status to the new; a write that keeps the status moves none", () => {
    expect(feedWriteOfStreamRecord(streamRecord(running, completed), WRITTEN_AT)?.counts?.move).toEqual({
      leave: "running",
      enter: "completed",
    });
    const progressed = { ...running, transition_seq: 2, progress: { step: 1 } };
    expect(feedWriteOfStreamRecord(streamRecord(running, progressed), WRITTEN_AT)?.counts).toBeUndefined();
  });

  it("an item from before the counts moves nothing until it is marked; the mark (status unchanged) counts it once, under its status then", () => {
    expect(feedWriteOfStreamRecord(withImages(uncounted(running), uncounted(completed)), WRITTEN_AT)?.counts).toBeUndefined();
    expect(feedWriteOfStreamRecord(withImages(undefined, uncounted(job("k-1"))), WRITTEN_AT)?.counts).toBeUndefined();
    // The migration's mark: no feed row (nothing the feed tells changed), one count.
    const mark = feedWriteOfStreamRecord(withImages(uncounted(completed), image(completed)), WRITTEN_AT);
    expect(mark?.rows).toEqual([]);
    expect(mark?.counts?.move).toEqual({ enter: "completed" });
  });

  it("the rule is core's, once: statusCountMove", () => {
    expect(statusCountMove(undefined, "pending")).toEqual({ enter: "pending" });
    expect(statusCountMove("pending", "running")).toEqual({ leave: "pending", enter: "running" });
    expect(statusCountMove("running", "running")).toEqual({});
    expect(statusCountMove(undefined, undefined)).toEqual({});
  });

  it("movesStatusCount: a write that sets the status may move a count, unless its condition pins the status it sets", () => {
    const write = (status: Status | undefined, from: readonly Status[]): RecordWrite => ({
      jobId: "m-1",
      conditions: [{ kind: "statusIn", statuses: from }],
      set: status === undefined ? {} : { status },
      unset: [],
      bump: [],
      keys: status === undefined ? {} : { status },
    });
    expect(movesStatusCount(write("running", ["pending"]))).toBe(true);
    expect(movesStatusCount(write("cancelled", ["pending", "running"]))).toBe(true);
    expect(movesStatusCount(write("running", ["pending", "running"]))).toBe(true);
    // progress: from running to running, pinned by its condition.
    expect(movesStatusCount(write("running", ["running"]))).toBe(false);
    expect(movesStatusCount(write(undefined, ["running"]))).toBe(false);
  });
});
