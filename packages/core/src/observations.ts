import type { Actor } from "./actor.ts";
import { OBSERVATION_BOUNDS, utf8Bytes } from "./bounds.ts";
import type { Using } from "./deps.ts";
import { getJob } from "./engine.ts";
import { MamError } from "./errors.ts";
import { noteOf } from "./feed.ts";
import { nudgeDue } from "./nudge.ts";
import { CLOCK_SOURCE_KIND, type RecordedScenario } from "./policy.ts";
import type { DispatchRecords, JobRecords } from "./ports.ts";
import { candidateDueOf } from "./quiescence-rules.ts";
import {
  type DispatchRecord,
  type EvidenceEnd,
  type HookDetails,
  isTerminal,
  type JobRecord,
  type Observation,
  type ObservationRequest,
  ObservationRequestSchema,
  type ObservationSet,
  type SourceClass,
  zodIssues,
} from "./schemas.ts";

/**
 * Who is recording an observation, as the token says (never the body): a watcher, by
 * its token's name (or, unnamed, its id), or the job's own agent, for the attempt its
 * token is bound to.
 */
export type Observer = { readonly kind: "watcher"; readonly name: string } | { readonly kind: "agent"; readonly attempt: number };

/** What `recordObservation` did: the observation as stored, and whether it was a repeat coalesced into the source's last one. */
export interface RecordedObservation {
  readonly observation: Observation;
  readonly coalesced: boolean;
  readonly job: JobRecord;
  /** The write counted a Stop nudge (`ObservationOptions.nudge`): answer it with one. */
  readonly nudged: boolean;
}

/** What an agent hook's event adds to an observation (agent-hooks.ts); a watcher's or a plain post has none. */
export interface ObservationOptions {
  /** The field the session came in, named when another session is refused (default `agent_session_uuid`). */
  readonly sessionField?: string;
  /**
   * The session named is the agent's own id (a Codex thread), not the dispatch's: the
   * attempt's first event binds it, set once, in that event's write; an event naming
   * another is refused. The observation then carries the dispatch's session.
   */
  readonly bindsSession?: boolean;
  /** The hook's allowlisted fields, kept on a new observation. */
  readonly hook?: HookDetails;
  /**
   * A Claude Code `SessionStart` of `clear` or `fork`: the conversation the dispatch
   * started is over. Recorded whatever session it names (the new one), and the same
   * write ends the attempt's quiescence evidence: the gate holds until the next dispatch.
   */
  readonly endsEvidence?: EvidenceEnd["cause"];
  /** A quiescent `Stop`: send the agent back when `nudgeDue` says so, counted in this write (`nudges`). */
  readonly nudge?: { readonly stopHookActive: boolean };
}

/** Times a lost write is tried again from a fresh read before the caller is told to retry. */
const WRITE_TRIES = 8;

/**
 * Record what a watcher or an agent hook saw of a job's latest dispatch, as one
 * conditional write of the job's observation set (`writeObservations`: the job not
 * terminal, the attempt still the latest, the set as read), retried from a fresh read
 * when another write landed first. Refused, writing nothing: a body that does not
 * parse; a job that is terminal or has no recorded dispatch; an observation of another
 * attempt, session, process generation or pane than the latest dispatch recorded
 * (`observation.mismatch`, naming the field); an `observed_at` later than mam's clock
 * beyond the skew, or before the dispatch's anchor. A repeat of the source's last
 * state (same kind of signal, same dispatch identity) is coalesced into it: its
 * `last_seen_received_at` moves, nothing is bumped, the feed gets no row. A new state
 * past its source class's bound (`OBSERVATION_BOUNDS`) is not stored: the one write
 * then marks the attempt's evidence overflowed (once; the gate holds on it until the
 * next dispatch) and the answer is `quota.observations`.
 */
