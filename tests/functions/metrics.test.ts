/**
 * What the dashboard and the alarms watch is what the functions emit. The template
 * is the packaged one (`npm run package`); the metrics are the EMF lines the three
 * handlers really print on stdout (Powertools Metrics, unmocked: the test reads the
 * process's stdout while a handler runs) over the local peers.
 *
 * - Every metric of namespace Mam named by an alarm or a dashboard widget: emitted
 *   with exactly that dimension set, the same `service` value, and any other
 *   dimension value from core's closed set (outcome, reason class, action).
 * - Every AWS/... metric: a metric name and dimension names AWS documents for that
 *   namespace, whose value is a reference to the right resource of the stack.
 * - Every alarm notifies the topic parameter only when it is set; the dashboard shows
 *   every alarm; access logs, throttling and reserved concurrency are wired.
 */
import { rmSync } from "node:fs";
import { type AttributeValue, PutItemCommand } from "@aws-sdk/client-dynamodb";
import { createTokenService, SCOPES } from "@mam/api";
import { createS3Client, S3ReportStore } from "@mam/aws/s3";
import {
  type Deps,
  GATE_OUTCOMES,
  GATE_REASON_CLASSES,
  INTENT_OUTCOMES,
  type JobRecord,
  METRIC_NAMES,
  parseFlags,
  randomIds,
  systemClock,
  TRANSITIONS,
} from "@mam/core";
import type { DynamoDBStreamEvent, ScheduledEvent } from "aws-lambda";
import type { LambdaEvent } from "hono/aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createHttpHandler, createRecoverySweepHandler, createStreamPublisherHandler } from "../../functions/compose.ts";
import { type Resource, runPackage, type Template } from "../packaging/package.ts";
import { readyJob } from "../seed/scenario.ts";
import { jobRecord } from "../support/records.ts";
import { tempDirSync } from "../support/temp-dir.ts";
import {
  CREDENTIALS,
  lambdaContext,
  lambdaFixture,
  memoryLog,
  type Peers,
  REGION,
  SIGNING_KEY,
  startPeers,
  TRANSACTIONS,
} from "./support.ts";

type Event = Extract<LambdaEvent, { rawPath: string }>;

/** One metric as an EMF line declares it: namespace, name, and one of its dimension sets with the line's values. */
interface Emitted {
  readonly namespace: string;
  readonly name: string;
  readonly dimensions: Readonly<Record<string, string>>;
}

/** One metric as the template names it; `ref` values are `<Logical>` or `<Logical.Attr>`. */
interface Named {
  readonly where: string;
  readonly namespace: string;
  readonly name: string;
  readonly dimensions: Readonly<Record<string, string>>;
}

interface EmfLine {
  readonly _aws: {
    readonly CloudWatchMetrics: readonly {
      readonly Namespace: string;
      readonly Dimensions: readonly (readonly string[])[];
      readonly Metrics: readonly { readonly Name: string; readonly Unit?: string }[];
    }[];
  };
  readonly [key: string]: unknown;
}

const emitted: Emitted[] = [];
const warnings: string[] = [];
const units = new Map<string, string>();

/**
 * Run one invocation with the process's stdout read: every EMF line (a JSON document
 * with `_aws`) is kept; anything else goes through. Powertools writes through a
 * Console over process.stdout, so this is where its lines go.
 */
async function capturingEmf<T>(run: () => Promise<T>): Promise<T> {
  const stdout = process.stdout;
  const write = stdout.write;
  // Powertools' own warnings (a bad dimension, a key collision) go to stderr: kept, to be none.
  const stderr = process.stderr;
  const writeErr = stderr.write;
  stderr.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
    const text = typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    if (/dimension|metric|EMF/i.test(text)) warnings.push(text);
    return (writeErr as (...a: unknown[]) => boolean).call(stderr, chunk, ...rest);
  }) as typeof stderr.write;
  let pending = "";
  stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
    const text = typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    if (!text.includes('"_aws"') && pending === "") return (write as (...a: unknown[]) => boolean).call(stdout, chunk, ...rest);
    pending += text;
    const lines = pending.split("\n");
    pending = lines.pop() ?? "";
    for (const line of lines) if (line.trim() !== "") record(JSON.parse(line) as EmfLine);
    const callback = rest.find((r) => typeof r === "function") as (() => void) | undefined;
    callback?.();
    return true;
  }) as typeof stdout.write;
  try {
    return await run();
  } finally {
    stdout.write = write;
    stderr.write = writeErr;
    expect(pending, "an EMF line left unfinished").toBe("");
  }
}

