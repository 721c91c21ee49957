/**
 * Issue 21, part 5, end to end: `mam serve` in-process (SQLite, files, its broker) on
 * the test clock, a fake herdr on a real Unix socket (tests/support/fake-herdr.ts,
 * following herdr's schema at a pinned commit), and the `mam watch herdr` collector
 * posting with a watcher token minted as an operator would
 * (`mam token create --scope read,observe --name herdr`). No mocks: the collector
 * reads mam's dispatches and posts over HTTP, and herdr's panes over the socket.
 * Every wait is on an event (a collector log line, a request the fake saw, an MQTT
 * message); time moves only by the test clock.
 */
import path from "node:path";
import { HerdrCollector, HerdrError, HerdrSocket, mamPort, type RunningService, runCli } from "@mam/cli";
import { createMamClient } from "@mam/client";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { TestClock } from "../support/clock.ts";
import { FakeHerdr, type FakePane } from "../support/fake-herdr.ts";
import { herdrSchemaErrors } from "../support/herdr-schema.ts";
import { serviceCaller, startTestService } from "../support/service-call.ts";
import { subscribe } from "../support/subscriber.ts";
import type { TempDir } from "../support/temp-dir.ts";

let tmp: TempDir;
let dataDir: string;
let service: RunningService;
let started: Awaited<ReturnType<typeof startTestService>> | undefined;
let watcherToken: string;
const clock = new TestClock(new Date().toISOString());

beforeAll(async () => {
  started = await startTestService("watch-herdr", clock);
  ({ service, dataDir, tmp } = started);
  const io = captureIo({});
  expect(await runCli(["token", "create", "--scope", "read,observe", "--name", "herdr", "--data-dir", dataDir, "--json"], io)).toBe(0);
  watcherToken = JSON.parse(io.out.join("")).token as string;
});
afterAll(async () => {
  await started?.stop();
});

const call = serviceCaller(() => service.url);

const SESSION = "0c9a2d11-0000-4000-8000-00000000c0de";

/** A running job, opted in, dispatched on `pane` (a dispatch without `terminal` records none); returns the agent's token. */
async function runningJob(
  jobId: string,
  pane: { pane_id?: string; terminal_id?: string },
  opts: { session?: string } = {},
): Promise<string> {
  const op = service.operatorToken;
  const created = await call("POST", "/v1/jobs", op, { job_id: jobId, prompt: "p", agent: "claude-code", auto_complete: true });
  expect(created.status, created.text).toBe(201);
  const claimed = await call("POST", `/v1/jobs/${jobId}/transitions`, op, { action: "claim", expected_seq: 0 });
  expect(claimed.status, claimed.text).toBe(200);
  const dispatched = await call("POST", `/v1/jobs/${jobId}/dispatches`, op, {
    attempt_id: 1,
    agent_session_uuid: opts.session ?? SESSION,
    pane_process_generation: 3,
    ...pane,
    anchor: { started_at: clock.now().toISOString() },
  });
  expect(dispatched.status, dispatched.text).toBe(201);
  return dispatched.body.agent_token as string;
}

async function finalizeReport(jobId: string, agentToken: string): Promise<void> {
  expect((await call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, agentToken, "# Report\n\ndone\n", "text/markdown")).status).toBe(201);
  const finalized = await call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, agentToken, { side_effects: [] });
  expect(finalized.status, finalized.text).toBe(200);
}

/** The job's recorded observations: `[state, sightings]` per entry, in order. */
async function observationsOf(jobId: string): Promise<[string, number][]> {
  const record = await call("GET", `/v1/jobs/${jobId}`, service.operatorToken);
  const entries = (record.body.observations?.entries ?? []) as { state: string; sightings: number }[];
  return entries.map((e) => [e.state, e.sightings]);
}

/** The collector's log, and a wait on its next line matching a pattern. */
class Log {
  readonly lines: string[] = [];
  readonly #waiters = new Set<() => void>();
  readonly add = (line: string): void => {
    this.lines.push(line);
    for (const w of [...this.#waiters]) w();
  };
  count(pattern: RegExp): number {
    return this.lines.filter((l) => pattern.test(l)).length;
  }
  /** Resolves once `n` lines match `pattern`. */
  until(pattern: RegExp, n = 1, timeoutMs = 15_000): Promise<void> {
    if (this.count(pattern) >= n) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters.delete(check);
        reject(new Error(`timed out waiting for ${n} log lines matching ${pattern}; log:\n${this.lines.join("\n")}`));
      }, timeoutMs);
      const check = () => {
        if (this.count(pattern) < n) return;
        clearTimeout(timer);
        this.#waiters.delete(check);
        resolve();
      };
      this.#waiters.add(check);
    });
  }
}

