import { randomUUID } from "node:crypto";
import { type AttributeValue, GetItemCommand, PutItemCommand } from "@aws-sdk/client-dynamodb";
import { marshall } from "@aws-sdk/util-dynamodb";
import { DynamoJobStore, feedWriteOfStreamRecord, JOB_ITEM_SK } from "@mam/aws";
import type { DynamoDBRecord } from "aws-lambda";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { TestClock } from "../support/clock.ts";
import { openStream } from "./feed.suite.ts";
import { makeHarness } from "./harness.ts";

// The feed's routes on the AWS adapters over dynalite. dynalite keeps no stream, and the
// DynamoDB feed is derived from the stream (docs/notifications.md): by itself no row
// appears, so the first test checks the answer's shape, the cursor and the token rules;
// the head's tests (issue 22) file the feed writer's rows by hand. The rows themselves,
// on DynamoDB, are tests/engine/feed.test.ts (DynamoDB Local's stream).

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

describe("the change feed over HTTP, on the AWS adapters (dynalite: no stream, so no rows)", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  it("answers an empty page with a cursor to continue from, refuses a foreign cursor naming query.after, and a token outside the header", async () => {
    const h = await makeHarness((opts) => peers.ports(opts), { feed: { streaming: false } }, cleanup);
    const reg = await h.call("POST", "/v1/jobs", {
      token: h.operator,
      json: { job_id: `aws-${randomUUID().slice(0, 8)}`, prompt: "p", agent: "codex" },
    });
    expect(reg.status).toBe(201);
    const page = await h.call("GET", "/v1/events", { token: h.operator });
    expect(page.status, page.text).toBe(200);
    expect(page.body.items).toEqual([]);
    const again = await h.call("GET", `/v1/events?after=${encodeURIComponent(page.body.cursor)}`, { token: h.operator });
    expect(again.body).toEqual({ items: [], cursor: page.body.cursor });
    const bad = await h.call("GET", "/v1/events?after=eyJsIjoiZmVlZCIsImMiOiJ4In0", { token: h.operator });
    expect(bad.status).toBe(400);
    expect(bad.body.errors.map((i: { path: string }) => i.path)).toEqual(["query.after"]);
    expect((await h.call("GET", `/v1/events?token=${h.operator}`)).status).toBe(401);
    const stream = await h.call("GET", "/v1/events/stream", { token: h.operator });
    expect(stream.status).toBe(200);
    expect(stream.text).toMatch(/^retry: \d+\n\n$/);
  });
});

