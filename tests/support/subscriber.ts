import type { Publisher } from "@mam/core";
import { connectAsync } from "mqtt";

export interface ReceivedMessage {
  readonly topic: string;
  readonly payload: string;
}

/** What a subscriber on a broker receives, in arrival order. */
export interface Subscription {
  /** Every message received so far, in arrival order. */
  readonly received: readonly ReceivedMessage[];
  /** The next message not yet taken by `next`; rejects if none arrives within `timeoutMs` (default 5000). */
  next(timeoutMs?: number): Promise<ReceivedMessage>;
  /** The first received message (past or future) that matches; rejects after `timeoutMs` (default 5000). */
  waitFor(match: (m: ReceivedMessage) => boolean, timeoutMs?: number): Promise<ReceivedMessage>;
  close(): Promise<void>;
}

/**
 * The one test subscriber, a plain MQTT client as a dashboard would be: it connects
 * without credentials, subscribes (filters allowed) at QoS 1, resolves once the
 * broker granted it, and throws if the broker refused it.
 */
export async function subscribe(url: string, topicFilter: string): Promise<Subscription> {
  // MQTT 3.1.1: the embedded (aedes) broker speaks nothing newer.
  const client = await connectAsync(url, { protocolVersion: 4, reconnectPeriod: 0, connectTimeout: 5000 });
  client.on("error", () => undefined);
  const received: ReceivedMessage[] = [];
  let taken = 0;
  const listeners = new Set<() => void>();
  client.on("message", (topic, payload) => {
    received.push({ topic, payload: payload.toString("utf8") });
    for (const l of [...listeners]) l();
  });
  // mqtt.js rejects a SUBACK of 0x80 itself ("Subscribe error: Unspecified error").
  const refused = await client.subscribeAsync(topicFilter, { qos: 1 }).then(
    (grants) => (grants.some((g) => g.qos === 128) ? "granted 0x80" : undefined),
    (e: unknown) => (e instanceof Error ? e.message : String(e)),
  );
  if (refused !== undefined) {
    await client.endAsync(true);
    throw new Error(`the broker refused the subscription to ${topicFilter}: ${refused}`);
  }

  /** Resolves with `pick()`'s first defined answer, checked now and on every arrival. */
  function until<T>(pick: () => T | undefined, timeoutMs: number, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const check = (): void => {
        const hit = pick();
        if (hit === undefined) return;
        clearTimeout(timer);
        listeners.delete(check);
        resolve(hit);
      };
      const timer = setTimeout(() => {
        listeners.delete(check);
        reject(new Error(`no ${what} on ${topicFilter} within ${timeoutMs} ms (received ${received.length})`));
      }, timeoutMs);
      listeners.add(check);
      check();
    });
  }

  return {
    received,
    next(timeoutMs = 5000) {
      return until(() => (taken < received.length ? received[taken++] : undefined), timeoutMs, "message");
    },
    waitFor(match, timeoutMs = 5000) {
      return until(() => received.find(match), timeoutMs, "matching message");
    },
    close: () => client.endAsync(true),
  };
}

/**
 * The absence check: publish a marker on `topic` through `publisher` and wait until the subscriber has
 * it. Messages on one topic from one publisher arrive in order, so once the marker is
 * in, anything published before it is in too: "nothing more arrived" is then a fact,
 * not a guess about a timeout. (A publish that completed before the marker was sent,
 * from any client, was in the broker first and reaches the subscriber first.)
 * Resolves with the marker's index in `sub.received`.
 */
export async function barrier(sub: Subscription, publisher: Publisher, topic: string): Promise<number> {
  const marker = `barrier-${Math.random().toString(36).slice(2)}`;
  await publisher.publish(topic, marker);
  await sub.waitFor((m) => m.payload === marker);
  return sub.received.findIndex((m) => m.payload === marker);
}
