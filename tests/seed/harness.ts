/**
 * The seed suite's backends. Every seed test is written once, against `SeedBackend`,
 * and runs on each entry of `BACKENDS` (see `describeBackends`). Adding a backend
 * (DynamoDB + S3 + IoT Core) is adding one entry: a `make()` that starts or connects
 * to its stores and broker and answers the questions below.
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { type AttributeValue, DynamoDBClient, PutItemCommand, ScanCommand, type ScanCommandOutput } from "@aws-sdk/client-dynamodb";
import { IoTDataPlaneClient } from "@aws-sdk/client-iot-data-plane";
import { GetObjectCommand, ListObjectsV2Command, type ListObjectsV2CommandOutput, type S3Client } from "@aws-sdk/client-s3";
import { marshall, unmarshall } from "@aws-sdk/util-dynamodb";
import { DynamoJobStore, IotPublisher, jobItem } from "@mam/aws";
import { type Deps, type Flags, type Publisher, parseFlags, randomIds } from "@mam/core";
import { type EmbeddedBroker, FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import Database from "better-sqlite3";
import { afterAll, afterEach, beforeEach, describe } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { startIotStandIn } from "../support/aws-peers.ts";
import { tickingClock } from "../support/clock.ts";
import { deadPort } from "../support/dead-port.ts";
import { type Subscription, subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";
import { runsBackend } from "../support/test-env.ts";

export interface SeedBackend {
  readonly name: string;
  /**
   * A ports bundle over this backend's stores (the same stores on every call) with
   * the given flags. `publisher` defaults to the backend's live publisher; `clock`
   * to a clock that starts at a fixed instant and ticks 1 ms per reading.
   */
  deps(flags?: Flags, override?: Partial<Pick<Deps, "publisher" | "clock">>): Deps;
  /**
   * Write `record` as the job's row or item straight into the storage, around the
   * store (whose base checks every record it is handed): to plant what no caller of
   * the port could write, such as a legacy or corrupt record.
   */
  plantJob(record: Record<string, unknown> & { job_id: string }): Promise<void>;
  /** A digest of everything the stores hold: every row, every object, every byte. */
  fingerprint(): Promise<string>;
  /** Is this `ReportStore.describe` result an absolute address (a file path, an `s3://` or `mam-file:///` URI)? */
  isAbsoluteAddress(address: string): boolean;
  /** Subscribe (filters allowed) on the broker the live publisher publishes to; resolves once subscribed. */
  subscribe(topicFilter: string): Promise<Subscription>;
  /** A publisher of the backend's kind whose publishes the broker receives and refuses. */
  refusingPublisher(): Promise<Publisher>;
  /** A publisher of the backend's kind aimed at a broker nobody answers on. */
  unreachablePublisher(): Promise<Publisher>;
  /**
   * Topics the live broker refuses a publish to, whoever sends it, while they are in
   * the set (the embedded broker's `refusePublish`; behind the IoT stand-in, a 403).
   */
  readonly refusedTopics: Set<string>;
  /** Drop every client and open new ones over the same storage: a process restart. */
  restart(): Promise<void>;
  close(): Promise<void>;
}

export interface BackendEntry {
  readonly name: string;
  make(): Promise<SeedBackend>;
}

/** Every fixed time in the seed suite comes from here; the scenario's timeline is 2026-11-20T10:00-10:07. */
export const CLOCK_START = "2026-11-20T10:10:00.000Z";

/**
 * Every row of every table of a SQLite file, read through a second, read-only connection (WAL content included).
 * `withoutJobFields`: fields of each job record (the `jobs` table's `doc`) left out of the digest.
 */
export function sqliteDigest(file: string, withoutJobFields: readonly string[] = []): string {
  const db = new Database(file, { readonly: true, fileMustExist: true });
  try {
    const hash = createHash("sha256");
    const objects = db.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").all() as {
      type: string;
      name: string;
      sql: string | null;
    }[];
    for (const o of objects) {
      hash.update(JSON.stringify(["object", o.type, o.name, o.sql]));
      if (o.type !== "table" || o.name.startsWith("sqlite_")) continue;
      const table = `"${o.name.replaceAll('"', '""')}"`;
      const columns = db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[];
      const order = columns.map((_, i) => String(i + 1)).join(", ");
      const rows = db.prepare(`SELECT * FROM ${table} ORDER BY ${order}`).raw().all();
      hash.update(JSON.stringify(["table", o.name, columns.map((c) => c.name)]));
      const doc = o.name === "jobs" && withoutJobFields.length > 0 ? columns.findIndex((c) => c.name === "doc") : -1;
      for (const row of rows) hash.update(JSON.stringify(doc < 0 ? row : withoutFields(row as unknown[], doc, withoutJobFields)));
    }
    return hash.digest("hex");
  } finally {
    db.close();
  }
}

