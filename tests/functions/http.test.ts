/**
 * The http function as Lambda runs it: recorded API Gateway HTTP API (payload 2.0)
 * events into the handler built by the composition root, against dynalite, s3rver
 * and the IoT stand-in.
 */
import { createHash } from "node:crypto";
import { SSMClient } from "@aws-sdk/client-ssm";
import { createTokenService, SCOPES } from "@mam/api";
import { systemClock } from "@mam/core";
import type { LambdaEvent } from "hono/aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createHttpHandler, type HttpHandler } from "../../functions/compose.ts";
import {
  CREDENTIALS,
  lambdaContext,
  lambdaFixture,
  memoryLog,
  type Peers,
  REGION,
  SIGNING_KEY,
  startPeers,
  startSsmStandIn,
  TRANSACTIONS,
} from "./support.ts";

const operatorToken = createTokenService({ signingKey: SIGNING_KEY, clock: systemClock }).mintOperator(SCOPES);
const context = lambdaContext("mam-dev-http");

/** API Gateway HTTP API, payload format 2.0. */
type Event = Extract<LambdaEvent, { rawPath: string }>;

function withToken(event: Event, token: string | undefined): Event {
  const headers = { ...event.headers };
  if (token === undefined) delete headers.authorization;
  else headers.authorization = `Bearer ${token}`;
  return { ...event, headers };
}

/** Another request on the GET fixture's envelope (same API, stage and caller). */
function request(method: string, path: string, opts: { token?: string; body?: Uint8Array | string; contentType?: string } = {}): Event {
  const base = lambdaFixture<Event>("http-api-v2-get-job.json");
  const headers: Record<string, string> = { ...(base.headers as Record<string, string>) };
  delete headers.authorization;
  delete headers["content-length"];
  if (opts.token !== undefined) headers.authorization = `Bearer ${opts.token}`;
  if (opts.contentType !== undefined) headers["content-type"] = opts.contentType;
  const binary = opts.body instanceof Uint8Array;
  if (opts.body !== undefined) headers["content-length"] = String(Buffer.byteLength(opts.body));
  return {
    ...base,
    rawPath: path,
    headers,
    requestContext: { ...base.requestContext, http: { ...base.requestContext.http, method, path } },
    pathParameters: { proxy: path.slice(1) },
    // API Gateway hands a binary body to Lambda base64-encoded.
    ...(opts.body === undefined
      ? {}
      : { body: binary ? Buffer.from(opts.body).toString("base64") : String(opts.body), isBase64Encoded: binary }),
  };
}

const json = (r: { body: string }): Record<string, unknown> => JSON.parse(r.body) as Record<string, unknown>;

let peers: Peers;
let table: string;
let handler: HttpHandler;
const log = memoryLog();

beforeAll(async () => {
  peers = await startPeers();
  table = await peers.newTable();
  handler = createHttpHandler(peers.env(table, { MAM_TOKEN_SIGNING_KEY: SIGNING_KEY }), {
    credentials: CREDENTIALS,
    transactions: TRANSACTIONS,
    log: log.sink,
  });
});

afterAll(async () => {
  await peers?.close();
});

describe("http function (API Gateway HTTP API -> Hono app on the AWS adapters)", () => {
  it("POST /v1/jobs (recorded event) registers the job in DynamoDB: 201 with the record", async () => {
    const event = withToken(lambdaFixture<Event>("http-api-v2-post-job.json"), operatorToken);
    const res = await handler(event, context);
    expect(res.statusCode).toBe(201);
    const record = json(res);
    expect(record).toMatchObject({ job_id: "job-fixture-1", agent: "claude-code", status: "pending", transition_seq: 0 });
    expect(res.headers).toMatchObject({ location: "/v1/jobs/job-fixture-1" });
    // It is in the table, not only in the answer.
    expect(await peers.store(table).get("job-fixture-1")).toMatchObject({ job_id: "job-fixture-1", status: "pending" });
  });

  it("GET /v1/jobs/{id} (recorded event) answers the stored record with its ETag", async () => {
    const res = await handler(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
    expect(res.statusCode).toBe(200);
    expect(json(res)).toMatchObject({
      job_id: "job-fixture-1",
      prompt: "Fix the flaky test in tests/unit",
      expected_artifacts: ["commit"],
    });
    expect(res.headers).toMatchObject({ etag: expect.stringContaining("0") });
  });

  it("the same event without a token is a 401 problem document", async () => {
    const res = await handler(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), undefined), context);
    expect(res.statusCode).toBe(401);
    expect(res.headers).toMatchObject({ "content-type": expect.stringContaining("application/problem+json") });
    expect(json(res)).toMatchObject({ code: "auth.missing", status: 401 });
  });

  it("a report body API Gateway base64-encoded reaches S3 byte for byte", async () => {
    const dispatch = await handler(
      request("POST", "/v1/jobs/job-fixture-1/dispatches", {
        token: operatorToken,
        contentType: "application/json",
        body: JSON.stringify({ attempt_id: 1, agent_session_uuid: "5f0c7d2e-3b1a-4e9f-8c6d-7a2b1c0d9e8f", pane_process_generation: 0 }),
      }),
      context,
    );
    expect(dispatch.statusCode).toBe(201);
    const agentToken = json(dispatch).agent_token as string;

    const report = new TextEncoder().encode("# Report\n\nFixed the flaky test: ünïcode ✓\n");
    const staged = await handler(
      request("PUT", "/v1/jobs/job-fixture-1/attempts/1/report", { token: agentToken, contentType: "text/markdown", body: report }),
      context,
    );
    expect(staged.statusCode).toBe(201);
    expect(json(staged)).toEqual({ sha256: createHash("sha256").update(report).digest("hex"), bytes: report.byteLength });
  });

  it("logs one JSON line per request on the sink it was given", () => {
    const requests = log.entries().filter((e) => e.msg === "request");
    expect(requests.length).toBeGreaterThanOrEqual(4);
    expect(requests.map((e) => e.path)).toContain("/v1/jobs");
  });
});

