import type { Actor, Deps } from "./deps.ts";
import { MamError } from "./errors.ts";
import type { JobChange } from "./ports.ts";
import {
  type Action,
  isTerminal,
  JobId,
  type JobRecord,
  type NotificationIntent,
  NotificationIntentSchema,
  type ProgressFields,
  type RegisterJob,
  RegisterJobSchema,
  type Status,
  zodIssues,
} from "./schemas.ts";

type ActorKind = Actor["kind"];

/**
 * The transition table. Every state change is one of these, committed as one
 * compare-and-swap on `transition_seq`. Anything not here is refused naming the
 * current status; terminal records accept no further state change.
 *
 *   pending --claim--> running --progress--> running
 *   pending|running --completed|error--> completed|error   (an agent may report unclaimed)
 *   pending|running --cancel--> cancelled                   (operator only)
 */
export const TRANSITIONS = {
  claim: { from: ["pending"], to: "running", actors: ["agent", "operator"], event: "running", fields: true },
  progress: { from: ["running"], to: "running", actors: ["agent", "operator"], event: "progress", fields: true },
  completed: { from: ["pending", "running"], to: "completed", actors: ["agent", "operator"], event: "completed", fields: false },
  error: { from: ["pending", "running"], to: "error", actors: ["agent", "operator"], event: "error", fields: false },
  cancel: { from: ["pending", "running"], to: "cancelled", actors: ["operator"], event: "cancelled", fields: false },
} as const satisfies Record<Action, { from: readonly Status[]; to: Status; actors: readonly ActorKind[]; event: string; fields: boolean }>;

/**
 * Which actor may write which field (on `claim` and `progress`). An agent writes
 * only its free-form progress fields, never what the gate reads.
 */
export const FIELD_WRITERS = {
  progress: ["agent", "operator"],
  agent_session: ["agent", "operator"],
  auto_complete: ["operator"],
  role: ["operator"],
  expected_artifacts: ["operator"],
} as const satisfies Record<keyof ProgressFields, readonly ActorKind[]>;

export function assertJobId(jobId: string): void {
  const r = JobId.safeParse(jobId);
  if (!r.success)
    throw new MamError("input.jobId", `not a valid job id: ${JSON.stringify(jobId).slice(0, 80)}`, {
      issues: zodIssues(r.error, "job_id"),
    });
}

export async function getJob(deps: Pick<Deps, "jobs">, jobId: string): Promise<JobRecord> {
  assertJobId(jobId);
  const job = await deps.jobs.get(jobId);
  if (!job) throw new MamError("job.notFound", `job ${jobId} does not exist`);
  return job;
}

/** Register a job: status pending, transition_seq 0. */
export async function registerJob(deps: Pick<Deps, "jobs" | "clock" | "ids">, input: RegisterJob): Promise<JobRecord> {
  const parsed = RegisterJobSchema.safeParse(input);
  if (!parsed.success) throw new MamError("input.invalid", "invalid job registration", { issues: zodIssues(parsed.error) });
  const req = parsed.data;
  const now = deps.clock.now().toISOString();
  const record: JobRecord = {
    job_id: req.job_id ?? deps.ids.uuid(),
    prompt: req.prompt,
    agent: req.agent,
    role: req.role ?? "Worker",
    status: "pending",
    iteration: 1,
    transition_seq: 0,
    expected_artifacts: req.expected_artifacts ?? [],
    auto_complete: req.auto_complete ?? false,
    created_at: now,
    updated_at: now,
  };
  await deps.jobs.create(record);
  return record;
}

export function newIntent(deps: Pick<Deps, "clock" | "ids">, event: string, seq: number, reason?: string): NotificationIntent {
  return {
    id: deps.ids.uuid(),
    event,
    seq,
    ...(reason === undefined ? {} : { reason }),
    created_at: deps.clock.now().toISOString(),
  };
}

export interface TransitionInput {
  readonly action: Action;
  /** Required while MAM_ENGINE_CAS=1; ignored (last writer wins) when it is 0. */
  readonly expectedSeq?: number | undefined;
  readonly fields?: ProgressFields | undefined;
  /** Commit a notification intent with the state. Default: on for terminal actions. */
  readonly notify?: boolean | undefined;
  readonly reason?: string | undefined;
}

