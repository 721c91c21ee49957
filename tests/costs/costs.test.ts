/**
 * What an operation costs, on both backends, measured on real peers:
 *
 * - DynamoDB and S3 (dynalite or DynamoDB Local, s3rver): requests, counted by `countRequests` on the
 *   SDK clients (one count per HTTP attempt, retries included); items read, counted
 *   by a middleware of this file that looks at every response of a read command
 *   (GetItem, BatchGetItem, Query, Scan) and adds up the items in it.
 * - SQLite and files: job rows read (counted on the store's connection, `countingConnection`,
 *   the stores composed as `mam serve` composes them) and, for the file
 *   report store, the ReportStore calls made (a counting decorator, below).
 *
 * Every count covers the operation alone: the counters are reset after the set-up.
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import { type DynamoDBClient, ScanCommand } from "@aws-sdk/client-dynamodb";
import {
  type Deps,
  evaluateDueCandidates,
  evaluateJob,
  getJob,
  type JobRecord,
  OPERATOR,
  type Publisher,
  parseFlags,
  type ReportStore,
  randomIds,
  recoverNotifications,
  registerJob,
  type Status,
  systemClock,
  transitionJob,
} from "@mam/core";
import { type EmbeddedBroker, FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readyJob } from "../seed/scenario.ts";
import { type AwsPeers, type AwsPorts, startAwsPeers } from "../support/aws-backend.ts";
import { DYNAMODB_PEER, type DynamoEngine } from "../support/aws-peers.ts";
import { countRequests, type RequestCounter } from "../support/count-requests.ts";
import { jobRecord } from "../support/records.ts";
import { countingConnection } from "../support/sqlite-rows-read.ts";
import { tempDir } from "../support/temp-dir.ts";
import { runsBackend } from "../support/test-env.ts";

/** The gate may commit: MAM_AUTO_COMPLETE=1 (CAS on, the evidence-backed allowlist). */
const FLAGS = parseFlags({ MAM_AUTO_COMPLETE: "1" });
const FLEET = 2000;
const OWED = 20;
const REVIEWER_REPORT = "Reviewed the change; the tests pass.\n\n[VERDICT: PASS]\n";

/** What each test measured, printed once at the end (the figures in docs/adapters.md). */
const measured: Record<string, Record<string, unknown>> = {};
const note = (backend: string, operation: string, figures: unknown): void => {
  measured[backend] ??= {};
  (measured[backend] as Record<string, unknown>)[operation] = figures;
};
afterAll(() => {
  console.log(`[costs] ${JSON.stringify(measured, null, 1)}`);
});

/**
 * Items that DynamoDB's read commands hand back, counted from their responses
 * (writes are not reads: an UpdateItem's returned attributes are not counted). A
 * Query or Scan counts what it examined (`ScannedCount`), so a filter could not hide
 * a read; without one that is the number of items returned.
 */
interface ItemsRead {
  readonly total: number;
  readonly byCommand: Readonly<Record<string, number>>;
  reset(): void;
}

function countItemsRead(client: DynamoDBClient): ItemsRead {
  let total = 0;
  let byCommand: Record<string, number> = {};
  client.middlewareStack.add(
    (next, context) => async (args) => {
      const result = await next(args);
      const out = result.output as { Item?: unknown; Items?: unknown[]; ScannedCount?: number; Responses?: Record<string, unknown[]> };
      const name = context.commandName ?? "unknown";
      let items = 0;
      if (name === "GetItemCommand") items = out.Item === undefined ? 0 : 1;
      else if (name === "QueryCommand" || name === "ScanCommand") items = Math.max(out.ScannedCount ?? 0, out.Items?.length ?? 0);
      else if (name === "BatchGetItemCommand") items = Object.values(out.Responses ?? {}).reduce((n, list) => n + list.length, 0);
      else return result;
      total += items;
      byCommand[name] = (byCommand[name] ?? 0) + items;
      return result;
    },
    { step: "initialize", name: "costsCountItemsRead" },
  );
  return {
    get total() {
      return total;
    },
    get byCommand() {
      return byCommand;
    },
    reset() {
      total = 0;
      byCommand = {};
    },
  };
}