function record(line: EmfLine): void {
  for (const directive of line._aws.CloudWatchMetrics) {
    for (const metric of directive.Metrics) {
      expect(line[metric.Name], `${metric.Name} has a value in its line`).toBeDefined();
      if (metric.Unit !== undefined) units.set(metric.Name, metric.Unit);
      for (const set of directive.Dimensions) {
        const dimensions = Object.fromEntries(set.map((d) => [d, String(line[d])]));
        emitted.push({ namespace: directive.Namespace, name: metric.Name, dimensions });
      }
    }
  }
}

const sameNames = (a: Readonly<Record<string, string>>, b: Readonly<Record<string, string>>): boolean =>
  Object.keys(a).sort().join(",") === Object.keys(b).sort().join(",");

// ---------------------------------------------------------------- the template's side

/** `{Ref: X}` as `<X>`, `{"Fn::GetAtt": [X, A]}` as `<X.A>`, a Sub string's `${X}` / `${X.A}` likewise; literals as they are. */
function refOf(value: unknown): string {
  if (typeof value === "string") return value.replace(/\$\{([\w.:]+)\}/g, "<$1>");
  const v = value as Record<string, unknown>;
  if (typeof v.Ref === "string") return `<${v.Ref}>`;
  if (Array.isArray(v["Fn::GetAtt"])) return `<${(v["Fn::GetAtt"] as string[]).join(".")}>`;
  throw new Error(`not a reference: ${JSON.stringify(value)}`);
}

interface AlarmMetric {
  readonly Namespace: string;
  readonly MetricName: string;
  readonly Dimensions?: readonly { readonly Name: string; readonly Value: unknown }[];
}

function alarmMetrics(template: Template): Named[] {
  const out: Named[] = [];
  for (const [id, r] of Object.entries(template.Resources)) {
    if (r.Type !== "AWS::CloudWatch::Alarm") continue;
    const p = r.Properties as Partial<AlarmMetric> & { Metrics?: { MetricStat?: { Metric: AlarmMetric } }[] };
    const metrics: AlarmMetric[] = [];
    if (p.MetricName !== undefined) metrics.push(p as AlarmMetric);
    for (const m of p.Metrics ?? []) if (m.MetricStat !== undefined) metrics.push(m.MetricStat.Metric);
    expect(metrics.length, `${id} watches a metric`).toBeGreaterThan(0);
    for (const m of metrics) {
      out.push({
        where: `alarm ${id}`,
        namespace: m.Namespace,
        name: m.MetricName,
        dimensions: Object.fromEntries((m.Dimensions ?? []).map((d) => [d.Name, refOf(d.Value)])),
      });
    }
  }
  return out;
}

interface Widget {
  readonly type: string;
  readonly properties: { readonly title?: string; readonly metrics?: unknown[][]; readonly alarms?: string[] };
}

function dashboardBody(template: Template): { widgets: Widget[] } {
  const [, dashboard] = Object.entries(template.Resources).find(([, r]) => r.Type === "AWS::CloudWatch::Dashboard") ?? [];
  if (dashboard === undefined) throw new Error("the template has no dashboard");
  const body = dashboard.Properties.DashboardBody as { "Fn::Sub": string };
  return JSON.parse(body["Fn::Sub"]) as { widgets: Widget[] };
}

function dashboardMetrics(template: Template): Named[] {
  const out: Named[] = [];
  for (const w of dashboardBody(template).widgets) {
    if (w.type !== "metric") continue;
    for (const row of w.properties.metrics ?? []) {
      const [namespace, name, ...rest] = row.filter((x) => typeof x === "string") as string[];
      expect(rest.length % 2, `a widget row names dimension name/value pairs: ${JSON.stringify(row)}`).toBe(0);
      const dimensions: Record<string, string> = {};
      for (let i = 0; i < rest.length; i += 2) dimensions[rest[i]!] = refOf(rest[i + 1]);
      out.push({ where: `widget "${w.properties.title}"`, namespace: namespace!, name: name!, dimensions });
    }
  }
  return out;
}

/**
 * What AWS documents for each namespace we watch: the metric names, and the one
 * dimension each is read by here, with the type of resource its value must name.
 */
