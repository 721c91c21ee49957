/**
 * When does an aedes broker own a message it acknowledged?
 *
 * The broker outage once lost one notification that the broker had acknowledged
 * (issue 11's closing note: "outcome: acknowledged", never received by the
 * `clean: false` subscriber). The cause is in aedes itself (1.2.0, and 2.0.0-beta.1
 * alike), lib/handlers/publish.js: a QoS 1 PUBLISH is answered with its PUBACK
 * *first*, and only in the PUBACK's write callback does the broker queue the
 * message for the persistent sessions and hand it to the connected subscribers. A
 * broker killed in between has acknowledged a message that it neither stored nor
 * sent, and the publisher, told "acknowledged", settles its intent:
 *
 * ```
 * QoS 1   PUBLISH ──> PUBACK written ──> enqueue (LevelDB) ──> deliver
 *                          ^ the publisher settles here; a SIGKILL now loses it
 * QoS 2   PUBLISH ──> store incoming ──> enqueue (LevelDB) ──> deliver ──> PUBREC ──> PUBREL ──> PUBCOMP
 *                                                                                   the publisher settles here ^
 * ```
 *
 * A QoS 2 PUBLISH is stored, queued and delivered before its PUBREC is written, so
 * the PUBCOMP a QoS 2 publisher waits for means the broker owns the message. And
 * aedes's in-process `publish(packet, callback)` calls back only after the same
 * enqueue and delivery. These tests pin both orders on a real aedes broker with the
 * persistence `mam serve` uses (aedes-persistence-level over a LevelDB on disk), by
 * reading, in the broker's own process, the order in which it finished queuing a
 * message and wrote the acknowledgement: no timing is involved. Then the same for
 * mam's `MqttPublisher`: when its `publish` resolves, the message is queued for a
 * `clean: false` subscriber, whichever broker process dies next.
 */
import { randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import net from "node:net";
import { MqttPublisher, startEmbeddedBroker } from "@mam/local";
import { Aedes } from "aedes";
import { Level } from "level";
import { connectAsync } from "mqtt";
import mqttPacket from "mqtt-packet";
import { afterEach, describe, expect, it } from "vitest";
import { subscribe, subscriberLogins, subscriberToken } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";

const levelPersistence = createRequire(import.meta.url)("aedes-persistence-level") as (db: Level<string, Buffer>) => Persistence;
interface Persistence {
  outgoingEnqueueCombi(subs: unknown[], packet: { topic: string }): Promise<unknown>;
}

/** What the broker did, in the order it did it, in its own process. */
type Step =
  | { readonly step: "queued"; readonly topic: string }
  | { readonly step: "acknowledged"; readonly cmd: string; readonly messageId: number };

interface WatchedBroker {
  readonly url: string;
  readonly aedes: Aedes;
  readonly steps: Step[];
  close(): Promise<void>;
}

/**
 * A bare aedes broker over aedes-persistence-level, recording when its queue write
 * for a message finished and every PUBACK/PUBREC it wrote to a client's socket (the
 * bytes it writes, parsed back by mqtt-packet, the parser aedes writes with).
 */
async function watchedBroker(dir: string): Promise<WatchedBroker> {
  const steps: Step[] = [];
  const db = new Level<string, Buffer>(dir);
  await db.open();
  const persistence = levelPersistence(db);
  const enqueue = persistence.outgoingEnqueueCombi.bind(persistence);
  persistence.outgoingEnqueueCombi = async (subs, packet) => {
    const done = await enqueue(subs, packet);
    steps.push({ step: "queued", topic: packet.topic });
    return done;
  };
  const aedes = await Aedes.createBroker({ persistence: persistence as never });
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    const parser = mqttPacket.parser();
    parser.on("packet", (p) => {
      if (p.cmd === "puback" || p.cmd === "pubrec") steps.push({ step: "acknowledged", cmd: p.cmd, messageId: p.messageId ?? 0 });
    });
    const write = socket.write.bind(socket) as (chunk: unknown, ...rest: unknown[]) => boolean;
    socket.write = ((chunk: unknown, ...rest: unknown[]) => {
      parser.parse(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string));
      return write(chunk, ...rest);
    }) as typeof socket.write;
    aedes.handle(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `mqtt://127.0.0.1:${port}`,
    aedes,
    steps,
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      await new Promise<void>((resolve) => aedes.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
      await db.close();
    },
  };
}

/** Resolves once aedes has routed a publish to `topic` (its "publish" event comes after the queue write and the delivery). */
function publishedOn(aedes: Aedes, topic: string): Promise<void> {
  return new Promise((resolve) => {
    const seen = (packet: { topic: string }) => {
      if (packet.topic !== topic) return;
      aedes.off("publish", seen);
      resolve();
    };
    aedes.on("publish", seen);
  });
}

/** The steps the broker took for `topic`: its queue write and the acknowledgement of the one publish to it. */
function stepsFor(steps: readonly Step[], topic: string, ackCmd: "puback" | "pubrec", messageId: number): string[] {
  return steps
    .filter((s) => (s.step === "queued" ? s.topic === topic : s.cmd === ackCmd && s.messageId === messageId))
    .map((s) => (s.step === "queued" ? "queued" : s.cmd));
}