/**
 * Every directory and every file under `root` (hidden ones too), by relative path:
 * `dir` for a directory, the sha256 and length of its bytes for a file.
 */
export async function treeObjects(root: string): Promise<Map<string, string>> {
  const objects = new Map<string, string>();
  const walk = async (dir: string): Promise<void> => {
    const entries = (await readdir(dir, { withFileTypes: true })).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const full = path.join(dir, e.name);
      const rel = path.relative(root, full);
      if (e.isDirectory()) {
        objects.set(rel, "dir");
        await walk(full);
      } else {
        const bytes = await readFile(full);
        objects.set(rel, `${createHash("sha256").update(bytes).digest("hex")}:${bytes.byteLength}`);
      }
    }
  };
  await walk(root);
  return objects;
}

/** A digest of `treeObjects(root)`: every directory and every byte of every file. */
export async function treeDigest(root: string): Promise<string> {
  return digestOf(await treeObjects(root));
}

/** One digest of a snapshot's entries, in key order. */
export function digestOf(objects: ReadonlyMap<string, string>): string {
  const hash = createHash("sha256");
  for (const key of [...objects.keys()].sort()) hash.update(JSON.stringify([key, objects.get(key)]));
  return hash.digest("hex");
}

/** SQLite over a temp file, files under a temp dir, MQTT to an aedes broker on a free loopback port. */
async function makeEmbedded(): Promise<SeedBackend> {
  const dir = (await tempDir("seed")).dir;
  const dbFile = path.join(dir, "mam.db");
  const reportRoot = path.join(dir, "reports-root");
  const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  const refusedTopics = new Set<string>();
  const broker = await startEmbeddedBroker({
    port: 0,
    publisherCredentials: credentials,
    refusePublish: (topic) => refusedTopics.has(topic),
  });
  const extraBrokers: EmbeddedBroker[] = [];
  const extraPublishers: Publisher[] = [];
  const subscriptions: Subscription[] = [];
  const clock = tickingClock(CLOCK_START);

  // As `mam serve` composes its store: core's guard, the record cache, SQLite.
  const open = () => ({
    ...openEmbeddedJobStore(dbFile),
    reports: new FileReportStore(reportRoot),
    publisher: new MqttPublisher({ url: broker.url, ...credentials, connectTimeoutMs: 3000, publishTimeoutMs: 3000 }),
  });
  let live = open();
  // The report root exists from the start, so a refusal that created it would be seen as a write.
  await mkdir(reportRoot, { recursive: true });

  const closeClients = async (): Promise<void> => {
    await live.publisher.close();
    await live.close();
  };

  return {
    name: "embedded",
    refusedTopics,
    async plantJob(record) {
      const db = new Database(dbFile);
      try {
        // As an older version may have left it: the table's json_valid CHECK not asked, the owed columns set.
        db.pragma("ignore_check_constraints = ON");
        const owed = record.pending_notification as { id: string; created_at: string } | undefined;
        db.prepare(
          "INSERT OR REPLACE INTO jobs (job_id, status, transition_seq, created_at, updated_at, owed_intent_id, owed_at, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ).run(
          record.job_id,
          String(record.status),
          Number(record.transition_seq),
          String(record.created_at),
          String(record.updated_at),
          owed?.id ?? null,
          owed?.created_at ?? null,
          JSON.stringify(record),
        );
      } finally {
        db.close();
      }
    },
    deps(flags = parseFlags({}), override = {}) {
      return {
        jobs: live.jobs,
        reports: live.reports,
        publisher: override.publisher ?? live.publisher,
        clock: override.clock ?? clock,
        ids: randomIds,
        flags,
      };
    },
    async fingerprint() {
      return `${sqliteDigest(dbFile)}:${await treeDigest(reportRoot)}`;
    },
    // The service's own tree is named in the store's namespace; the agent's own tree (the CLI) by its path.
    isAbsoluteAddress: (address) => /^mam-file:\/\/\/[^/]/.test(address) || path.isAbsolute(address),
    async subscribe(topicFilter) {
      const sub = await subscribe(broker.url, topicFilter);
      subscriptions.push(sub);
      return sub;
    },
    async refusingPublisher() {
      const refusing = await startEmbeddedBroker({ port: 0, publisherCredentials: credentials, refusePublish: () => true });
      extraBrokers.push(refusing);
      const p = new MqttPublisher({ url: refusing.url, ...credentials, connectTimeoutMs: 3000, publishTimeoutMs: 3000 });
      extraPublishers.push(p);
      return p;
    },
    async unreachablePublisher() {
      const p = new MqttPublisher({ url: `mqtt://127.0.0.1:${await deadPort()}`, connectTimeoutMs: 2000, publishTimeoutMs: 2000 });
      extraPublishers.push(p);
      return p;
    },
    async restart() {
      await closeClients();
      live = open();
    },
    async close() {
      for (const s of subscriptions.splice(0)) await s.close();
      for (const p of extraPublishers.splice(0)) await p.close?.();
      await closeClients();
      for (const b of extraBrokers.splice(0)) await b.close();
      await broker.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** A row whose JSON column `at` has `fields` removed. */
function withoutFields(row: readonly unknown[], at: number, fields: readonly string[]): unknown[] {
  const doc = JSON.parse(String(row[at])) as Record<string, unknown>;
  for (const f of fields) delete doc[f];
  return row.map((v, i) => (i === at ? canonical(doc) : v));
}

/** Each job's `field` (JSON, by job id) in a SQLite file, for what a digest without it left out. */
export function sqliteJobField(file: string, field: string): Map<string, string> {
  const db = new Database(file, { readonly: true, fileMustExist: true });
  try {
    const rows = db.prepare("SELECT job_id, json_extract(doc, '$.' || ?) AS v FROM jobs").all(field) as { job_id: string; v: unknown }[];
    return new Map(rows.map((r) => [r.job_id, JSON.stringify(r.v ?? null)]));
  } finally {
    db.close();
  }
}

/** Canonical JSON (sorted keys), so a digest does not depend on attribute order. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    if (value instanceof Uint8Array) return JSON.stringify(Buffer.from(value).toString("base64"));
    const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/**
 * Every item of a DynamoDB table (a consistent Scan), as one digest that does not depend on the Scan's order.
 * `withoutJobFields`: attributes of each job item (`sk = JOB`) left out of the digest; with `field`, each job
 * item's value of that one attribute is also handed back, by its `pk`.
 */
export async function dynamoDigest(client: DynamoDBClient, tableName: string, withoutJobFields: readonly string[] = []): Promise<string> {
  return (await dynamoDigestAnd(client, tableName, withoutJobFields)).digest;
}

export async function dynamoDigestAnd(
  client: DynamoDBClient,
  tableName: string,
  withoutJobFields: readonly string[],
  field?: string,
): Promise<{ digest: string; values: Map<string, string> }> {
  const hash = createHash("sha256");
  const items: string[] = [];
  const values = new Map<string, string>();
  let start: Record<string, AttributeValue> | undefined;
  do {
    const page: ScanCommandOutput = await client.send(
      new ScanCommand({ TableName: tableName, ConsistentRead: true, ...(start ? { ExclusiveStartKey: start } : {}) }),
    );
    for (const item of page.Items ?? []) {
      if (item.sk?.S !== "JOB" || withoutJobFields.length === 0) {
        items.push(canonical(item));
        continue;
      }
      const kept = { ...item };
      for (const f of withoutJobFields) delete kept[f];
      items.push(canonical(kept));
      if (field !== undefined) {
        const value = item[field];
        values.set(String(item.pk?.S), JSON.stringify(value === undefined ? null : unmarshall({ v: value }).v));
      }
    }
    start = page.LastEvaluatedKey;
  } while (start !== undefined);
  for (const item of items.sort()) hash.update(item);
  return { digest: hash.digest("hex"), values };
}

/** Every object of an S3 bucket, by key: the sha256 and length of its bytes, and its metadata. */
export async function s3Objects(client: S3Client, bucket: string): Promise<Map<string, string>> {
  const objects = new Map<string, string>();
  let token: string | undefined;
  do {
    const page: ListObjectsV2CommandOutput = await client.send(
      new ListObjectsV2Command({ Bucket: bucket, ...(token ? { ContinuationToken: token } : {}) }),
    );
    const keys = (page.Contents ?? []).flatMap((o) => (o.Key === undefined ? [] : [o.Key]));
    // A few reads at a time: a bucket of hundreds of objects is read in a fraction of the time.
    for (let i = 0; i < keys.length; i += 8) {
      await Promise.all(
        keys.slice(i, i + 8).map(async (key) => {
          const object = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key }));
          const bytes = (await object.Body?.transformToByteArray()) ?? new Uint8Array();
          objects.set(key, `${createHash("sha256").update(bytes).digest("hex")}:${bytes.byteLength}:${canonical(object.Metadata ?? {})}`);
        }),
      );
    }
    token = page.NextContinuationToken;
  } while (token !== undefined);
  return objects;
}