const AWS_METRICS: Record<string, { readonly metrics: readonly string[]; readonly dimension: string; readonly resource: string }> = {
  "AWS/DynamoDB": {
    metrics: ["ConsumedReadCapacityUnits", "ConsumedWriteCapacityUnits", "ReadThrottleEvents", "WriteThrottleEvents"],
    dimension: "TableName",
    resource: "AWS::DynamoDB::Table",
  },
  "AWS/Lambda": {
    metrics: ["Errors", "Throttles", "Duration", "IteratorAge"],
    dimension: "FunctionName",
    resource: "AWS::Lambda::Function",
  },
  "AWS/ApiGateway": {
    metrics: ["Count", "4xx", "5xx", "Latency", "IntegrationLatency"],
    dimension: "ApiId",
    resource: "AWS::ApiGatewayV2::Api",
  },
  "AWS/SQS": { metrics: ["ApproximateNumberOfMessagesVisible"], dimension: "QueueName", resource: "AWS::SQS::Queue" },
};

/** The value each resource type is named by in that dimension: a table, function or API by Ref; a queue by its QueueName. */
const REFERENCE: Record<string, (id: string) => string> = {
  "AWS::DynamoDB::Table": (id) => `<${id}>`,
  "AWS::Lambda::Function": (id) => `<${id}>`,
  "AWS::ApiGatewayV2::Api": (id) => `<${id}>`,
  "AWS::SQS::Queue": (id) => `<${id}.QueueName>`,
};

/** The dimension values core can emit beyond `service`. */
const CLOSED_SETS: Record<string, readonly string[]> = {
  outcome: GATE_OUTCOMES,
  reason_class: GATE_REASON_CLASSES,
  action: Object.keys(TRANSITIONS),
};

// ---------------------------------------------------------------- the run

let peers: Peers;
let outDir: string | undefined;
let template: Template;
let service: string;
const resource = (id: string): Resource => {
  const r = template.Resources[id];
  if (r === undefined) throw new Error(`no resource ${id}`);
  return r;
};

const operatorToken = createTokenService({ signingKey: SIGNING_KEY, clock: systemClock }).mintOperator(SCOPES);

function request(method: string, path: string, body?: unknown): Event {
  const base = lambdaFixture<Event>("http-api-v2-get-job.json");
  const headers: Record<string, string> = { ...(base.headers as Record<string, string>), authorization: `Bearer ${operatorToken}` };
  delete headers["content-length"];
  if (body !== undefined) headers["content-type"] = "application/json";
  return {
    ...base,
    rawPath: path,
    headers,
    requestContext: { ...base.requestContext, http: { ...base.requestContext.http, method, path } },
    pathParameters: { proxy: path.slice(1) },
    ...(body === undefined ? {} : { body: JSON.stringify(body), isBase64Encoded: false }),
  };
}

function owing(jobId: string, at: string): JobRecord {
  return jobRecord(jobId, {
    status: "cancelled",
    transition_seq: 1,
    pending_notification: { id: `intent-${jobId}`, event: "cancelled", seq: 1, created_at: at },
  });
}

