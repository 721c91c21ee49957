/**
 * Job-list pages bounded in bytes, by core's persistence base over every adapter: a page
 * (`list`, `listQuarantined`) holds at most JOB_PAGE_MAX_BYTES of records' JSON and at
 * least one record, and a record is itself at most JOB_RECORD_MAX_JSON_BYTES — so no
 * page comes near what one Lambda answer may carry (6 MB).
 */
import {
  JOB_PAGE_MAX_BYTES,
  JOB_RECORD_MAX_JSON_BYTES,
  type JobListing,
  type JobRecord,
  JobRecordSchema,
  type JobStore,
  MemoryJobStore,
  type Position,
  recordsWithinPageBytes,
} from "@mam/core";
import { describe, expect, it } from "vitest";
import { jobRecord } from "../support/records.ts";

/** A synchronous Lambda answer is at most 6 MB: 6,291,456 bytes. */
const LAMBDA_PAYLOAD_MAX = 6 * 1024 * 1024;

const bytesOf = (v: unknown): number => Buffer.byteLength(JSON.stringify(v));

/** Every character at its costliest as JSON: a control character is written `\u0001`, 6 bytes for 1. */
const costly = (n: number): string => "\u0001".repeat(n);
const at = (iso: string): string => iso;

/**
 * A record at every bound JobRecordSchema (and the writes that fill it) allows, with
 * locations as long as a path may be (the CLI, in an agent's own tree: PATH_MAX 4096).
 */
function largestRecord(id: string): JobRecord {
  const sha = "f".repeat(64);
  const time = at("2026-12-01T05:00:00.000Z");
  // Progress: 8 KiB of JSON (bounds.ts counts the JSON text), the most it may be.
  const progress = { note: "x".repeat(8 * 1024 - 11) };
  expect(bytesOf(progress)).toBe(8 * 1024);
  return {
    ...jobRecord(id),
    job_id: id,
    prompt: costly(65_536),
    agent: costly(64),
    role: "Reviewer",
    status: "completed",
    iteration: Number.MAX_SAFE_INTEGER,
    transition_seq: Number.MAX_SAFE_INTEGER,
    evidence_seq: Number.MAX_SAFE_INTEGER,
    latest_attempt: 1_000_000,
    finalized_report: { attempt_id: 1_000_000, report_sha256: sha, manifest_sha256: sha, finalized_at: time },
    expected_artifacts: Array.from({ length: 32 }, (_, i) => `k${i}`.padEnd(64, "a")),
    auto_complete: true,
    agent_session: costly(256),
    progress,
    completed_by: "auto_complete",
    completed_evidence: {
      attempt_id: 1_000_000,
      report_sha256: sha,
      manifest_sha256: sha,
      report_location: costly(4096),
      evidence_location: costly(4096),
      verified_at: time,
    },
    pending_notification: {
      id: costly(128),
      event: costly(64),
      seq: Number.MAX_SAFE_INTEGER,
      reason: costly(1024),
      by: "operator",
      created_at: time,
      failures: Number.MAX_SAFE_INTEGER,
      retry_at: time,
      quarantined_at: time,
      last_error: { code: costly(64), message: costly(1024), at: time },
    },
    created_at: time,
    updated_at: time,
  };
}