/** A ReportStore that counts the calls made to it (the file store has no request to count). */
class CountingReports implements ReportStore {
  calls: Record<string, number> = {};
  readonly #inner: ReportStore;
  constructor(inner: ReportStore) {
    this.#inner = inner;
  }
  get total(): number {
    return Object.values(this.calls).reduce((a, b) => a + b, 0);
  }
  reset(): void {
    this.calls = {};
  }
  #count(method: string): void {
    this.calls[method] = (this.calls[method] ?? 0) + 1;
  }
  put(location: string, name: string, body: Uint8Array | AsyncIterable<Uint8Array>) {
    this.#count("put");
    return this.#inner.put(location, name, body);
  }
  getBytes(location: string, name: string) {
    this.#count("getBytes");
    return this.#inner.getBytes(location, name);
  }
  read(location: string, name: string) {
    this.#count("read");
    return this.#inner.read(location, name);
  }
  exists(location: string, name: string) {
    this.#count("exists");
    return this.#inner.exists(location, name);
  }
  promote(location: string, from: string, to: string) {
    this.#count("promote");
    return this.#inner.promote(location, from, to);
  }
  hash(location: string, name: string) {
    this.#count("hash");
    return this.#inner.hash(location, name);
  }
  delete(location: string, name: string) {
    this.#count("delete");
    return this.#inner.delete(location, name);
  }
  retire(location: string, name: string) {
    this.#count("retire");
    return this.#inner.retire(location, name);
  }
  copyOnce(from: { location: string; name: string }, to: { location: string; name: string }, sha256: string) {
    this.#count("copyOnce");
    return this.#inner.copyOnce(from, to, sha256);
  }
  describe(location: string, name: string): string {
    return this.#inner.describe(location, name);
  }
}

const T0 = Date.parse("2026-11-01T00:00:00.000Z");
const FLEET_STATUSES: readonly Status[] = ["pending", "running", "completed", "error", "cancelled"];

/** A job that owes nothing, in one of every status, as the fleet around the owed ones. */
function fleetJob(i: number): JobRecord {
  const at = new Date(T0 + i * 1000).toISOString();
  return jobRecord(`fleet-${String(i).padStart(4, "0")}`, {
    prompt: "a job that owes no notification",
    agent: "codex",
    status: FLEET_STATUSES[i % FLEET_STATUSES.length] ?? "pending",
    iteration: 1,
    transition_seq: i % 3,
    created_at: at,
    updated_at: at,
  });
}

/**
 * 2,000 jobs, 20 of which owe a notification: 1,980 created through the store (in
 * parallel batches), and 20 registered and completed through the engine, whose
 * transition commits the intent they owe.
 */
async function seedFleet(deps: Deps, batch: number): Promise<string[]> {
  for (let i = 0; i < FLEET - OWED; i += batch) {
    const ids = Array.from({ length: Math.min(batch, FLEET - OWED - i) }, (_, k) => i + k);
    await Promise.all(ids.map((n) => deps.jobs.create(fleetJob(n))));
  }
  const owed: string[] = [];
  for (let i = 0; i < OWED; i++) {
    const job = await registerJob(deps, { job_id: `owed-${i}`, prompt: "owes a notification", agent: "codex" });
    await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: 0 }, OPERATOR);
    owed.push(job.job_id);
  }
  return owed;
}

const DUE = 20;
const NOT_YET = 30;

/**
 * 2,000 running jobs: `DUE` of them marked candidates due an hour ago, `NOT_YET`
 * marked due in an hour, the rest unmarked, all created through the store. None has a
 * dispatch, so the gate holds on each due one at once (no report read) and the sweep
 * clears its mark: what the pass reads is the index's due part and nothing else.
 */
