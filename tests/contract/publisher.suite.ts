import { randomUUID } from "node:crypto";
import { MamError, type Publisher } from "@mam/core";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { ReceivedMessage, Subscription } from "../support/subscriber.ts";

/**
 * One adapter wired to a broker a subscriber can reach. For MQTT that is the
 * broker the publisher talks to; for IoT Core over HTTP, the fake endpoint that
 * relays what it accepts onto an aedes broker, so `subscribe` is the same there.
 */
export interface PublisherHarness {
  readonly publisher: Publisher;
  /** Subscribes (topic filters allowed) and resolves once the broker confirmed it. */
  subscribe(topic: string): Promise<Subscription>;
  /** A publisher of the same kind aimed at a broker nobody answers on. */
  unreachable(): Publisher | Promise<Publisher>;
  /** A publisher of the same kind whose publishes the broker receives but refuses. */
  refusing(): Publisher | Promise<Publisher>;
  close(): Promise<void>;
}

/**
 * The Publisher contract: `publish` resolves only once the broker acknowledged, and
 * what a subscriber then receives is exactly what was published.
 */
export function publisherContract(name: string, make: () => Promise<PublisherHarness>): void {
  describe(`Publisher contract: ${name}`, () => {
    let harness: PublisherHarness;
    const extra: Publisher[] = [];

    beforeEach(async () => {
      harness = await make();
    });
    afterEach(async () => {
      for (const p of extra.splice(0)) await p.close?.();
      await harness.close();
    });

    it("a publish resolves, and a subscriber on the broker receives exactly that payload on that topic", async () => {
      const jobId = `job-${randomUUID().slice(0, 8)}`;
      const topic = `mam/jobs/${jobId}/events`;
      const sub = await harness.subscribe(topic);
      const payload = JSON.stringify({
        event: "completed",
        job_id: jobId,
        seq: 3,
        at: "2025-01-15T12:00:00.000Z",
        data: { notification_intent: { id: randomUUID(), seq: 3 }, note: "ünïcode ✓" },
      });
      await harness.publisher.publish(topic, payload);
      expect(await sub.next()).toEqual({ topic, payload });
      await sub.close();
    });

    it("concurrent publishes each resolve, and each message arrives once on its topic", async () => {
      const sub = await harness.subscribe("mam/jobs/+/events");
      const sent = Array.from({ length: 10 }, (_, i) => ({
        topic: `mam/jobs/fan-${i}/events`,
        payload: JSON.stringify({ event: "progress", job_id: `fan-${i}`, seq: i }),
      }));
      await Promise.all(sent.map((m) => harness.publisher.publish(m.topic, m.payload)));
      const received: ReceivedMessage[] = [];
      for (let i = 0; i < sent.length; i++) received.push(await sub.next());
      const byTopic = (a: ReceivedMessage, b: ReceivedMessage) => a.topic.localeCompare(b.topic);
      expect([...received].sort(byTopic)).toEqual([...sent].sort(byTopic));
      await sub.close();
    });

    it("publishing to an unreachable broker rejects with publish.unreachable", async () => {
      const publisher = await harness.unreachable();
      extra.push(publisher);
      await expectMamError(publisher.publish("mam/jobs/nobody/events", "{}"), "publish.unreachable");
    });

    it("a publish the broker refuses rejects with publish.refused, and no subscriber receives it", async () => {
      const topic = `mam/jobs/refused-${randomUUID().slice(0, 8)}/events`;
      const sub = await harness.subscribe(topic);
      const publisher = await harness.refusing();
      extra.push(publisher);
      await expectMamError(publisher.publish(topic, JSON.stringify({ event: "completed", spoofed: true })), "publish.refused");
      // The harness's own publisher still gets through afterwards, and its message is
      // the first the subscriber sees: the refused one was never delivered.
      await harness.publisher.publish(topic, "after");
      expect(await sub.next()).toEqual({ topic, payload: "after" });
      await sub.close();
    });
  });
}

async function expectMamError(p: Promise<unknown>, code: MamError["code"]): Promise<void> {
  let err: unknown;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  expect(err, `expected ${code}`).toBeInstanceOf(MamError);
  expect((err as MamError).code).toBe(code);
}
