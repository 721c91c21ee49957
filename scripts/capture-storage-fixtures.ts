/**
 * `node --import tsx scripts/capture-storage-fixtures.ts [OUT]` (default
 * fixtures/storage/v1/): the storage fixtures the upgrade tests (tests/upgrade/) open
 * with newer code.
 *
 * It drives ONE story of jobs through the real API (createApp over the real adapters:
 * the data dir's SQLite store and file report store; the DynamoDB store on DynamoDB
 * Local, with S3 on s3rver and IoT through the stand-in onto an aedes broker), on a
 * fixed clock, fixed ids and a fixed test signing key, and writes what the stores
 * then hold:
 *
 * - `data-dir/`: a `mam serve` data dir: `mam.db` (compacted with VACUUM INTO, no
 *   WAL), `reports/<job>/<attempt>/` (live report, manifest, `evidence/<sha256>`),
 *   `credentials.json` (the fixed test key: nothing secret);
 * - `dynamodb/items.json`: every item of the job table (DynamoDB JSON, sorted by key),
 *   the stream-fed change feed's rows included (the stream read once and handed to
 *   the real `writeStreamChanges`, as the feed writer function does);
 * - `dynamodb/s3/`: every object of the bucket as a file under its key, and
 *   `dynamodb/s3-objects.json` (key, content type, metadata);
 * - `jobs.json`: what the story left, job by job (status, completed_by, owed or
 *   quarantined intent, leases, usage), which the upgrade tests check after upgrading.
 *
 * It is run ON THE COMMIT WHOSE STORAGE IT CAPTURES (it uses only what that commit
 * has: the API, the adapters, the test peers), in a worktree of its own:
 *
 *   git worktree add /tmp/mam-v1 <commit> && cp scripts/capture-storage-fixtures.ts /tmp/mam-v1/scripts/
 *   (cd /tmp/mam-v1 && npm ci && MAM_DYNAMODB_PEER=dynamodb-local node --import tsx scripts/capture-storage-fixtures.ts "$PWD/fixtures/storage/v1")
 *
 * v1 was captured so from 55b396a (main before issue 18's storage versions). Capture
 * a version's fixture once, when a storage step lands (docs/adapters.md "Storage
 * versions and upgrades"); a released fixture is never re-captured: it is what users'
 * stores of that version hold. Needs Java 17 for DynamoDB Local (streams; dynalite
 * keeps none). Takes ~12 s (DynamoDB Local starts in 2-4 s of it).
 */