describe("job-list pages, bounded in bytes (JOB_PAGE_MAX_BYTES)", () => {
  it("the largest record the schema allows is under JOB_RECORD_MAX_JSON_BYTES, so no page can come near a Lambda answer", () => {
    const record = largestRecord("job-largest");
    expect(JobRecordSchema.safeParse(record).success).toBe(true);
    const size = bytesOf(record);
    expect(size).toBeGreaterThan(400 * 1024); // it is large: the bound is not slack by an order of magnitude
    expect(size).toBeLessThanOrEqual(JOB_RECORD_MAX_JSON_BYTES);
    // A page is at most the byte bound, or one record alone; its envelope ({items, cursor}) is small.
    const page = Math.max(JOB_PAGE_MAX_BYTES, JOB_RECORD_MAX_JSON_BYTES) + 4096;
    expect(page).toBeLessThan(LAMBDA_PAYLOAD_MAX);
  });

  it("at least one record, whatever its size; then as many as fit", () => {
    const records = [largestRecord("job-a"), largestRecord("job-b"), largestRecord("job-c")];
    expect(recordsWithinPageBytes(records, 1)).toBe(1);
    expect(recordsWithinPageBytes(records, bytesOf(records[0]) + bytesOf(records[1]))).toBe(2);
    expect(recordsWithinPageBytes(records, bytesOf(records[0]) + bytesOf(records[1]) - 1)).toBe(1);
    expect(recordsWithinPageBytes([])).toBe(0);
  });

  /** The memory adapter, counting how many records each listing asks its primitive for. */
  class CountingStore extends MemoryJobStore {
    readonly asks: number[] = [];
    protected override queryJobs(listing: JobListing, after: Position | undefined, limit: number): Promise<JobRecord[]> {
      this.asks.push(limit);
      return super.queryJobs(listing, after, limit);
    }
  }
  function counted(): { jobs: JobStore; inner: MemoryJobStore; asks: number[] } {
    const store = new CountingStore();
    return { jobs: store, inner: store, asks: store.asks };
  }

  async function walk(read: (cursor: string | undefined) => Promise<{ items: readonly JobRecord[]; cursor?: string }>) {
    const pages: JobRecord[][] = [];
    let cursor: string | undefined;
    do {
      const page = await read(cursor);
      pages.push([...page.items]);
      cursor = page.cursor;
    } while (cursor !== undefined);
    return pages;
  }

  it("list: every page is within the bound, and the pages hold every record once, in order", async () => {
    const { jobs, asks } = counted();
    const ids = Array.from({ length: 9 }, (_, i) => `job-${i}`);
    for (const [i, id] of ids.entries()) {
      await jobs.create({ ...largestRecord(id), status: "pending", updated_at: `2026-12-01T05:00:0${i}.000Z` });
    }
    const pages = await walk((cursor) => jobs.list({ limit: 100, ...(cursor === undefined ? {} : { cursor }) }));
    for (const page of pages) {
      expect(page.length).toBeGreaterThanOrEqual(1);
      expect(bytesOf(page)).toBeLessThanOrEqual(JOB_PAGE_MAX_BYTES + page.length + 1);
    }
    expect(pages.flat().map((r) => r.job_id)).toEqual([...ids].reverse());
    // Two of these records fill a page: one ask each (a record more than the limit, to know
    // whether another page exists), cut to the prefix that fits, the cursor after it.
    expect(pages.map((p) => p.length)).toEqual([2, 2, 2, 2, 1]);
    expect(asks).toEqual([101, 101, 101, 101, 101]);
  });

  it("list: a page within the bound costs one ask of the adapter", async () => {
    const { jobs, asks } = counted();
    for (let i = 0; i < 5; i++) await jobs.create(jobRecord(`job-small-${i}`));
    const page = await jobs.list({ limit: 10 });
    expect(page.items).toHaveLength(5);
    expect(asks).toEqual([11]);
  });

  it("listQuarantined: bounded the same way", async () => {
    const { jobs, inner, asks } = counted();
    for (let i = 0; i < 3; i++) {
      const r = largestRecord(`job-q-${i}`);
      await inner.create({
        ...r,
        status: "completed",
        pending_notification: { ...r.pending_notification!, quarantined_at: `2026-12-01T05:00:0${i}.000Z` },
      });
    }
    const pages = await walk((cursor) => jobs.listQuarantined({ limit: 3, ...(cursor === undefined ? {} : { cursor }) }));
    expect(pages.map((p) => p.length)).toEqual([2, 1]);
    expect(pages.flat().map((r) => r.job_id)).toEqual(["job-q-2", "job-q-1", "job-q-0"]);
    expect(asks).toEqual([4, 4]);
  });
});
