/**
 * Core's metrics port on Powertools Metrics: CloudWatch Embedded Metric Format lines
 * on stdout, which Lambda's log stream turns into metrics. One `Metrics` instance per
 * function (per container); each invocation's stored metrics are flushed at its end
 * (`publishStoredMetrics`, in the handler's `finally`).
 *
 * Namespace `Mam` and a `service` dimension on every metric (both Powertools' own
 * variables, POWERTOOLS_METRICS_NAMESPACE and POWERTOOLS_SERVICE_NAME, which
 * serverless.yml sets per stage). Metrics whose dimensions vary within an invocation
 * (a gate answer's outcome and reason class, a transition's action) go out at once as
 * single-metric lines, so they never share a line with another dimension set; the
 * counts and latencies with `service` alone are stored and flushed once.
 *
 *   GateAnswers          Count         [service, outcome]; a refusal also [service, outcome, reason_class]
 *   Transitions          Count         [service, action]
 *   IntentsSettled       Count         [service]
 *   IntentsFailed        Count         [service]
 *   IntentsQuarantined   Count         [service]
 *   PublishLatency       Milliseconds  [service]
 *   OldestOwedIntentAge  Seconds       [service]   (the sweep, once per run)
 */
import { Metrics, MetricUnit } from "@aws-lambda-powertools/metrics";
import { METRIC_NAMES, type MetricsSink } from "@mam/core";

export type Env = Readonly<Record<string, string | undefined>>;

export const DEFAULT_NAMESPACE = "Mam";
export const DEFAULT_SERVICE = "mam";

/** The function's one `Metrics` instance, from Powertools' own variables in the function's environment. */
export function createMetrics(env: Env): Metrics {
  return new Metrics({
    namespace: env.POWERTOOLS_METRICS_NAMESPACE || DEFAULT_NAMESPACE,
    serviceName: env.POWERTOOLS_SERVICE_NAME || DEFAULT_SERVICE,
  });
}

/** Core's port over that instance. */
export function metricsSink(metrics: Metrics): MetricsSink {
  return {
    gateAnswer(outcome, reasonClass) {
      // Two lines, one dimension set each: Powertools warns when two sets of one line share a key.
      metrics.singleMetric().addDimension("outcome", outcome).addMetric(METRIC_NAMES.gateAnswers, MetricUnit.Count, 1);
      if (reasonClass === undefined) return;
      metrics
        .singleMetric()
        .addDimension("outcome", outcome)
        .addDimension("reason_class", reasonClass)
        .addMetric(METRIC_NAMES.gateAnswers, MetricUnit.Count, 1);
    },
    transition(action) {
      metrics.singleMetric().addDimension("action", action).addMetric(METRIC_NAMES.transitions, MetricUnit.Count, 1);
    },
    intent(outcome) {
      metrics.addMetric(METRIC_NAMES.intents[outcome], MetricUnit.Count, 1);
    },
    publishLatency(ms) {
      metrics.addMetric(METRIC_NAMES.publishLatency, MetricUnit.Milliseconds, Math.round(ms * 1000) / 1000);
    },
    oldestOwedIntentAge(seconds) {
      metrics.addMetric(METRIC_NAMES.oldestOwedIntentAge, MetricUnit.Seconds, seconds);
    },
  };
}

/** The end of an invocation: what it stored goes out as one line (nothing when it stored nothing). */
export function flushMetrics(metrics: Metrics): void {
  if (metrics.hasStoredMetrics()) metrics.publishStoredMetrics();
}
