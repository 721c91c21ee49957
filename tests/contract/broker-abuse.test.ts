/**
 * The embedded broker against anonymous clients doing what an attacker would, each
 * with a real MQTT client (mqtt.js) on the real broker: an oversized packet, a
 * retained message, `$SYS`, the service's client id. In every case the abuse is
 * refused and the service keeps publishing: a live notification published after it
 * reaches a subscriber. And the service's publisher reconnects on its own after its
 * connection is dropped.
 */
import { randomBytes, randomUUID } from "node:crypto";
import net from "node:net";
import { DEFAULT_MAX_PACKET_BYTES, type EmbeddedBroker, MqttPublisher, startEmbeddedBroker } from "@mam/local";
import { connectAsync, type IClientOptions, type MqttClient } from "mqtt";
import mqttPacket from "mqtt-packet";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type Subscription, subscribe } from "../support/subscriber.ts";

const SERVICE_CLIENT_ID = "mam-service";
const MiB = 1024 * 1024;

/** Settles with `p`, or rejects naming `what` if nothing happened within `ms`. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** What the service publisher reported about its connection, awaited in order. */
class ConnectionWatch {
  readonly seen: boolean[] = [];
  #read = 0;
  #waiting: (() => void) | undefined;

  readonly record = (connected: boolean): void => {
    this.seen.push(connected);
    this.#waiting?.();
  };