export async function recordObservation(
  deps: Using<Pick<JobRecords, "get" | "writeObservations"> & Pick<DispatchRecords, "getDispatch">, "clock" | "flags">,
  jobId: string,
  request: ObservationRequest,
  observer: Observer,
  actor?: Actor,
  options: ObservationOptions = {},
): Promise<RecordedObservation> {
  const parsed = ObservationRequestSchema.safeParse(request);
  if (!parsed.success) throw new MamError("input.invalid", "invalid observation", { issues: zodIssues(parsed.error, "body") });
  const body = parsed.data;
  if (observer.kind === "agent" && observer.attempt !== body.attempt_id) {
    throw new MamError("auth.forbidden", `this agent token is bound to attempt ${observer.attempt}, not ${body.attempt_id}`);
  }
  let read: DispatchRecord | undefined;
  for (let tries = 0; tries < WRITE_TRIES; tries++) {
    const job = await getJob(deps, jobId);
    const sourceClass: SourceClass = observer.kind;
    const source = observer.kind === "watcher" ? `watcher:${observer.name}` : `agent:${job.agent}`;
    // The dispatch is write-once: read again only when the latest attempt moved.
    const dispatch =
      read !== undefined && read.attempt_id === job.latest_attempt && !isTerminal(job.status) ? read : await latestDispatch(deps, job);
    read = dispatch;
    const received = deps.clock.now();
    const stored = observationsOf(job, dispatch.attempt_id);
    const bound = boundSessionOf(stored, body.agent_session_uuid, dispatch, options);
    const nudged = options.nudge !== undefined && nudgeDue(job, stored, dispatch.attempt_id, deps.flags, options.nudge.stopHookActive);
    // A nudged Stop sends the agent back to work (mam's own answer): work in flight, as a
    // Stop with a background task is, never the quiescence a rule would measure from.
    const seen: ObservationRequest = { ...body, agent_session_uuid: bound.session, ...(nudged ? { state: "working" as const } : {}) };
    checkObservation(seen, job, dispatch, sourceClass, received, deps.flags.observationSkewSeconds, options);
    const receivedAt = received.toISOString();
    const rev = job.observations?.rev ?? 0;
    const entries = stored?.entries ?? [];
    // What every write of this observation carries besides it: the session it binds (once), an end, a nudge counted.
    const extra = (set: ObservationSet): ObservationSet => ({
      ...set,
      ...(set.bound_session === undefined && bound.binds !== undefined ? { bound_session: { ...bound.binds, at: receivedAt } } : {}),
      ...(options.endsEvidence === undefined || set.ended !== undefined
        ? {}
        : { ended: { source, cause: options.endsEvidence, at: receivedAt } }),
      ...(nudged ? { nudges: (set.nudges ?? 0) + 1 } : {}),
    });
    const last = findLast(entries, (e) => e.source === source);
    if (last !== undefined && repeats(last, seen)) {
      const again: Observation = {
        ...last,
        last_seen_received_at: laterOf(receivedAt, last.last_seen_received_at),
        sightings: last.sightings + 1,
      };
      const next: ObservationSet = extra({
        ...(stored as ObservationSet),
        rev: rev + 1,
        entries: entries.map((e) => (e.seq === again.seq ? again : e)),
      });
      const candidate = repeatCandidate(job, next, last, again, deps.flags.quiescenceRules);
      // A `working` sighted again is activity (it clears a stale mark); any other repeat is not.
      const activity = again.state === "working" ? { activity: { at: receivedAt } } : {};
      const written = await deps.jobs.writeObservations(jobId, rev, next, { bump: false, ...candidate, ...activity });
      if (written !== undefined) return { observation: again, coalesced: true, job: written, nudged };
      continue;
    }
    const observation: Observation = {
      seq: entries.reduce((max, e) => Math.max(max, e.seq), 0) + 1,
      source,
      source_kind: seen.source_kind,
      state: seen.state,
      agent_session_uuid: seen.agent_session_uuid,
      ...(seen.pane_process_generation === undefined ? {} : { pane_process_generation: seen.pane_process_generation }),
      ...(seen.pane_id === undefined ? {} : { pane_id: seen.pane_id }),
      observed_at: seen.observed_at,
      received_at: receivedAt,
      last_seen_received_at: receivedAt,
      sightings: 1,
      ...(options.hook === undefined ? {} : { hook: options.hook }),
    };
    const base: ObservationSet = stored ?? { attempt_id: dispatch.attempt_id, rev: rev + 1, entries: [] };
    const passed = boundPassed(entries, sourceClass, observation);
    if (passed !== undefined) {
      const refusal = overBound(sourceClass, passed, dispatch.attempt_id);
      // The attempt's evidence is already marked overflowed: nothing more to write.
      if (stored?.overflow !== undefined) throw refusal;
      const next: ObservationSet = { ...base, rev: rev + 1, overflow: { source, bound: passed, at: receivedAt } };
      const note = noteOf(actor, { overflowed: { source, bound: passed } });
      // Overflowed evidence holds the gate until the next dispatch: the job is no candidate.
      const candidate = job.candidate_at === undefined ? {} : { candidate: null };
      if ((await deps.jobs.writeObservations(jobId, rev, next, { bump: true, note, ...candidate })) !== undefined) throw refusal;
      continue;
    }
    const next: ObservationSet = extra({ ...base, rev: rev + 1, entries: [...entries, observation] });
    const note = noteOf(actor, { observed: { source, source_kind: observation.source_kind, state: observation.state } });
    const due = candidateDueOf(next, job.agent, deps.flags.quiescenceRules);
    const candidate = due === null && job.candidate_at === undefined ? {} : { candidate: due };
    const written = await deps.jobs.writeObservations(jobId, rev, next, { bump: true, note, ...candidate, activity: { at: receivedAt } });
    if (written !== undefined) return { observation, coalesced: false, job: written, nudged };
  }
  throw new MamError(
    "store.unavailable",
    `job ${jobId}'s observations kept changing while this one was written (${WRITE_TRIES} tries); send it again`,
  );
}

