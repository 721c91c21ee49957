import type { JobRecord } from "@mam/core";

/** The instant every built record carries unless a test says otherwise. */
export const RECORD_AT = "2025-01-15T12:00:00.000Z";

/**
 * The one job-record builder: a pending Worker job that expects nothing and owes
 * nothing, created and updated at `RECORD_AT`. A test states only the fields it is about.
 */
export function jobRecord(id: string, over: Partial<JobRecord> = {}): JobRecord {
  return {
    job_id: id,
    prompt: "p",
    agent: "claude",
    role: "Worker",
    status: "pending",
    iteration: 0,
    transition_seq: 0,
    evidence_seq: 0,
    expected_artifacts: [],
    auto_complete: false,
    created_at: RECORD_AT,
    updated_at: RECORD_AT,
    ...over,
  };
}
