/**
 * Core's metrics port on Powertools Metrics: CloudWatch Embedded Metric Format lines
 * on stdout, which Lambda's log stream turns into metrics. One `Metrics` instance per
 * function (per container), loaded on the first metric recorded; each invocation's
 * stored metrics are flushed at its end (`publishStoredMetrics`, in the handler's
 * `finally`).
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
 *   PinnedCopiesRetired       Count  [service]   (a finalize retired a copy nothing names)
 *   PinnedCopyRetireFailures  Count  [service]   (the store failed to retire one; the finalize stands)
 */
import type { Metrics } from "@aws-lambda-powertools/metrics";
import { METRIC_NAMES, type MetricsSink } from "@mam/core";

export type Env = Readonly<Record<string, string | undefined>>;

export const DEFAULT_NAMESPACE = "Mam";
export const DEFAULT_SERVICE = "mam";

/**
 * The function's metrics: core's port over one Powertools `Metrics` instance, built
 * from Powertools' own variables in the function's environment. Powertools is loaded
 * (a chunk of its own) on the first metric recorded, not at cold start: a read
 * records none. What is recorded before it has loaded is applied, in order, as soon
 * as it has; `flush` waits for that, so nothing recorded is lost.
 */
export interface FunctionMetrics {
  readonly sink: MetricsSink;
  /** The end of an invocation: what it stored goes out as one line (nothing when it stored nothing). */
  flush(): Promise<void>;
}

type Powertools = typeof import("@aws-lambda-powertools/metrics");
type Recording = (metrics: Metrics, unit: Powertools["MetricUnit"]) => void;

export function createMetrics(env: Env): FunctionMetrics {
  let loaded: { metrics: Metrics; unit: Powertools["MetricUnit"] } | undefined;
  let loading: Promise<void> | undefined;
  const queued: Recording[] = [];
  const load = (): Promise<void> =>
    (loading ??= import("@aws-lambda-powertools/metrics").then(({ Metrics, MetricUnit }) => {
      const metrics = new Metrics({
        namespace: env.POWERTOOLS_METRICS_NAMESPACE || DEFAULT_NAMESPACE,
        serviceName: env.POWERTOOLS_SERVICE_NAME || DEFAULT_SERVICE,
      });
      loaded = { metrics, unit: MetricUnit };
      for (const record of queued.splice(0)) record(metrics, MetricUnit);
    }));
  const record = (r: Recording): void => {
    if (loaded !== undefined) {
      r(loaded.metrics, loaded.unit);
      return;
    }
    queued.push(r);
    // A failed load is reported by the next flush (it awaits the same promise).
    load().catch(() => undefined);
  };
  return {
    sink: metricsSink(record),
    async flush() {
      if (loading === undefined) return; // nothing was recorded
      await loading;
      if (loaded?.metrics.hasStoredMetrics()) loaded.metrics.publishStoredMetrics();
    },
  };
}

/** Core's port: each call records through Powertools once it is loaded. */
function metricsSink(record: (r: Recording) => void): MetricsSink {
  return {
    gateAnswer(outcome, reasonClass) {
      // Two lines, one dimension set each: Powertools warns when two sets of one line share a key.
      record((metrics, unit) => {
        metrics.singleMetric().addDimension("outcome", outcome).addMetric(METRIC_NAMES.gateAnswers, unit.Count, 1);
        if (reasonClass === undefined) return;
        metrics
          .singleMetric()
          .addDimension("outcome", outcome)
          .addDimension("reason_class", reasonClass)
          .addMetric(METRIC_NAMES.gateAnswers, unit.Count, 1);
      });
    },
    transition(action) {
      record((metrics, unit) => metrics.singleMetric().addDimension("action", action).addMetric(METRIC_NAMES.transitions, unit.Count, 1));
    },
    intent(outcome) {
      record((metrics, unit) => metrics.addMetric(METRIC_NAMES.intents[outcome], unit.Count, 1));
    },
    publishLatency(ms) {
      record((metrics, unit) => metrics.addMetric(METRIC_NAMES.publishLatency, unit.Milliseconds, Math.round(ms * 1000) / 1000));
    },
    oldestOwedIntentAge(seconds) {
      record((metrics, unit) => metrics.addMetric(METRIC_NAMES.oldestOwedIntentAge, unit.Seconds, seconds));
    },
    pinnedCopy(outcome) {
      record((metrics, unit) => metrics.addMetric(METRIC_NAMES.pinnedCopies[outcome], unit.Count, 1));
    },
  };
}