interface Running {
  readonly herdr: FakeHerdr;
  readonly log: Log;
  stop(): Promise<void>;
}
let running: Running | undefined;

/** A fake herdr with `panes`, and a collector watching it; stopped after the test. */
async function watch(
  name: string,
  panes: (Partial<FakePane> & Pick<FakePane, "pane_id" | "terminal_id">)[],
  opts: { fetch?: typeof fetch } = {},
): Promise<Running> {
  const herdr = await FakeHerdr.start(path.join(tmp.dir, `${name}.sock`));
  for (const p of panes) herdr.createPane(p);
  const log = new Log();
  const controller = new AbortController();
  const done = new HerdrCollector({
    herdr: new HerdrSocket(herdr.path),
    mam: mamPort(
      createMamClient({ baseUrl: service.url, token: watcherToken, ...(opts.fetch === undefined ? {} : { fetch: opts.fetch }) }),
    ),
    clock,
    log: log.add,
    signal: controller.signal,
    discoveryMs: 50,
    tickMs: 50,
    backoff: { initialMs: 20, maxMs: 200 },
  }).run();
  running = {
    herdr,
    log,
    async stop() {
      controller.abort();
      await done;
      await herdr.stop();
    },
  };
  return running;
}

/**
 * Both sides spoke herdr's pinned schema: every request the collector sent is a
 * `request`; every line the fake wrote is a `success_response`, an `error_response`,
 * an `event` (lifecycle kinds are snake_case) or a `subscription_event` (dotted kinds).
 */
function expectSchemaConformance(herdr: FakeHerdr): void {
  const bad: string[] = [];
  for (const r of herdr.requests) for (const e of herdrSchemaErrors("request", r)) bad.push(`request ${JSON.stringify(r)}: ${e}`);
  for (const line of herdr.sent) {
    const l = line as Record<string, unknown>;
    const name =
      "result" in l ? "success_response" : "error" in l ? "error_response" : String(l.event).includes(".") ? "subscription_event" : "event";
    for (const e of herdrSchemaErrors(name, line)) bad.push(`${name} ${JSON.stringify(line)}: ${e}`);
  }
  expect(bad).toEqual([]);
}

afterEach(async () => {
  const r = running;
  running = undefined;
  if (r === undefined) return;
  await r.stop();
  expectSchemaConformance(r.herdr);
  expect(r.herdr.requests.length).toBeGreaterThan(0);
});