/**
 * Apply one transition from the table, as one conditional write. Throws:
 * `job.actionForbidden` / `job.fieldNotAllowed` (the actor may not), `input.invalid`
 * (no expected_seq while CAS is on), `job.notFound`, and `TransitionConflict`
 * (`job.transitionConflict` when stale, `job.transitionRefused` when the status
 * does not allow it), each writing nothing.
 */
export async function transitionJob(
  deps: Pick<Deps, "jobs" | "clock" | "ids" | "flags">,
  jobId: string,
  input: TransitionInput,
  actor: Actor,
): Promise<JobRecord> {
  assertJobId(jobId);
  const rule = TRANSITIONS[input.action];
  if (actor.kind === "agent" && actor.jobId !== jobId) {
    throw new MamError("auth.forbidden", `this agent is bound to job ${actor.jobId}, not ${jobId}`);
  }
  if (!(rule.actors as readonly ActorKind[]).includes(actor.kind)) {
    throw new MamError("job.actionForbidden", `an ${actor.kind} may not ${input.action} a job; only ${rule.actors.join(" or ")} may`);
  }
  const fields = input.fields ?? {};
  const names = Object.keys(fields) as (keyof ProgressFields)[];
  if (names.length > 0 && !rule.fields) {
    throw new MamError("job.fieldNotAllowed", `${input.action} writes no fields; set ${names.join(", ")} with claim or progress`);
  }
  const denied = names.filter((n) => !(FIELD_WRITERS[n] as readonly ActorKind[]).includes(actor.kind));
  if (denied.length > 0) {
    throw new MamError("job.fieldNotAllowed", `an ${actor.kind} may not set ${denied.join(", ")}; only an operator may`, {
      issues: denied.map((d) => ({ path: `fields.${d}`, message: "operator only" })),
    });
  }

  let expectedSeq: number | null;
  let nextSeq: number;
  if (deps.flags.engineCas) {
    if (input.expectedSeq === undefined) {
      throw new MamError("input.invalid", "expected_seq is required: every transition is compare-and-swap on transition_seq", {
        issues: [{ path: "expected_seq", message: "required" }],
      });
    }
    expectedSeq = input.expectedSeq;
    nextSeq = expectedSeq + 1;
  } else {
    // Rollback path (MAM_ENGINE_CAS=0): the caller's expected_seq is not checked,
    // the status still is. The intent's seq comes from a fresh read; a writer that
    // lands between the read and the write makes it trail the record (documented).
    expectedSeq = null;
    nextSeq = (await getJob(deps, jobId)).transition_seq + 1;
  }

  const notify = input.notify ?? isTerminal(rule.to);
  const set: Record<string, unknown> = { ...fields, status: rule.to, updated_at: deps.clock.now().toISOString() };
  if (notify) set.pending_notification = newIntent(deps, rule.event, nextSeq, input.reason);
  const change: JobChange = { from: rule.from, set: set as JobChange["set"] };
  return deps.jobs.transition(jobId, expectedSeq, change);
}

/**
 * Bookkeeping: the only write that is not a state transition. It may write
 * exactly one field, `pending_notification` (B-41), and never bumps
 * `transition_seq`. Clearing an intent goes through `settleNotification`, which is
 * conditional on the intent that was sent.
 */
export async function bookkeeping(deps: Pick<Deps, "jobs">, jobId: string, fields: Record<string, unknown>): Promise<void> {
  assertJobId(jobId);
  const others = Object.keys(fields).filter((k) => k !== "pending_notification");
  if (others.length > 0) {
    throw new MamError("bookkeeping.fieldRefused", `bookkeeping may not merge ${others.join(", ")}: it writes pending_notification only`, {
      issues: others.map((o) => ({ path: `fields.${o}`, message: "not writable by bookkeeping" })),
    });
  }
  if (!("pending_notification" in fields)) throw new MamError("input.invalid", "bookkeeping needs pending_notification");
  const intent = NotificationIntentSchema.safeParse(fields.pending_notification);
  if (!intent.success) {
    throw new MamError(
      "bookkeeping.fieldRefused",
      "bookkeeping may only replace pending_notification with a whole intent; clearing is settleNotification, conditional on the intent that was sent",
      { issues: zodIssues(intent.error, "fields.pending_notification") },
    );
  }
  // One conditional write; the store reports a missing job (`job.notFound`).
  await deps.jobs.replaceNotification(jobId, intent.data);
}
