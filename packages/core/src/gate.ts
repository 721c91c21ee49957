import type { Using } from "./deps.ts";
import { newIntent } from "./engine.ts";
import { isMamError } from "./errors.ts";
import { verifyFinalizedEvidence } from "./finalize.ts";
import { flagChecks, recordChecks } from "./gate-checks.ts";
import { GATE_REASON_CLASS, type GateRefusal } from "./metrics.ts";
import { buildScenario } from "./observations.ts";
import type { RecordedScenario } from "./policy.ts";
import * as policy from "./policy.ts";
import type { DispatchRecords, JobRecords } from "./ports.ts";
import type { Decision, DispatchRecord, JobRecord } from "./schemas.ts";

export interface GateResult {
  readonly committed: boolean;
  readonly reason: string;
  /** The policy's decision, when the gate got that far. */
  readonly decision: Decision | null;
  /** The committed record, when it committed. */
  readonly record?: JobRecord;
  /** A dry run: whether the gate would have committed (it wrote nothing). */
  readonly wouldCommit?: boolean;
  /** The scenario the policy read, when the gate built it from what mam recorded. */
  readonly scenario?: RecordedScenario;
  /** It decided to commit, and another write moved the job first (nothing written). */
  readonly lostRace?: true;
}

export interface EvaluateInput {
  readonly jobId: string;
  /**
   * The scenario as the watcher sent it: read raw, validated by the policy; or
   * `RECORDED`: the gate builds it from what mam recorded of the latest dispatch
   * (`buildScenario`, a `mam.scenario/v2`).
   */
  readonly scenario: unknown;
  /** Who posted the scenario (the token's id), recorded in the completion's evidence. */
  readonly postedBy?: string | undefined;
  /** Decide, and write nothing: the answer says whether it would have committed. */
  readonly dryRun?: boolean | undefined;
  /**
   * Where the attempt's report tree is; absent means the gate cannot verify, so it
   * refuses. The service passes a function of the latest dispatch (it derives the
   * location, never takes one from a caller).
   */
  readonly reportLocation?: string | ((dispatch: DispatchRecord) => string) | undefined;
  /** The record, when the caller has just read it (saves a read; the commit is still a CAS on its seq). */
  readonly job?: JobRecord | undefined;
}

export type GateDeps = Using<
  Pick<JobRecords, "get" | "transition"> & Pick<DispatchRecords, "getDispatch">,
  "reports" | "clock" | "ids" | "flags" | "metrics"
> & {
  /** The policy; replaceable so a test can make it throw (B-24). */
  readonly decide?: typeof policy.decide;
};

/** A refusal, with the kind of check that refused it (counted by class, then dropped from the answer). */
type Answer = GateResult & { readonly refusal?: GateRefusal };

const refuse = (refusal: GateRefusal, reason: string, decision: Decision | null = null): Answer => ({
  committed: false,
  reason,
  decision,
  refusal,
});

const VERDICT = /\[VERDICT: (PASS|FAIL)\]/;

/** The scenario an evaluation asks the gate to build from what mam recorded. */
export const RECORDED = Symbol.for("mam.recordedScenario");

/**
 * The auto-completion gate. Commits only if every condition holds, checked in
 * DESIGN.md's order; returns the first that fails and writes nothing. A refusal is
 * an answer, not an error. The commit is one conditional write against the
 * `transition_seq` the gate read: if the agent reported meanwhile, the gate loses.
 */
export async function evaluateGate(deps: GateDeps, input: EvaluateInput): Promise<GateResult> {
  const { refusal, ...answer } = await decide(deps, input);
  if (input.dryRun === true) return answer;
  if (answer.committed) deps.metrics?.gateAnswer("committed");
  else deps.metrics?.gateAnswer("refused", GATE_REASON_CLASS[refusal ?? "lost_race"]);
  return answer;
}