import { createHash } from "node:crypto";
import { cp, mkdir, readdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { type AttributeValue, ScanCommand } from "@aws-sdk/client-dynamodb";
import { DescribeStreamCommand, GetRecordsCommand, GetShardIteratorCommand } from "@aws-sdk/client-dynamodb-streams";
import { IoTDataPlaneClient } from "@aws-sdk/client-iot-data-plane";
import { CreateBucketCommand, GetObjectCommand, HeadObjectCommand, ListObjectsV2Command } from "@aws-sdk/client-s3";
import { createApp, createTokenService, SCOPES } from "@mam/api";
import { createJobTable, DynamoJobStore, IotPublisher, S3ReportStore } from "@mam/aws";
import { toLambdaRecord } from "@mam/aws/stream-records";
import { type Deps, type Ids, type JobStore, type Publisher, parseFlags, type ReportStore } from "@mam/core";
import { openDataDir, startEmbeddedBroker } from "@mam/local";
import Database from "better-sqlite3";
import { startAwsPeers } from "../tests/support/aws-backend.ts";
import { TestClock } from "../tests/support/clock.ts";

/** The fixed key the fixtures' tokens are signed with (a test key, not a secret; tests/api/harness.ts's). */
export const FIXTURE_SIGNING_KEY = "test-signing-key-0123456789abcdef-0123456789";
/** Where the story starts; the watcher fixture's scenario was collected just before. */
const START = "2026-11-20T10:10:00.000Z";
/** The fixed names on AWS: a manifest records `s3://<bucket>/<key>`, so a restore uses the same bucket. */
export const FIXTURE_TABLE = "mam-fixture";
export const FIXTURE_BUCKET = "mam-fixture";

const ROOT = path.resolve(import.meta.dirname, "..");
const SCENARIO = path.join(ROOT, "fixtures/watcher/finalized_candidate.json");

/** Ids in order: every run writes the same intent ids, event ids and lease ids. */
function countingIds(prefix: string): Ids {
  let n = 0;
  return { uuid: () => `${prefix}-0000-4000-8000-${String(++n).padStart(12, "0")}` };
}

interface Story {
  readonly jobs: JobStore;
  readonly reports: ReportStore;
  readonly publisher: Publisher;
  /** Topics the broker refuses while in the set. */
  readonly refused: Set<string>;
}

/** What the story left, per job: the upgrade tests' expectations. */
type Expectations = Record<string, Record<string, unknown>>;

async function runStory(s: Story, prefix: string): Promise<Expectations> {
  const clock = new TestClock(START, { tickMs: 1 });
  const deps: Deps = {
    jobs: s.jobs,
    reports: s.reports,
    publisher: s.publisher,
    clock,
    ids: countingIds(prefix),
    flags: parseFlags({ MAM_AUTO_COMPLETE: "1" }),
  };
  const tokens = createTokenService({ signingKey: FIXTURE_SIGNING_KEY, clock });
  const app = createApp({ deps, tokens, log: () => {}, feed: { streaming: false }, sweepGraceSeconds: 0 });
  const operator = tokens.mintOperator(SCOPES);
  const call = async (method: string, url: string, token: string, body?: unknown, headers: Record<string, string> = {}) => {
    const init: RequestInit = { method, headers: { authorization: `Bearer ${token}`, ...headers } };
    if (typeof body === "string") init.body = body;
    else if (body !== undefined) {
      init.body = JSON.stringify(body);
      (init.headers as Record<string, string>)["content-type"] = "application/json";
    }
    const res = await app.request(url, init);
    const text = await res.text();
    if (res.status >= 300) throw new Error(`${method} ${url}: ${res.status} ${text}`);
    return JSON.parse(text) as Record<string, unknown>;
  };
  const register = (jobId: string, extra: Record<string, unknown> = {}) =>
    call("POST", "/v1/jobs", operator, { job_id: jobId, prompt: `the story's ${jobId}`, agent: "codex", ...extra });
  const dispatch = async (jobId: string, body: Record<string, unknown> = {}) =>
    (
      await call("POST", `/v1/jobs/${jobId}/dispatches`, operator, {
        attempt_id: 1,
        agent_session_uuid: "0f0f0f0f-0000-4000-8000-000000000001",
        pane_process_generation: 1,
        ...body,
      })
    ).agent_token as string;
  const transition = (jobId: string, token: string, body: Record<string, unknown>) =>
    call("POST", `/v1/jobs/${jobId}/transitions`, token, body);
  const stage = (jobId: string, token: string, text: string) =>
    call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, token, text, { "content-type": "text/markdown" });
  const event = (jobId: string, token: string, body: Record<string, unknown>) => call("POST", `/v1/jobs/${jobId}/events`, token, body);

  // pending: registered, nothing more.
  await register("j-pending");
  // running: claimed by its agent, a progress event in its log (agent_usage charged),
  // a report upload declared and not sent (upload_in_flight, declared).
  {
    await register("j-running");
    const agent = await dispatch("j-running");
    await transition("j-running", agent, { action: "claim", expected_seq: 0, fields: { progress: { step: "tests" } } });
    await event("j-running", agent, { event: "progress", data: { note: "half way" } });
    const body = "# Half a report\n";
    await call("POST", "/v1/jobs/j-running/attempts/1/report/upload", agent, {
      sha256: createHash("sha256").update(body).digest("hex"),
      bytes: Buffer.byteLength(body),
    });
  }
  // finalizing: a staged report and a finalize in progress left held, as a process
  // that crashed mid-finalize leaves it (holdLease, the port's one writer of it).
  {
    await register("j-finalizing");
    const agent = await dispatch("j-finalizing");
    await transition("j-finalizing", agent, { action: "claim", expected_seq: 0 });
    await stage("j-finalizing", agent, "# Report being finalized\n");
    const now = clock.now();
    await s.jobs.holdLease(
      "j-finalizing",
      "finalize",
      {
        id: `${prefix}-finalize-lease`,
        attempt_id: 1,
        since: now.toISOString(),
        expires_at: new Date(now.getTime() + 60_000).toISOString(),
        actor: { type: "agent" },
      },
      { freeAt: now.toISOString() },
    );
  }
  // completed by its agent: expected artifacts, a report finalized with them, pinned evidence.
  {
    await register("j-agent-done", { expected_artifacts: ["commit"] });
    const agent = await dispatch("j-agent-done");
    await transition("j-agent-done", agent, { action: "claim", expected_seq: 0 });
    await stage("j-agent-done", agent, "# Report\n\nDone by the agent.\n");
    await event("j-agent-done", agent, {
      event: "completed",
      expected_seq: 1,
      finalize: { attempt_id: 1, side_effects: [{ kind: "commit", reference: "abc123" }] },
      data: { note: "done" },
    });
  }
  // completed by the gate, on the reference scenario.
  {
    await register("j-gate-done", { agent: "claude-code", auto_complete: true });
    await call("POST", "/v1/jobs/j-gate-done/dispatches", operator, {
      attempt_id: 1,
      agent_session_uuid: "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa",
      pane_process_generation: 3,
      pane_id: "%12",
      anchor: { started_at: "2026-11-20T09:59:00Z" },
    });
    await transition("j-gate-done", operator, { action: "claim", expected_seq: 0 });
    await stage("j-gate-done", operator, "# Report\n\nDone, as the gate saw it.\n");
    await call("POST", "/v1/jobs/j-gate-done/attempts/1/finalize", operator, { side_effects: [] });
    const scenario = (await import("node:fs/promises"))
      .readFile(SCENARIO, "utf8")
      .then((t) => JSON.parse(t.replaceAll('"job-4f2a"', '"j-gate-done"').replaceAll("reports/job-4f2a/", "reports/j-gate-done/")));
    const gate = await call("POST", "/v1/jobs/j-gate-done/evaluations", operator, { scenario: await scenario });
    if (gate.committed !== true) throw new Error(`the gate did not commit: ${JSON.stringify(gate)}`);
  }
  // error, reported by its agent; cancelled by the operator.
  {
    await register("j-error");
    const agent = await dispatch("j-error");
    await transition("j-error", agent, { action: "claim", expected_seq: 0 });
    await transition("j-error", agent, { action: "error", expected_seq: 1 });
    await register("j-cancelled");
    await transition("j-cancelled", operator, { action: "cancel", expected_seq: 0 });
  }
  s.refused.add("mam/jobs/j-quarantined/events");
  await register("j-quarantined");
  await transition("j-quarantined", operator, { action: "cancel", expected_seq: 0 });
  for (let i = 0; i < 6; i++) {
    clock.advance(3_600_000);
    await call("POST", "/v1/recovery-sweeps", operator);
  }
  s.refused.add("mam/jobs/j-owed/events");
  await register("j-owed");
  await transition("j-owed", operator, { action: "cancel", expected_seq: 0 });
  s.refused.clear();

  const expectations: Expectations = {};
  for (const jobId of [
    "j-pending",
    "j-running",
    "j-finalizing",
    "j-agent-done",
    "j-gate-done",
    "j-error",
    "j-cancelled",
    "j-quarantined",
    "j-owed",
  ]) {
    const r = (await s.jobs.get(jobId)) as unknown as Record<string, unknown>;
    const owed = r.pending_notification as Record<string, unknown> | undefined;
    expectations[jobId] = {
      status: r.status,
      transition_seq: r.transition_seq,
      evidence_seq: r.evidence_seq,
      ...(r.completed_by === undefined ? {} : { completed_by: r.completed_by }),
      ...(r.completed_evidence === undefined ? {} : { completed_evidence: r.completed_evidence }),
      ...(owed === undefined ? {} : { owed_intent_id: owed.id, quarantined: owed.quarantined_at !== undefined }),
      ...(r.agent_usage === undefined ? {} : { agent_usage: r.agent_usage }),
      ...(r.upload_in_flight === undefined ? {} : { upload_in_flight: r.upload_in_flight }),
      ...(r.finalize_in_progress === undefined ? {} : { finalize_in_progress: r.finalize_in_progress }),
    };
  }
  return expectations;
}