describe("http function start-up: the signing key from SSM, the app built once", () => {
  const parameter = "/mam/test/token-signing-key";

  it("reads the key once, by the parameter's name, WithDecryption, and reuses the app afterwards", async () => {
    const ssm = await startSsmStandIn(parameter, SIGNING_KEY);
    try {
      const h = createHttpHandler(peers.env(table, { MAM_TOKEN_SIGNING_KEY_PARAMETER: parameter }), {
        credentials: CREDENTIALS,
        transactions: TRANSACTIONS,
        ssm: new SSMClient({ region: REGION, endpoint: ssm.endpoint, credentials: CREDENTIALS }),
        log: () => undefined,
      });
      expect(ssm.requests).toHaveLength(0); // nothing at construction: the first invocation builds
      const first = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
      const second = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
      expect([first.statusCode, second.statusCode]).toEqual([200, 200]);
      expect(ssm.requests).toEqual([{ Name: parameter, WithDecryption: true }]);
    } finally {
      await ssm.close();
    }
  });

  it("a failed start answers a problem document, is not remembered, and the next request starts the app", async () => {
    const ssm = await startSsmStandIn(parameter, SIGNING_KEY);
    const startLog = memoryLog();
    try {
      const h = createHttpHandler(peers.env(table, { MAM_TOKEN_SIGNING_KEY_PARAMETER: parameter }), {
        credentials: CREDENTIALS,
        transactions: TRANSACTIONS,
        ssm: new SSMClient({ region: REGION, endpoint: ssm.endpoint, credentials: CREDENTIALS, maxAttempts: 1 }),
        log: startLog.sink,
      });
      ssm.failNext("AccessDeniedException");
      const refused = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
      expect(refused.statusCode).toBe(500);
      expect(refused.headers).toMatchObject({ "content-type": "application/problem+json" });
      expect(json(refused)).toMatchObject({ code: "config.invalid", request_id: context.awsRequestId });
      // The cause is logged, never answered.
      expect(refused.body).not.toContain("AccessDenied");
      expect(startLog.entries()[0]).toMatchObject({ event: "http_start_failed", code: "config.invalid" });
      expect(String(startLog.entries()[0]?.message)).toContain(parameter);

      const retried = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
      expect(retried.statusCode).toBe(200);
      expect(ssm.requests).toHaveLength(2);
    } finally {
      await ssm.close();
    }
  });

  it("a throttled SSM is a retryable 503, not a configuration error", async () => {
    const ssm = await startSsmStandIn(parameter, SIGNING_KEY);
    try {
      const h = createHttpHandler(peers.env(table, { MAM_TOKEN_SIGNING_KEY_PARAMETER: parameter }), {
        credentials: CREDENTIALS,
        transactions: TRANSACTIONS,
        ssm: new SSMClient({ region: REGION, endpoint: ssm.endpoint, credentials: CREDENTIALS, maxAttempts: 1 }),
        log: () => undefined,
      });
      ssm.failNext("ThrottlingException");
      const res = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
      expect(res.statusCode).toBe(503);
      expect(json(res)).toMatchObject({ code: "store.unavailable" });
    } finally {
      await ssm.close();
    }
  });

  it("missing AWS settings are named, all at once, in the log", async () => {
    const startLog = memoryLog();
    const h = createHttpHandler({ AWS_REGION: REGION, MAM_TOKEN_SIGNING_KEY: SIGNING_KEY }, { log: startLog.sink });
    const res = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
    expect(res.statusCode).toBe(500);
    expect(String(startLog.entries()[0]?.message)).toMatch(/MAM_TABLE_NAME, MAM_BUCKET_NAME, MAM_IOT_ENDPOINT/);
  });
});

