/**
 * Issue 17: feed streams that cannot be leaked and connections with hygiene, over
 * real HTTP on `startService` (what `mam serve` runs) and on `mam serve` itself.
 */
import { once } from "node:events";
import { readFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { createAdaptorServer } from "@hono/node-server";
import { type RunningService, startService } from "@mam/cli";
import { parseConfig } from "@mam/core";
import { dataDirPaths, openDataDir } from "@mam/local";
import Database from "better-sqlite3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeHarness } from "../api/harness.ts";
import { localPorts } from "../support/local-backend.ts";
import { jobRecord } from "../support/records.ts";
import { startServeProcess } from "../support/serve-process.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const STREAM = "/v1/events/stream";

/** A stream opened with fetch: read its text until `needle` arrives (or it ends first). */
async function openFeed(url: string, token: string) {
  const res = await fetch(`${url}${STREAM}`, { headers: { authorization: `Bearer ${token}` } });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  return {
    res,
    async until(needle: string): Promise<string> {
      while (!text.includes(needle)) {
        const r = await reader.read();
        if (r.done) throw new Error(`the stream ended before ${JSON.stringify(needle)}; it sent ${JSON.stringify(text)}`);
        text += decoder.decode(r.value, { stream: true });
      }
      return text;
    },
    cancel: () => reader.cancel(),
  };
}

/** A raw HTTP/1.1 GET on its own socket: the socket, once the answer's head has arrived. */
async function rawGet(url: string, pathName: string, token: string): Promise<net.Socket> {
  const u = new URL(url);
  const socket = net.connect(Number(u.port), u.hostname);
  await once(socket, "connect");
  socket.write(`GET ${pathName} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${token}\r\n\r\n`);
  let head = "";
  while (!head.includes("event: open")) head += String((await once(socket, "data"))[0]);
  return socket;
}

describe("feed streams and connections under startService (issue 17)", () => {
  let tmp: TempDir;
  let service: RunningService;
  let signingKey: string;

  beforeAll(async () => {
    tmp = await tempDir("streams");
    const dataDir = path.join(tmp.dir, "data");
    service = await startService(
      parseConfig({ MAM_DATA_DIR: dataDir, MAM_PORT: "0", MAM_MQTT_PORT: "0", MAM_HTTP_HEADERS_TIMEOUT_MS: "500" }),
      () => undefined,
    );
    signingKey = JSON.parse(await readFile(dataDirPaths(dataDir).credentials, "utf8")).signing_key;
  });
  afterAll(async () => {
    await service?.stop();
    await tmp?.remove();
  });

  const post = (pathName: string, body: unknown, token = service.operatorToken) =>
    fetch(`${service.url}${pathName}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });

  it("64 HEADs on the stream open nothing: a live stream afterwards still delivers, and the slot count is back to 0", async () => {
    for (let i = 0; i < 64; i++) {
      const res = await fetch(`${service.url}${STREAM}`, { method: "HEAD", headers: { authorization: `Bearer ${service.operatorToken}` } });
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    }
    expect(service.openStreams()).toBe(0);
    const live = await openFeed(service.url, service.operatorToken);
    await live.until("event: open");
    expect(service.openStreams()).toBe(1);
    expect((await post("/v1/jobs", { job_id: "streams-head", prompt: "p", agent: "codex" })).status).toBe(201);
    expect(await live.until('"job_id":"streams-head"')).toContain("event: job.registered");
    await live.cancel();
  });

  it("bounds streams per principal: an agent's 5th stream is a 429 naming the bound, an operator still gets one", async () => {
    expect((await post("/v1/jobs", { job_id: "streams-caps", prompt: "p", agent: "codex" })).status).toBe(201);
    const { createTokenService } = await import("@mam/api");
    const { systemClock } = await import("@mam/core");
    const agent = createTokenService({ signingKey, clock: systemClock }).mintAgent("streams-caps", 1).token;
    const dispatch = await post("/v1/jobs/streams-caps/dispatches", {
      attempt_id: 1,
      agent_session_uuid: "6f1c9a52-0d1b-4e3a-9c2f-5b7e8d9a0c1b",
      pane_process_generation: 1,
      anchor: { started_at: "2026-11-20T09:59:00Z" },
    });
    expect(dispatch.status).toBe(201);
    const held = [];
    for (let i = 0; i < 4; i++) {
      const s = await openFeed(service.url, agent);
      await s.until("event: open");
      held.push(s);
    }
    const fifth = await fetch(`${service.url}${STREAM}`, { headers: { authorization: `Bearer ${agent}` } });
    expect(fifth.status).toBe(429);
    expect(fifth.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    expect(fifth.headers.get("retry-after")).not.toBeNull();
    const problem = (await fifth.json()) as { detail: string };
    expect(problem).toMatchObject({ status: 429, code: "stream.tooMany" });
    expect(problem.detail).toMatch(/holds 4 open streams, the bound per agent attempt \(MAM_FEED_STREAMS_PER_AGENT\)/);
    const operator = await openFeed(service.url, service.operatorToken);
    await operator.until("event: open");
    for (const s of [...held, operator]) await s.cancel();
  });

  it("closes a socket that sends nothing within the headers timeout", async () => {
    const u = new URL(service.url);
    const socket = net.connect(Number(u.port), u.hostname);
    await once(socket, "connect");
    const opened = Date.now();
    socket.resume();
    await once(socket, "close");
    // 500 ms of headers timeout, checked every 50 ms.
    expect(Date.now() - opened).toBeLessThan(3000);
  });

  it("frees the slot of a stream whose reader stopped reading (a raw socket, paused)", async () => {
    const before = service.openStreams();
    const socket = await rawGet(service.url, STREAM, service.operatorToken);
    socket.pause();
    expect(service.openStreams()).toBe(before + 1);
    socket.destroy();
    await once(socket, "close");
    // The server sees the close as the end of the response: its slot is back.
    const next = await openFeed(service.url, service.operatorToken);
    await next.until("event: open");
    await next.cancel();
  });
});

/**
 * Fill a data dir's feed with `count` rows: one real registration, then copies of its
 * row inserted in one transaction (minutes of registrations otherwise). Tens of MiB:
 * loopback autotunes a paused reader's receive buffer up to net.ipv4.tcp_rmem's 32 MiB.
 */
async function feedOf(dataDir: string, count: number): Promise<void> {
  const store = openDataDir(dataDir);
  try {
    await store.jobs.create(jobRecord("bulk-000000"));
  } finally {
    store.close();
  }
  const db = new Database(dataDirPaths(dataDir).database);
  try {
    db.prepare(
      `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
       INSERT INTO changes (job_id, at, row) SELECT c.job_id, c.at, c.row FROM n, (SELECT * FROM changes LIMIT 1) AS c`,
    ).run(count - 1);
  } finally {
    db.close();
  }
}

/** Rows enough (about 60 MiB of stream) to exceed both sockets' buffers on loopback. */
const BULK_ROWS = 250_000;

describe("a reader that never reads (issue 17)", () => {
  let tmp: TempDir;
  let dataDir: string;

  beforeAll(async () => {
    tmp = await tempDir("streams-stall");
    dataDir = path.join(tmp.dir, "data");
    await feedOf(dataDir, BULK_ROWS);
  }, 120_000);
  afterAll(async () => {
    await tmp?.remove();
  });

  it("a write that does not complete within the bound closes the stream and its connection, and frees its slot", async () => {
    let stalled: (line: string) => void = () => undefined;
    const logged = new Promise<string>((resolve) => {
      stalled = (line) => {
        if (line.includes('"write stalled"')) resolve(line);
      };
    });
    const service = await startService(
      parseConfig({ MAM_DATA_DIR: dataDir, MAM_PORT: "0", MAM_MQTT_PORT: "0", MAM_FEED_WRITE_TIMEOUT_MS: "300" }),
      (line) => stalled(line),
    );
    try {
      const socket = await rawGet(service.url, STREAM, service.operatorToken);
      socket.pause();
      expect(service.openStreams()).toBe(1);
      // Once the sockets' buffers are full, a write waits; 300 ms later the stream is closed.
      expect(JSON.parse(await logged)).toMatchObject({ level: "warn", msg: "stream closed", reason: "write stalled" });
      expect(service.openStreams()).toBe(0);
      // The connection was closed under it: reading again, the client finds its end.
      socket.resume();
      await once(socket, "close");
    } finally {
      await service.stop();
    }
  }, 60_000);

  it("mam serve stops within its grace period with a stream open whose reader never reads, and exits 0", async () => {
    const served = await startServeProcess(dataDir, { MAM_STOP_GRACE_SECONDS: "1" });
    try {
      const token = JSON.parse(await readFile(dataDirPaths(dataDir).credentials, "utf8")).operator_token;
      const socket = await rawGet(served.url, STREAM, token);
      socket.pause();
      const asked = Date.now();
      const exit = await served.stop("SIGTERM");
      expect(exit).toBe(0);
      // 1 s of grace, and the rest of the stop (broker, store) well within a supervisor's 15 s.
      expect(Date.now() - asked).toBeLessThan(6000);
      socket.destroy();
    } finally {
      await served.stop("SIGKILL");
    }
  }, 60_000);
});

describe("one commit, one read for every open stream (issue 17)", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  it("16 open streams wake on one commit with one shared read of the feed, each still getting the row", async () => {
    const listeners = new Set<() => void>();
    const committed = () => {
      for (const l of listeners) l();
    };
    // No poll in the window: only the commit's signal wakes the streams.
    const h = await makeHarness(
      localPorts,
      {
        feed: {
          pollMs: 600_000,
          onCommitted: (l) => {
            listeners.add(l);
            return () => listeners.delete(l);
          },
        },
      },
      cleanup,
    );
    const server = createAdaptorServer({ fetch: h.app.fetch });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    cleanup.push(() => new Promise((resolve) => server.close(resolve)));
    const address = server.address() as net.AddressInfo;
    const url = `http://127.0.0.1:${address.port}`;
    const streams = [];
    for (let i = 0; i < 16; i++) {
      const s = await openFeed(url, h.operator);
      await s.until("event: open");
      streams.push(s);
    }
    expect(
      (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: "shared-1", prompt: "p", agent: "codex" } })).status,
    ).toBe(201);
    // The first signal seeds nothing new: the tail's head is the streams' page cursor.
    const before = h.calls.filter((c) => c === "listChanges").length;
    committed();
    for (const s of streams) await s.until('"job_id":"shared-1"');
    const reads = h.calls.filter((c) => c === "listChanges").length - before;
    expect(reads).toBe(1);
    if ("closeAllConnections" in server) server.closeAllConnections();
  });
});

