import type { Flags } from "./config.ts";
import { recordChecks } from "./gate-checks.ts";
import type { JobRecord, ObservationSet } from "./schemas.ts";

/**
 * The Stop nudge (issue 21): a job that opted in (`nudge_on_stop`) and whose agent
 * stops with its report not finalized is sent back to work once, with a fixed
 * instruction naming only the attempt and the `mam` command that finalizes a report.
 * Decided on the record the Stop observation's write read, and counted in that same
 * conditional write (`nudges`, at most MAM_NUDGE_MAX), so two Stops at once cannot
 * both nudge past the bound. It reads the record and hashes nothing: it answers
 * within the hook's time.
 *
 *   Stop (no finalized report) -> block: "finalize attempt N with mam finalize ..." -> agent finalizes -> Stop -> quiescent
 *
 * Never when Claude Code says the agent is already continuing because of a Stop hook
 * (`stop_hook_active`), never once MAM_NUDGE_MAX nudges were answered on the attempt,
 * and only when every gate check before the report's passes (the flag, the CAS switch,
 * the job running, opted in to auto-completion, its backend allowed): a nudge is for a
 * job the gate could complete but for its report.
 */
export function nudgeDue(
  job: JobRecord,
  set: ObservationSet | undefined,
  attemptId: number,
  flags: Flags,
  stopHookActive: boolean,
): boolean {
  if (stopHookActive || job.nudge_on_stop !== true) return false;
  if (recordChecks(flags, job, job.job_id) !== undefined) return false;
  if (job.finalized_report?.attempt_id === attemptId) return false;
  return (set?.nudges ?? 0) < flags.nudgeMax;
}

/**
 * What the agent reads (`reason` enters the model's context): a fixed template naming
 * the attempt and the command that finalizes its report, never a field of the job (an
 * id, a prompt) and never a command that completes it — the gate completes it, on
 * evidence, once the report is finalized and the agent stops.
 */
export function nudgeReason(attemptId: number): string {
  return (
    `mam: attempt ${attemptId} has no finalized report. Write your report to report-final.md, then run ` +
    `mam finalize --job "$MAM_JOB" --attempt "$MAM_ATTEMPT" --report report-final.md and stop again.`
  );
}
