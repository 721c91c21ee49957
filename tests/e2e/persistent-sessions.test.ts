/**
 * Subscribers who were away (issue 11, item 3): the embedded broker of `mam serve`
 * keeps persistent sessions (`clean: false`) and their QoS 1 queues on disk under
 * the data dir, across a restart by SIGTERM and one by SIGKILL; the start-up sweep
 * runs once those sessions are loaded, so what was owed at the restart is queued
 * for the subscriber too. The subscriber connects once, leaves, and on its return
 * (asking for nothing again) receives every intent that was not superseded, with
 * its id, and nothing else.
 */
import { randomBytes } from "node:crypto";
import { readFile, stat } from "node:fs/promises";
import { runCli } from "@mam/cli";
import { dataDirPaths, MqttPublisher, startEmbeddedBroker } from "@mam/local";
import { Level } from "level";
import { connectAsync } from "mqtt";
import { afterEach, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { deadPort } from "../support/dead-port.ts";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { barrier, dataDirSubscriberToken, type Subscription, subscribe, subscriberLogins, subscriberToken } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";

const FILTER = "mam/jobs/+/events";

/** The intent id a notification carries. */
const intentOf = (payload: string): string => JSON.parse(payload).data.notification_intent.id;

describe("e2e: persistent sessions across mam serve restarts", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  it("a clean: false subscriber away over a SIGTERM and a SIGKILL restart receives every intent not superseded, with its id, and the superseded one never", async () => {
    const dir = (await tempDir("sessions")).dir;
    const mqttPort = await deadPort();
    // The interval sweep would run only after an hour: what the restart owes goes out by the start-up sweep.
    const env = { MAM_MQTT_PORT: String(mqttPort), MAM_SWEEP_INTERVAL_SECONDS: "3600" };
    let served: ServeProcess = await startServeProcess(dir, env, { cwd: dir, broker: true });
    cleanup.push(() => served.stop("SIGKILL"));
    const credentials = JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8"));
    const operator: string = credentials.operator_token;
    const call = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(new URL(path, served.url), {
        method,
        headers: { authorization: `Bearer ${operator}`, "content-type": "application/json" },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
      // biome-ignore lint/suspicious/noExplicitAny: the test walks JSON answers whose shape each assertion states
      return { status: res.status, body: (await res.json()) as Record<string, any> };
    };
    const register = async () => {
      const r = await call("POST", "/v1/jobs", { prompt: "p", agent: "codex" });
      expect(r.status).toBe(201);
      return String(r.body.job_id);
    };
    /** Every intent committed, by id: what the subscriber is owed unless superseded. */
    const owed = new Map<string, string>();
    const event = async (jobId: string, name: string) => {
      const r = await call("POST", `/v1/jobs/${jobId}/events`, { event: name });
      expect(r.status).toBe(200);
      const id = String(r.body.record.pending_notification.id);
      owed.set(id, `${jobId} ${name}`);
      return id;
    };

    // It connects once, subscribes at QoS 1 with a persistent session, and leaves.
    // It logs in with a read token of its own name (what `mam token create --scope read --name` prints).
    const token = await dataDirSubscriberToken(dir, "dashboard");
    const first = await subscribe(served.mqttUrl, FILTER, { clientId: "dashboard-away", clean: false, token });
    expect(first.sessionPresent()).toBe(false);
    await first.close();

    // Away: intents committed and published while it is gone, then a SIGTERM restart.
    const [a, b, c] = [await register(), await register(), await register()];
    await event(a, "started");
    await event(a, "progress");
    await event(b, "completed");
    expect(await served.stop("SIGTERM")).toBe(0);
    served = await startServeProcess(dir, env, { cwd: dir, broker: true });
    expect(served.mqttUrl).toBe(`mqtt://127.0.0.1:${mqttPort}`);

    // Still away: more, then a SIGKILL.
    await event(a, "progress");
    await event(a, "completed");
    await served.stop("SIGKILL");

    // While the service is down, the CLI commits on the data dir itself: no broker
    // answers, so it exits 2 and each intent stays owed; the second supersedes the first.
    const cli = async (name: string) => {
      const io = captureIo({});
      const args = [
        "publish-event",
        "--job",
        c,
        "--event",
        name,
        "--data-dir",
        dir,
        "--mqtt-url",
        `mqtt://127.0.0.1:${mqttPort}`,
        "--json",
      ];
      expect(await runCli(args, io)).toBe(2);
      return String(JSON.parse(io.out.join("")).record.pending_notification.id);
    };
    const superseded = await cli("started");
    owed.set(await cli("error"), `${c} error (sent by the start-up sweep)`);

    // The restart: the start-up sweep sends what is owed, once the broker has loaded the sessions.
    served = await startServeProcess(dir, env, { cwd: dir, broker: true });
    // Owed: c's error, and a's completed too when the SIGKILL came before the relay
    // had settled it (the request answers once the commit stands, before the publish).
    const sweep = JSON.parse(await served.line((l) => l.includes('"msg":"sweep"')));
    expect([1, 2]).toContain(sweep.owed);
    expect(sweep).toMatchObject({ sent: sweep.owed, failed: 0 });

    // It returns, asking for nothing again: its session and its queue were kept.
    const back: Subscription = await subscribe(served.mqttUrl, FILTER, {
      clientId: "dashboard-away",
      clean: false,
      subscribe: false,
      token,
    });
    cleanup.push(() => back.close());
    expect(back.sessionPresent()).toBe(true);
    // Superseded, as the change feed records it: a newer commit of its job overwrote
    // it while it was still owed (the relay publishes after the answer, so one of two
    // back-to-back events may be). It may or may not have gone out before that.
    const feedSuperseded = new Set<string>();
    for (let after = ""; ; ) {
      const page = await call("GET", `/v1/events?limit=1000${after === "" ? "" : `&after=${encodeURIComponent(after)}`}`);
      expect(page.status).toBe(200);
      for (const row of page.body.items) if (row.kind === "intent.superseded") feedSuperseded.add(String(row.intent_id));
      if (page.body.items.length === 0) break;
      after = String(page.body.cursor);
    }
    expect(feedSuperseded).toContain(superseded);
    for (const [id, what] of owed) {
      if (feedSuperseded.has(id)) continue;
      const m = await back
        .waitFor((x) => intentOf(x.payload) === id, 10_000)
        .catch(() => {
          throw new Error(`never received ${what} (${id})`);
        });
      expect(m.topic).toMatch(/^mam\/jobs\/[^/]+\/events$/);
    }
    // Nothing more is on its way: a marker published now arrives after everything queued before it.
    const publisher = new MqttPublisher({ url: served.mqttUrl, clientId: "test-barrier", ...credentials.mqtt });
    cleanup.push(() => publisher.close());
    const at = await barrier(back, publisher, "mam/jobs/barrier/events");
    const ids = new Set(back.received.slice(0, at).map((m) => intentOf(m.payload)));
    expect(
      [...ids].filter((id) => !owed.has(id)),
      "only intents that were committed",
    ).toEqual([]);
    expect(
      [...owed.keys()].filter((id) => !ids.has(id) && !feedSuperseded.has(id)),
      "delivered or superseded",
    ).toEqual([]);
    expect(ids).not.toContain(superseded);

    // The sessions are on disk under the data dir, private like the rest of it.
    expect((await stat(dataDirPaths(dir).broker)).mode & 0o777).toBe(0o700);
  }, 90_000);

  it("a connected clean: false subscriber gets every message live while four publishers publish at once (none held back until its next reconnection)", async () => {
    const dir = (await tempDir("sessions-live")).dir;
    const publisherCredentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
    const broker = await startEmbeddedBroker({ port: 0, publisherCredentials, sessionsDir: dataDirPaths(dir).broker, ...subscriberLogins });
    cleanup.push(() => broker.close());
    const sub = await subscribe(broker.url, FILTER, { clientId: "live-session", clean: false, token: subscriberToken() });
    cleanup.push(() => sub.close());
    const publishers = await Promise.all(
      [0, 1, 2, 3].map(async (w) => {
        const c = await connectAsync(broker.url, {
          protocolVersion: 4,
          reconnectPeriod: 0,
          clientId: `publisher-${w}`,
          ...publisherCredentials,
        });
        c.on("error", () => undefined);
        cleanup.push(() => c.endAsync(true));
        return c;
      }),
    );
    const PER_PUBLISHER = 500;
    await Promise.all(
      publishers.map(async (c, w) => {
        for (let i = 0; i < PER_PUBLISHER; i++) await c.publishAsync(`mam/jobs/${w}/events`, `${w}-${i}`, { qos: 1 });
      }),
    );
    // Every publish above was acknowledged before the marker was sent: it arrives after them.
    const marker = new MqttPublisher({ url: broker.url, clientId: "test-barrier", ...publisherCredentials });
    cleanup.push(() => marker.close());
    const at = await barrier(sub, marker, "mam/jobs/barrier/events");
    const got = new Set(sub.received.slice(0, at).map((m) => m.payload));
    const missing = publishers.flatMap((_, w) => Array.from({ length: PER_PUBLISHER }, (_, i) => `${w}-${i}`)).filter((p) => !got.has(p));
    expect(missing).toEqual([]);
  });

  it("a persistent session's queue is bounded (maxQueuedPerSession): beyond it nothing more is queued, the count survives a restart, and a drained session queues again", async () => {
    const dir = (await tempDir("sessions-bound")).dir;
    const sessionsDir = dataDirPaths(dir).broker;
    const publisherCredentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
    const full: string[] = [];
    const start = () =>
      startEmbeddedBroker({
        port: 0,
        publisherCredentials,
        sessionsDir,
        ...subscriberLogins,
        maxQueuedPerSession: 5,
        onSessionQueueFull: (id) => full.push(id),
      });
    const publishAll = async (url: string, from: number, to: number) => {
      const publisher = new MqttPublisher({ url, clientId: "bound-publisher", ...publisherCredentials });
      for (let i = from; i < to; i++) await publisher.publish("mam/jobs/j/events", `m${i}`);
      await publisher.close();
    };

    let broker = await start();
    const token = subscriberToken();
    const first = await subscribe(broker.url, FILTER, { clientId: "away-long", clean: false, token });
    await first.close();
    await publishAll(broker.url, 0, 8);
    expect(full).toEqual(["away-long"]);
    await broker.close();
    // Restarted on the same disk: the five still queued count, so two more are not queued either.
    broker = await start();
    cleanup.push(() => broker.close());
    await publishAll(broker.url, 8, 10);
    expect(full).toEqual(["away-long", "away-long"]);

    const back = await subscribe(broker.url, FILTER, { clientId: "away-long", clean: false, subscribe: false, token });
    cleanup.push(() => back.close());
    expect(back.sessionPresent()).toBe(true);
    // Drained, it is queued for again: this one arrives, after the five kept and nothing else.
    const marker = new MqttPublisher({ url: broker.url, clientId: "test-barrier", ...publisherCredentials });
    cleanup.push(() => marker.close());
    await back.waitFor((m) => m.payload === "m4");
    await publishAll(broker.url, 10, 11);
    const at = await barrier(back, marker, "mam/jobs/barrier/events");
    expect(back.received.slice(0, at).map((m) => m.payload)).toEqual(["m0", "m1", "m2", "m3", "m4", "m10"]);
  });

  it("a client whose filters overlap (mam/events and mam/#) counts once per message against its session's bound", async () => {
    const dir = await tempDir("sessions-overlap");
    cleanup.push(() => dir.remove());
    const full: string[] = [];
    const broker = await startEmbeddedBroker({
      port: 0,
      sessionsDir: dataDirPaths(dir.dir).broker,
      ...subscriberLogins,
      maxQueuedPerSession: 10,
      onSessionQueueFull: (id) => full.push(id),
    });
    cleanup.push(() => broker.close());
    const token = subscriberToken();
    const connectOverlapping = () =>
      connectAsync(broker.url, {
        protocolVersion: 4,
        reconnectPeriod: 0,
        clientId: "overlap",
        clean: false,
        username: "d",
        password: token,
      });
    const first = await connectOverlapping();
    // Both filters match mam/events: the broker matches the session twice, queues the message once.
    await first.subscribeAsync({ "mam/events": { qos: 1 }, "mam/#": { qos: 1 } });
    await first.endAsync();
    const publisher = broker.publisher();
    // Eight while away, under the bound of ten: each counted once, all queued (counted once per
    // filter, the sixth would already find the session full).
    for (let i = 0; i < 8; i++) await publisher.publish("mam/events", `away-${i}`);
    expect(full).toEqual([]);
    const back = await connectOverlapping();
    cleanup.push(() => back.endAsync(true));
    const returned: string[] = [];
    await new Promise<void>((resolve) => {
      back.on("message", (_topic, payload) => {
        returned.push(String(payload));
        if (returned.length === 8) resolve();
      });
    });
    expect(returned).toEqual(Array.from({ length: 8 }, (_, i) => `away-${i}`));
  });

  it("a retained publish is refused on the persistent broker too, and nothing retained is kept on disk to come back after a restart", async () => {
    const dir = (await tempDir("sessions-retained")).dir;
    const sessionsDir = dataDirPaths(dir).broker;
    const publisherCredentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
    const broker = await startEmbeddedBroker({ port: 0, publisherCredentials, sessionsDir, ...subscriberLogins });
    cleanup.push(() => broker.close());
    const sub = await subscribe(broker.url, "#", { clientId: "keeps-a-session", clean: false, token: subscriberToken() });
    cleanup.push(() => sub.close());
    const service = await connectAsync(broker.url, { protocolVersion: 4, reconnectPeriod: 0, ...publisherCredentials });
    service.on("error", () => undefined);
    const closed = new Promise<void>((resolve) => service.once("close", () => resolve()));
    service.publish("mam/jobs/j/events", "retained", { qos: 1, retain: true });
    await closed;
    await sub.close();
    await broker.close();

    const db = new Level<string, string>(sessionsDir);
    cleanup.push(() => db.close());
    const keys = await db.keys().all();
    // The session itself is there: the database is the one the broker used.
    expect(keys.some((k) => k.startsWith("subscriptions:keeps-a-session:"))).toBe(true);
    expect(keys.filter((k) => k.startsWith("retained:"))).toEqual([]);
    expect(keys.filter((k) => k.startsWith("outgoing:"))).toEqual([]);
  });
});
