/**
 * The change feed is the same on both backends: the README's session (register,
 * dispatch, claim, stage, finalize, a progress without notify, evaluate, the settle)
 * runs on `mam serve`'s composition (SQLite) and on the AWS shape — the Lambda
 * composition of the http function over AWS's own DynamoDB Local and s3rver, with the
 * stream publisher and the feed writer each driven by our stream poller from the
 * table's real stream, with the event source mappings exactly as serverless.yml
 * declares them (filters included, read from it, never restated here) — and the two
 * feeds are compared row by row: kinds, order per job, actors, data; `at` only as lying
 * inside the session and never decreasing within a job. Then a feed write that keeps
 * failing sends its range to the on-failure queue (the SQS stand-in, read with the real
 * SQS client), the feed has a hole, and the sweep's redrive fills it.
 *
 * Needs Java (DynamoDB Local): the engine tier.
 */
import { randomBytes, randomUUID } from "node:crypto";
import path from "node:path";
import { CreateBucketCommand } from "@aws-sdk/client-s3";
import { SendMessageCommand, SQSClient } from "@aws-sdk/client-sqs";
import { createTokenService } from "@mam/api";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import { type RunningService, startService } from "@mam/cli";
import { type ChangeRow, parseConfig } from "@mam/core";
import { type EmbeddedBroker, startEmbeddedBroker } from "@mam/local";
import type { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  composeHttpApp,
  createFeedWriterHandler,
  createRecoverySweepHandler,
  createStreamPublisherHandler,
} from "../../functions/compose.ts";
import { streamMappingOf } from "../../scripts/offline/serverless-yml.ts";
import { type DynamoDbLocal, startDynamoDbLocal } from "../../scripts/peers/dynamodb-local.ts";
import { type IotStandIn, startIotStandIn } from "../../scripts/peers/iot-stand-in.ts";
import { type SqsStandIn, startSqsStandIn } from "../../scripts/peers/sqs-stand-in.ts";
import {
  type Invocation,
  type OnFailureMessage,
  type StreamHandler,
  type StreamPoller,
  startStreamPoller,
} from "../../scripts/peers/stream-poller.ts";
import { candidateScenario } from "../api/harness.ts";
import { type S3rverPeer, startS3rver } from "../support/aws-peers.ts";
import { startCountingProxy } from "../support/counting-proxy.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const REGION = "us-east-1";
// s3rver checks its own default key; DynamoDB Local, the IoT and SQS stand-ins take any.
const CREDENTIALS = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" };
const SIGNING_KEY = randomBytes(32).toString("hex");
const TIMEOUT_MS = 240_000;
const FEED_MAPPING = streamMappingOf("feedWriter");
const PUBLISHER_MAPPING = streamMappingOf("streamPublisher");

interface Answer {
  readonly status: number;
  // biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field
  readonly body: any;
}
type Call = (method: string, path: string, req: { token: string; json?: unknown; body?: string; type?: string }) => Promise<Answer>;

/** The README's session on one job, through the HTTP API. */
async function readmeSession(call: Call, operator: string, jobId: string): Promise<void> {
  const ok = (what: string, a: Answer, status?: number): Answer => {
    if (status !== undefined) expect(a.status, `${what}: ${JSON.stringify(a.body)}`).toBe(status);
    else expect([200, 201], `${what}: ${a.status} ${JSON.stringify(a.body)}`).toContain(a.status);
    return a;
  };
  ok(
    "register",
    await call("POST", "/v1/jobs", {
      token: operator,
      json: { job_id: jobId, prompt: "Fix the flaky test", agent: "claude-code", auto_complete: true },
    }),
    201,
  );
  const dispatch = await call("POST", `/v1/jobs/${jobId}/dispatches`, {
    token: operator,
    json: {
      attempt_id: 1,
      agent_session_uuid: "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa",
      pane_process_generation: 3,
      anchor: { started_at: "2026-11-20T09:59:00Z" },
    },
  });
  expect(dispatch.status, JSON.stringify(dispatch.body)).toBeLessThan(300);
  const agent = String(dispatch.body.agent_token);
  const claim = ok(
    "claim",
    await call("POST", `/v1/jobs/${jobId}/transitions`, { token: agent, json: { action: "claim", expected_seq: 0 } }),
  );
  const seq = Number(claim.body.record?.transition_seq ?? claim.body.transition_seq);
  ok(
    "stage",
    await call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
      token: agent,
      body: "# Report\n\nFixed the race in the retry test.\n",
      type: "text/markdown",
    }),
  );
  ok(
    "finalize",
    await call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, {
      token: agent,
      json: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
    }),
  );
  ok(
    "progress",
    await call("POST", `/v1/jobs/${jobId}/transitions`, {
      token: agent,
      json: { action: "progress", expected_seq: seq, fields: { progress: { step: "tests green" } }, notify: false },
    }),
  );
  const evaluation = ok(
    "evaluate",
    await call("POST", `/v1/jobs/${jobId}/evaluations`, { token: operator, json: { scenario: candidateScenario(jobId) } }),
  );
  expect(evaluation.body.committed, JSON.stringify(evaluation.body)).toBe(true);
}