/** One request over `agent` (one kept-alive socket): its status and body. */
function request(agent: http.Agent, url: string, method: string, pathName: string, token: string, body?: string, type?: string) {
  return new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = http.request(new URL(pathName, url), {
      method,
      agent,
      headers: { authorization: `Bearer ${token}`, ...(type === undefined ? {} : { "content-type": type }) },
    });
    req.on("response", (res) => {
      let text = "";
      res.on("data", (d) => {
        text += String(d);
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe("a socket flood under a low open-file limit (issue 17)", () => {
  it("600 idle sockets against 256 open files: report writes keep working, the idle sockets are closed, new connections are answered again", async () => {
    const tmp = await tempDir("streams-flood");
    const dataDir = path.join(tmp.dir, "data");
    const served = await startServeProcess(dataDir, { MAM_HTTP_HEADERS_TIMEOUT_MS: "2000" }, { openFiles: 256 });
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const flood: net.Socket[] = [];
    try {
      const token = JSON.parse(await readFile(dataDirPaths(dataDir).credentials, "utf8")).operator_token as string;
      const json = "application/json";
      // The writer's connection exists before the flood (kept alive, one socket).
      expect((await request(agent, served.url, "GET", "/v1/jobs", token)).status).toBe(200);
      const u = new URL(served.url);
      await Promise.all(
        Array.from({ length: 600 }, async () => {
          const socket = net.connect(Number(u.port), u.hostname);
          socket.on("error", () => undefined);
          flood.push(socket);
          await once(socket, "connect");
        }),
      );
      for (let i = 0; i < 10; i++) {
        const jobId = `flood-${i}`;
        const reg = JSON.stringify({ job_id: jobId, prompt: "p", agent: "codex" });
        expect((await request(agent, served.url, "POST", "/v1/jobs", token, reg, json)).status).toBe(201);
        const dispatch = await request(
          agent,
          served.url,
          "POST",
          `/v1/jobs/${jobId}/dispatches`,
          token,
          JSON.stringify({
            attempt_id: 1,
            agent_session_uuid: "6f1c9a52-0d1b-4e3a-9c2f-5b7e8d9a0c1b",
            pane_process_generation: 1,
            anchor: { started_at: "2026-11-20T09:59:00Z" },
          }),
          json,
        );
        expect(dispatch.status).toBe(201);
        const agentToken = JSON.parse(dispatch.body).agent_token as string;
        const put = await request(
          agent,
          served.url,
          "PUT",
          `/v1/jobs/${jobId}/attempts/1/report`,
          agentToken,
          "# Report\n",
          "text/markdown",
        );
        expect(put.status, put.body).toBe(201);
      }
      // Every flood socket is closed by the server: past the cap at once, the rest at the headers timeout.
      await Promise.all(
        flood.map((s) => {
          if (s.destroyed) return undefined;
          s.resume();
          return once(s, "close");
        }),
      );
      agent.destroy();
      const fresh = await fetch(`${served.url}/v1/jobs`, { headers: { authorization: `Bearer ${token}` } });
      expect(fresh.status).toBe(200);
      expect(served.stdout()).not.toContain("EMFILE");
    } finally {
      for (const s of flood) s.destroy();
      agent.destroy();
      await served.stop("SIGKILL");
      await tmp.remove();
    }
  }, 90_000);
});
