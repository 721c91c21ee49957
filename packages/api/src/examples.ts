import { createHash } from "node:crypto";

/**
 * Example values for the OpenAPI document: one job, `job-4f2a`, followed through its
 * life (the reference scenario's job, fixtures/watcher/finalized_candidate.json).
 * Linters check each example against its schema, and so does tests/api/openapi.test.ts.
 */

const JOB_ID = "job-4f2a";
const SESSION = "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa";
const REPORT = "# Report\n\nFixed the race in tests/unit/engine.test.ts (commit a1b2c3d); the suite passes 50 runs in a row.\n";
const REPORT_SHA = createHash("sha256").update(REPORT).digest("hex");
const REPORT_BYTES = Buffer.byteLength(REPORT);
const MANIFEST_SHA = "3b8e1d4a7c0f2e5b8a1d4c7f0e3b6a9d2c5f8e1b4a7d0c3f6e9b2a5d8c1f4e7b";
const AGENT_TOKEN =
  "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJtYW0iLCJraW5kIjoiYWdlbnQiLCJqdGkiOiI1ZTNhIiwiaWF0IjoxNzk1MTcyNDAwLCJleHAiOjE3OTUyNTg4MDAsImpvYl9pZCI6ImpvYi00ZjJhIiwiYXR0ZW1wdF9pZCI6MX0.q0b5Yw8hJ1mN3kR6tV9xA2cE4gI7lO0pS3uW5yZ8bDf";

const COMPLETED_BY_GATE = {
  job_id: JOB_ID,
  prompt: "Fix the flaky test in tests/unit/engine.test.ts and push the fix",
  agent: "claude-code",
  role: "Worker",
  status: "completed",
  iteration: 1,
  transition_seq: 3,
  evidence_seq: 3,
  latest_attempt: 1,
  finalized_report: {
    attempt_id: 1,
    report_sha256: REPORT_SHA,
    manifest_sha256: MANIFEST_SHA,
    finalized_at: "2026-11-20T10:05:20.000Z",
  },
  expected_artifacts: ["commit"],
  auto_complete: true,
  agent_session: SESSION,
  completed_by: "auto_complete",
  completed_evidence: {
    attempt_id: 1,
    report_sha256: REPORT_SHA,
    manifest_sha256: MANIFEST_SHA,
    report_location: `mam-file:///reports/${JOB_ID}/1/report-final.md`,
    evidence_location: `mam-file:///reports/${JOB_ID}/1/evidence/${REPORT_SHA}`,
    verified_at: "2026-11-20T10:06:30.000Z",
  },
  pending_notification: {
    id: "0f8e2c4a-1b3d-4e5f-8a9b-7c6d5e4f3a2b",
    event: "completed",
    seq: 3,
    reason: "auto_complete",
    by: "gate",
    created_at: "2026-11-20T10:06:30.000Z",
  },
  created_at: "2026-11-20T09:58:00.000Z",
  updated_at: "2026-11-20T10:06:30.000Z",
} as const;

const { completed_by: _gate, pending_notification: _sent, ...COMPLETED_BY_AGENT } = COMPLETED_BY_GATE;