/** Every file under `dir`, relative, sorted. */
async function filesUnder(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) out.push(path.relative(dir, path.join(e.parentPath, e.name)));
  }
  return out.sort();
}

async function captureDataDir(out: string): Promise<Expectations> {
  const work = path.join(out, ".work-data-dir");
  await rm(work, { recursive: true, force: true });
  await mkdir(work, { recursive: true, mode: 0o700 });
  const store = openDataDir(work, { allowAbsolute: false });
  const refused = new Set<string>();
  const broker = await startEmbeddedBroker({
    port: 0,
    publisherCredentials: { username: "mam-service", password: "fixture-password" },
    refusePublish: (topic) => refused.has(topic),
  });
  let expectations: Expectations;
  try {
    expectations = await runStory(
      { jobs: store.jobs, reports: store.reports, publisher: broker.publisher({ timeoutMs: 5000 }), refused },
      "d",
    );
  } finally {
    await broker.close();
    store.close();
  }
  const target = path.join(out, "data-dir");
  await rm(target, { recursive: true, force: true });
  await mkdir(target, { recursive: true, mode: 0o700 });
  // One file, no WAL beside it, free pages dropped.
  const db = new Database(path.join(work, "mam.db"));
  db.exec(`VACUUM INTO '${path.join(target, "mam.db").replaceAll("'", "''")}'`);
  db.close();
  await cp(path.join(work, "reports"), path.join(target, "reports"), { recursive: true });
  const tokens = createTokenService({ signingKey: FIXTURE_SIGNING_KEY, clock: new TestClock(START) });
  await writeFile(
    path.join(target, "credentials.json"),
    `${JSON.stringify(
      {
        operator_token: tokens.mintOperator(SCOPES),
        signing_key: FIXTURE_SIGNING_KEY,
        mqtt: { username: "mam-service", password: "fixture-password" },
      },
      null,
      2,
    )}\n`,
    { mode: 0o600 },
  );
  await rm(work, { recursive: true, force: true });
  return expectations;
}

