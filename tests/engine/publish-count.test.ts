/**
 * One publish per intent, per topic, on AWS (issue 11, item 1): the stream publisher
 * is the one path that publishes a committed intent; the http function only commits,
 * and the recovery sweep takes only intents older than its grace period, so neither
 * races the stream publisher into a duplicate.
 *
 * The store is AWS's own DynamoDB Local (through `startDynamoPeer`: this tier runs
 * with MAM_DYNAMODB_PEER=dynamodb-local), which keeps the table's stream; the stream
 * poller (scripts/peers/stream-poller.ts) imitates Lambda's event source mapping and
 * calls the real stream publisher handler (tests/support/stream-path.ts); the
 * publisher is the IoT Core stand-in over an embedded broker, and a real MQTT
 * subscriber counts what arrived.
 *
 * The full count mirrors the embedded backend's (tests/e2e/publish-count.test.ts):
 * commit every kind of intent-carrying change through the composed http app, wait
 * until the stream publisher has handled the last of them, run the recovery sweep
 * after its grace (a test clock shared by every function), then commit a sentinel;
 * the stream publisher handles a shard's records in order, so once the sentinel's
 * message arrived everything committed before it was handled: only then count. A
 * superseded intent is judged by the change feed's `intent.superseded` rows, which
 * the stream function wrote before it handled the sentinel, read with no feed delay
 * on the same test clock that stamped them.
 */
import { randomUUID } from "node:crypto";
import { type AppEnv, createTokenService, SCOPES } from "@mam/api";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import { bookkeeping, type JobRecord } from "@mam/core";
import type { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { composeHttpApp, createRecoverySweepHandler } from "../../functions/compose.ts";
import { CANDIDATE_DISPATCH, candidateScenario } from "../api/harness.ts";
import { CREDENTIALS, type Peers, REGION, SIGNING_KEY, startPeers } from "../functions/support.ts";
import { TestClock, tickingClock } from "../support/clock.ts";
import { type Committed, expectDeliveredOrSuperseded, supersededIn } from "../support/publish-count.ts";
import { streamPath } from "../support/stream-path.ts";
import { subscribe } from "../support/subscriber.ts";

const GRACE_SECONDS = 5;

let peers: Peers;

beforeAll(async () => {
  peers = await startPeers();
});

afterAll(async () => {
  await peers?.close();
});

/** A fresh job table on DynamoDB Local, and the environment the functions read, aimed at it. */
async function awsEnv(extra: Record<string, string> = {}): Promise<Record<string, string>> {
  const table = `mam-count-${randomUUID().slice(0, 8)}`;
  await createJobTable(peers.dynamo.client, table);
  return peers.env(table, {
    MAM_TOKEN_SIGNING_KEY: SIGNING_KEY,
    MAM_SWEEP_GRACE_SECONDS: String(GRACE_SECONDS),
    ...extra,
  });
}

async function call(app: Hono<AppEnv>, token: string, method: string, path: string, body?: unknown, raw?: string) {
  const res = await app.request(path, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
      ...(raw === undefined ? {} : { "content-type": "text/markdown" }),
    },
    ...(body === undefined ? (raw === undefined ? {} : { body: raw }) : { body: JSON.stringify(body) }),
  });
  // biome-ignore lint/suspicious/noExplicitAny: the test walks JSON answers whose shape each assertion states
  return { status: res.status, body: (await res.json()) as any };
}

const idsAccepted = (): string[] => peers.iot.accepted.map((m) => JSON.parse(m.payload.toString("utf8")).data.notification_intent.id);

