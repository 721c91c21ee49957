import type { Actor, Using } from "./deps.ts";
import { getJob } from "./engine.ts";
import { MamError } from "./errors.ts";
import type { JobRecords } from "./ports.ts";
import type { AgentUsage } from "./schemas.ts";

/** What one request of an agent is about to send: events, and bytes of event data, report body or declared upload. */
export interface UsageCharge {
  readonly events: number;
  readonly bytes: number;
}

/** Charges that lost to another charge of the same job, in a row, before the request is told to retry. */
const CHARGE_ATTEMPTS = 8;

/**
 * Reserve what an agent is about to send against its job's quotas (`flags.quotas`),
 * before any of it is written: one conditional write of the job's `agent_usage`
 * (`chargeUsage`, conditional on the counts read), re-read and tried again when another
 * charge of the job landed in between. Past a bound it refuses, naming the bound and
 * writing nothing: `quota.events` (429) for the job's events, `quota.bytes` (413) for
 * the attempt's or the job's bytes.
 *
 *   read agent_usage -> over a bound? refuse -> chargeUsage(prior, next) -> write the bytes
 *                                               lost to another charge: read again
 *
 * A reservation is never given back: a write that fails after it (a refusal further on,
 * a full disk, a dropped upload) leaves it counted. That is the fail-closed side: an
 * agent can be refused early, never let past its bound. Only agents are charged; what
 * the service writes of its own (log lines, bookkeeping, feed rows, settles) and what an
 * operator sends never are.
 */
export async function chargeAgentUsage(
  deps: Using<Pick<JobRecords, "get" | "chargeUsage">, "flags">,
  jobId: string,
  actor: Actor | undefined,
  charge: UsageCharge,
): Promise<void> {
  if (actor?.kind !== "agent" || (charge.events === 0 && charge.bytes === 0)) return;
  const quotas = deps.flags.quotas;
  for (let attempt = 0; attempt < CHARGE_ATTEMPTS; attempt++) {
    const job = await getJob(deps, jobId);
    const prior = job.agent_usage;
    // A retired attempt's request (its write will refuse it, saying so) still counts for
    // the job, and leaves the count of the attempt that superseded it as it is.
    const retired = prior !== undefined && prior.attempt_id > actor.attemptId;
    const next: AgentUsage = {
      events: (prior?.events ?? 0) + charge.events,
      bytes: (prior?.bytes ?? 0) + charge.bytes,
      attempt_id: retired ? prior.attempt_id : actor.attemptId,
      attempt_bytes: (prior?.attempt_id === actor.attemptId || retired ? prior.attempt_bytes : 0) + (retired ? 0 : charge.bytes),
    };
    if (charge.events > 0 && next.events > quotas.jobEvents) {
      throw new MamError(
        "quota.events",
        `job ${jobId} has taken its quota of ${quotas.jobEvents} agent events (MAM_QUOTA_JOB_EVENTS); nothing was written`,
        { details: { limit: quotas.jobEvents, used: prior?.events ?? 0, quota: "MAM_QUOTA_JOB_EVENTS" } },
      );
    }
    if (!retired && next.attempt_bytes > quotas.attemptBytes) {
      const used = next.attempt_bytes - charge.bytes;
      throw new MamError(
        "quota.bytes",
        `attempt ${actor.attemptId} of job ${jobId} has sent ${used} bytes; ${charge.bytes} more would pass its quota of ${quotas.attemptBytes} (MAM_QUOTA_ATTEMPT_BYTES); nothing was written`,
        { details: { limit: quotas.attemptBytes, used, quota: "MAM_QUOTA_ATTEMPT_BYTES" } },
      );
    }
    if (next.bytes > quotas.jobBytes) {
      const used = next.bytes - charge.bytes;
      throw new MamError(
        "quota.bytes",
        `job ${jobId} has been sent ${used} bytes; ${charge.bytes} more would pass its quota of ${quotas.jobBytes} (MAM_QUOTA_JOB_BYTES); nothing was written`,
        { details: { limit: quotas.jobBytes, used, quota: "MAM_QUOTA_JOB_BYTES" } },
      );
    }
    if (await deps.jobs.chargeUsage(jobId, prior, next)) return;
  }
  throw new MamError("store.unavailable", `other requests of job ${jobId} kept being counted first; nothing was written; retry`);
}