describe("http function: bodies larger than a Lambda event carries", () => {
  const LIMIT = 4 * 1024 * 1024;
  let agentToken: string;

  beforeAll(async () => {
    const created = await handler(
      request("POST", "/v1/jobs", {
        token: operatorToken,
        contentType: "application/json",
        body: JSON.stringify({ job_id: "job-large-1", prompt: "write a long report", agent: "codex" }),
      }),
      context,
    );
    expect(created.statusCode).toBe(201);
    const dispatch = await handler(
      request("POST", "/v1/jobs/job-large-1/dispatches", {
        token: operatorToken,
        contentType: "application/json",
        body: JSON.stringify({ attempt_id: 1, agent_session_uuid: "0b6e2f4a-1c3d-4e5f-8a9b-0c1d2e3f4a5b", pane_process_generation: 0 }),
      }),
      context,
    );
    expect(dispatch.statusCode).toBe(201);
    agentToken = json(dispatch).agent_token as string;
  });

  function expectTooLarge(
    res: { statusCode: number; headers?: Record<string, unknown> | undefined; body: string },
    limit: number,
    upload: string,
  ): void {
    expect(res.statusCode).toBe(413);
    expect(res.headers).toMatchObject({ "content-type": expect.stringContaining("application/problem+json") });
    const problem = json(res);
    expect(problem).toMatchObject({ code: "input.tooLarge", status: 413, limit, upload });
    expect(String(problem.detail)).toContain(`limit of ${limit} bytes`);
    expect(String(problem.detail)).toContain(`POST ${upload}`);
  }

  it("a report over 4 MiB (the AWS default: 4/3 of it in base64 still fits a 6 MB event) is a 413 problem pointing at the upload route", async () => {
    const report = new Uint8Array(LIMIT + 1).fill(0x61);
    const event = request("PUT", "/v1/jobs/job-large-1/attempts/1/report", {
      token: agentToken,
      contentType: "text/markdown",
      body: report,
    });
    // What API Gateway hands over is under Lambda's 6 MB (6,291,456 bytes) request limit.
    expect(Buffer.byteLength(JSON.stringify(event))).toBeLessThan(6 * 1024 * 1024);
    expectTooLarge(await handler(event, context), LIMIT, "/v1/jobs/job-large-1/attempts/1/report/upload");
    // Without a Content-Length the body is counted as it streams: the same answer.
    const { "content-length": _, ...headers } = event.headers as Record<string, string>;
    expectTooLarge(await handler({ ...event, headers }, context), LIMIT, "/v1/jobs/job-large-1/attempts/1/report/upload");
    expect(await peers.store(table).get("job-large-1")).toMatchObject({ evidence_seq: 1 }); // the dispatch's write only
  });

  it("a JSON body over 1 MiB is a 413 problem naming the limit (never a 5xx)", async () => {
    const body = JSON.stringify({ job_id: "job-large-2", prompt: "x".repeat(1024 * 1024), agent: "codex" });
    const res = await handler(request("POST", "/v1/jobs", { token: operatorToken, contentType: "application/json", body }), context);
    expectTooLarge(res, 1024 * 1024, "/v1/jobs/{job_id}/attempts/{attempt}/report/upload");
    expect(await peers.store(table).get("job-large-2")).toBeUndefined();
  });

  it("a larger report goes by the presigned upload the function answers, and finalize verifies it", async () => {
    const report = new Uint8Array(LIMIT + 1024).fill(0x62);
    const sha256 = createHash("sha256").update(report).digest("hex");
    const asked = await handler(
      request("POST", "/v1/jobs/job-large-1/attempts/1/report/upload", {
        token: agentToken,
        contentType: "application/json",
        body: JSON.stringify({ sha256, bytes: report.byteLength }),
      }),
      context,
    );
    expect(asked.statusCode).toBe(200);
    const target = json(asked) as { url: string; headers: Record<string, string>; bearer: boolean };
    expect(target.bearer).toBe(false);
    expect(target.url.startsWith(peers.env(table).MAM_S3_ENDPOINT ?? "-")).toBe(true);
    const { "content-length": _, ...headers } = target.headers;
    const put = await fetch(target.url, { method: "PUT", headers, body: report });
    await put.arrayBuffer();
    expect(put.status).toBe(200);
    const fin = await handler(
      request("POST", "/v1/jobs/job-large-1/attempts/1/finalize", {
        token: agentToken,
        contentType: "application/json",
        body: JSON.stringify({ side_effects: [] }),
      }),
      context,
    );
    expect(fin.statusCode, fin.body).toBe(200);
    expect(json(fin).manifest).toMatchObject({ sha256, bytes: report.byteLength });
  });

  it("a configured body limit above what a Lambda event carries is a start-up error naming the variable", async () => {
    const startLog = memoryLog();
    const h = createHttpHandler(peers.env(table, { MAM_TOKEN_SIGNING_KEY: SIGNING_KEY, MAM_REPORT_BODY_LIMIT: String(8 * 1024 * 1024) }), {
      credentials: CREDENTIALS,
      transactions: TRANSACTIONS,
      log: startLog.sink,
    });
    const res = await h(withToken(lambdaFixture<Event>("http-api-v2-get-job.json"), operatorToken), context);
    expect(res.statusCode).toBe(500);
    expect(json(res)).toMatchObject({ code: "config.invalid" });
    expect(String(startLog.entries()[0]?.message)).toContain("MAM_REPORT_BODY_LIMIT must be at most 4194304");
  });
});
