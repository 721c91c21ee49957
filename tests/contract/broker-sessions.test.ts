/**
 * Subscribers who log in (issue 17): on the embedded broker a persistent session
 * (`clean: false`) needs a login, an operator token with the read scope and a name as
 * the MQTT password, and it belongs to the token's name. Real aedes, real mqtt.js
 * clients, a real token service: the takeover that issue 17 found (an anonymous
 * client with the subscriber's client id receiving its queue) is refused with
 * CONNACK 2, and the owner, with a renewed token of the same name, receives its
 * queue after a broker restart; the caps on sessions per name, in all, and on a
 * session's queued bytes; and nobody but the service publishes or leaves a will.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createTokenService, verifySubscriberLogin } from "@mam/api";
import { systemClock } from "@mam/core";
import { CONNACK, type EmbeddedBroker, type EmbeddedBrokerOptions, startEmbeddedBroker } from "@mam/local";
import { connectAsync, type IClientOptions } from "mqtt";
import { afterEach, describe, expect, it } from "vitest";
import { barrier, subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";

const tokens = createTokenService({ signingKey: randomBytes(32).toString("hex"), clock: systemClock });
const publisherCredentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
const readToken = (name: string) => tokens.mintOperator(["read"], { name });

/** The CONNACK return code a CONNECT is answered with (0: accepted). */
async function connackOf(url: string, options: IClientOptions): Promise<number> {
  try {
    const c = await connectAsync(url, { protocolVersion: 4, reconnectPeriod: 0, connectTimeout: 3000, ...options });
    await c.endAsync(true);
    return 0;
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    if (typeof code !== "number") throw e;
    return code;
  }
}