export const EXAMPLE = {
  jobId: JOB_ID,
  attempt: 1,
  file: "dashboard.js",

  registerJob: {
    job_id: JOB_ID,
    prompt: "Fix the flaky test in tests/unit/engine.test.ts and push the fix",
    agent: "claude-code",
    role: "Worker",
    expected_artifacts: ["commit"],
    auto_complete: true,
  },

  pendingJob: {
    job_id: JOB_ID,
    prompt: "Fix the flaky test in tests/unit/engine.test.ts and push the fix",
    agent: "claude-code",
    role: "Worker",
    status: "pending",
    iteration: 1,
    transition_seq: 0,
    evidence_seq: 0,
    expected_artifacts: ["commit"],
    auto_complete: true,
    created_at: "2026-11-20T09:58:00.000Z",
    updated_at: "2026-11-20T09:58:00.000Z",
  },

  runningJob: {
    job_id: JOB_ID,
    prompt: "Fix the flaky test in tests/unit/engine.test.ts and push the fix",
    agent: "claude-code",
    role: "Worker",
    status: "running",
    iteration: 1,
    transition_seq: 2,
    evidence_seq: 1,
    latest_attempt: 1,
    expected_artifacts: ["commit"],
    auto_complete: true,
    agent_session: SESSION,
    progress: { step: "running the unit tests", done: 3, of: 5 },
    created_at: "2026-11-20T09:58:00.000Z",
    updated_at: "2026-11-20T10:02:41.000Z",
  },

  completedJob: COMPLETED_BY_GATE,
  /** The same job completed by its agent (POST /events): no `completed_by`, its notification already sent. */
  completedByAgent: COMPLETED_BY_AGENT,

  claim: { action: "claim", expected_seq: 0, fields: { agent_session: SESSION } },
  progressWithIfMatch: { action: "progress", fields: { progress: { step: "running the unit tests", done: 3, of: 5 } } },

  dispatchRequest: {
    attempt_id: 1,
    agent_session_uuid: SESSION,
    pane_process_generation: 3,
    pane_id: "%12",
    anchor: { started_at: "2026-11-20T09:59:00Z", workspace_revision: "a1b2c3d" },
  },
  dispatchResponse: {
    dispatch: {
      job_id: JOB_ID,
      attempt_id: 1,
      agent_session_uuid: SESSION,
      pane_process_generation: 3,
      pane_id: "%12",
      anchor: { started_at: "2026-11-20T09:59:00Z", workspace_revision: "a1b2c3d" },
      recorded_at: "2026-11-20T09:59:02.000Z",
    },
    agent_token: AGENT_TOKEN,
    expires_at: "2026-11-21T09:59:02.000Z",
  },

  observationRequest: {
    state: "idle",
    source_kind: "pane_status",
    attempt_id: 1,
    agent_session_uuid: SESSION,
    pane_process_generation: 3,
    pane_id: "%12",
    observed_at: "2026-11-20T10:05:00Z",
  },
  observation: {
    seq: 2,
    source: "watcher:herdr-1",
    source_kind: "pane_status",
    state: "idle",
    agent_session_uuid: SESSION,
    pane_process_generation: 3,
    pane_id: "%12",
    observed_at: "2026-11-20T10:05:00Z",
    received_at: "2026-11-20T10:05:00.412Z",
    last_seen_received_at: "2026-11-20T10:05:00.412Z",
    sightings: 1,
  },

  report: REPORT,
  staged: { sha256: REPORT_SHA, bytes: REPORT_BYTES },

  finalizeRequest: { side_effects: [{ kind: "commit", reference: "a1b2c3d" }] },
  manifest: {
    schema: "mam.manifest/v1",
    job_id: JOB_ID,
    attempt_id: 1,
    report_location: `mam-file:///reports/${JOB_ID}/1/report-final.md`,
    sha256: REPORT_SHA,
    bytes: REPORT_BYTES,
    side_effects: [{ kind: "commit", reference: "a1b2c3d" }],
    finalized_at: "2026-11-20T10:05:20.000Z",
  },

  scenario: {
    schema: "mam.scenario/v1",
    dispatch_context: {
      job_id: JOB_ID,
      attempt_id: 1,
      agent_session_uuid: SESSION,
      pane_process_generation: 3,
      backend: "claude-code",
      pane_id: "%12",
    },
    timeline: [
      { at: "2026-11-20T10:05:00Z", source_kind: "herdr", payload: { agent_status: "working" } },
      { at: "2026-11-20T10:05:40Z", source_kind: "herdr", payload: { agent_status: "idle" } },
      { at: "2026-11-20T10:06:20Z", source_kind: "herdr", payload: { agent_status: "idle" } },
    ],
    filesystem: { manifest_committed: true },
  },
  approved: { decision: "candidate_approved", reason: "quiescent for 40 s after the last working observation; manifest committed" },

  publishEvent: {
    event: "completed",
    expected_seq: 2,
    finalize: { attempt_id: 1, side_effects: [{ kind: "commit", reference: "a1b2c3d" }] },
    data: { summary: "flaky test fixed", commits: ["a1b2c3d"] },
  },

  eventLogEntry: {
    job_id: JOB_ID,
    at: "2026-11-20T10:05:21.000Z",
    id: "2026-11-20T10:05:21.000Z#0001",
    event: "publish_event",
    data: { event: "completed", seq: 3, data: { summary: "flaky test fixed", commits: ["a1b2c3d"] } },
  },

  cursor: "eyJ1IjoiMjAyNi0xMS0yMFQxMDowMjo0MS4wMDBaIiwiaSI6ImpvYi00ZjJhIn0",
  requestId: "3c6e1f0a-5b2d-4e8f-9a1c-7d4b2e6f8a0c",
} as const;
