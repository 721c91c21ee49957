import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import path from "node:path";
import { RETRY_AFTER_SECONDS } from "@mam/api";
import { FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { tempDir } from "../support/temp-dir.ts";
import { type ApiPorts, type Harness, makeHarness, type Res } from "./harness.ts";

/**
 * A full disk, through SQLite's own bound: `max_page_count` makes the database file
 * answer exactly as a full disk does ("database or disk is full", SQLITE_FULL), so
 * the test needs no tmpfs and no root.
 */
async function fullablePorts(): Promise<ApiPorts & { db: Database.Database; capAt(extraPages: number): void; lift(): void }> {
  const dir = (await tempDir("full-disk")).dir;
  const reportRoot = path.join(dir, "store");
  await mkdir(reportRoot, { recursive: true });
  const db = new Database(path.join(dir, "mam.db"));
  const { jobs, close: closeJobs } = openEmbeddedJobStore(db);
  const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  const broker = await startEmbeddedBroker({ port: 0, publisherCredentials: credentials });
  const publisher = new MqttPublisher({ url: broker.url, ...credentials });
  return {
    jobs,
    reports: new FileReportStore(reportRoot, { allowAbsolute: false }),
    publisher,
    db,
    capAt(extraPages) {
      // Checkpointed first, so the WAL's pages are counted in the file the bound applies to.
      db.pragma("wal_checkpoint(TRUNCATE)");
      const pages = db.pragma("page_count", { simple: true }) as number;
      db.pragma(`max_page_count = ${pages + extraPages}`);
    },
    lift() {
      db.pragma("max_page_count = 4294967294");
    },
    async close() {
      await publisher.close();
      await broker.close();
      await closeJobs();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

describe("a full disk (issue 17): the job database answers 'database or disk is full'", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  async function register(h: Harness, jobId: string): Promise<Res> {
    return h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "fix the bug", agent: "codex" } });
  }

  async function dispatch(h: Harness, jobId: string): Promise<string> {
    const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
      token: h.operator,
      json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
    });
    expect(res.status, res.text).toBe(201);
    return res.body.agent_token;
  }

  function expectUnavailableOrSuccess(res: Res, what: string): void {
    if (res.status < 300) return;
    expect(res.status, `${what}: ${res.text}`).toBe(503);
    expect(res.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    expect(res.body).toMatchObject({ status: 503, code: "store.unavailable" });
    expect(res.headers.get("retry-after")).toBe(String(RETRY_AFTER_SECONDS));
    expect(res.body.detail).toMatch(/full/);
  }

  it("an agent that fills it gets a 503 store.unavailable with Retry-After; every other client's answer is a 503 or a success, and nothing acknowledged is lost", async () => {
    let ports: Awaited<ReturnType<typeof fullablePorts>> | undefined;
    const h = await makeHarness(
      async () => {
        ports = await fullablePorts();
        return ports;
      },
      {},
      cleanup,
    );
    const p = ports!;
    const filler = `job-${randomUUID().slice(0, 12)}`;
    const other = `job-${randomUUID().slice(0, 12)}`;
    expect((await register(h, filler)).status).toBe(201);
    expect((await register(h, other)).status).toBe(201);
    const fillerAgent = await dispatch(h, filler);
    const otherAgent = await dispatch(h, other);
    p.capAt(24);

    // The agent reports progress with 15 KiB of data each time until the database is full.
    expect((await h.call("POST", `/v1/jobs/${filler}/events`, { token: fillerAgent, json: { event: "started" } })).status).toBe(200);
    const acknowledged: number[] = [];
    const logged: number[] = [];
    let refusal: Res | undefined;
    for (let i = 0; i < 200 && refusal === undefined; i++) {
      const res = await h.call("POST", `/v1/jobs/${filler}/events`, {
        token: fillerAgent,
        json: { event: "progress", data: { blob: "x".repeat(15 * 1024), i } },
      });
      if (res.status !== 200) refusal = res;
      else {
        acknowledged.push(res.body.record.transition_seq);
        if (res.body.warnings === undefined) logged.push(res.body.record.transition_seq);
      }
    }
    expect(refusal, "the database never filled").toBeDefined();
    expectUnavailableOrSuccess(refusal!, "the filler's refusal");
    expect(refusal!.status).toBe(503);
    // Logged as what it is: a 503, never a 500 with a stack.
    expect(h.lines.map((l) => JSON.parse(l)).filter((l) => l.status === 500 || l.stack !== undefined)).toEqual([]);

    // Every other client: a registration, another agent's transition and event, the operator's reads.
    const late = `job-${randomUUID().slice(0, 12)}`;
    const answers: [string, Res][] = [
      ["a registration", await register(h, late)],
      [
        "another agent's transition",
        await h.call("POST", `/v1/jobs/${other}/transitions`, { token: otherAgent, json: { action: "claim", expected_seq: 0 } }),
      ],
      ["another agent's event", await h.call("POST", `/v1/jobs/${other}/events`, { token: otherAgent, json: { event: "started" } })],
      ["the operator's read", await h.call("GET", `/v1/jobs/${other}`, { token: h.operator })],
      ["the operator's listing", await h.call("GET", "/v1/jobs", { token: h.operator })],
    ];
    for (const [what, res] of answers) expectUnavailableOrSuccess(res, what);
    expect(answers.some(([, res]) => res.status === 503)).toBe(true);

    // Room again: every acknowledged write is there, and the refused ones left nothing behind.
    p.lift();
    const log = await h.call("GET", `/v1/jobs/${filler}/events?limit=200`, { token: h.operator });
    expect(log.status).toBe(200);
    const lines = (log.body.items as { data?: { event?: string; transition_seq?: number } }[])
      .filter((e) => e.data?.event === "progress")
      .map((e) => e.data?.transition_seq);
    for (const seq of logged) expect(lines).toContain(seq);
    const job = await h.call("GET", `/v1/jobs/${filler}`, { token: h.operator });
    expect(job.body.transition_seq).toBe(acknowledged.at(-1) ?? 2);
    const registered = answers[0]![1];
    expect((await h.call("GET", `/v1/jobs/${late}`, { token: h.operator })).status).toBe(registered.status === 201 ? 200 : 404);
    // The service works again once there is room.
    expect((await register(h, `job-${randomUUID().slice(0, 12)}`)).status).toBe(201);
  });
});