describe("the embedded broker's persistent sessions belong to a logged-in name", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  async function start(sessionsDir: string | undefined, extra: Partial<EmbeddedBrokerOptions> = {}): Promise<EmbeddedBroker> {
    const broker = await startEmbeddedBroker({
      port: 0,
      publisherCredentials,
      serviceClientId: "mam-service",
      verifySubscriber: (token) => verifySubscriberLogin(tokens, token),
      ...(sessionsDir === undefined ? {} : { sessionsDir }),
      ...extra,
    });
    cleanup.push(() => broker.close());
    return broker;
  }

  const notification = () => {
    const jobId = `job-${randomUUID().slice(0, 8)}`;
    return { topic: `mam/jobs/${jobId}/events`, payload: JSON.stringify({ event: "completed", job_id: jobId, id: randomUUID() }) };
  };

  it("a session store that cannot be opened (another broker holds it) is store.unavailable naming the store and LevelDB's reason", async () => {
    const dir = await tempDir("held-sessions");
    cleanup.push(() => dir.remove());
    const sessionsDir = `${dir.dir}/broker`;
    await start(sessionsDir);
    await expect(start(sessionsDir)).rejects.toMatchObject({
      code: "store.unavailable",
      message: expect.stringMatching(new RegExp(`^the broker's session store ${sessionsDir} could not be opened: .*LOCK`)),
    });
  });

  it("an anonymous client, or another name, with the owner's client id is refused (CONNACK 2); the owner's renewed token gets every queued message after a restart", async () => {
    const dir = await tempDir("owned-sessions");
    cleanup.push(() => dir.remove());
    const sessionsDir = `${dir.dir}/broker`;
    let broker = await start(sessionsDir);
    const clientId = `dashboard-${randomUUID().slice(0, 8)}`;

    const first = await subscribe(broker.url, "mam/jobs/+/events", { clientId, clean: false, token: readToken("dashboard") });
    await first.close();
    const publisher = broker.publisher();
    const sent = [notification(), notification(), notification()];
    for (const n of sent) await publisher.publish(n.topic, n.payload);

    // The takeover of issue 17: an anonymous CONNECT with the id, persistent or clean (which would wipe it).
    expect(await connackOf(broker.url, { clientId, clean: false })).toBe(CONNACK.IDENTIFIER_REJECTED);
    expect(await connackOf(broker.url, { clientId, clean: true })).toBe(CONNACK.IDENTIFIER_REJECTED);
    // Another name's valid read token: refused the same way.
    expect(await connackOf(broker.url, { clientId, clean: false, username: "x", password: readToken("intruder") })).toBe(
      CONNACK.IDENTIFIER_REJECTED,
    );
    // The ownership lives on disk beside the sessions.
    expect(JSON.parse(await readFile(`${sessionsDir}-owners.json`, "utf8"))).toEqual({ version: 1, owners: { [clientId]: "dashboard" } });

    await broker.close();
    broker = await start(sessionsDir);
    expect(await connackOf(broker.url, { clientId, clean: false })).toBe(CONNACK.IDENTIFIER_REJECTED);

    // A renewed token of the same name (another token id) is the same subscriber.
    const renewed = readToken("dashboard");
    const back = await subscribe(broker.url, "mam/jobs/+/events", { clientId, clean: false, token: renewed, subscribe: false });
    cleanup.push(() => back.close());
    expect(back.sessionPresent()).toBe(true);
    for (const n of sent) expect(await back.next()).toEqual(n);
    // And nothing else: a marker published after them arrives next.
    const marker = notification();
    await barrier(back, { publish: (topic, payload) => broker.publisher().publish(topic, payload) }, marker.topic);
    expect(back.received.slice(0, 3)).toEqual(sent);
    expect(back.received).toHaveLength(4);
  });

  it("a persistent session needs a login: anonymous clean: false is refused (5), as are agent tokens, tokens without read or without a name (4); anonymous clean: true is welcome on loopback", async () => {
    const broker = await start(undefined);
    expect(await connackOf(broker.url, { clientId: "anon-persistent", clean: false })).toBe(CONNACK.NOT_AUTHORIZED);
    const agent = tokens.mintAgent("job-1", 1).token;
    expect(await connackOf(broker.url, { clientId: "agent", clean: false, username: "a", password: agent })).toBe(
      CONNACK.BAD_USERNAME_OR_PASSWORD,
    );
    const writeOnly = tokens.mintOperator(["write"], { name: "w" });
    expect(await connackOf(broker.url, { clientId: "w", clean: false, username: "a", password: writeOnly })).toBe(
      CONNACK.BAD_USERNAME_OR_PASSWORD,
    );
    const nameless = tokens.mintOperator(["read"]);
    expect(await connackOf(broker.url, { clientId: "n", clean: false, username: "a", password: nameless })).toBe(
      CONNACK.BAD_USERNAME_OR_PASSWORD,
    );
    const forged = createTokenService({ signingKey: randomBytes(32).toString("hex"), clock: systemClock }).mintOperator(["read"], {
      name: "dashboard",
    });
    expect(await connackOf(broker.url, { clientId: "f", clean: false, username: "a", password: forged })).toBe(
      CONNACK.BAD_USERNAME_OR_PASSWORD,
    );
    expect(await connackOf(broker.url, { clean: true })).toBe(0);
  });

  it("beyond loopback, anonymous clients are refused (5) and a logged-in one is welcome", async () => {
    const broker = await start(undefined, { host: "0.0.0.0" });
    const url = `mqtt://127.0.0.1:${broker.port}`;
    expect(await connackOf(url, { clean: true })).toBe(CONNACK.NOT_AUTHORIZED);
    expect(await connackOf(url, { clean: true, username: "d", password: readToken("dashboard") })).toBe(0);
  });

  it("one name owns at most maxSessionsPerName persistent sessions (the next is refused, 5), the broker at most maxSessions (3); a clean: true CONNECT by the owner frees one", async () => {
    const refused: string[] = [];
    const broker = await start(undefined, {
      maxSessionsPerName: 2,
      maxSessions: 3,
      onConnectRefused: (_id, code, reason) => refused.push(`${code} ${reason}`),
    });
    const login = (name: string) => ({ username: name, password: readToken(name) });
    expect(await connackOf(broker.url, { clientId: "a-1", clean: false, ...login("a") })).toBe(0);
    expect(await connackOf(broker.url, { clientId: "a-2", clean: false, ...login("a") })).toBe(0);
    expect(await connackOf(broker.url, { clientId: "a-3", clean: false, ...login("a") })).toBe(CONNACK.NOT_AUTHORIZED);
    expect(refused.at(-1)).toMatch(/a already owns 2 persistent sessions/);
    // Its own session again is not a new one.
    expect(await connackOf(broker.url, { clientId: "a-2", clean: false, ...login("a") })).toBe(0);
    expect(await connackOf(broker.url, { clientId: "b-1", clean: false, ...login("b") })).toBe(0);
    expect(await connackOf(broker.url, { clientId: "b-2", clean: false, ...login("b") })).toBe(CONNACK.SERVER_UNAVAILABLE);
    expect(refused.at(-1)).toMatch(/keeps 3 persistent sessions/);
    // The owner ends one of its sessions: the name has room again.
    expect(await connackOf(broker.url, { clientId: "a-1", clean: true, ...login("a") })).toBe(0);
    expect(await connackOf(broker.url, { clientId: "a-3", clean: false, ...login("a") })).toBe(0);
  });

  it("a session's queue is bounded in bytes, not only in messages", async () => {
    const dir = await tempDir("queued-bytes");
    cleanup.push(() => dir.remove());
    const full: string[] = [];
    const broker = await start(`${dir.dir}/broker`, { maxQueuedBytesPerSession: 2000, onSessionQueueFull: (id) => full.push(id) });
    const token = readToken("dashboard");
    const away = await subscribe(broker.url, "mam/#", { clientId: "bytes-1", clean: false, token });
    await away.close();
    const publisher = broker.publisher();
    // 10 messages of ~600 bytes: three fit in 2,000 bytes.
    const sent = Array.from({ length: 10 }, () => ({ topic: "mam/events", payload: "x".repeat(590) }));
    for (const n of sent) await publisher.publish(n.topic, n.payload);
    expect(full).toEqual(["bytes-1"]);
    const back = await subscribe(broker.url, "mam/#", { clientId: "bytes-1", clean: false, token, subscribe: false });
    cleanup.push(() => back.close());
    for (let i = 0; i < 3; i++) expect(await back.next()).toEqual(sent[i]);
    await barrier(back, publisher, "mam/events");
    expect(back.received).toHaveLength(4);
  });

  it("nobody but the service publishes or leaves a will, logged-in subscribers included", async () => {
    const broker = await start(undefined);
    const token = readToken("dashboard");
    const sub = await subscribe(broker.url, "#");
    cleanup.push(() => sub.close());
    for (const options of [{}, { username: "d", password: token }]) {
      const c = await connectAsync(broker.url, { protocolVersion: 4, reconnectPeriod: 0, ...options });
      c.on("error", () => undefined);
      cleanup.push(() => c.endAsync(true));
      const closed = new Promise<void>((resolve) => c.once("close", () => resolve()));
      c.publish("elsewhere/junk", "junk", { qos: 2 });
      await closed;
      expect(
        await connackOf(broker.url, { ...options, will: { topic: "elsewhere/will", payload: Buffer.from("w"), qos: 0, retain: false } }),
      ).toBe(CONNACK.NOT_AUTHORIZED);
    }
    const marker = await barrier(sub, broker.publisher(), "mam/events");
    expect(sub.received.slice(0, marker)).toEqual([]);
  });
});