async function seedCandidates(deps: Deps, batch: number): Promise<string[]> {
  const now = Date.now();
  const mark = (i: number): string | undefined =>
    i < DUE ? new Date(now - 3_600_000 + i).toISOString() : i < DUE + NOT_YET ? new Date(now + 3_600_000).toISOString() : undefined;
  for (let i = 0; i < FLEET; i += batch) {
    const ids = Array.from({ length: Math.min(batch, FLEET - i) }, (_, k) => i + k);
    await Promise.all(
      ids.map((n) => {
        const due = mark(n);
        return deps.jobs.create({
          ...fleetJob(n),
          status: "running",
          auto_complete: true,
          agent: "claude-code",
          ...(due === undefined ? {} : { candidate_at: due }),
        });
      }),
    );
  }
  return Array.from({ length: DUE }, (_, i) => fleetJob(i).job_id);
}

/** A ready job (the seed's `_ready_job`) that is a Reviewer with a verdict token in its report. */
async function readyReviewer(deps: Deps) {
  const ready = await readyJob(deps, { body: REVIEWER_REPORT });
  const job = await getJob(deps, ready.jobId);
  await transitionJob(deps, ready.jobId, { action: "progress", expectedSeq: job.transition_seq, fields: { role: "Reviewer" } }, OPERATOR);
  return ready;
}

// ---------------------------------------------------------------- DynamoDB + S3 + IoT Core

/**
 * What a losing transition costs, per engine. DynamoDB hands back the record a write
 * lost to (`ReturnValuesOnConditionCheckFailure: ALL_OLD`), so losing is the one
 * UpdateItem; dynalite returns no item, so the store reads it: one GetItem more.
 */
const LOST_TRANSITION: Record<DynamoEngine, Record<string, number>> = {
  dynalite: { UpdateItemCommand: 1, GetItemCommand: 1 },
  "dynamodb-local": { UpdateItemCommand: 1 },
};

