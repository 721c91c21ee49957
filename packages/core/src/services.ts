import type { Actor, Deps } from "./deps.ts";
import { getJob, TRANSITIONS, type TransitionInput, transitionJob } from "./engine.ts";
import { conflictFor, MamError } from "./errors.ts";
import {
  attemptReportLocation,
  type Finalized,
  finalizeReport,
  STAGED_REPORT_NAME,
  type Verification,
  validateSideEffects,
  verifyManifest,
} from "./finalize.ts";
import { evaluateGate, type GateDeps, type GateResult } from "./gate.ts";
import { type FlushResult, flushNotification } from "./notifier.ts";
import {
  type Action,
  type DispatchRecord,
  type DispatchRequest,
  DispatchRequestSchema,
  isTerminal,
  type JobRecord,
  zodIssues,
} from "./schemas.ts";

/**
 * The use cases every entry point shares (HTTP routes, the CLI, the Lambda
 * handlers): one function per thing a user can do, so there is one way to do it.
 */

/** Record a dispatch (write-once per attempt) with its execution anchor. */
export async function recordDispatch(deps: Pick<Deps, "jobs" | "clock">, jobId: string, req: DispatchRequest): Promise<DispatchRecord> {
  const parsed = DispatchRequestSchema.safeParse(req);
  if (!parsed.success) throw new MamError("input.invalid", "invalid dispatch", { issues: zodIssues(parsed.error) });
  const job = await getJob(deps, jobId);
  if (isTerminal(job.status))
    throw new MamError("job.transitionRefused", `job ${jobId} is ${job.status}; a terminal job is not dispatched again`);
  const now = deps.clock.now().toISOString();
  const d = parsed.data;
  const record: DispatchRecord = {
    job_id: jobId,
    attempt_id: d.attempt_id,
    agent_session_uuid: d.agent_session_uuid,
    pane_process_generation: d.pane_process_generation,
    ...(d.pane_id === undefined ? {} : { pane_id: d.pane_id }),
    anchor: {
      started_at: d.anchor?.started_at ?? now,
      ...(d.anchor?.workspace_revision === undefined ? {} : { workspace_revision: d.anchor.workspace_revision }),
    },
    recorded_at: now,
  };
  await deps.jobs.recordDispatch(record);
  return record;
}

/** The job exists, is not terminal (its report tree is frozen once it is), and this attempt was dispatched. */
async function writableAttempt(deps: Pick<Deps, "jobs">, jobId: string, attemptId: number): Promise<string> {
  const job = await getJob(deps, jobId);
  if (isTerminal(job.status)) throw new MamError("report.frozen", `job ${jobId} is ${job.status}: its report tree is frozen`);
  if (!(await deps.jobs.getDispatch(jobId, attemptId))) {
    throw new MamError("dispatch.notFound", `job ${jobId} has no recorded dispatch for attempt ${attemptId}`);
  }
  return attemptReportLocation(jobId, attemptId);
}

/** Stage a report body for an attempt (`report-final.md.tmp`), atomically. */
export async function stageAttemptReport(
  deps: Pick<Deps, "jobs" | "reports">,
  jobId: string,
  attemptId: number,
  body: Uint8Array | AsyncIterable<Uint8Array>,
): Promise<{ sha256: string; bytes: number }> {
  const location = await writableAttempt(deps, jobId, attemptId);
  return deps.reports.put(location, STAGED_REPORT_NAME, body);
}

/** Finalize an attempt's report on the service (location derived, never supplied). */
export async function finalizeAttemptReport(
  deps: Pick<Deps, "jobs" | "reports" | "clock">,
  jobId: string,
  attemptId: number,
  sideEffects: readonly unknown[],
): Promise<Finalized> {
  validateSideEffects(sideEffects);
  const location = await writableAttempt(deps, jobId, attemptId);
  return finalizeReport(deps.reports, deps.clock, { location, jobId, attemptId, sideEffects });
}

