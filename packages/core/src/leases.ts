import { reportFrozen } from "./conflicts.ts";
import type { Actor, Using } from "./deps.ts";
import { getJob } from "./engine.ts";
import { MamError } from "./errors.ts";
import { changeActorOf } from "./feed.ts";
import type { JobRecords, LeaseExpectation } from "./ports.ts";
import { isTerminal, type JobRecord, LEASE_FIELDS, type Lease, type LeaseKind } from "./schemas.ts";

/**
 * Whether `holdLease(kind, lease, expect)` may write on `record`: the rule every
 * adapter compiles to its condition, and the memory store evaluates as the reference.
 * Times are compared as the ISO strings the clock gives (`toISOString`: one format,
 * so string order is time order), as SQLite and DynamoDB compare them.
 */
export function leaseHolds(record: JobRecord, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): boolean {
  const stored = record[LEASE_FIELDS[kind]];
  if ("heldBy" in expect) return stored?.id === expect.heldBy;
  if (isTerminal(record.status)) return false;
  return stored === undefined || stored.expires_at <= expect.freeAt || (lease !== null && stored.attempt_id < lease.attempt_id);
}

/** Whether `lease` still holds `attemptId` at `now` (an older attempt's, or an expired one, holds nothing). */
export function leaseIsLive(lease: Lease | undefined, attemptId: number, now: string): lease is Lease {
  return lease !== undefined && lease.expires_at > now && lease.attempt_id >= attemptId;
}

/** Takes that lost to another writer of the job's lease, in a row, before the request is told to retry. */
const TAKE_ATTEMPTS = 8;

const KIND_CODE = { upload: "report.uploadInFlight", finalize: "report.finalizeInProgress" } as const satisfies Record<LeaseKind, string>;

/** The 409 a second upload or finalize of an attempt gets: it names the one holding it, and says nothing was written. */
export function leaseHeld(jobId: string, kind: LeaseKind, held: Lease): MamError {
  const what =
    kind === "finalize"
      ? `a finalize of attempt ${held.attempt_id} of job ${jobId} is in progress`
      : `an upload of attempt ${held.attempt_id} of job ${jobId} is in flight${held.declared ? " (declared, its bytes not yet staged)" : ""}`;
  const by = held.actor === undefined ? "" : ` by ${held.actor.type}${held.actor.token_id === undefined ? "" : ` ${held.actor.token_id}`}`;
  return new MamError(
    KIND_CODE[kind],
    `${what}${by}, since ${held.since}, until it ends or at the latest ${held.expires_at}; nothing was written; try again then`,
    { details: { in_progress: { kind, ...held } } },
  );
}

export interface LeaseRequest {
  readonly kind: LeaseKind;
  readonly attemptId: number;
  /** How long it holds at most: a crashed holder frees the attempt then. */
  readonly seconds: number;
  /** An upload held by its declaration (its bytes not sent yet). */
  readonly declared?: boolean;
  readonly actor?: Actor | undefined;
}

/**
 * Take the attempt's one upload in flight, or its one finalize in progress (issue 17),
 * with one conditional write on the job record (`holdLease`): only if none is held,
 * the one held expired by the clock, or it is an older attempt's. Held: a 409 naming
 * it, and nothing written. The rule is per attempt, not per caller: an operator's
 * request waits its turn like an agent's.
 *
 *   read lease -> live? refuse (409, names it)
 *              -> holdLease(lease, {freeAt: now})  lost: read again
 *
 * A report PUT through the service's route takes over an upload held by its
 * declaration (`{heldBy}` the declaration's lease: it is that upload's body), never a
 * PUT's: of parallel PUTs of one declaration, one is staged and the others are 409.
 * Never an in-memory lock: `mam --data-dir` and `mam serve` are separate processes
 * on one store.
 */
export async function takeLease(
  deps: Using<Pick<JobRecords, "get" | "holdLease">, "clock" | "ids">,
  jobId: string,
  request: LeaseRequest,
): Promise<Lease> {
  for (let attempt = 0; attempt < TAKE_ATTEMPTS; attempt++) {
    const job = await getJob(deps, jobId);
    if (isTerminal(job.status)) throw reportFrozen(job);
    const now = deps.clock.now();
    const since = now.toISOString();
    const lease: Lease = {
      id: deps.ids.uuid(),
      attempt_id: request.attemptId,
      since,
      expires_at: new Date(now.getTime() + request.seconds * 1000).toISOString(),
      ...(request.declared === true ? { declared: true as const } : {}),
      actor: changeActorOf(request.actor) as NonNullable<Lease["actor"]>,
    };
    const held = job[LEASE_FIELDS[request.kind]];
    let expect: LeaseExpectation = { freeAt: since };
    if (leaseIsLive(held, request.attemptId, since)) {
      const takesOverDeclaration = request.kind === "upload" && request.declared !== true && held.declared === true;
      if (!takesOverDeclaration || held.attempt_id !== request.attemptId) throw leaseHeld(jobId, request.kind, held);
      expect = { heldBy: held.id };
    }
    if (await deps.jobs.holdLease(jobId, request.kind, lease, expect)) return lease;
  }
  throw new MamError(
    "store.unavailable",
    `other requests of job ${jobId} kept taking its ${request.kind} lease first; nothing was written; retry`,
  );
}

/**
 * Release a lease this request took: one conditional write on its id, so a lease that
 * expired and was taken by another is left alone. A release that fails (the store
 * unreachable) leaves the lease to expire: the attempt waits, never overlaps.
 */
export async function releaseLease(
  deps: Using<Pick<JobRecords, "holdLease">>,
  jobId: string,
  kind: LeaseKind,
  lease: Lease,
): Promise<void> {
  await deps.jobs.holdLease(jobId, kind, null, { heldBy: lease.id }).catch(() => false);
}

/**
 * Run `body` holding the lease `request` takes, releasing it when `body` returns or
 * throws (the TTL bounds it if this process dies in between).
 */
export async function withLease<T>(
  deps: Using<Pick<JobRecords, "get" | "holdLease">, "clock" | "ids">,
  jobId: string,
  request: LeaseRequest,
  body: (lease: Lease) => Promise<T>,
): Promise<T> {
  const lease = await takeLease(deps, jobId, request);
  try {
    return await body(lease);
  } finally {
    await releaseLease(deps, jobId, request.kind, lease);
  }
}