describe("mam watch herdr (issue 21, part 5)", () => {
  it("records a completion: herdr's pane goes working -> idle, the collector's re-posts span the settle window, and the sweep completes the job on the watcher's evidence", async () => {
    const jobId = "herdr-complete";
    const agent = await runningJob(jobId, { pane_id: "w1:p1", terminal_id: "term-a" });
    await finalizeReport(jobId, agent);
    const sub = await subscribe(service.mqttUrl, `mam/jobs/${jobId}/events`);
    try {
      const { herdr, log } = await watch("complete", [
        { pane_id: "w1:p1", terminal_id: "term-a", agent_status: "working", agent: "claude" },
      ]);
      await log.until(/^herdr: connected/);
      await log.until(/^posted job herdr-complete attempt 1 pane w1:p1: working/);
      clock.advance(2_000);
      herdr.setStatus("w1:p1", "idle");
      await log.until(/^posted job herdr-complete attempt 1 pane w1:p1: idle/);
      expect(log.count(/^re-posted /)).toBe(0);
      // claude-code's settle window is 30 s: the collector re-posts the quiescent pane every half window.
      clock.advance(16_000);
      await log.until(/^re-posted job herdr-complete attempt 1 pane w1:p1: idle/, 1);
      clock.advance(16_000);
      await log.until(/^re-posted job herdr-complete attempt 1 pane w1:p1: idle/, 2);

      const message = await sub
        .waitFor((m) => JSON.parse(m.payload).event === "completed", 20_000)
        .catch(async (e: Error) => {
          const now = await call("GET", `/v1/jobs/${jobId}`, service.operatorToken);
          const gate = await call("GET", `/v1/jobs/${jobId}/gate`, service.operatorToken);
          throw new Error(`${e.message}\nrecord: ${now.text}\ngate: ${gate.text}\nlog:\n${log.lines.join("\n")}`);
        });
      expect(JSON.parse(message.payload)).toMatchObject({
        event: "completed",
        job_id: jobId,
        data: {
          status: "completed",
          completed_by: "auto_complete",
          rule: "watcher.pane_status",
          sources: ["watcher:herdr"],
          quiescence: "watcher-observed",
        },
      });
      const record = await call("GET", `/v1/jobs/${jobId}`, service.operatorToken);
      expect(record.body).toMatchObject({
        status: "completed",
        completed_by: "auto_complete",
        completed_evidence: { evidence: "recorded", sources: ["watcher:herdr"] },
      });
      // What mam recorded: working once, then idle sighted three times (one post, two coalesced re-posts).
      expect(await observationsOf(jobId)).toEqual([
        ["working", 1],
        ["idle", 3],
      ]);
      const entries = record.body.observations.entries as Record<string, unknown>[];
      expect(entries[0]).toMatchObject({
        source: "watcher:herdr",
        source_kind: "pane_status",
        agent_session_uuid: SESSION,
        pane_process_generation: 3,
        pane_id: "w1:p1",
      });
      // Every post named the collector's own request ids, one request per connection.
      expect(herdr.asked("pane.list").every((r) => typeof r.id === "string" && (r.id as string).startsWith("mam-"))).toBe(true);
      expect(log.lines.join("\n")).not.toContain(watcherToken);
    } finally {
      await sub.close();
    }
  }, 60_000);

  it("reconnects: the fake drops every connection, the collector reconnects, re-lists and re-subscribes, posts only what changed meanwhile, and carries on", async () => {
    const jobId = "herdr-reconnect";
    await runningJob(jobId, { pane_id: "w1:p2", terminal_id: "term-b" });
    const { herdr, log } = await watch("reconnect", [{ pane_id: "w1:p2", terminal_id: "term-b", agent_status: "working" }]);
    await log.until(/^posted job herdr-reconnect attempt 1 pane w1:p2: working/);
    await herdr.until(() => herdr.subscribed("pane.agent_status_changed", "w1:p2") === 1, "the status subscription");
    const lists = herdr.asked("pane.list").length;

    // Dropped, and the pane changes while no one is subscribed: herdr replays nothing, the re-list finds it.
    herdr.dropConnections();
    herdr.setStatus("w1:p2", "idle");
    await log.until(/^herdr: connected/, 2);
    await log.until(/^posted job herdr-reconnect attempt 1 pane w1:p2: idle/);
    expect(herdr.asked("pane.list").length).toBeGreaterThan(lists);
    await herdr.until(() => herdr.subscribed("pane.agent_status_changed", "w1:p2") === 1, "the status subscription again");

    // Dropped with nothing changed: the re-list posts nothing.
    herdr.dropConnections();
    await log.until(/^herdr: connected/, 3);
    await herdr.until(() => herdr.subscribed("pane.agent_status_changed", "w1:p2") === 1, "the status subscription a third time");

    // It carries on over the new subscription.
    herdr.setStatus("w1:p2", "working");
    await log.until(/^posted job herdr-reconnect attempt 1 pane w1:p2: working/, 2);
    expect(log.count(/^(re-)?posted job herdr-reconnect /)).toBe(3);
    expect(await observationsOf(jobId)).toEqual([
      ["working", 1],
      ["idle", 1],
      ["working", 1],
    ]);
    expect(log.count(/^herdr: not connected; reconnecting/)).toBeGreaterThanOrEqual(2);
  }, 60_000);

  it("refuses a reused pane: a second running dispatch naming a pane another running dispatch holds is never posted for", async () => {
    const first = "herdr-pane-holder";
    const second = "herdr-pane-reuser";
    await runningJob(first, { pane_id: "w1:p3", terminal_id: "term-c" });
    const { herdr, log } = await watch("reused", [{ pane_id: "w1:p3", terminal_id: "term-c", agent_status: "working" }]);
    await log.until(/^posted job herdr-pane-holder attempt 1 pane w1:p3: working/);

    clock.advance(1_000);
    await runningJob(second, { pane_id: "w1:p3", terminal_id: "term-c" });
    await log.until(/^refused: job herdr-pane-reuser attempt 1 names pane w1:p3, which job herdr-pane-holder attempt 1 holds/);
    herdr.setStatus("w1:p3", "idle");
    await log.until(/^posted job herdr-pane-holder attempt 1 pane w1:p3: idle/);

    expect(await observationsOf(second)).toEqual([]);
    expect(await observationsOf(first)).toEqual([
      ["working", 1],
      ["idle", 1],
    ]);
    expect(log.count(/herdr-pane-reuser/)).toBe(1);
  }, 60_000);

  it("ignores the panes it cannot map: another terminal under a dispatch's pane id, a pane no dispatch names, a dispatch without a terminal, another agent session, a pane that closed and came back", async () => {
    await runningJob("herdr-other-terminal", { pane_id: "w1:p4", terminal_id: "term-d" });
    await runningJob("herdr-no-terminal", { pane_id: "w1:p6" });
    await runningJob("herdr-other-session", { pane_id: "w1:p7", terminal_id: "term-f" });
    await runningJob("herdr-closed", { pane_id: "w1:p8", terminal_id: "term-g" });
    await runningJob("herdr-control", { pane_id: "w1:p9", terminal_id: "term-h" });
    const unmapped = ["herdr-other-terminal", "herdr-no-terminal", "herdr-other-session"];
    const fingerprint = async (jobs: readonly string[]) =>
      Promise.all(
        jobs.map(async (j) => ({
          // The sweep's own next look (`attention_at`) moves by itself; everything else is the job's.
          record: { ...(await call("GET", `/v1/jobs/${j}`, service.operatorToken)).body, attention_at: undefined },
          events: (await call("GET", `/v1/jobs/${j}/events`, service.operatorToken)).text,
        })),
      );
    const before = await fingerprint(unmapped);

    const { herdr, log } = await watch("unmappable", [
      { pane_id: "w1:p4", terminal_id: "term-other", agent_status: "working" },
      { pane_id: "w1:p5", terminal_id: "term-e", agent_status: "working" },
      { pane_id: "w1:p6", terminal_id: "term-x", agent_status: "working" },
      {
        pane_id: "w1:p7",
        terminal_id: "term-f",
        agent_status: "working",
        agent_session: { source: "herdr:claude", agent: "claude", kind: "id", value: "someone-else" },
      },
      { pane_id: "w1:p8", terminal_id: "term-g", agent_status: "working" },
      { pane_id: "w1:p9", terminal_id: "term-h", agent_status: "working" },
    ]);
    await log.until(/^posted job herdr-closed attempt 1 pane w1:p8: working/);
    await log.until(/^posted job herdr-control attempt 1 pane w1:p9: working/);
    await log.until(/^job herdr-no-terminal attempt 1 recorded no terminal_id: no pane maps to it/);
    await log.until(/^pane w1:p7 runs agent session someone-else, not job herdr-other-session attempt 1's: not mapped/);

    // The pane closes; herdr reuses its id for the same terminal: the mapping ended for good.
    herdr.closePane("w1:p8");
    await log.until(/^pane w1:p8 pane_closed: job herdr-closed attempt 1 is no longer mapped, for good/);
    herdr.createPane({ pane_id: "w1:p8", terminal_id: "term-g", agent_status: "idle" });
    for (const pane of ["w1:p4", "w1:p5", "w1:p6", "w1:p7"]) herdr.setStatus(pane, "idle");

    // The control pane's change comes after all of theirs, and a reconnect re-lists them all.
    herdr.setStatus("w1:p9", "idle");
    await log.until(/^posted job herdr-control attempt 1 pane w1:p9: idle/);
    herdr.dropConnections();
    await log.until(/^herdr: connected/, 2);
    herdr.setStatus("w1:p9", "working");
    await log.until(/^posted job herdr-control attempt 1 pane w1:p9: working/, 2);

    expect(await fingerprint(unmapped)).toEqual(before);
    for (const j of unmapped) expect(await observationsOf(j)).toEqual([]);
    // Nor a row of the change feed naming one of them.
    const feed = await call("GET", "/v1/events?limit=1000", service.operatorToken);
    const rows = (feed.body.items as { job_id: string; kind: string }[]).filter((r) => unmapped.includes(r.job_id));
    expect(rows.filter((r) => r.kind.startsWith("observation"))).toEqual([]);
    expect(await observationsOf("herdr-closed")).toEqual([["working", 1]]);
    expect(herdr.subscribed("pane.agent_status_changed", "w1:p8")).toBe(0);
    expect(log.count(/^(re-)?posted job herdr-(other|no-|closed attempt 1 pane w1:p8: idle)/)).toBe(0);
  }, 60_000);
});

describe("mam watch herdr, when mam or the pane goes away", () => {
  it("retries a post mam could not be reached for, and posts it once mam answers again", async () => {
    const jobId = "herdr-retry";
    await runningJob(jobId, { pane_id: "w3:p1", terminal_id: "term-retry" });
    // The network between the collector and mam fails for observation posts until told otherwise.
    let down = true;
    const failing: typeof fetch = (input, init) => {
      const request = new Request(input, init);
      if (down && request.method === "POST" && request.url.endsWith("/observations")) return Promise.reject(new TypeError("fetch failed"));
      return fetch(request);
    };
    const { log } = await watch("retry", [{ pane_id: "w3:p1", terminal_id: "term-retry", agent_status: "working" }], { fetch: failing });
    await log.until(/^mam: could not post for job herdr-retry attempt 1, will retry: /);
    expect(await observationsOf(jobId)).toEqual([]);
    down = false;
    await log.until(/^mam: reachable again/);
    await log.until(/^posted job herdr-retry attempt 1 pane w3:p1: working/);
    expect(log.count(/^mam: could not post/)).toBe(1);
    expect(await observationsOf(jobId)).toEqual([["working", 1]]);
  }, 30_000);

  it("ends a mapping for good on pane_exited: nothing is posted for the pane after it, whatever it shows", async () => {
    const jobId = "herdr-exited";
    await runningJob(jobId, { pane_id: "w3:p2", terminal_id: "term-exit" });
    await runningJob("herdr-exited-control", { pane_id: "w3:p3", terminal_id: "term-control" });
    const { herdr, log } = await watch("exited", [
      { pane_id: "w3:p2", terminal_id: "term-exit", agent_status: "working" },
      { pane_id: "w3:p3", terminal_id: "term-control", agent_status: "working" },
    ]);
    await log.until(/^posted job herdr-exited attempt 1 pane w3:p2: working/);
    herdr.exitPane("w3:p2");
    await log.until(/^pane w3:p2 pane_exited: job herdr-exited attempt 1 is no longer mapped, for good/);
    await herdr.until(() => herdr.subscribed("pane.agent_status_changed", "w3:p2") === 0, "the pane's status subscription closed");
    herdr.createPane({ pane_id: "w3:p2", terminal_id: "term-exit", agent_status: "idle" });
    herdr.dropConnections();
    await log.until(/^herdr: connected/, 2);
    // The control pane's change is posted after the re-list that would have posted the exited pane.
    herdr.setStatus("w3:p3", "idle");
    await log.until(/^posted job herdr-exited-control attempt 1 pane w3:p3: idle/);
    expect(log.count(/^(re-)?posted job herdr-exited /)).toBe(1);
    expect(await observationsOf(jobId)).toEqual([["working", 1]]);
  }, 30_000);
});

describe("the herdr socket client", () => {
  it("sends one request per connection with its own ids, and turns herdr's error answer into a HerdrError with herdr's code", async () => {
    const herdr = await FakeHerdr.start(path.join(tmp.dir, "client.sock"));
    try {
      herdr.createPane({ pane_id: "w4:p1", terminal_id: "term-1", agent_status: "done" });
      const socket = new HerdrSocket(herdr.path);
      const listed = await socket.request("pane.list", {});
      expect(listed).toMatchObject({
        type: "pane_list",
        panes: [{ pane_id: "w4:p1", terminal_id: "term-1", agent_status: "done", revision: 1 }],
      });
      const refused = await socket
        .subscribe([{ type: "pane.agent_status_changed", pane_id: "w4:nope" }], () => {})
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(HerdrError);
      expect((refused as HerdrError).code).toBe("pane_not_found");
      expect(herdr.requests.map((r) => r.id)).toEqual(["mam-1", "mam-2"]);
      expectSchemaConformance(herdr);
    } finally {
      await herdr.stop();
    }
  });
});

describe("herdr's pinned schema, as the tests read it", () => {
  it("rejects what herdr would not send or accept: a dotted lifecycle kind, a status event with a revision-only body, a request without params", () => {
    expect(
      herdrSchemaErrors("event", { event: "pane.closed", data: { type: "pane_closed", pane_id: "w1:p1", workspace_id: "w1" } }),
    ).not.toEqual([]);
    expect(
      herdrSchemaErrors("event", { event: "pane_closed", data: { type: "pane_closed", pane_id: "w1:p1", workspace_id: "w1" } }),
    ).toEqual([]);
    expect(
      herdrSchemaErrors("subscription_event", { event: "pane.agent_status_changed", data: { pane_id: "w1:p1", revision: 3 } }),
    ).not.toEqual([]);
    expect(herdrSchemaErrors("request", { id: "mam-1", method: "pane.list" })).not.toEqual([]);
    expect(herdrSchemaErrors("request", { id: "mam-1", method: "pane.list", params: {} })).toEqual([]);
    expect(
      herdrSchemaErrors("request", {
        id: "mam-2",
        method: "events.subscribe",
        params: { subscriptions: [{ type: "pane.agent_status_changed" }] },
      }),
    ).not.toEqual([]);
  });
});

describe("mam watch herdr, refused by mam", () => {
  it("logs mam's refusal (a token without the observe scope) and carries on: it never crashes, and posts the next change", async () => {
    const jobId = "herdr-refused";
    await runningJob(jobId, { pane_id: "w2:p1", terminal_id: "term-r" });
    const io = captureIo({});
    expect(await runCli(["token", "create", "--scope", "read", "--name", "herdr-read-only", "--data-dir", dataDir, "--json"], io)).toBe(0);
    const readOnly = JSON.parse(io.out.join("")).token as string;
    const herdr = await FakeHerdr.start(path.join(tmp.dir, "refused.sock"));
    herdr.createPane({ pane_id: "w2:p1", terminal_id: "term-r", agent_status: "working" });
    const log = new Log();
    const controller = new AbortController();
    const done = new HerdrCollector({
      herdr: new HerdrSocket(herdr.path),
      mam: mamPort(createMamClient({ baseUrl: service.url, token: readOnly })),
      clock,
      log: log.add,
      signal: controller.signal,
      discoveryMs: 50,
      tickMs: 50,
      backoff: { initialMs: 20, maxMs: 200 },
    }).run();
    try {
      await log.until(/^mam refused working for job herdr-refused attempt 1 pane w2:p1: /);
      herdr.setStatus("w2:p1", "idle");
      await log.until(/^mam refused idle for job herdr-refused attempt 1 pane w2:p1: /);
      expect(log.count(/^mam refused working/)).toBe(1);
      expect(await observationsOf(jobId)).toEqual([]);
    } finally {
      controller.abort();
      await done;
      await herdr.stop();
    }
    expectSchemaConformance(herdr);
  }, 30_000);
});

describe("mam watch herdr, the command", () => {
  it("needs herdr's socket, the service and a token; --once lists, posts what changed, and exits 0 without printing the token", async () => {
    const noSocket = captureIo({});
    expect(await runCli(["watch", "herdr", "--api", service.url, "--token", "t"], noSocket)).toBe(1);
    expect(noSocket.err.join("")).toContain("--socket PATH (or HERDR_SOCKET_PATH)");

    // herdr not there: --once did not do what was asked, exit 2 (nothing was reached), saying why on stderr.
    const absent = captureIo({ MAM_API_URL: service.url, MAM_TOKEN: watcherToken });
    expect(await runCli(["watch", "herdr", "--once", "--socket", path.join(tmp.dir, "absent.sock")], absent)).toBe(2);
    expect(absent.err.join("")).toMatch(/could not be reached/);

    const herdr = await FakeHerdr.start(path.join(tmp.dir, "once.sock"));
    try {
      herdr.createPane({ pane_id: "w9:p1", terminal_id: "term-z", agent_status: "idle" });
      const io = captureIo({ HERDR_SOCKET_PATH: herdr.path, MAM_API_URL: service.url, MAM_TOKEN: watcherToken });
      expect(await runCli(["watch", "herdr", "--once"], io)).toBe(0);
      const err = io.err.join("");
      expect(err).toMatch(/mam watch herdr: herdr: connected to .*once\.sock; 1 panes listed, 0 mapped/);
      expect(err).not.toContain(watcherToken);
      expect(herdr.asked("pane.list").length).toBe(1);
      // --once subscribes to nothing: it lists, posts what changed, and exits.
      expect(herdr.asked("events.subscribe").length).toBe(0);
    } finally {
      await herdr.stop();
    }
  }, 30_000);
});