export async function verifyAttemptReport(
  deps: Pick<Deps, "jobs" | "reports">,
  jobId: string,
  attemptId: number,
  expectedArtifacts?: readonly string[],
): Promise<Verification> {
  const job = await getJob(deps, jobId);
  return verifyManifest(deps.reports, {
    location: attemptReportLocation(jobId, attemptId),
    jobId,
    attemptId,
    expectedArtifacts: expectedArtifacts ?? job.expected_artifacts,
  });
}

/** The gate over the service's own report tree: the location comes from the latest dispatch. */
export async function evaluateJob(deps: GateDeps, jobId: string, scenario: unknown): Promise<GateResult> {
  const job = await getJob(deps, jobId);
  return evaluateGate(deps, { jobId, job, scenario, reportLocation: (d) => attemptReportLocation(jobId, d.attempt_id) });
}

export const EVENT_ACTIONS = { started: "claim", progress: "progress", completed: "completed", error: "error" } as const satisfies Record<
  string,
  Action
>;
export type AgentEvent = keyof typeof EVENT_ACTIONS;

export interface PublishEventInput {
  readonly event: AgentEvent;
  /** Absent: the seq the caller sees now (read, then compare-and-swap on it). */
  readonly expectedSeq?: number | undefined;
  /** The attempt reporting (recorded in the event log); implied by `finalize`. */
  readonly attemptId?: number | undefined;
  /** Finalize first: where the report lies (the service derives it; the CLI passes the agent's own directory). */
  readonly finalize?: { readonly location: string; readonly attemptId: number; readonly sideEffects: readonly unknown[] } | undefined;
  readonly data?: Record<string, import("zod").z.core.util.JSONType> | undefined;
}

export interface PublishEventResult {
  readonly record: JobRecord;
  readonly finalized?: Finalized;
  readonly flush: FlushResult;
}

/**
 * An explicit report from the agent: finalize first (when asked), commit the
 * transition with its intent, record the attempt in the job's event log, publish,
 * settle. Bad input is refused before anything is finalized or committed; a
 * broker that cannot be reached leaves the commit in place and the intent owed.
 */
export async function publishAgentEvent(deps: Deps, jobId: string, input: PublishEventInput, actor: Actor): Promise<PublishEventResult> {
  if (input.finalize) validateSideEffects(input.finalize.sideEffects);
  const job = await getJob(deps, jobId);
  const action = EVENT_ACTIONS[input.event];
  let finalized: Finalized | undefined;
  if (input.finalize) {
    if (isTerminal(job.status)) throw new MamError("report.frozen", `job ${jobId} is ${job.status}: its report tree is frozen`);
    // Refuse what the commit would refuse before finalizing anything: bad input changes nothing.
    const rule = TRANSITIONS[action];
    if (!(rule.from as readonly string[]).includes(job.status)) throw conflictFor(job, null, rule.from);
    finalized = await finalizeReport(deps.reports, deps.clock, { ...input.finalize, jobId });
  }
  const t: TransitionInput = { action, expectedSeq: input.expectedSeq ?? job.transition_seq, notify: true };
  const record = await transitionJob(deps, jobId, t, actor);
  const attemptId = input.attemptId ?? input.finalize?.attemptId;
  await deps.jobs.appendEvent({
    job_id: jobId,
    at: deps.clock.now().toISOString(),
    id: deps.ids.uuid(),
    event: "publish_event",
    data: {
      event: input.event,
      transition_seq: record.transition_seq,
      ...(attemptId === undefined ? {} : { attempt_id: attemptId }),
      ...(finalized ? { report_sha256: finalized.manifest.sha256 } : {}),
      ...(input.data ? { data: input.data } : {}),
    },
  });
  const flush = await flushNotification(deps, jobId);
  return { record, ...(finalized ? { finalized } : {}), flush };
}