/**
 * The candidate mark a coalesced repeat leaves: due, in the same write, when the repeat
 * makes its source's own span cover the settle window (its last sighting reaches the
 * source's own due time: a polling rule measures each source on its own, so another
 * source's earlier receipt, which set the job's first due time, is not the crossing);
 * removed when the set can no longer approve (a `working` seen again); otherwise left
 * as it is, so a watcher's every poll does not re-mark a job the sweep found held.
 */
function repeatCandidate(
  job: JobRecord,
  next: ObservationSet,
  before: Observation,
  after: Observation,
  rules: readonly string[],
): { candidate?: string | null } {
  if (candidateDueOf(next, job.agent, rules) === null) return job.candidate_at === undefined ? {} : { candidate: null };
  const own = candidateDueOf(next, job.agent, rules, after.source);
  if (own === null) return {};
  const at = Date.parse(own);
  const covers = Date.parse(before.last_seen_received_at) < at && at <= Date.parse(after.last_seen_received_at);
  return covers ? { candidate: own } : {};
}

/** The job's observation set, when it is of `attemptId` (a set of an earlier attempt is none of this one's). */
export function observationsOf(job: JobRecord, attemptId: number): ObservationSet | undefined {
  return job.observations?.attempt_id === attemptId ? job.observations : undefined;
}

/** The job's latest recorded dispatch, or the refusal saying why there is none to observe. */
async function latestDispatch(deps: Using<Pick<DispatchRecords, "getDispatch">>, job: JobRecord): Promise<DispatchRecord> {
  if (isTerminal(job.status)) {
    throw new MamError("job.transitionRefused", `job ${job.job_id} is ${job.status}; a terminal job takes no observations`, {
      details: { current: job },
    });
  }
  const dispatch = job.latest_attempt === undefined ? undefined : await deps.jobs.getDispatch(job.job_id, job.latest_attempt);
  if (dispatch === undefined) {
    throw new MamError(
      "dispatch.notFound",
      `job ${job.job_id} has no recorded dispatch: an observation is of a dispatch; record one first`,
    );
  }
  return dispatch;
}

/**
 * The refusals that need the record and the dispatch: the dispatch identity the body
 * names against the latest dispatch (each field named), and its `observed_at` against
 * mam's clock and the dispatch's anchor. Every identity field given is checked; a
 * watcher must name the process generation, and the pane where the dispatch recorded one.
 */
