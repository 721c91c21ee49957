import type { Actor, Deps, Using } from "./deps.ts";
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
 *
 * Before the charge, the disk floor (`keepDiskFloor`): below it the agent is refused
 * with 507 and not even its usage is counted.
 */
export async function chargeAgentUsage(
  deps: Using<Pick<JobRecords, "get" | "chargeUsage">, "flags" | "disk">,
  jobId: string,
  actor: Actor | undefined,
  charge: UsageCharge,
): Promise<void> {
  if (actor?.kind !== "agent") return;
  await keepDiskFloor(deps, charge.bytes);
  if (charge.events === 0 && charge.bytes === 0) return;
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

/**
 * Refuse an agent's write that would leave less than `flags.diskFloorBytes` free on
 * the stores' disk (`deps.disk`; none on AWS, or a floor of 0: nothing to keep):
 * `store.insufficientSpace` (507), naming the free bytes, the floor and its variable,
 * before anything is written. The room below the floor is for what is never refused
 * by it: the service's own records (log lines, bookkeeping, feed rows, settles) and
 * operators' writes, until the disk is really full and the store answers 503.
 *
 * The disk is asked on every agent write (one statfs, a few microseconds), never
 * cached: the bound on overshoot is what agents' writes already past this check
 * have still to write, not a cache's age.
 *
 *   statfs: free -> free - bytes < floor? 507, nothing written -> charge -> write
 */
export async function keepDiskFloor(deps: Pick<Deps, "flags" | "disk">, bytes: number): Promise<void> {
  const floor = deps.flags.diskFloorBytes;
  if (deps.disk === undefined || floor <= 0) return;
  const free = await deps.disk.freeBytes();
  if (free - bytes >= floor) return;
  const what = bytes > 0 ? `; ${bytes} more would leave less than` : ", less than";
  throw new MamError(
    "store.insufficientSpace",
    `the store's disk has ${free} bytes free${what} the floor of ${floor} bytes kept for the service's own records (MAM_DISK_FLOOR_BYTES); nothing was written; retry once space is freed`,
    { details: { free_bytes: free, floor_bytes: floor, variable: "MAM_DISK_FLOOR_BYTES" } },
  );
}
