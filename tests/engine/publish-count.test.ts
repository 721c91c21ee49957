/**
 * One publish path per process, on AWS (issue 11, item 1): the stream publisher is
 * the one path that publishes a committed intent; the http function only commits,
 * and the recovery sweep takes only intents older than its grace period, so neither
 * races the stream publisher into a duplicate.
 *
 * The store is AWS's own DynamoDB Local (scripts/peers/dynamodb-local.ts); the
 * publisher is the IoT Core stand-in over an embedded broker, whose `accepted` list
 * is every publish IoT Core would have taken.
 *
 * What needs a real stream is not here yet: the full count (commit -> the table's
 * stream -> the stream publisher -> a subscriber, exactly one message per topic per
 * intent for every kind of commit, then a sweep and a sentinel, as
 * tests/e2e/publish-count.test.ts counts it on the embedded backend) runs in the
 * engine tier once the stream poller (scripts/peers/stream-poller.ts, the `stream`
 * engineer's) lands: DynamoDB Local has the stream, dynalite has none. Until then
 * this file checks what holds without one: the http function publishes nothing
 * itself, and the sweep leaves a fresh intent alone for its grace period and then
 * sends it exactly once.
 */
import { randomUUID } from "node:crypto";
import { type AppEnv, createTokenService } from "@mam/api";
import { createJobTable } from "@mam/aws";
import type { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { composeHttpApp, createRecoverySweepHandler } from "../../functions/compose.ts";
import { type DynamoDbLocal, startDynamoDbLocal } from "../../scripts/peers/dynamodb-local.ts";
import { CREDENTIALS, type Peers, SIGNING_KEY, startPeers } from "../functions/support.ts";
import { TestClock } from "../support/clock.ts";

const GRACE_SECONDS = 5;

let peers: Peers;
let ddb: DynamoDbLocal;

beforeAll(async () => {
  [peers, ddb] = await Promise.all([startPeers(), startDynamoDbLocal()]);
});

afterAll(async () => {
  await ddb?.close();
  await peers?.close();
});

/** A fresh job table on DynamoDB Local, and the environment the functions read, aimed at it. */
async function awsEnv(): Promise<Record<string, string>> {
  const table = `mam-count-${randomUUID().slice(0, 8)}`;
  await createJobTable(ddb.client, table);
  return peers.env(table, {
    MAM_DYNAMODB_ENDPOINT: ddb.endpoint,
    MAM_TOKEN_SIGNING_KEY: SIGNING_KEY,
    MAM_SWEEP_GRACE_SECONDS: String(GRACE_SECONDS),
  });
}

async function call(app: Hono<AppEnv>, token: string, method: string, path: string, body?: unknown) {
  const res = await app.request(path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  // biome-ignore lint/suspicious/noExplicitAny: the test walks JSON answers whose shape each assertion states
  return { status: res.status, body: (await res.json()) as any };
}

const idsAccepted = (): string[] => peers.iot.accepted.map((m) => JSON.parse(m.payload.toString("utf8")).data.notification_intent.id);

describe("publish count on AWS: the stream publisher is the one path (DynamoDB Local)", () => {
  it("the http function commits an agent event, a notifying transition and a cancel without publishing any of them (the stream publisher does)", async () => {
    const clock = new TestClock(new Date().toISOString(), { tickMs: 1 });
    const app = await composeHttpApp(await awsEnv(), { credentials: CREDENTIALS, clock, log: () => undefined });
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(["read", "write", "gate", "ops"]);
    const before = peers.iot.accepted.length;

    const reg = await call(app, operator, "POST", "/v1/jobs", { prompt: "p", agent: "codex" });
    expect(reg.status).toBe(201);
    const jobId = reg.body.job_id as string;
    const event = await call(app, operator, "POST", `/v1/jobs/${jobId}/events`, { event: "started" });
    expect(event.status).toBe(200);
    expect(event.body).not.toHaveProperty("published");
    const intent = event.body.record.pending_notification;
    expect(intent).toMatchObject({ event: "running" });
    const progress = await call(app, operator, "POST", `/v1/jobs/${jobId}/transitions`, {
      action: "progress",
      expected_seq: event.body.record.transition_seq,
      notify: true,
    });
    expect(progress.status).toBe(200);
    const cancel = await call(app, operator, "POST", `/v1/jobs/${jobId}/transitions`, {
      action: "cancel",
      expected_seq: progress.body.transition_seq,
    });
    expect(cancel.status).toBe(200);

    // Nothing went to IoT Core from the request path; the newest intent is owed, for the stream publisher.
    expect(peers.iot.accepted.length).toBe(before);
    const job = await call(app, operator, "GET", `/v1/jobs/${jobId}`);
    expect(job.body.pending_notification).toEqual(cancel.body.pending_notification);
  });

  it("the recovery sweep (the scheduled function and POST /v1/recovery-sweeps) leaves a fresh intent for its grace period, then sends it once", async () => {
    const env = await awsEnv();
    const clock = new TestClock(new Date().toISOString(), { tickMs: 1 });
    const app = await composeHttpApp(env, { credentials: CREDENTIALS, clock, log: () => undefined });
    const sweep = createRecoverySweepHandler(env, { credentials: CREDENTIALS, clock, log: () => undefined });
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(["read", "write", "gate", "ops"]);
    const reg = await call(app, operator, "POST", "/v1/jobs", { prompt: "p", agent: "codex" });
    const jobId = reg.body.job_id as string;
    const claim = await call(app, operator, "POST", `/v1/jobs/${jobId}/transitions`, { action: "claim", expected_seq: 0, notify: true });
    const intentId = claim.body.pending_notification.id as string;

    // Fresh: the stream publisher's, not the sweep's.
    expect(await sweep({} as never)).toMatchObject({ owed: 0, sent: 0 });
    expect((await call(app, operator, "POST", "/v1/recovery-sweeps", {})).body).toMatchObject({ owed: 0, sent: 0 });
    expect(idsAccepted()).not.toContain(intentId);

    clock.advance(GRACE_SECONDS * 1000);
    expect(await sweep({} as never)).toMatchObject({ owed: 1, sent: 1 });
    expect(await sweep({} as never)).toMatchObject({ owed: 0, sent: 0 });
    expect((await call(app, operator, "POST", "/v1/recovery-sweeps", { grace_seconds: 0 })).body).toMatchObject({ owed: 0 });
    // Once on each topic: the job's and the fan-in.
    const sent = peers.iot.accepted.filter((m) => JSON.parse(m.payload.toString("utf8")).data.notification_intent.id === intentId);
    expect(sent.map((m) => m.topic).sort()).toEqual([`mam/jobs/${jobId}/events`, "mam/events"].sort());
  });

  it("an operator may ask POST /v1/recovery-sweeps for another grace (0: everything due now)", async () => {
    const env = await awsEnv();
    const clock = new TestClock(new Date().toISOString(), { tickMs: 1 });
    const app = await composeHttpApp(env, { credentials: CREDENTIALS, clock, log: () => undefined });
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(["read", "write", "gate", "ops"]);
    const reg = await call(app, operator, "POST", "/v1/jobs", { prompt: "p", agent: "codex" });
    const jobId = reg.body.job_id as string;
    const claim = await call(app, operator, "POST", `/v1/jobs/${jobId}/transitions`, { action: "claim", expected_seq: 0, notify: true });
    expect((await call(app, operator, "POST", "/v1/recovery-sweeps", {})).body).toMatchObject({ owed: 0 });
    const now = await call(app, operator, "POST", "/v1/recovery-sweeps", { grace_seconds: 0 });
    expect(now.body).toMatchObject({ owed: 1, sent: 1, results: [{ job_id: jobId, intent_id: claim.body.pending_notification.id }] });
    const refused = await call(app, operator, "POST", "/v1/recovery-sweeps", { grace_seconds: -1 });
    expect(refused.status).toBe(400);
  });
});