function checkObservation(
  body: ObservationRequest,
  job: JobRecord,
  dispatch: DispatchRecord,
  sourceClass: SourceClass,
  received: Date,
  skewSeconds: number,
  options: ObservationOptions,
): void {
  const mismatch = (field: string, message: string) =>
    new MamError("observation.mismatch", message, { issues: [{ path: `body.${field}`, message }], details: { current: job } });
  if (body.attempt_id !== dispatch.attempt_id) {
    if (body.attempt_id > dispatch.attempt_id) {
      throw new MamError("dispatch.notFound", `job ${job.job_id} has no recorded dispatch for attempt ${body.attempt_id}`);
    }
    throw mismatch(
      "attempt_id",
      `attempt ${body.attempt_id} is not job ${job.job_id}'s latest dispatch (attempt ${dispatch.attempt_id}): an observation of a superseded dispatch is not recorded`,
    );
  }
  // A cleared or forked session names its new id: recorded as what ends the evidence of the one dispatched.
  // A cleared or forked session names its new id: recorded as what ends the evidence of the one dispatched.
  if (options.endsEvidence === undefined) checkDispatchedSession(body.agent_session_uuid, dispatch, options, job);
  if (body.pane_process_generation === undefined) {
    if (sourceClass === "watcher") {
      throw mismatch("pane_process_generation", "a watcher's observation names the pane's process generation (pane_process_generation)");
    }
  } else if (body.pane_process_generation !== dispatch.pane_process_generation) {
    throw mismatch(
      "pane_process_generation",
      `pane_process_generation ${body.pane_process_generation} does not match attempt ${dispatch.attempt_id}'s recorded dispatch (${dispatch.pane_process_generation})`,
    );
  }
  if (body.pane_id === undefined) {
    if (sourceClass === "watcher" && dispatch.pane_id !== undefined) {
      throw mismatch(
        "pane_id",
        `attempt ${dispatch.attempt_id}'s dispatch recorded pane ${dispatch.pane_id}: a watcher's observation names it (pane_id)`,
      );
    }
  } else if (body.pane_id !== dispatch.pane_id) {
    throw mismatch(
      "pane_id",
      dispatch.pane_id === undefined
        ? `attempt ${dispatch.attempt_id}'s dispatch recorded no pane, so pane_id ${body.pane_id} cannot be checked; leave it out`
        : `pane_id ${body.pane_id} does not match attempt ${dispatch.attempt_id}'s recorded pane ${dispatch.pane_id}`,
    );
  }
  const observed = Date.parse(body.observed_at);
  if (observed > received.getTime() + skewSeconds * 1000) {
    const message = `observed_at ${body.observed_at} is later than mam received it (${received.toISOString()}) by more than ${skewSeconds} s (MAM_OBSERVATION_SKEW_SECONDS): check the sender's clock`;
    throw new MamError("input.invalid", message, { issues: [{ path: "body.observed_at", message: "later than mam's clock" }] });
  }
  if (observed < Date.parse(dispatch.anchor.started_at)) {
    const message = `observed_at ${body.observed_at} is before attempt ${dispatch.attempt_id}'s dispatch started (${dispatch.anchor.started_at}): it is not an observation of this dispatch`;
    throw new MamError("input.invalid", message, { issues: [{ path: "body.observed_at", message: "before the dispatch's anchor" }] });
  }
}

/**
 * The session an event names when it is the agent's own (`bindsSession`, a Codex
 * thread): the one the attempt's first event bound, or, with none bound yet, bound
 * by this one (`binds`). The observation then carries the dispatch's session. An
 * event naming another than the bound one is refused, naming its field.
 */
function boundSessionOf(
  stored: ObservationSet | undefined,
  session: string,
  dispatch: DispatchRecord,
  options: ObservationOptions,
): { session: string; binds?: { id: string; field: string } } {
  if (options.bindsSession !== true) return { session };
  const field = options.sessionField ?? "agent_session_uuid";
  const bound = stored?.bound_session;
  if (bound !== undefined && bound.id !== session) {
    const message = `${field} ${session} is not the session attempt ${dispatch.attempt_id}'s first event bound (${bound.id}, at ${bound.at}): another session's event on this token`;
    throw new MamError("observation.mismatch", message, { issues: [{ path: `body.${field}`, message }] });
  }
  return bound === undefined
    ? { session: dispatch.agent_session_uuid, binds: { id: session, field } }
    : { session: dispatch.agent_session_uuid };
}

/** The session an observation names must be the one its dispatch recorded (`mam dispatch` generated it): another is refused, naming the field it came in. */
function checkDispatchedSession(session: string, dispatch: DispatchRecord, options: ObservationOptions, job?: JobRecord): void {
  if (session === dispatch.agent_session_uuid) return;
  const field = options.sessionField ?? "agent_session_uuid";
  const message = `${field} does not match attempt ${dispatch.attempt_id}'s recorded dispatch (another session's observation): this token belongs to the session mam dispatch generated (MAM_SESSION)`;
  throw new MamError("observation.mismatch", message, {
    issues: [{ path: `body.${field}`, message }],
    ...(job === undefined ? {} : { details: { current: job } }),
  });
}

/**
 * The session an event with no evidence names (a hook's `SessionStart`, an unread
 * notification), checked as `recordObservation` checks an observation's: bound once
 * (`bindsSession`) or the dispatch's. A read; nothing is written, nothing bound.
 */
export async function checkObservedSession(
  deps: Using<Pick<JobRecords, "get"> & Pick<DispatchRecords, "getDispatch">>,
  jobId: string,
  attemptId: number,
  session: string,
  options: ObservationOptions,
): Promise<void> {
  const job = await getJob(deps, jobId);
  const dispatch = await deps.jobs.getDispatch(jobId, attemptId);
  if (dispatch === undefined) return;
  const bound = boundSessionOf(observationsOf(job, attemptId), session, dispatch, options);
  if (options.bindsSession !== true) checkDispatchedSession(bound.session, dispatch, options);
}