beforeAll(async () => {
  outDir = tempDirSync("metrics-package").dir;
  ({ template } = runPackage(outDir, []));
  const variables = (resource("HttpLambdaFunction").Properties.Environment as { Variables: Record<string, unknown> }).Variables;
  service = String(variables.POWERTOOLS_SERVICE_NAME);
  peers = await startPeers();

  // Each function with the Powertools settings the template gives it.
  const powertools = (id: string): Record<string, string> => {
    const v = (resource(id).Properties.Environment as { Variables: Record<string, unknown> }).Variables;
    return {
      POWERTOOLS_METRICS_NAMESPACE: String(v.POWERTOOLS_METRICS_NAMESPACE),
      POWERTOOLS_SERVICE_NAME: String(v.POWERTOOLS_SERVICE_NAME),
    };
  };
  const log = memoryLog();

  // http: a job registered, claimed and cancelled (two transitions), and a gate answer (refused: auto-completion off).
  const httpTable = await peers.newTable();
  const http = createHttpHandler(peers.env(httpTable, { MAM_TOKEN_SIGNING_KEY: SIGNING_KEY, ...powertools("HttpLambdaFunction") }), {
    credentials: CREDENTIALS,
    transactions: TRANSACTIONS,
    log: log.sink,
  });
  const ctx = lambdaContext("mam-dev-http");
  const answers: number[] = [];
  await capturingEmf(async () => {
    const register = lambdaFixture<Event>("http-api-v2-post-job.json");
    answers.push((await http({ ...register, headers: { ...register.headers, authorization: `Bearer ${operatorToken}` } }, ctx)).statusCode);
    const invoke = async (method: string, path: string, body?: unknown) =>
      answers.push((await http(request(method, path, body), ctx)).statusCode);
    await invoke("POST", "/v1/jobs/job-fixture-1/transitions", { action: "claim", expected_seq: 0 });
    await invoke("POST", "/v1/jobs/job-fixture-1/evaluations", { scenario: {} });
    await invoke("POST", "/v1/jobs/job-fixture-1/transitions", { action: "cancel", expected_seq: 1 });
  });
  expect(answers).toEqual([201, 200, 200, 200]);

  // http again, auto-completion on: a job ready for the gate (claimed, opted in,
  // dispatched, its report staged and finalized, as the seed's scenario has it), then
  // the gate commits it: the other outcome.
  const reports = new S3ReportStore({
    bucket: peers.s3.bucket,
    client: createS3Client({ region: REGION, endpoint: peers.s3.endpoint, credentials: CREDENTIALS }),
  });
  const deps: Deps = {
    jobs: peers.store(httpTable),
    reports,
    publisher: { publish: async () => undefined },
    clock: systemClock,
    ids: randomIds,
    flags: parseFlags({}),
  };
  const ready = await readyJob(deps, { backend: "claude-code" });
  const gate = createHttpHandler(
    peers.env(httpTable, { MAM_TOKEN_SIGNING_KEY: SIGNING_KEY, MAM_AUTO_COMPLETE: "1", ...powertools("HttpLambdaFunction") }),
    { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: log.sink },
  );
  const committed = await capturingEmf(() =>
    gate(request("POST", `/v1/jobs/${ready.jobId}/evaluations`, { scenario: ready.scenario }), ctx),
  );
  expect(JSON.parse(committed.body)).toMatchObject({ committed: true });

  // stream publisher: the recorded batch, one of whose jobs' topic the broker refuses.
  const streamTable = await peers.newTable();
  const batch = lambdaFixture<DynamoDBStreamEvent>("dynamodb-stream-batch.json");
  // The table as the stream saw it: each record's new image, put as the item it is.
  for (const r of batch.Records) {
    const image = r.dynamodb?.NewImage;
    if (image !== undefined) {
      await peers.dynamo.client.send(new PutItemCommand({ TableName: streamTable, Item: image as Record<string, AttributeValue> }));
    }
  }
  peers.refusedTopics.add("mam/jobs/stream-refused/events");
  const stream = createStreamPublisherHandler(peers.env(streamTable, powertools("StreamPublisherLambdaFunction")), {
    credentials: CREDENTIALS,
    transactions: TRANSACTIONS,
    log: log.sink,
  });
  await capturingEmf(() => stream(batch, lambdaContext("mam-dev-streamPublisher")));

  // recovery sweep: one owed intent sent, one refused and quarantined at its first failure.
  const sweepTable = await peers.newTable();
  const sweepStore = peers.store(sweepTable);
  const now = Date.now();
  await sweepStore.create(owing("sweep-sent", new Date(now - 120_000).toISOString()));
  await sweepStore.create(owing("sweep-refused", new Date(now - 60_000).toISOString()));
  peers.refusedTopics.add("mam/jobs/sweep-refused/events");
  const sweep = createRecoverySweepHandler(
    peers.env(sweepTable, { MAM_SWEEP_MAX_FAILURES: "1", ...powertools("RecoverySweepLambdaFunction") }),
    {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: log.sink,
    },
  );
  const counts = await capturingEmf(() =>
    sweep(lambdaFixture<ScheduledEvent>("eventbridge-scheduled.json"), lambdaContext("mam-dev-recoverySweep")),
  );
  expect(counts).toMatchObject({ owed: 2, sent: 1, quarantined: 1 });
}, 300_000);

afterAll(async () => {
  await peers?.close();
  if (outDir !== undefined) rmSync(outDir, { recursive: true, force: true });
});