describe("publish count on AWS: the stream publisher is the one path (DynamoDB Local)", () => {
  it("the http function commits an agent event, a notifying transition and a cancel without publishing any of them (the stream publisher does)", async () => {
    const clock = new TestClock(new Date().toISOString(), { tickMs: 1 });
    const app = await composeHttpApp(await awsEnv(), { credentials: CREDENTIALS, clock, log: () => undefined });
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(SCOPES);
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
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(SCOPES);
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
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(SCOPES);
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

describe("publish count on AWS: commit -> the table's stream -> the stream publisher -> a subscriber (DynamoDB Local)", () => {
  it("every kind of intent-carrying commit arrives exactly once per topic (job and mam/events), none left superseded; a sweep after the grace sends nothing twice (B-13, B-40 unchanged)", async () => {
    const { streams } = peers.dynamo;
    if (streams === undefined)
      throw new Error(`the stream path needs DynamoDB Local (MAM_DYNAMODB_PEER=dynamodb-local), not ${peers.dynamo.engine}`);
    const env = await awsEnv({ MAM_AUTO_COMPLETE: "1" });
    const tableName = env.MAM_TABLE_NAME as string;
    // One clock for every function: the sweep's grace and the feed's written_at are read on it.
    const clock = tickingClock(new Date().toISOString());
    const overrides = { credentials: CREDENTIALS, clock, log: () => undefined };
    const app = await composeHttpApp(env, overrides);
    const sweep = createRecoverySweepHandler(env, overrides);
    const path = streamPath({ dynamodb: peers.dynamo.client, streams, tableName, env, overrides, region: REGION });
    const store = new DynamoJobStore({ client: peers.dynamo.client, tableName });
    // The feed as the stream function wrote it, read with no delay on the clock that stamped its rows.
    const feed = new DynamoJobStore({ client: peers.dynamo.client, tableName, feedDelayMs: 0, clock });
    const operator = createTokenService({ signingKey: SIGNING_KEY, clock }).mintOperator(SCOPES);
    const sub = await subscribe(peers.broker.url, "mam/#");
    const committed: Committed[] = [];
    const lastIntentOf = new Map<string, string | undefined>();
    const noteIntent = (what: string, record: JobRecord, expectIntent: boolean): void => {
      const id = record.pending_notification?.id;
      const fresh = id !== undefined && id !== lastIntentOf.get(record.job_id);
      expect(fresh, `${what}: ${expectIntent ? "carries" : "carries no"} new intent`).toBe(expectIntent);
      if (fresh) committed.push({ job: record.job_id, intent: id, what });
      lastIntentOf.set(record.job_id, id);
    };
    const commit = async (what: string, token: string, route: string, body: unknown, expectIntent: boolean): Promise<JobRecord> => {
      const res = await call(app, token, "POST", route, body);
      expect(res.status, `${what}: ${JSON.stringify(res.body)}`).toBe(200);
      expect(res.body, `${what}: the http function does not publish`).not.toHaveProperty("published");
      const record: JobRecord = res.body.record ?? res.body;
      noteIntent(what, record, expectIntent);
      return record;
    };
    const register = async (extra: Record<string, unknown> = {}): Promise<string> => {
      const res = await call(app, operator, "POST", "/v1/jobs", { prompt: "p", agent: "claude-code", ...extra });
      expect(res.status).toBe(201);
      return res.body.job_id as string;
    };
    const transition = (what: string, job: string, seq: number, action: string, extra: Record<string, unknown>, intent: boolean) =>
      commit(what, operator, `/v1/jobs/${job}/transitions`, { action, expected_seq: seq, ...extra }, intent);
    const handled = (intent: string) =>
      path.invocation(
        (i) => i.outcome.kind === "succeeded" && i.records.some((r) => r.dynamodb?.NewImage?.pending_notification?.M?.id?.S === intent),
      );

    try {
      await path.start();
      // claim, progress: notify only when asked; completed, error, cancel: unless told not to (with a reason).
      const a = await register();
      let r = await transition("claim", a, 0, "claim", {}, false);
      r = await transition("progress", a, r.transition_seq, "progress", { fields: { progress: { step: 1 } } }, false);
      r = await transition("progress notify", a, r.transition_seq, "progress", { notify: true }, true);
      await transition("completed", a, r.transition_seq, "completed", {}, true);

      const b = await register();
      r = await transition("claim notify", b, 0, "claim", { notify: true }, true);
      await transition("error", b, r.transition_seq, "error", {}, true);

      const c = await register();
      await transition("operator cancel", c, 0, "cancel", {}, true);

      const d = await register();
      r = await transition("claim (d)", d, 0, "claim", {}, false);
      await transition("completed, notify: false", d, r.transition_seq, "completed", { notify: false, reason: "rerun" }, false);
      const e = await register();
      await transition("cancel, notify: false", e, 0, "cancel", { notify: false, reason: "duplicate job" }, false);

      // Agent events over POST /events, then finalize+event.
      const f = await register();
      const dispatch = await call(app, operator, "POST", `/v1/jobs/${f}/dispatches`, CANDIDATE_DISPATCH);
      expect(dispatch.status, JSON.stringify(dispatch.body)).toBe(201);
      const agent = dispatch.body.agent_token as string;
      for (const event of ["started", "progress"] as const) {
        await commit(`POST /events ${event}`, agent, `/v1/jobs/${f}/events`, { event }, true);
      }
      expect((await call(app, agent, "PUT", `/v1/jobs/${f}/attempts/1/report`, undefined, "# done\n")).status).toBe(201);
      await commit(
        "POST /events completed with finalize",
        agent,
        `/v1/jobs/${f}/events`,
        { event: "completed", finalize: { attempt_id: 1, side_effects: [] } },
        true,
      );

      // The gate's completion (MAM_AUTO_COMPLETE=1 and the job's auto_complete).
      const g = await register({ auto_complete: true });
      const gd = await call(app, operator, "POST", `/v1/jobs/${g}/dispatches`, CANDIDATE_DISPATCH);
      const gAgent = gd.body.agent_token as string;
      await commit("agent claim", gAgent, `/v1/jobs/${g}/transitions`, { action: "claim", expected_seq: 0 }, false);
      expect((await call(app, gAgent, "PUT", `/v1/jobs/${g}/attempts/1/report`, undefined, "# Report\n\nFixed.\n")).status).toBe(201);
      expect((await call(app, gAgent, "POST", `/v1/jobs/${g}/attempts/1/finalize`, { side_effects: [] })).status).toBe(200);
      const gate = await call(app, operator, "POST", `/v1/jobs/${g}/evaluations`, { scenario: candidateScenario(g) });
      expect(gate.body.committed, gate.body.reason).toBe(true);
      noteIntent("the gate's completion", gate.body.record, true);

      // Bookkeeping: an operator's replacement intent (no API route; core's function over the same table).
      const h = await register();
      r = await transition("cancel (h)", h, 0, "cancel", { notify: false, reason: "to re-announce" }, false);
      const replacement = {
        id: randomUUID(),
        event: "cancelled",
        seq: r.transition_seq,
        created_at: clock.now().toISOString(),
        by: "operator",
      };
      await bookkeeping({ jobs: store }, h, { pending_notification: replacement });
      committed.push({ job: h, intent: replacement.id, what: "bookkeeping replace" });

      // Two notifying commits back to back on one job: the second may supersede the first before it was sent.
      const s = await register();
      r = await transition("claim notify (s)", s, 0, "claim", { notify: true }, true);
      await transition("progress notify right after (s)", s, r.transition_seq, "progress", { notify: true }, true);

      // Fresh intents are the stream publisher's: a sweep now takes none of them.
      expect(await sweep({} as never)).toMatchObject({ sent: 0, failed: 0 });
      // Once the stream publisher has handled the last commit (a shard's records go in order), the grace passes
      // and the sweep runs again: the stream publisher settled everything, so nothing is owed and nothing re-sent.
      await handled(committed.at(-1)?.intent as string);
      clock.advance(GRACE_SECONDS * 1000);
      expect(await sweep({} as never)).toMatchObject({ owed: 0, sent: 0, failed: 0 });

      // The sentinel: once its message is in, everything committed before it is.
      const sentinel = await register();
      const sr = await transition("sentinel claim", sentinel, 0, "claim", { notify: true }, true);
      const sentinelIntent = sr.pending_notification?.id as string;
      await sub.waitFor((m) => m.topic === "mam/events" && m.payload.includes(`"${sentinelIntent}"`), 60_000);
      await sub.waitFor((m) => m.topic === `mam/jobs/${sentinel}/events` && m.payload.includes(`"${sentinelIntent}"`), 60_000);

      const counts = await expectDeliveredOrSuperseded(sub, committed, supersededIn(feed));
      expect(counts.delivered + counts.superseded).toBe(committed.length);
      // On AWS nothing is left superseded: each stream record carries the intent its own write committed
      // (its NewImage), and the stream publisher publishes it from there, even when a newer write replaced
      // it in the table before it was handled (the back-to-back pair on job s).
      expect(counts.superseded).toBe(0);
      expect(path.failures).toEqual([]);
      // What the feed says of the back-to-back pair (a figure, not a pass condition: it depends on whether the
      // second write landed before the first intent was settled).
      const supersededOnS = (await supersededIn(feed)(s)).size;
      console.log(
        `publish count on AWS (DynamoDB Local, stream poller): ${committed.length} committed intents, ` +
          `${counts.delivered} delivered once per topic, ${counts.superseded} superseded; ${path.invocations.length} stream publisher calls; ` +
          `the feed records ${supersededOnS} of job s's two intents superseded`,
      );
    } finally {
      await sub.close();
      await path.close();
    }
  }, 180_000);
});