describe("issue 22: the feed's head on DynamoDB, with the feed delay (dynalite: the feed writer's rows filed by hand)", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });
  const DELAY_MS = 30_000;

  /**
   * The AWS ports with a job store on a clock the test moves, and the feed writer's
   * part played by hand: dynalite keeps no stream and has no transactions, so `file`
   * writes what `writeStreamChanges` would for the job's latest write (core's
   * `feedWriteOfStreamRecord` on its old and new item), with `PutItem`s, at `writtenAt`.
   */
  async function awsHead(streaming: boolean) {
    const clock = new TestClock("2026-11-20T10:10:00.000Z");
    let tableName = "";
    let store: DynamoJobStore | undefined;
    const h = await makeHarness(
      async (opts) => {
        const ports = await peers.ports(opts);
        tableName = ports.tableName;
        store = new DynamoJobStore({ client: peers.dynamo.client, tableName, transactions: false, feedDelayMs: DELAY_MS, clock });
        return { ...ports, jobs: store };
      },
      { feed: streaming ? { pollMs: 10 } : { streaming: false } },
      cleanup,
    );
    const seen = new Map<string, Record<string, AttributeValue>>();
    let seq = 0;
    const file = async (jobId: string, writtenAt: string): Promise<void> => {
      const key = marshall({ pk: `JOB#${jobId}`, sk: JOB_ITEM_SK });
      const now = (await peers.dynamo.client.send(new GetItemCommand({ TableName: tableName, Key: key, ConsistentRead: true }))).Item!;
      const old = seen.get(jobId);
      seen.set(jobId, now);
      seq += 1;
      const record = {
        eventID: `e-${seq}`,
        eventName: old === undefined ? "INSERT" : "MODIFY",
        dynamodb: {
          SequenceNumber: String(seq),
          ...(old === undefined ? {} : { OldImage: old }),
          NewImage: now,
          StreamViewType: "NEW_AND_OLD_IMAGES",
        },
      } as unknown as DynamoDBRecord;
      const write = feedWriteOfStreamRecord(record, writtenAt)!;
      for (const item of [write.hour, ...write.rows]) {
        await peers.dynamo.client.send(new PutItemCommand({ TableName: tableName, Item: marshall(item, { removeUndefinedValues: true }) }));
      }
    };
    return { h, clock, file, store: () => store! };
  }
  const register = async (h: Awaited<ReturnType<typeof awsHead>>["h"]): Promise<string> => {
    const res = await h.call("POST", "/v1/jobs", {
      token: h.operator,
      json: { job_id: `aws-${randomUUID().slice(0, 8)}`, prompt: "p", agent: "codex" },
    });
    expect(res.status, res.text).toBe(201);
    return res.body.job_id;
  };
  const jobIds = (res: { body: { items: { job_id: string; kind: string }[] } }) => res.body.items.map((r) => [r.job_id, r.kind]);

  it("?from=head is the position at the horizon (now minus the delay): a row still inside the delay, or filed late, is read after it once readable", async () => {
    const { h, clock, file } = await awsHead(false);
    const empty = await h.call("GET", "/v1/events?from=head", { token: h.operator });
    expect(empty.body.items).toEqual([]);

    const a = await register(h);
    await file(a, "2026-11-20T10:09:00.000Z");
    const b = await register(h);
    await file(b, "2026-11-20T10:09:40.000Z"); // inside the delay: not readable yet
    // The empty feed's head (the horizon hour's start) reads both once they are readable.
    clock.advance(DELAY_MS);
    const fromEmpty = await h.call("GET", `/v1/events?after=${encodeURIComponent(empty.body.cursor)}`, { token: h.operator });
    expect(jobIds(fromEmpty)).toEqual([
      [a, "job.registered"],
      [b, "job.registered"],
    ]);

    // Now 10:10:30, the horizon 10:10:00: a and b are before it.
    const c = await register(h);
    await file(c, "2026-11-20T10:10:00.000Z"); // at the horizon itself: before the head
    const head = await h.call("GET", "/v1/events?from=head", { token: h.operator });
    expect(head.status, head.text).toBe(200);
    expect(head.body.items).toEqual([]);
    const d = await register(h);
    await file(d, "2026-11-20T10:10:20.000Z"); // written before the head was asked, but inside the delay
    const e = await register(h);
    await file(e, "2026-11-20T10:10:45.000Z"); // written after
    const after = `/v1/events?after=${encodeURIComponent(head.body.cursor)}`;
    expect((await h.call("GET", after, { token: h.operator })).body.items).toEqual([]);
    clock.advance(2 * DELAY_MS); // the horizon 10:11:00: d and e are readable
    expect(jobIds(await h.call("GET", after, { token: h.operator }))).toEqual([
      [d, "job.registered"],
      [e, "job.registered"],
    ]);
    const all = await h.call("GET", `/v1/events?after=${encodeURIComponent(empty.body.cursor)}`, { token: h.operator });
    expect(jobIds(all).map(([id]) => id)).toEqual([a, b, c, d, e]);
  });

  it("an hour with no row yet at the horizon: the head is that hour's start, and its first rows come after it", async () => {
    const { h, clock, file } = await awsHead(false);
    const a = await register(h);
    await file(a, "2026-11-20T10:30:00.000Z");
    clock.advance(51 * 60_000); // 11:01:00, the horizon 11:00:30: nothing filed in hour 11
    const head = await h.call("GET", "/v1/events?from=head", { token: h.operator });
    const after = `/v1/events?after=${encodeURIComponent(head.body.cursor)}`;
    const none = await h.call("GET", after, { token: h.operator });
    expect(none.body).toEqual({ items: [], cursor: head.body.cursor });
    const b = await register(h);
    await file(b, "2026-11-20T11:00:40.000Z");
    clock.advance(DELAY_MS);
    expect(jobIds(await h.call("GET", after, { token: h.operator }))).toEqual([[b, "job.registered"]]);
  });

  it("a job's head (an agent token's from=head) is its last row at or before the horizon", async () => {
    const { h, clock, file } = await awsHead(false);
    const jobId = await register(h);
    await file(jobId, "2026-11-20T10:09:00.000Z");
    const dispatched = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
      token: h.operator,
      json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
    });
    expect(dispatched.status, dispatched.text).toBe(201);
    await file(jobId, "2026-11-20T10:09:50.000Z"); // inside the delay
    const agentToken = dispatched.body.agent_token as string;
    const head = await h.call("GET", "/v1/events?from=head", { token: agentToken });
    expect(head.status, head.text).toBe(200);
    clock.advance(DELAY_MS);
    const after = await h.call("GET", `/v1/events?after=${encodeURIComponent(head.body.cursor)}`, { token: agentToken });
    expect(jobIds(after)).toEqual([[jobId, "dispatch.recorded"]]);
  });

  it("the stream from=head sends event: head at once, then only rows readable after it", async () => {
    const { h, clock, file } = await awsHead(true);
    const a = await register(h);
    await file(a, "2026-11-20T10:09:00.000Z");
    const stream = await openStream(h, "/v1/events/stream?from=head", h.operator);
    const opening = await stream.until((e) => e.event === "head");
    expect(opening.map((e) => e.event)).toEqual(["open", "head"]);
    const b = await register(h);
    await file(b, "2026-11-20T10:09:50.000Z");
    clock.advance(DELAY_MS);
    const rows = await stream.until((e) => e.event === "job.registered");
    expect(rows.map((e) => JSON.parse(e.data).job_id)).toEqual([b]);
    await stream.cancel();
  });
});
