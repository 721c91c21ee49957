import { connectAsync } from "mqtt";
import type { ReceivedMessage, Subscription } from "./publisher.suite.ts";

/**
 * A plain MQTT subscriber, as a dashboard would be: it connects without
 * credentials, subscribes at QoS 1 and hands out what the broker delivers, in order.
 * Shared by every publisher harness whose messages end up on an MQTT broker.
 */
export async function subscribeOn(url: string, topic: string): Promise<Subscription> {
  // MQTT 3.1.1: the embedded (aedes) broker speaks nothing newer.
  const client = await connectAsync(url, { protocolVersion: 4, reconnectPeriod: 0, connectTimeout: 3000 });
  client.on("error", () => undefined);
  const queue: ReceivedMessage[] = [];
  const waiting: ((m: ReceivedMessage) => void)[] = [];
  client.on("message", (t, payload) => {
    const message = { topic: t, payload: payload.toString("utf8") };
    const waiter = waiting.shift();
    if (waiter === undefined) queue.push(message);
    else waiter(message);
  });
  // mqtt.js rejects a SUBACK of 0x80 itself ("Subscribe error: Unspecified error").
  const refused = await client.subscribeAsync(topic, { qos: 1 }).then(
    (grants) => (grants.some((g) => g.qos === 128) ? "granted 0x80" : undefined),
    (e: unknown) => (e instanceof Error ? e.message : String(e)),
  );
  if (refused !== undefined) {
    await client.endAsync(true);
    throw new Error(`the broker refused the subscription to ${topic}: ${refused}`);
  }
  return {
    next(timeoutMs = 5000) {
      const queued = queue.shift();
      if (queued !== undefined) return Promise.resolve(queued);
      return new Promise<ReceivedMessage>((resolve, reject) => {
        const deliver = (m: ReceivedMessage): void => {
          clearTimeout(timer);
          resolve(m);
        };
        const timer = setTimeout(() => {
          waiting.splice(waiting.indexOf(deliver), 1);
          reject(new Error(`no message on ${topic} within ${timeoutMs} ms`));
        }, timeoutMs);
        waiting.push(deliver);
      });
    },
    async close() {
      await client.endAsync(true);
    },
  };
}