describe("metrics (Powertools EMF) and what the template's dashboard and alarms watch", () => {
  it("each function emits its metrics as EMF lines: namespace Mam, the template's service dimension, the documented units", () => {
    const names = new Set(emitted.map((e) => e.name));
    for (const name of [
      METRIC_NAMES.gateAnswers,
      METRIC_NAMES.transitions,
      ...INTENT_OUTCOMES.map((o) => METRIC_NAMES.intents[o]),
      METRIC_NAMES.publishLatency,
      METRIC_NAMES.oldestOwedIntentAge,
    ]) {
      expect(names, `${name} emitted`).toContain(name);
    }
    expect(new Set(emitted.map((e) => e.namespace))).toEqual(new Set(["Mam"]));
    expect(new Set(emitted.map((e) => e.dimensions.service))).toEqual(new Set([service]));
    expect(service).toMatch(/^mam-dev$/);
    expect(Object.fromEntries(units)).toMatchObject({
      GateAnswers: "Count",
      Transitions: "Count",
      IntentsSettled: "Count",
      IntentsFailed: "Count",
      IntentsQuarantined: "Count",
      PublishLatency: "Milliseconds",
      OldestOwedIntentAge: "Seconds",
    });
    // What the invocations did, as counted: claim and cancel; a refusal (auto-completion off); the sweep's oldest owed (~120 s).
    const of = (name: string) => emitted.filter((e) => e.name === name);
    expect(of("Transitions").map((e) => e.dimensions.action)).toEqual(["claim", "cancel"]);
    expect(of("GateAnswers").map((e) => e.dimensions)).toEqual([
      { service, outcome: "refused" },
      { service, outcome: "refused", reason_class: "disabled" },
      { service, outcome: "committed" },
    ]);
    expect(of("OldestOwedIntentAge")).toHaveLength(1);
    expect(warnings, "Powertools warned").toEqual([]);
  });

  it("every Mam metric an alarm or a widget names is emitted with that dimension set, service value and a value from core's closed sets", () => {
    const named = [...alarmMetrics(template), ...dashboardMetrics(template)].filter((m) => m.namespace === "Mam");
    expect(named.length).toBeGreaterThan(0);
    for (const m of named) {
      const match = emitted.find((e) => e.name === m.name && sameNames(e.dimensions, m.dimensions));
      expect(match, `${m.where}: ${m.name} ${JSON.stringify(m.dimensions)} is emitted with these dimension names`).toBeDefined();
      expect(m.dimensions.service, `${m.where}: service`).toBe(service);
      for (const [name, value] of Object.entries(m.dimensions)) {
        if (name === "service") continue;
        expect(CLOSED_SETS[name], `${m.where}: ${name} is a dimension core emits`).toBeDefined();
        expect(CLOSED_SETS[name], `${m.where}: ${name}=${value}`).toContain(value);
      }
    }
    // And the dashboard shows every one of our metrics, and every value of each closed set.
    const onDashboard = dashboardMetrics(template).filter((m) => m.namespace === "Mam");
    expect(new Set(onDashboard.map((m) => m.name))).toEqual(new Set(emitted.map((e) => e.name)));
    const shown = (name: string, dimension: string) =>
      new Set(onDashboard.filter((m) => m.name === name && m.dimensions[dimension] !== undefined).map((m) => m.dimensions[dimension]));
    expect(shown("GateAnswers", "outcome")).toEqual(new Set(GATE_OUTCOMES));
    expect(shown("GateAnswers", "reason_class")).toEqual(new Set(GATE_REASON_CLASSES));
    expect(shown("Transitions", "action")).toEqual(new Set(Object.keys(TRANSITIONS)));
  });

  it("every AWS metric an alarm or a widget names is one AWS documents, by the documented dimension, naming the right resource", () => {
    const named = [...alarmMetrics(template), ...dashboardMetrics(template)].filter((m) => m.namespace !== "Mam");
    expect(new Set(named.map((m) => m.namespace))).toEqual(new Set(Object.keys(AWS_METRICS)));
    for (const m of named) {
      const spec = AWS_METRICS[m.namespace];
      expect(spec, `${m.where}: namespace ${m.namespace}`).toBeDefined();
      expect(spec!.metrics, `${m.where}: ${m.namespace} ${m.name}`).toContain(m.name);
      expect(Object.keys(m.dimensions), `${m.where}: ${m.name}'s dimensions`).toEqual([spec!.dimension]);
      const value = m.dimensions[spec!.dimension]!;
      const target = /^<(\w+)/.exec(value)?.[1];
      expect(target, `${m.where}: ${spec!.dimension} is a reference, not a literal`).toBeDefined();
      expect(resource(target!).Type, `${m.where}: ${value}`).toBe(spec!.resource);
      expect(value).toBe(REFERENCE[spec!.resource]!(target!));
      // A stream's iterator age is one of its two consumers'.
      if (m.name === "IteratorAge") expect(["<StreamPublisherLambdaFunction>", "<FeedWriterLambdaFunction>"]).toContain(value);
    }
  });

  it("every alarm notifies the AlarmTopicArn parameter's topic, and nobody when it is empty; the dashboard shows every alarm", () => {
    expect(template.Parameters?.AlarmTopicArn).toEqual(expect.objectContaining({ Type: "String", Default: "" }));
    expect(template.Conditions?.HasAlarmTopic).toEqual({ "Fn::Not": [{ "Fn::Equals": [{ Ref: "AlarmTopicArn" }, ""] }] });
    const alarms = Object.entries(template.Resources).filter(([, r]) => r.Type === "AWS::CloudWatch::Alarm");
    expect(alarms.map(([id]) => id).sort()).toEqual(
      [
        "StreamFailureQueueNotEmptyAlarm",
        "OldestOwedIntentAlarm",
        "StreamIteratorAgeAlarm",
        "FeedFailureQueueNotEmptyAlarm",
        "FeedIteratorAgeAlarm",
        "Http5xxRateAlarm",
        "LambdaThrottlesAlarm",
        "TableThrottlesAlarm",
      ].sort(),
    );
    const toTopic = { "Fn::If": ["HasAlarmTopic", [{ Ref: "AlarmTopicArn" }], { Ref: "AWS::NoValue" }] };
    for (const [id, r] of alarms) {
      expect(r.Properties.AlarmActions, id).toEqual(toTopic);
      expect(r.Properties.OKActions, id).toEqual(toTopic);
    }
    expect(resource("OldestOwedIntentAlarm").Properties.Threshold).toEqual({ Ref: "OldestOwedIntentAlarmMinutes" });
    const shown = dashboardBody(template)
      .widgets.filter((w) => w.type === "alarm")
      .flatMap((w) => w.properties.alarms ?? [])
      .map(refOf);
    expect(shown.sort()).toEqual(alarms.map(([id]) => `<${id}.Arn>`).sort());
  });

  it("HTTP API: JSON access logs with a retention and no credentials, default route throttling and reserved concurrency from parameters", () => {
    const stage = resource("HttpApiStage").Properties as {
      AccessLogSettings: { DestinationArn: unknown; Format: string };
      DefaultRouteSettings: Record<string, unknown>;
    };
    const group = refOf(stage.AccessLogSettings.DestinationArn).replace(/^<(\w+)\.Arn>$/, "$1");
    expect(resource(group).Type).toBe("AWS::Logs::LogGroup");
    expect(resource(group).Properties.RetentionInDays).toBeGreaterThan(0);
    const format = JSON.parse(stage.AccessLogSettings.Format.replaceAll(/\$context\.[\w.]+/g, "x")) as Record<string, string>;
    expect(Object.keys(format)).toEqual(expect.arrayContaining(["requestId", "status", "path", "responseLatency", "integrationError"]));
    expect(stage.AccessLogSettings.Format).not.toMatch(/authorization|header/i);
    expect(stage.DefaultRouteSettings).toEqual({
      DetailedMetricsEnabled: false,
      ThrottlingBurstLimit: { Ref: "HttpThrottleBurst" },
      ThrottlingRateLimit: { Ref: "HttpThrottleRate" },
    });
    expect(resource("HttpLambdaFunction").Properties.ReservedConcurrentExecutions).toEqual({
      "Fn::If": ["ReservesHttpConcurrency", { Ref: "HttpReservedConcurrency" }, { Ref: "AWS::NoValue" }],
    });
    expect(template.Parameters?.HttpReservedConcurrency?.Default).toBe(0);
    expect(template.Conditions?.ReservesHttpConcurrency).toEqual({
      "Fn::Not": [{ "Fn::Equals": [{ Ref: "HttpReservedConcurrency" }, "0"] }],
    });
  });
});