/**
 * DynamoDB (dynalite, or DynamoDB Local: MAM_DYNAMODB_PEER) + S3 (s3rver) + IoT Core
 * (the HTTP stand-in onto aedes). The peers start once per test file; each backend
 * gets a table and a bucket of its own.
 */
let awsPeers: Promise<AwsPeers> | undefined;
function sharedAwsPeers(): Promise<AwsPeers> {
  awsPeers ??= startAwsPeers();
  return awsPeers;
}

/**
 * Close the file's AWS peers, if it started them. Registered once per file by
 * `describeBackends`, as the file is collected: an `afterAll` registered while a
 * hook runs (where the peers start) is never run, and the peers (a DynamoDB Local
 * JVM among them) would outlive the file.
 */
async function closeSharedAwsPeers(): Promise<void> {
  const peers = awsPeers;
  awsPeers = undefined;
  await (await peers)?.close();
}
let closeRegistered = false;

async function makeAws(): Promise<SeedBackend> {
  const peers = await sharedAwsPeers();
  const clock = tickingClock(CLOCK_START);
  let live = await peers.ports();
  const extra: { close(): Promise<void> }[] = [];
  const subscriptions: Subscription[] = [];
  const iotAt = (endpoint: string): IotPublisher => {
    const client = new IoTDataPlaneClient({
      endpoint,
      region: "us-east-1",
      credentials: { accessKeyId: "local", secretAccessKey: "local" },
    });
    extra.push({ close: async () => client.destroy() });
    return new IotPublisher({ client });
  };
  // The peers' broker is shared by the file's tests; each backend refuses only what it was told to.
  const refusedTopics = new Set<string>();
  peers.refusing.add(refusedTopics);
  extra.push({ close: async () => void peers.refusing.delete(refusedTopics) });
  return {
    name: "aws",
    refusedTopics,
    async plantJob(record) {
      await peers.dynamo.client.send(
        new PutItemCommand({ TableName: live.tableName, Item: marshall(jobItem(record as never), { removeUndefinedValues: true }) }),
      );
    },
    deps(flags = parseFlags({}), override = {}) {
      return {
        jobs: live.jobs,
        reports: live.reports,
        publisher: override.publisher ?? live.publisher,
        clock: override.clock ?? clock,
        ids: randomIds,
        flags,
      };
    },
    async fingerprint() {
      const [items, objects] = await Promise.all([
        dynamoDigest(peers.dynamo.client, live.tableName),
        s3Objects(peers.s3.client, live.bucket),
      ]);
      return `${items}:${digestOf(objects)}`;
    },
    isAbsoluteAddress: (address) => address.startsWith("s3://"),
    async subscribe(topicFilter) {
      const sub = await subscribe(peers.broker.url, topicFilter);
      subscriptions.push(sub);
      return sub;
    },
    async refusingPublisher() {
      // A data plane without the right to publish under mam/: the broker refuses, IoT answers 403.
      const unauthorised = await startIotStandIn(peers.broker.url);
      extra.push(unauthorised);
      return iotAt(unauthorised.endpoint);
    },
    async unreachablePublisher() {
      return iotAt(`http://127.0.0.1:${await deadPort()}`);
    },
    async restart() {
      // New clients over the same table and bucket: what a new Lambda container sees.
      const client = new DynamoDBClient({
        endpoint: peers.dynamo.endpoint,
        region: "us-east-1",
        credentials: { accessKeyId: "local", secretAccessKey: "local" },
      });
      extra.push({ close: async () => client.destroy() });
      live = {
        ...live,
        jobs: new DynamoJobStore({ client, tableName: live.tableName, transactions: !peers.dynamo.gaps.noTransactions }),
        publisher: iotAt(peers.standIn.endpoint),
      };
    },
    async close() {
      for (const s of subscriptions.splice(0)) await s.close();
      for (const e of extra.splice(0)) await e.close();
      await live.close();
    },
  };
}

/** Every seed test runs on each of these. */
export const BACKENDS: readonly BackendEntry[] = [
  { name: "embedded", make: makeEmbedded },
  { name: "aws", make: makeAws },
];

/**
 * `describe(title)` once per backend, with a fresh backend for each test (made before,
 * closed after). `body` receives a getter for the current test's backend.
 * With `MAM_TEST_BACKENDS=aws` (the aws-engine tier) only the AWS backend's are declared.
 */
export function describeBackends(title: string, body: (backend: () => SeedBackend) => void): void {
  if (!closeRegistered) {
    closeRegistered = true;
    afterAll(closeSharedAwsPeers);
  }
  for (const entry of BACKENDS.filter((b) => runsBackend(b.name === "aws" ? "aws" : "embedded"))) {
    describe(`${title} [${entry.name}]`, () => {
      let current: SeedBackend | undefined;
      beforeEach(async () => {
        current = await entry.make();
      });
      afterEach(async () => {
        await current?.close();
        current = undefined;
      });
      body(() => {
        if (current === undefined) throw new Error("the backend is only available inside a test");
        return current;
      });
    });
  }
}
