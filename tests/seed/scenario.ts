/**
 * The seed's helpers, in TypeScript: watcher scenarios from fixtures/watcher, and the
 * seed's `_ready_job` — a job in exactly the state that should auto-complete, plus
 * its evidence.
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  attemptReportLocation,
  type Deps,
  finalizeAttemptReport,
  finalizeReport,
  OPERATOR,
  parseSideEffects,
  type RegisterJob,
  recordDispatch,
  registerJob,
  STAGED_REPORT_NAME,
  stageAttemptReport,
  transitionJob,
} from "@mam/core";

export const WATCHER_FIXTURES = fileURLToPath(new URL("../../fixtures/watcher/", import.meta.url));

/**
 * The manifest's file name, as a reader outside core sees it. Production code names
 * it in core's finalize module alone (B-02); the seed's tests forge manifests by hand
 * (the seed's `manifest_in`), so they must know where it lies.
 */
export const MANIFEST_FILE = "report-manifest.json";

export interface DispatchContext {
  job_id: string;
  attempt_id: number;
  agent_session_uuid: string;
  pane_process_generation: number;
  backend: string;
  pane_id: string;
  [key: string]: unknown;
}

export interface Observation {
  at: string;
  source_kind: string;
  collector_attribution?: Record<string, unknown>;
  payload?: Record<string, unknown>;
  [key: string]: unknown;
}

export interface ScenarioDoc {
  schema: string;
  dispatch_context: DispatchContext;
  timeline: Observation[];
  filesystem: { manifest_committed: boolean; [key: string]: unknown };
  [key: string]: unknown;
}

/** A fresh copy of a watcher fixture (`finalized_candidate` unless named). */
export function loadScenario(name = "finalized_candidate"): ScenarioDoc {
  return JSON.parse(readFileSync(`${WATCHER_FIXTURES}${name}.json`, "utf8")) as ScenarioDoc;
}

export const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

/** The execution anchor: one minute before the fixture's timeline starts (10:00:05). */
export const ANCHOR_STARTED_AT = "2026-11-20T09:59:00Z";

export interface ReadyJobOptions {
  readonly backend?: string;
  readonly optIn?: boolean;
  readonly artifacts?: readonly string[];
  readonly body?: string;
  /** Record the dispatch (default true); B-30 needs a job without one. */
  readonly dispatch?: boolean;
}

export interface ReadyJob {
  readonly jobId: string;
  readonly scenario: ScenarioDoc;
  readonly reportLocation: string;
  readonly attemptId: number;
}

/**
 * The seed's `_ready_job`: registered with a backend and its expected artifacts,
 * claimed, opted in by an operator, its dispatch recorded with an execution anchor
 * before the evidence, the scenario's identifiers rewritten to name this job (and its
 * backend), and its
 * report staged and finalized for that attempt with `<artifact>=ref` side effects.
 */
export async function readyJob(deps: Deps, opts: ReadyJobOptions = {}): Promise<ReadyJob> {
  const artifacts = [...(opts.artifacts ?? [])];
  const registration: RegisterJob = { prompt: "p", agent: opts.backend ?? "claude-code", expected_artifacts: artifacts };
  const job = await registerJob(deps, registration);
  const jobId = job.job_id;
  let record = await transitionJob(deps, jobId, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
  if (opts.optIn ?? true) {
    record = await transitionJob(
      deps,
      jobId,
      { action: "progress", expectedSeq: record.transition_seq, fields: { auto_complete: true } },
      OPERATOR,
    );
  }

  // The evidence names this job, and the job's backend (what the watcher would have
  // collected for it), so a refusal below can only come from the job itself.
  const scenario = loadScenario();
  const dispatch = scenario.dispatch_context;
  dispatch.job_id = jobId;
  dispatch.backend = job.agent;
  for (const item of scenario.timeline) {
    if (item.collector_attribution) {
      item.collector_attribution.job_id = jobId;
      item.collector_attribution.backend = job.agent;
    }
    // A non-herdr payload is a legitimate identifier source, so it has to agree too.
    if (item.source_kind !== "herdr" && item.payload && "job_id" in item.payload) item.payload.job_id = jobId;
  }
  if (opts.dispatch ?? true) {
    await recordDispatch(deps, jobId, {
      attempt_id: dispatch.attempt_id,
      agent_session_uuid: dispatch.agent_session_uuid,
      pane_process_generation: dispatch.pane_process_generation,
      pane_id: dispatch.pane_id,
      anchor: { started_at: ANCHOR_STARTED_AT },
    });
  }

  const reportLocation = attemptReportLocation(jobId, dispatch.attempt_id);
  const sideEffects = parseSideEffects(artifacts.map((a) => `${a}=ref`));
  if (opts.dispatch ?? true) {
    // As the agent would, through mam: the finalize mam committed is what the gate trusts.
    await stageAttemptReport(deps, jobId, dispatch.attempt_id, utf8(opts.body ?? "report\n"));
    await finalizeAttemptReport(deps, jobId, dispatch.attempt_id, sideEffects);
  } else {
    // No dispatch, so mam takes no report for the attempt: the files alone.
    await deps.reports.put(reportLocation, STAGED_REPORT_NAME, utf8(opts.body ?? "report\n"));
    await finalizeReport(deps.reports, deps.clock, { location: reportLocation, jobId, attemptId: dispatch.attempt_id, sideEffects });
  }
  return { jobId, scenario, reportLocation, attemptId: dispatch.attempt_id };
}