describe(`cost per operation: DynamoDB (${DYNAMODB_PEER}), S3 (s3rver), IoT Core (stand-in onto aedes)`, () => {
  let peers: AwsPeers;
  let dynamo: RequestCounter;
  let s3: RequestCounter;
  let itemsRead: ItemsRead;
  const opened: AwsPorts[] = [];

  beforeAll(async () => {
    peers = await startAwsPeers();
    dynamo = countRequests(peers.dynamo.client);
    s3 = countRequests(peers.s3.client);
    itemsRead = countItemsRead(peers.dynamo.client);
  }, 60_000);
  afterAll(async () => {
    for (const p of opened) await p.close();
    await peers?.close();
  });

  /** A table and a bucket of the test's own, the shared clients (and their counters) underneath. */
  async function ports(): Promise<Deps & { readonly tableName: string }> {
    const p = await peers.ports();
    opened.push(p);
    return {
      jobs: p.jobs,
      reports: p.reports,
      publisher: p.publisher,
      clock: systemClock,
      ids: randomIds,
      flags: FLAGS,
      tableName: p.tableName,
    };
  }
  const reset = (): void => {
    dynamo.reset();
    s3.reset();
    itemsRead.reset();
  };

  it("a transition is exactly one request: one UpdateItem, state and intent together", async () => {
    const deps = await ports();
    const job = await registerJob(deps, { prompt: "p", agent: "codex" });

    reset();
    const claimed = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: 0 }, OPERATOR);
    expect(dynamo.total).toBe(1);
    expect(dynamo.byCommand).toEqual({ UpdateItemCommand: 1 });

    reset();
    const completed = await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: claimed.transition_seq }, OPERATOR);
    expect(completed.pending_notification).toBeDefined();
    expect(dynamo.total).toBe(1);
    expect(dynamo.byCommand).toEqual({ UpdateItemCommand: 1 });

    // Losing: one UpdateItem where the engine hands back the record it lost to
    // (ALL_OLD), one GetItem more where it does not (dynalite): LOST_TRANSITION.
    reset();
    await expect(
      transitionJob(deps, job.job_id, { action: "cancel", expectedSeq: claimed.transition_seq }, OPERATOR),
    ).rejects.toMatchObject({
      code: "job.transitionConflict",
    });
    const lost = { ...dynamo.byCommand };
    expect(peers.dynamo.gaps.noItemOnConditionFailure).toBe(peers.dynamo.engine === "dynalite");
    expect(lost).toEqual(LOST_TRANSITION[peers.dynamo.engine]);
    note(`dynamodb (${peers.dynamo.engine})`, "transition", { committed: { UpdateItemCommand: 1 }, lost });
  });

  it("a gate evaluation that commits makes at most 4 DynamoDB and 3 S3 requests, a Reviewer's verdict token included", async () => {
    const deps = await ports();
    const worker = await readyJob(deps);
    const reviewer = await readyReviewer(deps);

    /** One evaluation, counted alone, within the bounds. */
    const evaluateCounted = async (ready: { jobId: string; scenario: unknown }) => {
      reset();
      const result = await evaluateJob(deps, ready.jobId, ready.scenario);
      expect(dynamo.total).toBeLessThanOrEqual(4);
      expect(s3.total).toBeLessThanOrEqual(3);
      return { result, cost: { dynamodb: { ...dynamo.byCommand }, s3: { ...s3.byCommand } } };
    };

    const { result: workerResult, cost: workerCost } = await evaluateCounted(worker);
    expect(workerResult).toMatchObject({ committed: true, record: { status: "completed", completed_by: "auto_complete" } });
    // the manifest, the live report, and the pinned copy the completion names
    expect(s3.byCommand).toEqual({ GetObjectCommand: 3 });

    const { result: reviewerResult, cost: reviewerCost } = await evaluateCounted(reviewer);
    expect(reviewerResult).toMatchObject({ committed: true, record: { role: "Reviewer", status: "completed" } });
    // Nothing written to S3 by a decision, and one conditional write to the table.
    expect(Object.keys(s3.byCommand)).toEqual(["GetObjectCommand"]);
    expect(dynamo.byCommand.UpdateItemCommand).toBe(1);
    note("dynamodb+s3", "gate evaluation (evaluateJob, commits)", { worker: workerCost, reviewer: reviewerCost });
  });

  it(`a recovery sweep over ${FLEET} jobs, ${OWED} owing, reads at most 25 job items: one Query of the sparse index, no Scan`, async () => {
    const deps = await ports();
    const t0 = performance.now();
    const owed = await seedFleet(deps, 100);
    const seedMs = performance.now() - t0;
    const acceptedBefore = peers.standIn.accepted.length;

    reset();
    const result = await recoverNotifications(deps);
    const reads = { total: itemsRead.total, byCommand: { ...itemsRead.byCommand } };
    const requests = { ...dynamo.byCommand };
    const queries = dynamo.calls.filter((c) => c.command === "QueryCommand");

    expect(result).toMatchObject({ owed: OWED, sent: OWED, failed: 0 });
    expect(result.results.map((r) => r.job_id).sort()).toEqual([...owed].sort());
    expect(reads.total).toBeLessThanOrEqual(25);
    expect(reads.total).toBe(OWED);
    expect(requests.ScanCommand).toBeUndefined();
    expect(queries.map((q) => q.input.IndexName)).toEqual(["owed"]);
    // The writes the sweep makes, not counted as reads: per owed job, the event-log line
    // and the settle, as one TransactWriteItems where the engine has transactions (else a
    // PutItem and an UpdateItem); and two publishes through IoT.
    expect(requests).toEqual(
      peers.dynamo.gaps.noTransactions
        ? { QueryCommand: 1, PutItemCommand: OWED, UpdateItemCommand: OWED }
        : { QueryCommand: 1, TransactWriteItemsCommand: OWED },
    );
    expect(peers.standIn.accepted.length - acceptedBefore).toBe(2 * OWED);
    expect(await deps.jobs.listOwed(100)).toEqual([]);

    // The meter would have seen a scan: one Scan of the table examines every item.
    reset();
    await peers.dynamo.client.send(new ScanCommand({ TableName: deps.tableName, Select: "COUNT" }));
    expect(itemsRead.byCommand.ScanCommand).toBeGreaterThanOrEqual(FLEET);

    note("dynamodb", `recovery sweep (${FLEET} jobs, ${OWED} owed)`, {
      itemsRead: reads,
      requests,
      iotPublishes: 2 * OWED,
      seedMs: Math.round(seedMs),
    });
  }, 120_000);

  it(`the sweep's evaluation over ${FLEET} running jobs, ${DUE} due candidates and ${NOT_YET} not yet due, reads the ${DUE} due and nothing else: one Query of the candidates' partition, no Scan (issue 20)`, async () => {
    const deps = await ports();
    const due = await seedCandidates(deps, 100);
    reset();
    const result = await evaluateDueCandidates(deps, { budget: { evaluations: 100, bytes: 1 << 20 } });
    const reads = { total: itemsRead.total, byCommand: { ...itemsRead.byCommand } };
    const requests = { ...dynamo.byCommand };
    expect(result).toMatchObject({ due: DUE, held: DUE, completed: 0, failed: 0 });
    expect(result.results.map((r) => r.job_id)).toEqual(due);
    // The listed items carry the record (the index projects ALL); the gate held before reading a dispatch.
    expect(reads.total).toBe(DUE);
    expect(requests.ScanCommand).toBeUndefined();
    expect(dynamo.calls.filter((c) => c.command === "QueryCommand").map((q) => q.input.IndexName)).toEqual(["feed-by-job"]);
    // Each hold clears its mark: one conditional UpdateItem each.
    expect(requests).toEqual({ QueryCommand: 1, UpdateItemCommand: DUE });
    expect(await deps.jobs.listCandidates(100, { dueBy: new Date(Date.now() + 7_200_000).toISOString() })).toHaveLength(NOT_YET);
    note("dynamodb", `sweep evaluation (${FLEET} running, ${DUE} due, ${NOT_YET} not yet)`, { itemsRead: reads, requests });
  }, 120_000);
});