  /** The next change the publisher reports. */
  async next(timeoutMs = 5000): Promise<boolean> {
    if (this.#read === this.seen.length) {
      await within(
        new Promise<void>((resolve) => {
          this.#waiting = resolve;
        }),
        timeoutMs,
        "the publisher's next connection change",
      );
      this.#waiting = undefined;
    }
    return this.seen[this.#read++] as boolean;
  }
}

describe("the embedded broker under abuse: each refused, and the service keeps publishing", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  const publisherCredentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  let broker: EmbeddedBroker;
  let watch: ConnectionWatch;
  let service: MqttPublisher;
  let sub: Subscription;

  async function startBroker(port = 0, extra: { refusePublish?: (topic: string) => boolean } = {}): Promise<EmbeddedBroker> {
    const b = await startEmbeddedBroker({ port, publisherCredentials, serviceClientId: SERVICE_CLIENT_ID, ...extra });
    cleanup.push(() => b.close());
    return b;
  }

  /** The service publishes a notification; a subscriber receives exactly it. */
  async function liveNotification(to: Subscription = sub): Promise<void> {
    const jobId = `live-${randomUUID().slice(0, 8)}`;
    const topic = `mam/jobs/${jobId}/events`;
    const payload = JSON.stringify({
      event: "completed",
      job_id: jobId,
      seq: 1,
      data: { notification_intent: { id: randomUUID(), seq: 1 } },
    });
    await service.publish(topic, payload);
    expect(await to.next()).toEqual({ topic, payload });
  }

  async function client(options: IClientOptions = {}): Promise<MqttClient> {
    const c = await connectAsync(broker.url, { protocolVersion: 4, reconnectPeriod: 0, connectTimeout: 3000, ...options });
    c.on("error", () => undefined);
    cleanup.push(() => c.endAsync(true));
    return c;
  }

  const closed = (c: MqttClient | net.Socket, what: string): Promise<void> =>
    within(new Promise<void>((resolve) => c.once("close", () => resolve())), 5000, what);

  beforeEach(async () => {
    broker = await startBroker();
    watch = new ConnectionWatch();
    service = new MqttPublisher({
      url: broker.url,
      clientId: SERVICE_CLIENT_ID,
      ...publisherCredentials,
      reconnectPeriodMs: 50,
      onConnectionChange: watch.record,
    });
    cleanup.push(() => service.close());
    // Everything a wildcard subscriber sees (`#` never matches `$SYS`).
    sub = await subscribe(broker.url, "#");
    cleanup.push(() => sub.close());
    await liveNotification();
    expect(await watch.next()).toBe(true);
  });

  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  it("a packet over the limit closes its connection once its header has arrived, before its body is read", async () => {
    // A raw client: it announces a 100 MiB publish and sends no byte of the body.
    const socket = net.connect(broker.port, "127.0.0.1");
    cleanup.push(async () => socket.destroy());
    socket.on("error", () => undefined);
    const connack = within(new Promise((resolve) => socket.once("data", resolve)), 5000, "CONNACK");
    // CONNECT, MQTT 3.1.1, clean session, keepalive 60, client id "raw".
    socket.write(Buffer.from([0x10, 15, 0, 4, ...Buffer.from("MQTT"), 4, 0x02, 0, 60, 0, 3, ...Buffer.from("raw")]));
    expect(await connack).toEqual(Buffer.from([0x20, 2, 0, 0]));
    const remaining = 2 + "elsewhere/big".length + 100 * MiB;
    const length = [
      (remaining % 128) | 0x80,
      (Math.floor(remaining / 128) % 128) | 0x80,
      (Math.floor(remaining / 16_384) % 128) | 0x80,
      Math.floor(remaining / 2_097_152),
    ];
    socket.write(Buffer.from([0x30, ...length, 0, 13, ...Buffer.from("elsewhere/big")]));
    await closed(socket, "the broker closing an oversized publish");
    await liveNotification();
  });

  it("an oversized publish from mqtt.js (100 MiB) is refused and never delivered; one at the limit is", async () => {
    // The limit counts the whole packet: fixed header (1 + 3 length bytes), topic
    // (2 + 11), packet id (2, QoS 1), payload.
    const atLimit = DEFAULT_MAX_PACKET_BYTES - 1 - 3 - 2 - "elsewhere/x".length - 2;
    // With the service's login (nobody else may publish at all), so what is refused is the size.
    const chatty = await client(publisherCredentials);
    await chatty.publishAsync("elsewhere/x", Buffer.alloc(atLimit, "a"), { qos: 1 });
    expect((await sub.next()).payload).toHaveLength(atLimit);

    const oneOver = await client(publisherCredentials);
    oneOver.publish("elsewhere/x", Buffer.alloc(atLimit + 1, "b"), { qos: 1 }, () => undefined);
    await closed(oneOver, "the broker closing a publish one byte over the limit");

    const huge = await client(publisherCredentials);
    huge.publish("elsewhere/huge", Buffer.alloc(100 * MiB, "c"), { qos: 0 }, () => undefined);
    await closed(huge, "the broker closing a 100 MiB publish");
    // The first message after them is the service's: neither oversized one was delivered.
    await liveNotification();
  });

  it("a retained publish is refused, anonymous or the service's own: its connection closes, and a new subscriber receives no retained message", async () => {
    const anonymous = await client();
    anonymous.publish("elsewhere/state", Buffer.alloc(1024, "r"), { qos: 1, retain: true }, () => undefined);
    await closed(anonymous, "the broker closing an anonymous retained publish");
    // mam's notifications are events, not state: not even the service's credentials may retain.
    const withServiceLogin = await client({ ...publisherCredentials, clientId: "mam-cli-1" });
    withServiceLogin.publish("mam/jobs/retained/events", "{}", { qos: 1, retain: true }, () => undefined);
    await closed(withServiceLogin, "the broker closing the service's retained publish");
    // Neither was delivered live either.
    await liveNotification();

    // A retained message is sent to a new subscriber right after its SUBACK, before
    // anything published later: so the first message is the live one, or there was one.
    const late = await subscribe(broker.url, "#");
    cleanup.push(() => late.close());
    await liveNotification(late);
  });

  it("a will is refused with its CONNECT, anyone's but the service's (which sets none), so none is kept to be published after a crash", async () => {
    for (const will of [
      { topic: "status/me", payload: Buffer.from("offline"), qos: 1 as const, retain: false },
      { topic: "status/me", payload: Buffer.from("offline"), qos: 1 as const, retain: true },
      { topic: "mam/jobs/spoof/events", payload: Buffer.from("{}"), qos: 1 as const, retain: false },
      { topic: "$SYS/spoof", payload: Buffer.from("x"), qos: 0 as const, retain: false },
    ]) {
      await expect(client({ clientId: `will-${randomUUID().slice(0, 8)}`, will }), will.topic).rejects.toMatchObject({ code: 5 }); // not authorized
    }
    // Not even the service's login may leave one that could never be published.
    await expect(
      client({ ...publisherCredentials, will: { topic: "$SYS/spoof", payload: Buffer.from("x"), qos: 0, retain: false } }),
    ).rejects.toMatchObject({ code: 5 });
    await liveNotification();
  });

  it("a subscriber that never reads holds the service's publishes only until the broker drops it (more than its outgoing bound behind, or past its drain timeout, whichever comes first), never past the publish timeout", async () => {
    const bounded = await startEmbeddedBroker({ port: 0, publisherCredentials, drainTimeoutMs: 300 });
    cleanup.push(() => bounded.close());
    const honest = await subscribe(bounded.url, "mam/jobs/after/events");
    cleanup.push(() => honest.close());
    // A raw client subscribes to everything under mam/ and then stops reading its socket.
    const deaf = net.connect(bounded.port, "127.0.0.1");
    cleanup.push(async () => deaf.destroy());
    deaf.on("error", () => undefined);
    const parser = mqttPacket.parser();
    const suback = within(
      new Promise<void>((resolve) => {
        parser.on("packet", (p) => {
          if (p.cmd === "suback") resolve();
        });
        deaf.on("data", (d) => parser.parse(d));
      }),
      5000,
      "SUBACK",
    );
    deaf.write(
      mqttPacket.generate({ cmd: "connect", protocolId: "MQTT", protocolVersion: 4, clean: true, clientId: "deaf", keepalive: 0 }),
    );
    deaf.write(mqttPacket.generate({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "mam/#", qos: 1 }] }));
    await suback;
    deaf.pause();
    // Large messages (60 KB, under the packet bound), 24 MB in all: more than its socket
    // and the kernel's buffers hold, so deliveries to it stall; the broker drops it once
    // it is more than its outgoing bound behind (MAM_MQTT_MAX_OUTGOING_BYTES), and a
    // publish waits at most the drain timeout in any case.
    const publisher = bounded.publisher({ timeoutMs: 3000 });
    const payload = "x".repeat(60_000);
    let slowest = 0;
    for (let i = 0; i < 400; i++) {
      const started = performance.now();
      await publisher.publish(`mam/jobs/flood-${i}/events`, payload);
      slowest = Math.max(slowest, performance.now() - started);
    }
    expect(slowest).toBeLessThan(3000);
    // Read again, it finds its connection closed by the broker behind what was buffered.
    const dropped = closed(deaf, "the broker dropping the subscriber that never read");
    deaf.resume();
    await dropped;
    // And the broker delivers as before.
    await publisher.publish("mam/jobs/after/events", "after");
    expect(await honest.next()).toEqual({ topic: "mam/jobs/after/events", payload: "after" });
  });

  it("$SYS is closed to anonymous clients: the subscription is refused, so the service's client id is not revealed", async () => {
    for (const filter of ["$SYS/#", "$SYS/+/new/clients", `$SYS/${"+"}/heartbeat`]) {
      await expect(subscribe(broker.url, filter)).rejects.toThrow(/refused the subscription/);
    }
    // A client connecting now would be announced on $SYS/<broker>/new/clients; the
    // wildcard subscriber's next message is still the service's.
    await client({ clientId: "newcomer" });
    await liveNotification();
  });

  it("the service's client id is refused to a client without the service's credentials, and the service's connection is never taken over", async () => {
    for (let round = 0; round < 20; round++) {
      await expect(client({ clientId: SERVICE_CLIENT_ID })).rejects.toMatchObject({ code: 2 }); // identifier rejected
      await expect(
        client({ clientId: SERVICE_CLIENT_ID, username: publisherCredentials.username, password: "guess" }),
      ).rejects.toMatchObject({
        code: 4, // bad user name or password
      });
      await liveNotification();
    }
    // The service's one connection, from before the first attempt, is still the one.
    expect(watch.seen).toEqual([true]);
  });

  it("a publish over the broker's limit is publish.tooLarge from the publisher itself, and its connection stays up", async () => {
    const bounded = new MqttPublisher({
      url: broker.url,
      ...publisherCredentials,
      maxPacketBytes: DEFAULT_MAX_PACKET_BYTES,
      onConnectionChange: watch.record,
    });
    cleanup.push(() => bounded.close());
    await bounded.publish("mam/jobs/small/events", "{}");
    expect(await watch.next()).toBe(true);
    expect((await sub.next()).payload).toBe("{}");
    await expect(bounded.publish("mam/jobs/big/events", "x".repeat(DEFAULT_MAX_PACKET_BYTES))).rejects.toMatchObject({
      code: "publish.tooLarge",
    });
    await bounded.publish("mam/jobs/small/events", "again");
    expect((await sub.next()).payload).toBe("again");
    expect(watch.seen).toEqual([true, true]);
  });
});

