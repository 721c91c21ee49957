/**
 * What core counts, through a port: core knows no cloud. The AWS composition root
 * (functions/compose.ts) wires this to Powertools Metrics (CloudWatch EMF); `mam
 * serve`, the CLI and tests leave it out, and nothing is counted (`NO_METRICS`).
 *
 * The names and the closed sets of dimension values are here, once, so the
 * template's dashboard and alarms and the test that checks them read one list.
 */

/** A gate answer: committed, or refused for one of a few classes of reason. */
export const GATE_OUTCOMES = ["committed", "refused"] as const;
export type GateOutcome = (typeof GATE_OUTCOMES)[number];

/**
 * Why the gate refused, finely (one kind per check in gate.ts, in the order it makes
 * them). Each maps to one class below; a new check needs a kind and its class.
 */
export type GateRefusal =
  | "disabled"
  | "cas_rolled_back"
  | "job_missing"
  | "not_running"
  | "not_opted_in"
  | "backend_not_allowed"
  | "no_report_location"
  | "no_dispatch"
  | "context_mismatch"
  | "report_unverified"
  | "no_verdict"
  | "policy_error"
  | "policy_holds"
  | "lost_race";

/**
 * The few classes a dashboard shows (a dimension's values must stay few):
 * - `disabled`: the service is configured not to auto-complete;
 * - `ineligible`: the job is not one the gate may complete (absent, not running, not opted in, backend not allowed);
 * - `evidence`: what the watcher or the report says does not bind to the job's latest dispatch, or does not verify;
 * - `policy`: the policy holds (not settled yet), or could not decide;
 * - `raced`: the job moved while the gate was deciding (its conditional write lost).
 */
export const GATE_REASON_CLASSES = ["disabled", "ineligible", "evidence", "policy", "raced"] as const;
export type GateReasonClass = (typeof GATE_REASON_CLASSES)[number];

/** The one place a refusal's kind is mapped to its class. */
export const GATE_REASON_CLASS: Readonly<Record<GateRefusal, GateReasonClass>> = {
  disabled: "disabled",
  cas_rolled_back: "disabled",
  job_missing: "ineligible",
  not_running: "ineligible",
  not_opted_in: "ineligible",
  backend_not_allowed: "ineligible",
  no_report_location: "evidence",
  no_dispatch: "evidence",
  context_mismatch: "evidence",
  report_unverified: "evidence",
  no_verdict: "evidence",
  policy_error: "policy",
  policy_holds: "policy",
  lost_race: "raced",
};

/** What became of an owed intent the notifier tried: published and settled, a failed publish, quarantined by the sweep. */
export const INTENT_OUTCOMES = ["settled", "failed", "quarantined"] as const;
export type IntentMetricOutcome = (typeof INTENT_OUTCOMES)[number];

/**
 * The metric names (CloudWatch namespace `Mam`, dimension `service` on every one).
 * Dimension sets beyond `service`: `GateAnswers` by `outcome`, and by `outcome` and
 * `reason_class`; `Transitions` by `action`. The rest have `service` alone.
 */
export const METRIC_NAMES = {
  gateAnswers: "GateAnswers",
  transitions: "Transitions",
  intents: { settled: "IntentsSettled", failed: "IntentsFailed", quarantined: "IntentsQuarantined" },
  publishLatency: "PublishLatency",
  oldestOwedIntentAge: "OldestOwedIntentAge",
} as const;

/** The port. Each call records one observation; the sink decides when it is flushed. */
export interface MetricsSink {
  /** One answer of the gate (a refusal names its class, a commit has none). */
  gateAnswer(outcome: GateOutcome, reasonClass?: GateReasonClass): void;
  /** One transition committed, by its action (claim, progress, completed, error, cancel). */
  transition(action: string): void;
  /** One owed intent tried by the notifier (request path, stream publisher or sweep). */
  intent(outcome: IntentMetricOutcome): void;
  /** How long the broker took to acknowledge one notification's publishes, in milliseconds. */
  publishLatency(ms: number): void;
  /** The age of the oldest owed intent the sweep found due, in seconds (0 when none is owed). */
  oldestOwedIntentAge(seconds: number): void;
}

export const NO_METRICS: MetricsSink = {
  gateAnswer: () => undefined,
  transition: () => undefined,
  intent: () => undefined,
  publishLatency: () => undefined,
  oldestOwedIntentAge: () => undefined,
};