/** The same state, by the same kind of signal, of the same dispatch identity: a repeat, coalesced. */
function repeats(last: Observation, body: ObservationRequest): boolean {
  return (
    last.state === body.state &&
    last.source_kind === body.source_kind &&
    last.agent_session_uuid === body.agent_session_uuid &&
    last.pane_process_generation === body.pane_process_generation &&
    last.pane_id === body.pane_id
  );
}

/** Which of its class's bounds `observation` would pass, if stored beside `entries`. */
function boundPassed(entries: readonly Observation[], sourceClass: SourceClass, observation: Observation): "count" | "bytes" | undefined {
  const bounds = OBSERVATION_BOUNDS[sourceClass];
  const mine = entries.filter((e) => e.source.startsWith(`${sourceClass}:`));
  if (mine.length + 1 > bounds.count) return "count";
  const bytes = mine.reduce((sum, e) => sum + utf8Bytes(JSON.stringify(e)), utf8Bytes(JSON.stringify(observation)));
  return bytes > bounds.bytes ? "bytes" : undefined;
}

function overBound(sourceClass: SourceClass, bound: "count" | "bytes", attempt: number): MamError {
  const limit = OBSERVATION_BOUNDS[sourceClass];
  const what = bound === "count" ? `${limit.count} observations` : `${limit.bytes} bytes of observations`;
  return new MamError(
    "quota.observations",
    `the ${sourceClass} sources of attempt ${attempt} have recorded ${what}, their bound: this state was not stored, and the attempt's evidence is marked overflowed (the gate holds until the next dispatch)`,
    { details: { source_class: sourceClass, bound, limit: bound === "count" ? limit.count : limit.bytes } },
  );
}

/** The later of two ISO times of one format (`toISOString`): string order is time order. */
function laterOf(a: string, b: string): string {
  if (a < b) return b;
  return a;
}

function findLast<T>(items: readonly T[], test: (item: T) => boolean): T | undefined {
  for (let i = items.length - 1; i >= 0; i--) if (test(items[i] as T)) return items[i];
  return undefined;
}

/**
 * The scenario mam builds from what it recorded of `dispatch`, the job's latest
 * (`mam.scenario/v2`, read by the policy's rules): the attempt's observations as
 * stored (first receipt, last sighting, who), the report's state, the overflow if
 * there was one, and mam's clock at `now` as its own source kind (`mam.clock`), the
 * one time an event-driven rule may close a span with. `built_from` names what it
 * can be rebuilt from.
 */
export function buildScenario(job: JobRecord, dispatch: DispatchRecord, now: Date): RecordedScenario {
  const set = observationsOf(job, dispatch.attempt_id);
  const at = now.toISOString();
  return {
    schema: "mam.scenario/v2",
    dispatch_context: {
      job_id: job.job_id,
      attempt_id: dispatch.attempt_id,
      agent_session_uuid: dispatch.agent_session_uuid,
      pane_process_generation: dispatch.pane_process_generation,
      backend: job.agent,
      ...(dispatch.pane_id === undefined ? {} : { pane_id: dispatch.pane_id }),
    },
    // The stored set's rev, whichever attempt it is of: the gate's commit is conditional on it.
    built_from: { evidence_seq: job.evidence_seq, transition_seq: job.transition_seq, observations_rev: job.observations?.rev ?? 0 },
    timeline: [
      ...(set?.entries ?? []).map((e) => ({
        seq: e.seq,
        source: e.source,
        source_kind: e.source_kind,
        state: e.state,
        received_at: e.received_at,
        last_seen_at: e.last_seen_received_at,
        sightings: e.sightings,
        observed_at: e.observed_at,
        agent_session_uuid: e.agent_session_uuid,
        ...(e.pane_process_generation === undefined ? {} : { pane_process_generation: e.pane_process_generation }),
        ...(e.pane_id === undefined ? {} : { pane_id: e.pane_id }),
      })),
      { source: "mam", source_kind: CLOCK_SOURCE_KIND, state: "unknown", received_at: at, last_seen_at: at, sightings: 1 },
    ],
    filesystem: { manifest_committed: job.finalized_report?.attempt_id === dispatch.attempt_id },
    ...(set?.overflow === undefined ? {} : { evidence_overflow: set.overflow }),
    ...(set?.ended === undefined ? {} : { evidence_ended: set.ended }),
  };
}