async function captureTable(out: string): Promise<Expectations> {
  const peers = await startAwsPeers();
  if (peers.dynamo.streams === undefined) {
    await peers.close();
    throw new Error("the table's feed is read from its stream: run with MAM_DYNAMODB_PEER=dynamodb-local (dynalite keeps no stream)");
  }
  try {
    // As tests/support/aws-backend.ts composes them, under fixed names (a manifest names its bucket).
    const refused = new Set<string>();
    peers.refusing.add(refused);
    await createJobTable(peers.dynamo.client, FIXTURE_TABLE);
    await peers.s3.client.send(new CreateBucketCommand({ Bucket: FIXTURE_BUCKET }));
    const iot = new IoTDataPlaneClient({
      endpoint: peers.standIn.endpoint,
      region: "us-east-1",
      credentials: { accessKeyId: "local", secretAccessKey: "local" },
    });
    const unguardedJobs = new DynamoJobStore({ client: peers.dynamo.client, tableName: FIXTURE_TABLE });
    const ports = {
      jobs: unguardedJobs,
      unguardedJobs,
      reports: new S3ReportStore({ client: peers.s3.client, bucket: FIXTURE_BUCKET }),
      publisher: new IotPublisher({ client: iot }),
      close: async () => iot.destroy(),
    };
    const expectations = await runStory({ jobs: ports.jobs, reports: ports.reports, publisher: ports.publisher, refused }, "a");
    // The stream, read once from its start, into the feed writer's own method.
    const streams = peers.dynamo.streams;
    {
      const arn = await latestStreamArn(peers, FIXTURE_TABLE);
      const { StreamDescription } = await streams.send(new DescribeStreamCommand({ StreamArn: arn }));
      for (const shard of StreamDescription?.Shards ?? []) {
        let iterator = (
          await streams.send(new GetShardIteratorCommand({ StreamArn: arn, ShardId: shard.ShardId, ShardIteratorType: "TRIM_HORIZON" }))
        ).ShardIterator;
        while (iterator !== undefined) {
          const page = await streams.send(new GetRecordsCommand({ ShardIterator: iterator }));
          for (const record of page.Records ?? []) await ports.unguardedJobs.writeStreamChanges(toLambdaRecord(record, arn));
          if ((page.Records ?? []).length === 0) break;
          iterator = page.NextShardIterator;
        }
      }
    }
    const items: Record<string, AttributeValue>[] = [];
    let start: Record<string, AttributeValue> | undefined;
    do {
      const page = await peers.dynamo.client.send(new ScanCommand({ TableName: FIXTURE_TABLE, ExclusiveStartKey: start }));
      items.push(...(page.Items ?? []));
      start = page.LastEvaluatedKey;
    } while (start !== undefined);
    const key = (i: Record<string, AttributeValue>) => `${i.pk?.S}\u0000${i.sk?.S}`;
    items.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
    const target = path.join(out, "dynamodb");
    await rm(target, { recursive: true, force: true });
    await mkdir(path.join(target, "s3"), { recursive: true });
    // One item a line: small, and a diff of two captures reads item by item.
    await writeFile(path.join(target, "items.json"), `[\n${items.map((i) => JSON.stringify(i)).join(",\n")}\n]\n`);
    const objects: { key: string; content_type?: string; metadata: Record<string, string> }[] = [];
    const listed = await peers.s3.client.send(new ListObjectsV2Command({ Bucket: FIXTURE_BUCKET }));
    for (const o of listed.Contents ?? []) {
      const k = o.Key as string;
      const head = await peers.s3.client.send(new HeadObjectCommand({ Bucket: FIXTURE_BUCKET, Key: k }));
      const body = await (
        await peers.s3.client.send(new GetObjectCommand({ Bucket: FIXTURE_BUCKET, Key: k }))
      ).Body?.transformToByteArray();
      const file = path.join(target, "s3", k);
      await mkdir(path.dirname(file), { recursive: true });
      await writeFile(file, body ?? new Uint8Array());
      objects.push({
        key: k,
        ...(head.ContentType === undefined ? {} : { content_type: head.ContentType }),
        metadata: head.Metadata ?? {},
      });
    }
    await writeFile(path.join(target, "s3-objects.json"), `${JSON.stringify(objects, null, 1)}\n`);
    await ports.close();
    return expectations;
  } finally {
    await peers.close();
  }
}

async function latestStreamArn(peers: Awaited<ReturnType<typeof startAwsPeers>>, table: string): Promise<string> {
  const { DescribeTableCommand } = await import("@aws-sdk/client-dynamodb");
  const d = await peers.dynamo.client.send(new DescribeTableCommand({ TableName: table }));
  const arn = d.Table?.LatestStreamArn;
  if (arn === undefined) throw new Error(`table ${table} has no stream`);
  return arn;
}

async function main(): Promise<void> {
  const out = path.resolve(process.argv[2] ?? path.join(ROOT, "fixtures/storage/v1"));
  await mkdir(out, { recursive: true });
  const started = Date.now();
  const dataDir = await captureDataDir(out);
  const table = await captureTable(out);
  await writeFile(path.join(out, "jobs.json"), `${JSON.stringify({ "data-dir": dataDir, dynamodb: table }, null, 2)}\n`);
  const files = [...(await filesUnder(path.join(out, "data-dir"))), ...(await filesUnder(path.join(out, "dynamodb")))];
  process.stdout.write(`captured ${files.length} files into ${out} in ${Date.now() - started} ms\n`);
}

await main();
