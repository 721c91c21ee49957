import type { Answer, Schemas } from "@mam/client";
import type { AgentEvent, SideEffect } from "@mam/core";

/**
 * What a `mam` command asks of mam, whichever mode it runs in. Each command is
 * written once over this interface; `httpBackend` calls the API through @mam/client,
 * `embeddedBackend` calls core's services over the stores of a data dir (and the
 * agent's own report tree). Both answer in the API's wire shapes — the types
 * generated from the served OpenAPI document — so `--json` prints one shape per
 * command in both modes.
 */
export interface Backend {
  /** `api` (`--api URL`) or `embedded` (`--data-dir DIR`; `finalize`: the report's own directory). */
  readonly mode: "api" | "embedded";
  /**
   * The agent's explicit report: finalize first (when asked), commit the transition
   * with its intent, log the attempt, publish, settle. A publish that fails after the
   * commit is an answer (`published: false`, `publish_error`), not an error.
   */
  publishEvent(jobId: string, input: PublishEventInput): Promise<PublishEventAnswer>;
  /** Promote the report and write its manifest (`report-final.md` where it lies, or on the service). */
  finalize(jobId: string, input: ReportInput): Promise<FinalizeAnswer>;
  /**
   * Verify the service's copy of an attempt (the store's, in a data dir) and, once the
   * job completed on it, the copy its completion pinned: the one verification the API
   * answers. A failed verification is an answer (`ok: false`). A report directory
   * verified in place (`mam verify --report-dir`) is no backend's: `verifyReportDir`.
   */
  verify(jobId: string, input: VerifyInput): Promise<VerificationAnswer>;
  /**
   * Record a dispatch and mint its agent's token (the operator's call): through the
   * API, or on the data dir's store with its signing key (`mam dispatch`).
   */
  dispatch(jobId: string, request: DispatchRequestBody): Promise<DispatchAnswer>;
  /** One page of the change feed after `after` (from the beginning without it). */
  listChanges(query: { after?: string | undefined; limit: number }): Promise<ChangePageAnswer>;
  close(): Promise<void>;
}

export type ChangePageAnswer = Answer<"/v1/events", "get">;
export type DispatchAnswer = Answer<"/v1/jobs/{job_id}/dispatches", "post">;
export type DispatchRequestBody = Schemas["DispatchRequest"];

/** A re-sent completion (or its finalize), on the bytes its completion pinned: the job is already done; nothing was written. */
export type AlreadyCompletedAnswer = Schemas["AlreadyCompleted"];

export type PublishEventAnswer = Answer<"/v1/jobs/{job_id}/events", "post">;
export type FinalizeAnswer = Answer<"/v1/jobs/{job_id}/attempts/{attempt}/finalize", "post">;
export type VerificationAnswer = Answer<"/v1/jobs/{job_id}/attempts/{attempt}/verification", "get">;

/** The report an agent finalizes: the directory holding `report-final.md` (or `report-final.md.tmp`). */
export interface ReportInput {
  readonly reportDir: string;
  readonly attemptId: number;
  readonly sideEffects: readonly SideEffect[];
}

export interface PublishEventInput {
  readonly event: AgentEvent;
  readonly attemptId?: number | undefined;
  readonly finalize?: ReportInput | undefined;
}

export interface VerifyInput {
  readonly attemptId: number;
  /** Kinds of side effect that must be evidenced; the job's own list when undefined. */
  readonly expectedArtifacts: readonly string[] | undefined;
}