/** What two backends must agree on: every field but the cursor, the time and the job id; intent and token ids by order of first appearance. */
function comparable(rows: readonly ChangeRow[]): unknown[] {
  const ids = new Map<string, string>();
  const label = (id: string): string => {
    if (!ids.has(id)) ids.set(id, `id-${ids.size + 1}`);
    return ids.get(id) as string;
  };
  return rows.map((r) => {
    const { cursor: _cursor, at: _at, job_id: _job, ...rest } = r;
    const data =
      rest.data === undefined
        ? undefined
        : Object.fromEntries(Object.entries(rest.data).map(([k, v]) => [k, k === "by" ? label(String(v)) : v]));
    const actor: Record<string, unknown> = { ...rest.actor };
    if (typeof actor.token_id === "string") actor.token_id = label(actor.token_id);
    return {
      ...rest,
      actor,
      ...(rest.intent_id === undefined ? {} : { intent_id: label(rest.intent_id) }),
      ...(data === undefined ? {} : { data }),
    };
  });
}

function expectTimesInside(rows: readonly ChangeRow[], from: number, to: number): void {
  let last = 0;
  for (const r of rows) {
    const t = Date.parse(r.at);
    expect(r.at, "the writer's own time, to the millisecond").toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(t).toBeGreaterThanOrEqual(from);
    expect(t).toBeLessThanOrEqual(to);
    expect(t, `${r.kind} went back in time`).toBeGreaterThanOrEqual(last);
    last = t;
  }
}

let tmp: TempDir;
let ddb: DynamoDbLocal;
let s3: S3rverPeer;
let sqs: SqsStandIn;
let broker: EmbeddedBroker;
let standIn: IotStandIn;
let sqliteRows: readonly ChangeRow[];
let sqliteWindow: [number, number];

beforeAll(async () => {
  tmp = await tempDir("feed-session");
  const service = { username: "mam-iot-stand-in", password: randomBytes(16).toString("hex") };
  [ddb, s3, sqs, broker] = await Promise.all([
    startDynamoDbLocal(),
    startS3rver(),
    startSqsStandIn(),
    startEmbeddedBroker({ port: 0, publisherCredentials: service }),
  ]);
  standIn = await startIotStandIn(broker.url, service);

  // SQLite: mam serve's composition, in-process, over real HTTP.
  const running: RunningService = await startService(
    parseConfig({ MAM_DATA_DIR: path.join(tmp.dir, "data"), MAM_PORT: "0", MAM_MQTT_PORT: "0", MAM_AUTO_COMPLETE: "1" }),
    () => undefined,
  );
  try {
    const from = Date.now();
    await readmeSession(httpCall(running.url), running.operatorToken, "fix-flaky-test");
    await running.relayed();
    const page = await httpCall(running.url)("GET", "/v1/events?limit=100", { token: running.operatorToken });
    expect(page.status).toBe(200);
    sqliteRows = (page.body.items as ChangeRow[]).filter((r) => r.job_id === "fix-flaky-test");
    sqliteWindow = [from, Date.now()];
  } finally {
    await running.stop();
  }
}, TIMEOUT_MS);

afterAll(async () => {
  await Promise.allSettled([standIn?.close(), sqs?.close(), s3?.close()]);
  await Promise.allSettled([broker?.close(), ddb?.close()]);
  await tmp?.remove();
});

