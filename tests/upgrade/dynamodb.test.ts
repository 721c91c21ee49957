/**
 * Upgrading the DynamoDB job table: the v1 fixture (fixtures/storage/v1/dynamodb,
 * captured from main before storage versions, with its bucket's objects) restored on
 * the test's peers (dynalite in `npm test`, DynamoDB Local in the engine tier) and
 * opened by this code's functions. The http function runs the cheap step where it
 * starts; every completed job re-verifies against its pinned evidence; the recovery
 * sweep function sends the owed intent to a real MQTT subscriber (through IoT's
 * publish API, the stand-in) and leaves the quarantined one; listings, the stream-fed
 * feed's rows, leases and usage read as they were written. A step is recorded only
 * after it completed, so one that crashed runs again; a table behind a step that is
 * not cheap, or newer than this code, is refused, naming the command or both versions.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import { CreateTableCommand, DescribeTableCommand, PutItemCommand, ScanCommand } from "@aws-sdk/client-dynamodb";
import { createTokenService, SCOPES } from "@mam/api";
import {
  COUNTED,
  DynamoJobStore,
  JOB_TABLE_DEFINITION,
  JOB_TABLE_INDEX,
  markJobItemsCounted,
  migrateJobTable,
  readTableVersion,
  TABLE_SCHEMA_VERSION,
  TABLE_STEPS,
  TABLE_VERSION_KEY,
  type TableTarget,
} from "@mam/aws";
import { runCli } from "@mam/cli";
import { type MigrationStep, systemClock } from "@mam/core";
import type { LambdaEvent } from "hono/aws-lambda";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { composeHttpApp, createHttpHandler, createRecoverySweepHandler } from "../../functions/compose.ts";
import { CREDENTIALS, lambdaContext, lambdaFixture, memoryLog, type Peers, startPeers, TRANSACTIONS } from "../functions/support.ts";
import { captureIo } from "../support/cli-io.ts";
import { StreamPump } from "../support/stream-pump.ts";
import { subscribe } from "../support/subscriber.ts";
import { completedJobs, expectations, FIXTURE_BUCKET, FIXTURE_SIGNING_KEY, fixtureDir, restoreBucket, restoreTable } from "./fixtures.ts";

const V1 = expectations(1, "dynamodb");
const operator = createTokenService({ signingKey: FIXTURE_SIGNING_KEY, clock: systemClock }).mintOperator(SCOPES);
const v1FeedRows = (JSON.parse(readFileSync(path.join(fixtureDir(1), "dynamodb", "items.json"), "utf8")) as { pk: { S: string } }[]).filter(
  (i) => /^FEED#/.test(i.pk.S),
).length;

let peers: Peers;
beforeAll(async () => {
  peers = await startPeers();
  await restoreBucket(peers.s3.client, 1);
});
afterAll(async () => {
  await peers?.close();
});

describe(`upgrading a v1 job table (fixtures/storage/v1/dynamodb) on ${process.env.MAM_DYNAMODB_PEER ?? "dynalite"}`, () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    vi.unstubAllEnvs();
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });
  const restored = async (): Promise<TableTarget & { env: Record<string, string> }> => {
    const tableName = `mam-upgrade-${randomUUID().slice(0, 8)}`;
    await restoreTable(peers.dynamo.client, tableName, 1);
    return {
      client: peers.dynamo.client,
      tableName,
      env: peers.env(tableName, { MAM_BUCKET_NAME: FIXTURE_BUCKET, MAM_TOKEN_SIGNING_KEY: FIXTURE_SIGNING_KEY }),
    };
  };

  it("the functions refuse it until `mam migrate` (step 4, the counts, scans); then every job reads as it was: completions re-verify on their pinned evidence, the sweep sends the owed intent to a subscriber and keeps the quarantined one, listings, feed, leases and usage; every job is counted once", async () => {
    const table = await restored();
    expect(await readTableVersion(table)).toBe(1);
    const app = await composeHttpApp(table.env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: () => undefined });
    // Composing contacts nothing; the first request that uses the table checks its version.
    expect(await readTableVersion(table)).toBe(1);
    const get = async (url: string) => {
      const res = await app.request(url, { headers: { authorization: `Bearer ${operator}` } });
      expect(res.status, url).toBe(200);
      // biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field in assertions
      return (await res.json()) as Record<string, any>;
    };

    expect(completedJobs(V1).sort()).toEqual(["j-agent-done", "j-gate-done"]);
    // Behind step 4 (a Scan), a function runs no step and refuses, naming the command.
    const refused = await app.request("/v1/jobs/j-pending", { headers: { authorization: `Bearer ${operator}` } });
    expect(refused.status).toBe(500);
    expect(await refused.json()).toMatchObject({
      code: "store.version",
      detail: expect.stringContaining(`mam migrate --table ${table.tableName}`),
    });
    expect(await readTableVersion(table)).toBe(1);
    vi.stubEnv("AWS_ACCESS_KEY_ID", CREDENTIALS.accessKeyId);
    vi.stubEnv("AWS_SECRET_ACCESS_KEY", CREDENTIALS.secretAccessKey);
    const io = captureIo({});
    const migrated = await runCli(
      ["migrate", "--table", table.tableName, "--region", "us-east-1", "--endpoint", peers.dynamo.endpoint, "--json"],
      io,
    );
    expect(migrated, io.err.join("")).toBe(0);
    expect(await readTableVersion(table)).toBe(TABLE_SCHEMA_VERSION);
    await get("/v1/jobs/j-pending");
    // Step 4 marked every v1 job item counted, once; the feed writer counts each from its mark's stream record.
    const jobItems =
      (
        await peers.dynamo.client.send(
          new ScanCommand({ TableName: table.tableName, FilterExpression: "sk = :j", ExpressionAttributeValues: { ":j": { S: "JOB" } } }),
        )
      ).Items ?? [];
    expect(jobItems).toHaveLength(Object.keys(V1).length);
    for (const item of jobItems) expect(item[COUNTED], item.pk?.S).toEqual({ BOOL: true });
    expect(await markJobItemsCounted({ ...table, run: "all" })).toBe(0);
    const counts = await get("/v1/job-counts");
    expect(counts.consistency).toBe("eventual");
    if (peers.dynamo.streams !== undefined) {
      // DynamoDB Local: the stream (the restore's writes, the marks) through the feed writer.
      const store = new DynamoJobStore({ client: peers.dynamo.client, tableName: table.tableName });
      await new StreamPump({ client: peers.dynamo.client, streams: peers.dynamo.streams }, table.tableName, (r) =>
        store.writeStreamChanges(r),
      ).pump();
      const want = { pending: 0, running: 0, completed: 0, error: 0, cancelled: 0 } as Record<string, number>;
      for (const e of Object.values(V1)) want[e.status] = (want[e.status] ?? 0) + 1;
      expect((await get("/v1/job-counts")).counts).toEqual(want);
    } else {
      // dynalite keeps no stream: no feed writer runs, nothing is counted.
      expect(counts.counts).toEqual({ pending: 0, running: 0, completed: 0, error: 0, cancelled: 0 });
    }
    for (const jobId of completedJobs(V1)) {
      const v = await get(`/v1/jobs/${jobId}/attempts/1/verification`);
      expect(v, jobId).toMatchObject({ ok: true, matches_completion: true, pinned: { ok: true } });
      const record = await get(`/v1/jobs/${jobId}`);
      expect(record.completed_evidence, jobId).toEqual(V1[jobId]?.completed_evidence);
      expect(record.completed_by).toBe(V1[jobId]?.completed_by);
    }
    for (const [jobId, e] of Object.entries(V1)) {
      const r = await get(`/v1/jobs/${jobId}`);
      expect(r, jobId).toMatchObject({ status: e.status, transition_seq: e.transition_seq, evidence_seq: e.evidence_seq });
      expect(r.agent_usage, jobId).toEqual(e.agent_usage);
      expect(r.upload_in_flight, jobId).toEqual(e.upload_in_flight);
      expect(r.finalize_in_progress, jobId).toEqual(e.finalize_in_progress);
    }
    for (const status of ["pending", "running", "completed", "error", "cancelled"]) {
      const listed = ((await get(`/v1/jobs?status=${status}`)).items as { job_id: string }[]).map((j) => j.job_id).sort();
      const want = Object.entries(V1)
        .filter(([, e]) => e.status === status)
        .map(([id]) => id)
        .sort();
      expect(listed, status).toEqual(want);
    }
    // The stream-fed feed's rows, as the feed writer wrote them under v1.
    expect(v1FeedRows).toBeGreaterThan(0);
    const feed = await get("/v1/events?limit=500");
    expect(feed.items.length).toBe(v1FeedRows);
    expect(new Set(feed.items.map((r: { job_id: string }) => r.job_id))).toEqual(new Set(Object.keys(V1)));

    // The recovery sweep function, on the upgraded table.
    const sub = await subscribe(peers.broker.url, "mam/jobs/+/events");
    cleanup.push(() => sub.close());
    const sweep = createRecoverySweepHandler(table.env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: () => undefined });
    await sweep(lambdaFixture("eventbridge-scheduled.json"), lambdaContext("mam-dev-recoverySweep"));
    const owed = V1["j-owed"]?.owed_intent_id;
    const sent = await sub.waitFor((m) => m.topic === "mam/jobs/j-owed/events", 10_000);
    expect(JSON.parse(sent.payload)).toMatchObject({ event: "cancelled", job_id: "j-owed", data: { notification_intent: { id: owed } } });
    expect((await get("/v1/jobs/j-owed")).pending_notification).toBeUndefined();
    expect((await get("/v1/jobs/j-quarantined")).pending_notification).toMatchObject({
      id: V1["j-quarantined"]?.owed_intent_id,
      quarantined_at: expect.any(String),
    });
    expect(sub.received.filter((m) => m.topic === "mam/jobs/j-quarantined/events")).toEqual([]);
  });

  it("running the migration again is a no-op; running a step's up twice changes nothing", async () => {
    const table = await restored();
    const started = performance.now();
    expect(await migrateJobTable(table, { run: "all" })).toMatchObject({
      from: 1,
      to: TABLE_SCHEMA_VERSION,
      applied: [{ version: 2 }, { version: 3 }, { version: 4 }],
    });
    const ms = performance.now() - started;
    expect(await migrateJobTable(table, { run: "all" })).toEqual({ from: TABLE_SCHEMA_VERSION, to: TABLE_SCHEMA_VERSION, applied: [] });
    for (const step of TABLE_STEPS) {
      await step.up(table);
      await step.up(table);
    }
    expect(await readTableVersion(table)).toBe(TABLE_SCHEMA_VERSION);
    expect(ms).toBeLessThan(5_000);
  });

  it("a step whose up crashed before its version was recorded runs again on the next start; the version never moves past a step that did not complete", async () => {
    const table = await restored();
    let runs = 0;
    const crashing: MigrationStep<TableTarget>[] = [
      {
        ...TABLE_STEPS[0]!,
        up: async (t) => {
          runs++;
          await TABLE_STEPS[0]?.up(t);
          throw new Error("killed after its up, before its version was recorded");
        },
      },
    ];
    await expect(migrateJobTable(table, { run: "all", steps: crashing })).rejects.toThrow("killed after its up");
    expect(await readTableVersion(table)).toBe(1);
    const counted: MigrationStep<TableTarget>[] = [
      {
        ...TABLE_STEPS[0]!,
        up: async (t) => {
          runs++;
          await TABLE_STEPS[0]?.up(t);
        },
      },
    ];
    expect(await migrateJobTable(table, { run: "cheap", steps: counted })).toMatchObject({ from: 1, to: 2 });
    expect(runs).toBe(2);
    expect(await readTableVersion(table)).toBe(2);
    // Stopped between two steps: the next run starts at the second.
    const later = TABLE_SCHEMA_VERSION + 1;
    const next: MigrationStep<TableTarget>[] = [...TABLE_STEPS, { version: later, describe: "a later step", cheap: true, up: () => {} }];
    const stopped = { run: "all" as const, steps: [...next, { version: later + 1, describe: "after it", up: () => {} }] };
    await expect(
      migrateJobTable(table, {
        ...stopped,
        onStep: (v) => {
          if (v === later) throw new Error("stopped between steps");
        },
      }),
    ).rejects.toThrow("stopped between steps");
    expect(await readTableVersion(table)).toBe(later);
    expect(await migrateJobTable(table, stopped)).toMatchObject({ from: later, to: later + 1, applied: [{ version: later + 1 }] });
  });

  it("behind a step that is not cheap, a function refuses to start naming `mam migrate --table <name>`, which runs it", async () => {
    const table = await restored();
    const costly: MigrationStep<TableTarget>[] = [{ ...TABLE_STEPS[0]!, cheap: false }];
    await expect(migrateJobTable(table, { run: "cheap", steps: costly })).rejects.toMatchObject({
      code: "store.version",
      message: expect.stringContaining(`run \`mam migrate --table ${table.tableName}\``),
    });
    expect(await readTableVersion(table)).toBe(1);
    vi.stubEnv("AWS_ACCESS_KEY_ID", CREDENTIALS.accessKeyId);
    vi.stubEnv("AWS_SECRET_ACCESS_KEY", CREDENTIALS.secretAccessKey);
    const io = captureIo({});
    const code = await runCli(
      ["migrate", "--table", table.tableName, "--region", "us-east-1", "--endpoint", peers.dynamo.endpoint, "--json"],
      io,
    );
    expect(code, io.err.join("")).toBe(0);
    expect(JSON.parse(io.out.join(""))).toMatchObject({ store: `table ${table.tableName}`, from: 1, to: TABLE_SCHEMA_VERSION });
    expect(await readTableVersion(table)).toBe(TABLE_SCHEMA_VERSION);
  });

  it("a table made before the attention index (issue 20): a function refuses to start naming `mam migrate --table <name>`, which adds it and waits for it (DynamoDB Local; dynalite cannot add an index to a table, noIndexCreation, so there mam migrate exits 1 naming it)", async () => {
    const tableName = `mam-upgrade-${randomUUID().slice(0, 8)}`;
    const def = JOB_TABLE_DEFINITION;
    const without = def.GlobalSecondaryIndexes.filter((g) => g.IndexName !== JOB_TABLE_INDEX.attention);
    await peers.dynamo.client.send(
      new CreateTableCommand({
        TableName: tableName,
        BillingMode: def.BillingMode,
        AttributeDefinitions: def.AttributeDefinitions.filter((a) => !a.AttributeName.startsWith("attn_")).map((a) => ({ ...a })),
        KeySchema: def.KeySchema.map((k) => ({ ...k })),
        GlobalSecondaryIndexes: without.map((g) => ({
          IndexName: g.IndexName,
          KeySchema: g.KeySchema.map((k) => ({ ...k })),
          Projection: { ...g.Projection },
        })),
        StreamSpecification: { StreamEnabled: true, StreamViewType: def.StreamSpecification.StreamViewType },
      }),
    );
    const table = { client: peers.dynamo.client, tableName };
    // At version 2, the layout before the index.
    await peers.dynamo.client.send(
      new PutItemCommand({
        TableName: tableName,
        Item: { pk: { S: TABLE_VERSION_KEY.pk }, sk: { S: TABLE_VERSION_KEY.sk }, version: { N: "2" } },
      }),
    );
    const env = peers.env(tableName, { MAM_BUCKET_NAME: FIXTURE_BUCKET, MAM_TOKEN_SIGNING_KEY: FIXTURE_SIGNING_KEY });
    const app = await composeHttpApp(env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: () => undefined });
    const refused = await app.request("/v1/jobs", { headers: { authorization: `Bearer ${operator}` } });
    expect(refused.status).toBe(500);
    expect(await refused.json()).toMatchObject({
      code: "store.version",
      detail: expect.stringContaining(`mam migrate --table ${tableName}`),
    });
    expect(await readTableVersion(table)).toBe(2);
    vi.stubEnv("AWS_ACCESS_KEY_ID", CREDENTIALS.accessKeyId);
    vi.stubEnv("AWS_SECRET_ACCESS_KEY", CREDENTIALS.secretAccessKey);
    const io = captureIo({});
    const code = await runCli(
      ["migrate", "--table", tableName, "--region", "us-east-1", "--endpoint", peers.dynamo.endpoint, "--json"],
      io,
    );
    const indexes = async () =>
      ((await peers.dynamo.client.send(new DescribeTableCommand({ TableName: tableName }))).Table?.GlobalSecondaryIndexes ?? []).map(
        (g) => g.IndexName,
      );
    if (peers.dynamo.gaps.noIndexCreation) {
      expect(code).toBe(1);
      expect(io.err.join("")).toMatch(/add index attention to table/);
      expect(await readTableVersion(table)).toBe(2);
      return;
    }
    expect(code, io.err.join("")).toBe(0);
    expect(await indexes()).toContain(JOB_TABLE_INDEX.attention);
    expect(await readTableVersion(table)).toBe(TABLE_SCHEMA_VERSION);
    const listed = await app.request("/v1/jobs", { headers: { authorization: `Bearer ${operator}` } });
    expect(listed.status).toBe(200);
  });

  it("a table stamped with a future version is refused, naming both versions: the http function answers 500 store.version (liveness still 200), the sweep throws, mam migrate exits 1", async () => {
    const table = await restored();
    await peers.dynamo.client.send(
      new PutItemCommand({
        TableName: table.tableName,
        Item: { pk: { S: TABLE_VERSION_KEY.pk }, sk: { S: TABLE_VERSION_KEY.sk }, version: { N: "99" } },
      }),
    );
    const newer = new RegExp(
      `table mam-upgrade-\\w+ is at schema version 99, newer than this mam knows \\(version ${TABLE_SCHEMA_VERSION}\\)`,
    );
    // Composing contacts nothing: liveness answers; the first request that needs the table is refused.
    const log = memoryLog();
    const http = createHttpHandler(table.env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: log.sink });
    const event = lambdaFixture<Extract<LambdaEvent, { rawPath: string }>>("http-api-v2-get-job.json");
    const health = await http({ ...event, rawPath: "/healthz", headers: {} }, lambdaContext("mam-dev-http"));
    expect(health.statusCode).toBe(200);
    const res = await http({ ...event, headers: { ...event.headers, authorization: `Bearer ${operator}` } }, lambdaContext("mam-dev-http"));
    expect(res.statusCode).toBe(500);
    expect(JSON.parse(res.body)).toMatchObject({ code: "store.version" });
    const app = await composeHttpApp(table.env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: () => undefined });
    const answer = await app.request("/v1/jobs/j-owed", { headers: { authorization: `Bearer ${operator}` } });
    expect(answer.status).toBe(500);
    const problem = (await answer.json()) as Record<string, unknown>;
    expect(problem).toMatchObject({ code: "store.version", detail: expect.stringMatching(newer) });
    const sweep = createRecoverySweepHandler(table.env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: () => undefined });
    await expect(sweep(lambdaFixture("eventbridge-scheduled.json"), lambdaContext("mam-dev-recoverySweep"))).rejects.toMatchObject({
      code: "store.version",
    });
    vi.stubEnv("AWS_ACCESS_KEY_ID", CREDENTIALS.accessKeyId);
    vi.stubEnv("AWS_SECRET_ACCESS_KEY", CREDENTIALS.secretAccessKey);
    const io = captureIo({});
    expect(await runCli(["migrate", "--table", table.tableName, "--region", "us-east-1", "--endpoint", peers.dynamo.endpoint], io)).toBe(1);
    expect(io.err.join("")).toMatch(newer);
    expect(await readTableVersion(table)).toBe(99);
  });
});