describe("the service's publisher reconnects on its own", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  const publisherCredentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  async function setup(port = 0, extra: { refusePublish?: (topic: string) => boolean } = {}) {
    const broker = await startEmbeddedBroker({ port, publisherCredentials, serviceClientId: SERVICE_CLIENT_ID, ...extra });
    cleanup.push(() => broker.close());
    const sub = await subscribe(broker.url, "mam/#");
    cleanup.push(() => sub.close());
    return { broker, sub };
  }

  function servicePublisher(url: string, watch: ConnectionWatch): MqttPublisher {
    const p = new MqttPublisher({
      url,
      clientId: SERVICE_CLIENT_ID,
      ...publisherCredentials,
      reconnectPeriodMs: 50,
      onConnectionChange: watch.record,
    });
    cleanup.push(() => p.close());
    return p;
  }

  it("after the broker restarts: it is connected again before its next publish, which is delivered", async () => {
    const first = await setup();
    const watch = new ConnectionWatch();
    const service = servicePublisher(first.broker.url, watch);
    await service.publish("mam/jobs/r/events", "before");
    expect(await first.sub.next()).toEqual({ topic: "mam/jobs/r/events", payload: "before" });
    expect(await watch.next()).toBe(true);

    await first.broker.close();
    expect(await watch.next()).toBe(false);
    // Its first tries find nobody listening; it keeps trying until the broker is back.
    const second = await setup(first.broker.port);
    expect(await watch.next(10_000)).toBe(true);

    await service.publish("mam/jobs/r/events", "after");
    expect(await second.sub.next()).toEqual({ topic: "mam/jobs/r/events", payload: "after" });
    expect(watch.seen).toEqual([true, false, true]);
  });

  it("after the broker closes its connection (a refused publish): it reconnects, and the next publish is delivered", async () => {
    const { broker, sub } = await setup(0, { refusePublish: (topic) => topic.endsWith("/blocked") });
    const watch = new ConnectionWatch();
    const service = servicePublisher(broker.url, watch);
    await service.publish("mam/jobs/r/events", "first");
    expect(await sub.next()).toEqual({ topic: "mam/jobs/r/events", payload: "first" });
    expect(await watch.next()).toBe(true);

    await expect(service.publish("mam/jobs/r/blocked", "refused")).rejects.toMatchObject({ code: "publish.refused" });
    expect(await watch.next()).toBe(false);
    expect(await watch.next()).toBe(true);
    await service.publish("mam/jobs/r/events", "next");
    expect(await sub.next()).toEqual({ topic: "mam/jobs/r/events", payload: "next" });
  });
});