/** Calls through `fetch`-shaped transport: a real server's `fetch`, or a Hono app's `request`. */
function callWith(send: (path: string, init: RequestInit) => Promise<Response>): Call {
  return async (method, p, req) => {
    const headers: Record<string, string> = { authorization: `Bearer ${req.token}` };
    let body: string | undefined = req.body;
    if (req.json !== undefined) {
      body = JSON.stringify(req.json);
      headers["content-type"] = "application/json";
    } else if (req.type !== undefined) headers["content-type"] = req.type;
    const res = await send(p, { method, headers, ...(body === undefined ? {} : { body }) });
    const text = await res.text();
    return { status: res.status, body: text === "" ? undefined : JSON.parse(text) };
  };
}

const httpCall = (base: string): Call => callWith((p, init) => fetch(new URL(p, base), init));
const appCall = (app: Hono): Call => callWith(async (p, init) => app.request(p, init));

let tables = 0;

/** The AWS shape over a fresh table and bucket: the http app, both stream consumers (not yet polling), the sweep. */
async function awsShape(opts: { feedAround?: (h: StreamHandler) => StreamHandler; measure?: boolean } = {}) {
  const n = `${process.pid}-${++tables}`;
  const tableName = `mam-session-${n}`;
  const bucket = `mam-session-${n}`;
  await Promise.all([createJobTable(ddb.client, tableName), s3.client.send(new CreateBucketCommand({ Bucket: bucket }))]);
  const queueUrl = sqs.queueUrl(`feed-failures-${n}`);
  const env = {
    AWS_REGION: REGION,
    MAM_TABLE_NAME: tableName,
    MAM_BUCKET_NAME: bucket,
    MAM_IOT_ENDPOINT: standIn.endpoint,
    MAM_DYNAMODB_ENDPOINT: ddb.endpoint,
    MAM_S3_ENDPOINT: s3.endpoint,
    MAM_TOKEN_SIGNING_KEY: SIGNING_KEY,
    MAM_AUTO_COMPLETE: "1",
    MAM_FEED_FAILURE_QUEUE_URL: queueUrl,
    MAM_SQS_ENDPOINT: sqs.endpoint,
    // The sweep's redrive only: nothing is owed once the publisher settled.
    MAM_SWEEP_GRACE_SECONDS: "0",
  };
  const overrides = {
    credentials: CREDENTIALS,
    log: (l: string) => {
      if (process.env.DEBUG_SESSION) console.error(l);
    },
  };
  const app = (await composeHttpApp(env, overrides)) as unknown as Hono;
  const operator = createTokenService({ signingKey: SIGNING_KEY, clock: { now: () => new Date() } }).mintOperator([
    "read",
    "write",
    "gate",
    "ops",
  ]);
  // Each stream consumer talks to DynamoDB Local through a proxy of its own, which counts what it sent.
  const [feedProxy, publisherProxy] = await Promise.all([startCountingProxy(ddb.endpoint), startCountingProxy(ddb.endpoint)]);
  const feedWriter = createFeedWriterHandler({ ...env, MAM_DYNAMODB_ENDPOINT: feedProxy.endpoint }, overrides);
  const feedHandler: StreamHandler = (opts.feedAround ?? ((h) => h))((event) => feedWriter(event));
  const publisher = createStreamPublisherHandler({ ...env, MAM_DYNAMODB_ENDPOINT: publisherProxy.endpoint }, overrides);
  const publisherInvocations: Invocation[] = [];
  // What the feed writer's mapping would be invoked for without its filter: a consumer that only counts.
  const unfilteredInvocations: Invocation[] = [];
  const sweep = createRecoverySweepHandler(env, overrides);
  const sender = new SQSClient({ endpoint: sqs.endpoint, region: REGION, credentials: CREDENTIALS });
  // The store the API reads, without the feed delay: every row asked for here was written first.
  const store = new DynamoJobStore({ client: ddb.client, tableName, feedDelayMs: 0 });
  const pollers: StreamPoller[] = [];
  const feedInvocations: Invocation[] = [];
  const wakers = new Set<() => void>();
  const failures: OnFailureMessage[] = [];
  return {
    call: appCall(app),
    operator,
    tableName,
    queue: `feed-failures-${n}`,
    feedInvocations,
    publisherInvocations,
    unfilteredInvocations,
    feedProxy,
    publisherProxy,
    failures,
    async startPolling(): Promise<void> {
      pollers.push(
        await startStreamPoller({
          streams: ddb.streams,
          dynamodb: ddb.client,
          tableName,
          region: REGION,
          mapping: PUBLISHER_MAPPING,
          handler: (event) => publisher(event),
          onInvocation: (i) => {
            publisherInvocations.push(i);
          },
        }),
        await startStreamPoller({
          streams: ddb.streams,
          dynamodb: ddb.client,
          tableName,
          region: REGION,
          mapping: FEED_MAPPING,
          handler: feedHandler,
          onInvocation: (i) => {
            feedInvocations.push(i);
            for (const w of [...wakers]) w();
          },
          // What Lambda does with a range the function gave up on: one message to the queue.
          onFailure: async (m) => {
            failures.push(m);
            await sender.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify(m) }));
            for (const w of [...wakers]) w();
          },
        }),
      );
      if (opts.measure) {
        pollers.push(
          await startStreamPoller({
            streams: ddb.streams,
            dynamodb: ddb.client,
            tableName,
            region: REGION,
            mapping: { ...FEED_MAPPING, filterPatterns: [] },
            handler: async () => ({ batchItemFailures: [] }),
            onInvocation: (i) => {
              unfilteredInvocations.push(i);
            },
          }),
        );
      }
    },
    /** The job's rows as the API reads them (one job's rows, in its stream order). */
    async rows(jobId: string): Promise<readonly ChangeRow[]> {
      return (await store.listChanges({ jobId, limit: 100 })).items;
    },
    /** Resolves once `done` holds, checked after every call of the feed writer and every on-failure message. */
    until(done: () => Promise<boolean>): Promise<void> {
      return new Promise((resolve, reject) => {
        const check = (): void => {
          done().then(
            (yes) => {
              if (!yes) return;
              wakers.delete(check);
              resolve();
            },
            (err: unknown) => {
              wakers.delete(check);
              reject(err);
            },
          );
        };
        wakers.add(check);
        check();
      });
    },
    sweep: () => sweep({} as never),
    async close(): Promise<void> {
      for (const p of pollers) await p.close();
      sender.destroy();
      await Promise.all([feedProxy.close(), publisherProxy.close()]);
    },
  };
}