// ---------------------------------------------------------------- SQLite + files + MQTT

/** Declared only when the run includes the embedded backend (MAM_TEST_BACKENDS, tests/support/test-env.ts). */
function describeEmbedded(title: string, body: () => void): void {
  if (runsBackend("embedded")) describe(title, body);
}

describeEmbedded("cost per operation: SQLite, files, MQTT (aedes)", () => {
  let dir: string;
  let broker: EmbeddedBroker;
  let credentials: { username: string; password: string };
  const open: { close(): Promise<void>; publisher: Publisher }[] = [];
  let n = 0;

  beforeAll(async () => {
    dir = (await tempDir("costs")).dir;
    credentials = { username: "mam-service", password: randomIds.uuid() };
    broker = await startEmbeddedBroker({ port: 0, publisherCredentials: credentials });
  });
  afterAll(async () => {
    for (const o of open) {
      await o.publisher.close?.();
      await o.close();
    }
    await broker?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  /** A database file and a report root of the test's own. */
  /** `jobs` as `mam serve` composes it (guard, record cache, SQLite); `rowsRead` counts on its connection. */
  function ports(): Deps & { reports: CountingReports; rowsRead(): number } {
    n += 1;
    const connection = countingConnection(path.join(dir, `mam-${n}.db`));
    const { jobs, close } = openEmbeddedJobStore(connection.db);
    const reports = new CountingReports(new FileReportStore(path.join(dir, `reports-${n}`)));
    const publisher = new MqttPublisher({ url: broker.url, ...credentials });
    open.push({ close, publisher });
    return { jobs, reports, publisher, clock: systemClock, ids: randomIds, flags: FLAGS, rowsRead: connection.rowsRead };
  }

  it("a transition reads no row: one UPDATE ... RETURNING", async () => {
    const deps = ports();
    const job = await registerJob(deps, { prompt: "p", agent: "codex" });
    const before = deps.rowsRead();
    const claimed = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: 0 }, OPERATOR);
    await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: claimed.transition_seq }, OPERATOR);
    expect(deps.rowsRead() - before).toBe(0);

    // A lost one reads the row it lost to, to say why.
    const lostFrom = deps.rowsRead();
    await expect(
      transitionJob(deps, job.job_id, { action: "cancel", expectedSeq: claimed.transition_seq }, OPERATOR),
    ).rejects.toMatchObject({
      code: "job.transitionConflict",
    });
    expect(deps.rowsRead() - lostFrom).toBe(1);
    note("sqlite", "transition", { committedRowsRead: 0, lostRowsRead: 1 });
  });

  it("a gate evaluation that commits reads the job row twice and makes at most 3 report-store reads (a Reviewer's included)", async () => {
    const deps = ports();
    const worker = await readyJob(deps);
    const reviewer = await readyReviewer(deps);

    deps.reports.reset();
    let before = deps.rowsRead();
    expect(await evaluateJob(deps, worker.jobId, worker.scenario)).toMatchObject({ committed: true });
    const workerCost = { jobRowsRead: deps.rowsRead() - before, reportCalls: { ...deps.reports.calls } };
    expect(workerCost.jobRowsRead).toBeLessThanOrEqual(2);
    // the manifest, the live report hashed, the pinned copy read and hashed
    expect(deps.reports.calls).toEqual({ getBytes: 1, hash: 1, read: 1 });

    deps.reports.reset();
    before = deps.rowsRead();
    expect(await evaluateJob(deps, reviewer.jobId, reviewer.scenario)).toMatchObject({ committed: true, record: { role: "Reviewer" } });
    const reviewerCost = { jobRowsRead: deps.rowsRead() - before, reportCalls: { ...deps.reports.calls } };
    expect(reviewerCost.jobRowsRead).toBeLessThanOrEqual(2);
    expect(deps.reports.total).toBeLessThanOrEqual(3);
    // the verdict token is found in the same read of the pinned copy that re-hashes it
    expect(deps.reports.calls).toEqual({ getBytes: 1, hash: 1, read: 1 });
    note("sqlite+files", "gate evaluation (evaluateJob, commits)", { worker: workerCost, reviewer: reviewerCost });
  });

  it(`a recovery sweep over ${FLEET} jobs, ${OWED} owing, reads at most 25 job rows (the partial index)`, async () => {
    const deps = ports();
    const t0 = performance.now();
    const owed = await seedFleet(deps, 100);
    const seedMs = performance.now() - t0;

    const before = deps.rowsRead();
    const result = await recoverNotifications(deps);
    const rowsRead = deps.rowsRead() - before;
    expect(result).toMatchObject({ owed: OWED, sent: OWED, failed: 0 });
    expect(result.results.map((r) => r.job_id).sort()).toEqual([...owed].sort());
    expect(rowsRead).toBeLessThanOrEqual(25);
    expect(rowsRead).toBe(OWED);
    expect(await deps.jobs.listOwed(100)).toEqual([]);
    note("sqlite", `recovery sweep (${FLEET} jobs, ${OWED} owed)`, { rowsRead, seedMs: Math.round(seedMs) });
  }, 120_000);

  it(`the sweep's evaluation over ${FLEET} running jobs, ${DUE} due candidates and ${NOT_YET} not yet due, reads the ${DUE} due rows (the partial index; issue 20)`, async () => {
    const deps = ports();
    const due = await seedCandidates(deps, 100);
    const before = deps.rowsRead();
    const result = await evaluateDueCandidates(deps, { budget: { evaluations: 100, bytes: 1 << 20 } });
    const rowsRead = deps.rowsRead() - before;
    expect(result).toMatchObject({ due: DUE, held: DUE, completed: 0, failed: 0 });
    expect(result.results.map((r) => r.job_id)).toEqual(due);
    expect(rowsRead).toBe(DUE);
    expect(deps.reports.total).toBe(0);
    expect(await deps.jobs.listCandidates(100, { dueBy: new Date(Date.now() + 7_200_000).toISOString() })).toHaveLength(NOT_YET);
    note("sqlite", `sweep evaluation (${FLEET} running, ${DUE} due, ${NOT_YET} not yet)`, { rowsRead });
  }, 120_000);
});