async function decide(deps: GateDeps, input: EvaluateInput): Promise<Answer> {
  const { flags } = deps;
  // The flags refuse before the record is read; the record's checks after.
  const flagged = flagChecks(flags);
  if (flagged !== undefined) return refuse(flagged.refusal, flagged.reason);
  const job = input.job ?? (await deps.jobs.get(input.jobId));
  const checked = recordChecks(flags, job, input.jobId);
  if (checked !== undefined || job === undefined) return refuse(checked?.refusal ?? "job_missing", checked?.reason ?? "");
  if (input.reportLocation === undefined) {
    return refuse("no_report_location", "no report location was given, so the gate cannot independently verify the report");
  }
  // "Latest" is the job's own `latest_attempt`, written by the dispatch's conditional write.
  const dispatch = job.latest_attempt === undefined ? undefined : await deps.jobs.getDispatch(job.job_id, job.latest_attempt);
  if (!dispatch) return refuse("no_dispatch", `job ${job.job_id} has no recorded dispatch`);

  const now = deps.clock.now();
  const built = input.scenario === RECORDED ? buildScenario(job, dispatch, now) : undefined;
  const withScenario = (answer: Answer): Answer => (built === undefined ? answer : { ...answer, scenario: built });
  const posted: unknown = built ?? input.scenario;

  // Bind the evidence to the target before anything else reads the scenario:
  // raw values, so a mismatch of value or of type is refused naming the field.
  const scenario = posted as { dispatch_context?: unknown } | null;
  const ctx = typeof scenario === "object" && scenario !== null ? scenario.dispatch_context : undefined;
  if (typeof ctx !== "object" || ctx === null)
    return refuse("context_mismatch", "invalid scenario: dispatch_context is missing or not an object");
  const raw = ctx as Record<string, unknown>;
  if (raw.job_id !== job.job_id) {
    return refuse(
      "context_mismatch",
      `the scenario's dispatch context names job ${JSON.stringify(raw.job_id)}, which does not match job ${job.job_id}`,
    );
  }
  // The settle window the policy applies is the scenario's backend's: it must be the job's own.
  if (raw.backend !== job.agent) {
    return refuse(
      "context_mismatch",
      `dispatch_context.backend is ${JSON.stringify(raw.backend)}, which does not match the job's backend ${JSON.stringify(job.agent)}`,
    );
  }
  for (const field of ["attempt_id", "agent_session_uuid", "pane_process_generation"] as const) {
    if (raw[field] !== dispatch[field]) {
      return refuse(
        "context_mismatch",
        `dispatch_context.${field} is ${JSON.stringify(raw[field])}, which does not match the latest recorded dispatch (${JSON.stringify(dispatch[field])})`,
      );
    }
  }

  const location = typeof input.reportLocation === "function" ? input.reportLocation(dispatch) : input.reportLocation;
  const verification = await verifyFinalizedEvidence(deps.reports, {
    location,
    jobId: job.job_id,
    attemptId: dispatch.attempt_id,
    expectedArtifacts: job.expected_artifacts,
    finalized: job.finalized_report,
    // A reviewer's verdict is read from the pinned copy, the bytes the completion will
    // name, in the same read that re-hashes it.
    ...(job.role === "Reviewer" ? { find: VERDICT } : {}),
  });
  if (!verification.ok) return refuse("report_unverified", verification.reason);
  if (job.role === "Reviewer" && !verification.found) {
    return refuse("no_verdict", "the reviewer's report has no verdict token ([VERDICT: PASS] or [VERDICT: FAIL])");
  }

  // The policy is pure and reads only the scenario's times: the evaluation, which
  // knows the clock, holds a posted scenario that says it saw the future.
  if (built === undefined) {
    const future = laterThan(posted, now.getTime() + deps.flags.observationSkewSeconds * 1000);
    if (future !== undefined) {
      return refuse(
        "policy_holds",
        `the scenario's ${future.path} (${future.at}) is later than mam's clock (${now.toISOString()}) by more than ${deps.flags.observationSkewSeconds} s (MAM_OBSERVATION_SKEW_SECONDS): evidence from the future is no evidence`,
      );
    }
  }

  let decision: Decision;
  try {
    decision = (deps.decide ?? policy.decide)(posted, { notBefore: dispatch.anchor.started_at, rules: flags.quiescenceRules });
  } catch (e) {
    return withScenario(refuse("policy_error", `policy error: ${e instanceof Error ? e.message : String(e)}`));
  }
  if (decision.decision !== "candidate_approved")
    return withScenario(refuse("policy_holds", `the policy holds: ${decision.reason}`, decision));
  if (input.dryRun === true) {
    return withScenario({ committed: false, wouldCommit: true, reason: `would complete on evidence: ${decision.reason}`, decision });
  }

  // A finalize in progress (issue 17's lease) does not make the gate hold: mid-finalize
  // the gate either verifies the tree `finalized_report` names (and the finalize's own
  // commit, bumping evidence_seq, then loses: the job is terminal) or finds the live
  // tree is not that one and refuses. The commit's condition is the guarantee; a hold
  // on a read of the lease would add none, and would let a crashed finalize delay a
  // completion by its TTL.
  //   gate: read record (T, E) .. verify .. policy .. commit if seq = T and evidence_seq = E
  //   agent:                 stage / finalize / dispatch: evidence_seq E -> E+1   => the gate loses
  const at = now.toISOString();
  const rested = {
    ...(built === undefined
      ? { evidence: "posted" as const, ...(input.postedBy === undefined ? {} : { posted_by: input.postedBy }) }
      : { evidence: "recorded" as const, observations_rev: built.built_from?.observations_rev ?? 0 }),
    ...(decision.rule === undefined ? {} : { rule: decision.rule }),
    ...(decision.sources === undefined ? {} : { sources: decision.sources }),
    ...(decision.quiescence === undefined ? {} : { quiescence: decision.quiescence }),
  };
  try {
    const record = await deps.jobs.transition(job.job_id, job.transition_seq, {
      from: ["running"],
      set: {
        status: "completed",
        completed_by: "auto_complete",
        completed_evidence: { ...verification.evidence, verified_at: at, ...rested },
        updated_at: at,
        pending_notification: newIntent(deps, "completed", job.transition_seq + 1, "auto_complete", "gate"),
      },
      // On recorded evidence, also the observation set it was built from: a coalesced
      // repeat (a `working` sighted again) bumps no evidence_seq, but moves the set's rev.
      evidence: {
        seq: job.evidence_seq,
        attempt: dispatch.attempt_id,
        ...(built === undefined ? {} : { observationsRev: built.built_from?.observations_rev ?? 0 }),
      },
      note: { actor: { type: "gate" } },
    });
    return withScenario({ committed: true, reason: `completed on evidence: ${decision.reason}`, decision, record });
  } catch (e) {
    if (isMamError(e, "job.") || isMamError(e, "report."))
      return withScenario({ ...refuse("lost_race", `the job moved while the gate was deciding: ${e.message}`, decision), lostRace: true });
    throw e;
  }
}

/** The times a posted scenario's timeline item may carry: v1's `at`; v2's receipts, last sightings and claims. */
const TIME_FIELDS = ["at", "received_at", "last_seen_at", "observed_at"] as const;

/** The first time in a posted scenario (its timeline, its overflow) later than `limit` (ms): where, and what it says. */
function laterThan(scenario: unknown, limit: number): { path: string; at: string } | undefined {
  const s = scenario as { timeline?: unknown; evidence_overflow?: unknown } | null;
  const items: [string, unknown][] = Array.isArray(s?.timeline) ? s.timeline.map((item, i) => [`timeline[${i}]`, item]) : [];
  if (s?.evidence_overflow !== undefined) items.push(["evidence_overflow", s.evidence_overflow]);
  for (const [path, item] of items) {
    for (const field of TIME_FIELDS) {
      const at = (item as Record<string, unknown> | null)?.[field];
      if (typeof at === "string" && Date.parse(at) > limit) return { path: `${path}.${field}`, at };
    }
  }
  return undefined;
}