describe("the change feed on the AWS shape, with the event source mappings serverless.yml declares", () => {
  it("the mappings are read from serverless.yml: the feed writer's takes job items only, the publisher's only what owes an intent", () => {
    expect(FEED_MAPPING.filterPatterns).toEqual([{ dynamodb: { Keys: { sk: { S: ["JOB"] } } } }]);
    expect(JSON.stringify(PUBLISHER_MAPPING.filterPatterns)).toContain("pending_notification");
    expect(FEED_MAPPING.reportBatchItemFailures && PUBLISHER_MAPPING.reportBatchItemFailures).toBe(true);
  });

  it(
    "the README session gives, row by row, the feed mam serve gives on SQLite: eight rows, the same kinds, order, actors and data",
    async () => {
      expect(sqliteRows.map((r) => r.kind)).toEqual([
        "job.registered",
        "dispatch.recorded",
        "job.transitioned",
        "report.staged",
        "report.finalized",
        "job.transitioned",
        "job.transitioned",
        "intent.published",
      ]);
      expectTimesInside(sqliteRows, ...sqliteWindow);
      const aws = await awsShape({ measure: true });
      try {
        await aws.startPolling();
        const from = Date.now();
        await readmeSession(aws.call, aws.operator, "fix-flaky-test");
        const to = Date.now();
        await aws.until(async () => (await aws.rows("fix-flaky-test")).some((r) => r.kind === "intent.published"));
        const rows = await aws.rows("fix-flaky-test");
        expect(comparable(rows)).toEqual(comparable(sqliteRows));
        // The settle comes after the session, when the publisher has published.
        expectTimesInside(rows.slice(0, -1), from, to);
        expectTimesInside(rows, from, Date.now());
        // The whole feed (no job filter) holds the same rows in the same order.
        const whole = await new DynamoJobStore({ client: ddb.client, tableName: aws.tableName, feedDelayMs: 0 }).listChanges({
          limit: 100,
        });
        expect(comparable(whole.items)).toEqual(comparable(rows));
        expect(aws.failures).toEqual([]);

        // What the lifecycle cost the two consumers (docs/adapters.md, "The change feed on
        // DynamoDB"): every job-item write reaches the feed writer, which writes each
        // record's rows with one hour PutItem and one transaction; the unfiltered mapping
        // the filter saves would also have been invoked for the feed's own items.
        const records = (is: readonly Invocation[]): number => is.reduce((n, i) => n + i.records.length, 0);
        const feedRecords = records(aws.feedInvocations);
        const feedCalls = aws.feedProxy.counts();
        const cost = {
          job_item_writes: feedRecords,
          feed_rows: rows.length,
          feed_writer: { invocations: aws.feedInvocations.length, records: feedRecords, dynamodb: feedCalls },
          publisher: {
            invocations: aws.publisherInvocations.length,
            records: records(aws.publisherInvocations),
            dynamodb: aws.publisherProxy.counts(),
          },
          unfiltered_mapping: { invocations: aws.unfilteredInvocations.length, records: records(aws.unfilteredInvocations) },
        };
        console.log(`feed cost per README lifecycle: ${JSON.stringify(cost)}`);
        expect(aws.feedInvocations.every((i) => i.records.every((r) => r.dynamodb?.Keys?.sk?.S === "JOB"))).toBe(true);
        expect(feedCalls.TransactWriteItems).toBe(feedCalls.PutItem);
        expect(feedCalls.TransactWriteItems).toBeLessThanOrEqual(feedRecords);
        expect(cost.unfiltered_mapping.records).toBeGreaterThan(feedRecords);
      } finally {
        await aws.close();
      }
    },
    TIMEOUT_MS,
  );

  it(
    "a feed write that keeps failing sends its range to the on-failure queue, leaving a hole; the sweep's redrive fills it, once",
    async () => {
      // The feed writer fails every batch holding the job's claim (as a throttled table
      // would) until the range has gone to the on-failure queue; then it works again.
      let broken = true;
      const isClaim = (event: Parameters<StreamHandler>[0]): boolean =>
        event.Records.some((r) => r.dynamodb?.NewImage?.status?.S === "running" && r.dynamodb?.OldImage?.status?.S === "pending");
      const aws = await awsShape({
        feedAround: (h) => async (event) => {
          if (broken && isClaim(event)) throw new Error("the feed's table is throttled (a test's stand-in for an outage)");
          return h(event);
        },
      });
      try {
        await aws.startPolling();
        const jobId = `redrive-${randomUUID().slice(0, 8)}`;
        await readmeSession(aws.call, aws.operator, jobId);
        await aws.until(async () => aws.failures.length > 0 && (await aws.rows(jobId)).some((r) => r.kind === "intent.published"));
        broken = false;
        expect(aws.failures).toHaveLength(1);
        expect(aws.failures[0]?.requestContext.condition).toBe("RetryAttemptsExhausted");
        const holed = await aws.rows(jobId);
        expect(holed.map((r) => r.kind)).not.toEqual(sqliteRows.map((r) => r.kind));
        expect(holed.length).toBeLessThan(sqliteRows.length);
        expect(sqs.depth(aws.queue)).toBe(1);

        const first = await aws.sweep();
        expect(first.feed_redrive).toMatchObject({ messages: 1, redriven: 1, failed: 0, expired: 0 });
        expect(first.feed_redrive?.rows).toBe(sqliteRows.length - holed.length);
        expect(sqs.depth(aws.queue)).toBe(0);
        const filled = await aws.rows(jobId);
        expect(comparable(filled)).toEqual(comparable(sqliteRows));

        // Nothing left to redrive, and nothing written twice.
        const second = await aws.sweep();
        expect(second.feed_redrive).toEqual({ messages: 0, redriven: 0, rows: 0, failed: 0, expired: 0 });
        expect(await aws.rows(jobId)).toEqual(filled);
      } finally {
        await aws.close();
      }
    },
    TIMEOUT_MS,
  );
});
