import type { Flags } from "./config.ts";
import type { GateRefusal } from "./metrics.ts";
import type { JobRecord } from "./schemas.ts";

/**
 * The gate's first checks, in DESIGN.md's order, on the flags and the record alone
 * (no dispatch, no report, no hash): the feature flag, the CAS switch, the job
 * running, opted in, and its backend in the evidence-backed allowlist. The first
 * that fails, or undefined when all pass. The gate begins with these; the Stop
 * nudge asks them too (it nudges only a job the gate could complete but for its report).
 */
export function recordChecks(
  flags: Flags,
  job: JobRecord | undefined,
  jobId: string,
): { refusal: GateRefusal; reason: string } | undefined {
  const flagged = flagChecks(flags);
  if (flagged !== undefined) return flagged;
  if (!job) return { refusal: "job_missing", reason: `job ${jobId} does not exist` };
  if (job.status !== "running") return { refusal: "not_running", reason: `job ${job.job_id} is ${job.status}, not running` };
  if (job.auto_complete !== true)
    return { refusal: "not_opted_in", reason: `job ${job.job_id} did not opt in to auto-completion (auto_complete is not true)` };
  if (!flags.allowedBackends.includes(job.agent)) {
    return {
      refusal: "backend_not_allowed",
      reason: `backend ${JSON.stringify(job.agent)} has no quiescent-state evidence in the allowlist (allowed: ${flags.allowedBackends.join(", ") || "none"})`,
    };
  }
  return undefined;
}

/** The first two of them, on the flags alone: what the gate asks before it reads the record. */
export function flagChecks(flags: Flags): { refusal: GateRefusal; reason: string } | undefined {
  if (!flags.autoComplete) return { refusal: "disabled", reason: "auto-completion is disabled (set MAM_AUTO_COMPLETE=1 to enable it)" };
  if (!flags.engineCas)
    return { refusal: "cas_rolled_back", reason: "auto-completion is refused while the CAS engine is rolled back (MAM_ENGINE_CAS=0)" };
  return undefined;
}