describe("aedes: what its acknowledgement of a publish promises (the peer's own order)", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  async function setup() {
    const dir = await tempDir("ownership");
    cleanup.push(() => dir.remove());
    const broker = await watchedBroker(dir.dir);
    cleanup.push(() => broker.close());
    // A persistent session on every topic, so each publish is queued on disk for it.
    const sub = await subscribe(broker.url, "mam/#", { clientId: `away-${randomBytes(4).toString("hex")}`, clean: false });
    cleanup.push(() => sub.close());
    return { broker, sub };
  }

  it("QoS 1: aedes writes the PUBACK before it has queued the message for a persistent session (the gap that lost one notification)", async () => {
    const { broker } = await setup();
    const client = await connectAsync(broker.url, { protocolVersion: 4, reconnectPeriod: 0 });
    cleanup.push(() => client.endAsync(true));
    const topic = "mam/jobs/qos1/events";
    const routed = publishedOn(broker.aedes, topic);
    const ack = await client.publishAsync(topic, "{}", { qos: 1 });
    // The message is queued eventually (aedes says "publish" once it is routed); the PUBACK went out first.
    await routed;
    expect(stepsFor(broker.steps, topic, "puback", ack?.messageId ?? -1)).toEqual(["puback", "queued"]);
  });

  it("QoS 2: aedes writes the PUBREC only after the message is queued for every persistent session", async () => {
    const { broker } = await setup();
    const client = await connectAsync(broker.url, { protocolVersion: 4, reconnectPeriod: 0 });
    cleanup.push(() => client.endAsync(true));
    const topic = "mam/jobs/qos2/events";
    const ack = await client.publishAsync(topic, "{}", { qos: 2 });
    expect(stepsFor(broker.steps, topic, "pubrec", ack?.messageId ?? -1)).toEqual(["queued", "pubrec"]);
  });

  it("in process: aedes's publish(packet, callback) calls back only after the message is queued", async () => {
    const { broker } = await setup();
    const topic = "mam/jobs/in-process/events";
    await new Promise<void>((resolve, reject) =>
      broker.aedes.publish({ cmd: "publish", topic, payload: Buffer.from("{}"), qos: 1, retain: false, dup: false }, (err?: Error) =>
        err ? reject(err) : resolve(),
      ),
    );
    expect(broker.steps.filter((s) => s.step === "queued" && s.topic === topic)).toHaveLength(1);
  });

  it("MqttPublisher: when publish resolves, the broker has queued the message for the persistent session (it publishes at QoS 2)", async () => {
    const { broker, sub } = await setup();
    const publisher = new MqttPublisher({ url: broker.url });
    cleanup.push(() => publisher.close());
    for (let i = 0; i < 20; i++) {
      const topic = `mam/jobs/owned-${i}/events`;
      await publisher.publish(topic, JSON.stringify({ i }));
      // The publisher's connection is the only one that publishes: the newest acknowledgement is this publish's.
      const acked = broker.steps.findLastIndex((s) => s.step === "acknowledged");
      const queued = broker.steps.findIndex((s) => s.step === "queued" && s.topic === topic);
      expect({ topic, queuedBeforeItsAcknowledgement: queued !== -1 && queued < acked }).toEqual({
        topic,
        queuedBeforeItsAcknowledgement: true,
      });
    }
    // And the subscriber receives each once, at the QoS it subscribed with.
    await sub.waitFor((m) => m.topic === "mam/jobs/owned-19/events");
    expect(sub.received.filter((m) => m.topic.startsWith("mam/jobs/owned-"))).toHaveLength(20);
  });

  it("the embedded broker's in-process publisher: what it resolved is queued on disk for a session that is away, and reaches it on a broker restarted over the same disk", async () => {
    const dir = await tempDir("ownership-embedded");
    cleanup.push(() => dir.remove());
    const clientId = `away-${randomBytes(4).toString("hex")}`;
    let broker = await startEmbeddedBroker({ port: 0, sessionsDir: dir.dir, ...subscriberLogins });
    const token = subscriberToken();
    const away = await subscribe(broker.url, "mam/#", { clientId, clean: false, token });
    await away.close();
    const publisher = broker.publisher();
    const topics = Array.from({ length: 20 }, (_, i) => `mam/jobs/on-disk-${i}/events`);
    for (const topic of topics) await publisher.publish(topic, JSON.stringify({ topic }));
    // Nothing awaited but the publishes: the broker closes at once. (That aedes's
    // publish callback comes after the queue write is pinned above.)
    await broker.close();
    broker = await startEmbeddedBroker({ port: 0, sessionsDir: dir.dir, ...subscriberLogins });
    cleanup.push(() => broker.close());
    const back = await subscribe(broker.url, "mam/#", { clientId, clean: false, subscribe: false, token });
    cleanup.push(() => back.close());
    await back.waitFor((m) => m.topic === topics.at(-1));
    expect(back.received.map((m) => m.topic)).toEqual(topics);
  });
});
