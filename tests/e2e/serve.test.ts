import { randomUUID } from "node:crypto";
import { readFile, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { runCli } from "@mam/cli";
import { dataDirPaths, MqttPublisher, openEmbeddedJobStore } from "@mam/local";
import { connectAsync } from "mqtt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureIo, publishCompletedArgs } from "../support/cli-io.ts";
import { jobRecord } from "../support/records.ts";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { barrier, dataDirSubscriberToken, subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";

/**
 * The whole flow against a real `mam serve` process (what `npm start` runs): an
 * operator registers and dispatches, the agent works with its own token, the
 * watcher asks the gate, and a plain MQTT subscriber receives the completion.
 */
const ROOT = new URL("../..", import.meta.url).pathname;
const SCENARIO = JSON.parse(await readFile(join(ROOT, "fixtures/watcher/finalized_candidate.json"), "utf8"));

describe("e2e: mam serve", () => {
  let dir: string;
  let served: ServeProcess;
  let operator: string;

  beforeAll(async () => {
    dir = (await tempDir("e2e")).dir;
    served = await startServeProcess(dir, { MAM_AUTO_COMPLETE: "1" }, { cwd: dir, broker: true });
    operator = JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8")).operator_token;
  }, 30_000);

  afterAll(async () => {
    if (served) await served.stop();
    await rm(dir, { recursive: true, force: true });
  });

  const call = async (token: string, method: string, path: string, body?: unknown, raw?: string) => {
    const res = await fetch(new URL(path, served.url), {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body !== undefined ? { "content-type": "application/json" } : {}),
        ...(raw !== undefined ? { "content-type": "text/markdown" } : {}),
      },
      ...(body !== undefined ? { body: JSON.stringify(body) } : raw !== undefined ? { body: raw } : {}),
    });
    // biome-ignore lint/suspicious/noExplicitAny: the test walks JSON answers whose shape each assertion states
    return { status: res.status, body: (await res.json()) as Record<string, any> };
  };

  it("writes the operator token to credentials.json with mode 0600 and says where", async () => {
    const s = await stat(dataDirPaths(dir).credentials);
    expect(s.mode & 0o777).toBe(0o600);
    expect(served.stderr()).toContain(dataDirPaths(dir).credentials);
  });

  it("register, dispatch, the agent claims, uploads and finalizes, the watcher evaluates, a subscriber receives the completion with its intent id", async () => {
    const sub = await subscribe(served.mqttUrl, "mam/jobs/+/events");
    try {
      const reg = await call(operator, "POST", "/v1/jobs", { prompt: "fix the flaky test", agent: "claude-code", auto_complete: true });
      expect(reg.status).toBe(201);
      const jobId = reg.body.job_id as string;
      const ctx = SCENARIO.dispatch_context;
      const dispatch = await call(operator, "POST", `/v1/jobs/${jobId}/dispatches`, {
        attempt_id: ctx.attempt_id,
        agent_session_uuid: ctx.agent_session_uuid,
        pane_process_generation: ctx.pane_process_generation,
        anchor: { started_at: "2026-11-20T09:59:00Z" },
      });
      expect(dispatch.status).toBe(201);
      const agent = dispatch.body.agent_token as string;

      // The agent's token is good for its own job only.
      expect((await call(agent, "GET", "/v1/jobs")).status).toBe(403);
      const claim = await call(agent, "POST", `/v1/jobs/${jobId}/transitions`, { action: "claim", expected_seq: 0 });
      expect(claim.status).toBe(200);
      expect(claim.body.status).toBe("running");
      expect((await call(agent, "PUT", `/v1/jobs/${jobId}/attempts/1/report`, undefined, "# Report\n\nFixed the race.\n")).status).toBe(
        201,
      );
      const fin = await call(agent, "POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { side_effects: [] });
      expect(fin.status).toBe(200);
      // A URI in the store's own namespace, never the server's path to the file.
      expect(fin.body.manifest.report_location).toBe(`mam-file:///reports/${jobId}/1/report-final.md`);
      expect((await call(agent, "POST", `/v1/jobs/${jobId}/evaluations`, { scenario: {} })).status).toBe(403);

      const scenario = structuredClone(SCENARIO);
      scenario.dispatch_context.job_id = jobId;
      for (const item of scenario.timeline) {
        item.collector_attribution.job_id = jobId;
        if (item.source_kind !== "herdr" && item.payload?.job_id !== undefined) item.payload.job_id = jobId;
      }
      const gate = await call(operator, "POST", `/v1/jobs/${jobId}/evaluations`, { scenario });
      expect(gate.status).toBe(200);
      expect(gate.body.committed, gate.body.reason).toBe(true);
      const intent = gate.body.record.pending_notification;
      expect(intent.event).toBe("completed");

      const message = await sub.next(10_000);
      expect(message.topic).toBe(`mam/jobs/${jobId}/events`);
      const payload = JSON.parse(message.payload);
      expect(payload).toMatchObject({
        event: "completed",
        job_id: jobId,
        data: { notification_intent: { id: intent.id, seq: intent.seq } },
      });

      // The relay settled it: nothing is owed any more.
      await expect
        .poll(async () => (await call(operator, "GET", `/v1/jobs/${jobId}`)).body.pending_notification, { timeout: 5000 })
        .toBeUndefined();
      const job = await call(operator, "GET", `/v1/jobs/${jobId}`);
      expect(job.body).toMatchObject({ status: "completed", completed_by: "auto_complete" });
    } finally {
      await sub.close();
    }
  });

  it("the agent's `mam` command in API mode: publish-event uploads, finalizes and completes; verify re-derives the hash", async () => {
    const reg = await call(operator, "POST", "/v1/jobs", { prompt: "p", agent: "codex", expected_artifacts: ["git_push"] });
    const jobId = reg.body.job_id as string;
    const dispatch = await call(operator, "POST", `/v1/jobs/${jobId}/dispatches`, {
      attempt_id: 1,
      agent_session_uuid: "0c9a2d11-0000-4000-8000-000000000001",
      pane_process_generation: 1,
    });
    const agent = dispatch.body.agent_token as string;
    const tree = (await tempDir("agent")).dir;
    await writeFile(join(tree, "report-final.md.tmp"), "# done\n\npushed a1b2c3d\n");
    const sub = await subscribe(served.mqttUrl, `mam/jobs/${jobId}/events`);
    const io = captureIo({ MAM_API_URL: served.url, MAM_TOKEN: agent });
    const { out, err } = io;
    const report = join(tree, "report-final.md");
    const publishCompleted = (sideEffect: string, ...more: string[]) =>
      runCli([...publishCompletedArgs(jobId, report, sideEffect), ...more], io);
    try {
      const bad = await publishCompleted("git_push");
      expect(bad, err.join("")).toBe(1);
      expect((await call(operator, "GET", `/v1/jobs/${jobId}`)).body.status).toBe("pending");

      const code = await publishCompleted("git_push=a1b2c3d", "--json");
      expect(code, err.join("")).toBe(0);
      // The service's relay publishes; the answer does not claim to know whether it has yet.
      const answer = JSON.parse(out.at(-1) ?? "{}");
      expect(answer).toMatchObject({ record: { status: "completed" } });
      expect(answer).not.toHaveProperty("published");
      const message = JSON.parse((await sub.next(10_000)).payload);
      expect(message).toMatchObject({ event: "completed", job_id: jobId });

      const verify = await runCli(["verify", "--job", jobId, "--attempt", "1", "--json", "--token", operator], io);
      expect(verify, err.join("")).toBe(0);
      expect(JSON.parse(out.at(-1) ?? "{}")).toMatchObject({
        ok: true,
        manifest: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
      });
      // The agent finalizing the bytes it completed on again is told it is done (exit 0);
      // other bytes find the report tree frozen, and the CLI says so with exit 1.
      expect(await runCli(["finalize", "--job", jobId, "--attempt", "1", "--report", report, "--json"], io), err.join("")).toBe(0);
      expect(JSON.parse(out.at(-1) ?? "{}")).toMatchObject({ already_completed: true, record: { status: "completed" } });
      await writeFile(join(tree, "report-final.md.tmp"), "# done\n\npushed something else\n");
      expect(await runCli(["finalize", "--job", jobId, "--attempt", "1", "--report", report], io), err.join("")).toBe(1);
      expect(err.join("")).toMatch(/frozen/);
    } finally {
      await sub.close();
      await rm(tree, { recursive: true, force: true });
    }
  });

  it("the `mam` command says so, with exit 2, when the service cannot be reached", async () => {
    const { err, ...io } = captureIo();
    const code = await runCli(["publish-event", "--job", "j", "--event", "started", "--api", "http://127.0.0.1:9", "--token", "t"], io);
    expect(code).toBe(2);
    expect(err.join("")).toMatch(/could not be reached/);
  });

  it("the embedded broker lets anyone subscribe but only the service publish under mam/", async () => {
    const sub = await subscribe(served.mqttUrl, "mam/#");
    const spoofer = await connectAsync(served.mqttUrl, { protocolVersion: 4, reconnectPeriod: 0 });
    spoofer.on("error", () => undefined);
    try {
      const forged = JSON.stringify({ event: "completed", job_id: "victim", seq: 1, data: {} });
      // aedes answers an unauthorized publish by dropping the connection: the publish never acks.
      const dropped = new Promise<never>((_, reject) => spoofer.once("close", () => reject(new Error("connection dropped, no ack"))));
      await expect(Promise.race([spoofer.publishAsync("mam/jobs/victim/events", forged, { qos: 1 }), dropped])).rejects.toThrow();
      // the service's own publish, sent after the refused one, is the first thing the subscriber gets
      const { mqtt } = JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8")) as {
        mqtt: { username: string; password: string };
      };
      const service = new MqttPublisher({ url: served.mqttUrl, ...mqtt });
      const silenceEnds = await barrier(sub, service, "mam/barrier").finally(() => service.close());
      expect(sub.received.slice(0, silenceEnds)).toEqual([]);
    } finally {
      await spoofer.endAsync(true);
      await sub.close();
    }
  });

  it("logs one JSON line per request", () => {
    const lines = served
      .stdout()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    const requests = lines.filter((l) => l.msg === "request");
    expect(requests.length).toBeGreaterThan(5);
    expect(requests.every((l) => typeof l.request_id === "string" && typeof l.status === "number")).toBe(true);
  });

  it("a publish nobody could deliver stays owed across a SIGTERM and is sent by the sweep after a restart", async () => {
    // A subscriber with a persistent session, away over the restart: what the start-up
    // sweep sends is queued for it (a clean-session subscriber would catch up from the feed).
    const clientId = `owed-${randomUUID().slice(0, 8)}`;
    const token = await dataDirSubscriberToken(dir);
    await (await subscribe(served.mqttUrl, "mam/jobs/owed-across-restart/events", { clientId, clean: false, token })).close();
    // Commit an intent behind the service's back (as the CLI in another process would),
    // with the service stopped: nothing can send it until the restarted sweep does.
    // The request log is written in batches; a SIGTERM right after a request loses no line.
    const last = await fetch(new URL("/healthz", served.url), { headers: { "x-request-id": "last-before-sigterm" } });
    expect(last.status).toBe(200);
    expect(await served.stop()).toBe(0);
    expect(served.stderr()).toContain("stopped");
    expect(served.stdout()).toContain('"request_id":"last-before-sigterm"');
    const { jobs: store, close } = openEmbeddedJobStore(dataDirPaths(dir).database);
    const now = new Date().toISOString();
    await store.create(jobRecord("owed-across-restart", { agent: "codex", iteration: 1, created_at: now, updated_at: now }));
    const intent = { id: "intent-restart-1", event: "error", seq: 1, created_at: now };
    await store.transition("owed-across-restart", 0, {
      from: ["pending"],
      set: { status: "error", updated_at: now, pending_notification: intent },
    });
    await close();

    // The start-up sweep sends it at once, after the broker loaded its sessions from disk.
    served = await startServeProcess(dir, { MAM_AUTO_COMPLETE: "1", MAM_SWEEP_INTERVAL_SECONDS: "3" }, { cwd: dir, broker: true });
    const sub = await subscribe(served.mqttUrl, "mam/jobs/owed-across-restart/events", { clientId, clean: false, subscribe: false, token });
    try {
      const message = await sub.next(10_000);
      expect(JSON.parse(message.payload).data.notification_intent.id).toBe("intent-restart-1");
    } finally {
      await sub.close();
    }
    await expect
      .poll(async () => (await call(operator, "GET", "/v1/jobs/owed-across-restart")).body.pending_notification, { timeout: 5000 })
      .toBeUndefined();
  }, 40_000);
});
