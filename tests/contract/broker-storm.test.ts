/**
 * The stalled-subscriber storm (issue 17): anonymous clients subscribe to
 * everything and stop reading their sockets (and, dropped, come back and stall
 * again), beside junk publishes outside mam/, while the service sweeps owed
 * intents through the embedded broker's in-process publisher, as `mam serve` does.
 * No service publish may time out, nothing may be quarantined, the sweep must send
 * every owed intent, and the service's publishes resolve while the stalled clients'
 * sockets are still paused. Real aedes, real mqtt.js clients.
 *
 * Sized to take seconds in npm test; the reliability tier may run it larger:
 * MAM_STORM_STALLED (stalled clients, default 12), MAM_STORM_JUNK (junk clients,
 * default 4), MAM_STORM_OWED (owed intents, default 20).
 */
import { randomBytes } from "node:crypto";
import {
  type Deps,
  MemoryJobStore,
  MemoryReportStore,
  OPERATOR,
  parseFlags,
  randomIds,
  recoverNotifications,
  registerJob,
  systemClock,
  transitionJob,
} from "@mam/core";
import { startEmbeddedBroker } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { junkPublisher, stalled as stalledClient, stalledSubscriber } from "../support/hostile-mqtt.ts";
import { subscribe, subscriberLogins } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";

const STALLED = Number(process.env.MAM_STORM_STALLED ?? 12);
const JUNK = Number(process.env.MAM_STORM_JUNK ?? 4);
const OWED = Number(process.env.MAM_STORM_OWED ?? 20);
/** `mam serve`'s defaults: the publish timeout, and the drain timeout after which aedes drops a full socket. */
const PUBLISH_TIMEOUT_MS = 5000;
const DRAIN_TIMEOUT_MS = 2000;
/**
 * The small bound on a service publish under the storm: half the drain timeout, so
 * a publish that waited for any stalled client to be dropped fails it (before issue
 * 17 every publish did, and the slowest took the drain timeout or more).
 */
const SERVICE_PUBLISH_BOUND_MS = DRAIN_TIMEOUT_MS / 2;

describe("the stalled-subscriber storm: the service's deliveries never wait on other clients", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  it(`${STALLED} stalled subscribers and ${JUNK} junk publishers: the sweep sends all ${OWED} owed intents, none times out or is quarantined`, async () => {
    const dir = await tempDir("storm");
    cleanup.push(() => dir.remove());
    const broker = await startEmbeddedBroker({
      port: 0,
      publisherCredentials: { username: "mam-service", password: randomBytes(16).toString("hex") },
      serviceClientId: "mam-service",
      sessionsDir: `${dir.dir}/broker`,
      drainTimeoutMs: DRAIN_TIMEOUT_MS,
      ...subscriberLogins,
    });
    cleanup.push(() => broker.close());
    const inner = broker.publisher({ timeoutMs: PUBLISH_TIMEOUT_MS });
    const latencies: number[] = [];
    const publisher = {
      async publish(topic: string, payload: string) {
        const started = performance.now();
        try {
          await inner.publish(topic, payload);
        } finally {
          latencies.push(performance.now() - started);
        }
      },
    };
    const deps: Deps = {
      jobs: new MemoryJobStore(),
      reports: new MemoryReportStore(),
      publisher,
      clock: systemClock,
      ids: randomIds,
      flags: parseFlags({}),
    };
    const owed: string[] = [];
    for (let i = 0; i < OWED; i++) {
      const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
      const running = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
      await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: running.transition_seq, notify: true }, OPERATOR);
      owed.push(job.job_id);
    }
    const honest = await subscribe(broker.url, "mam/jobs/+/events");
    cleanup.push(() => honest.close());

    const storm = { on: true };
    cleanup.push(async () => {
      storm.on = false;
    });
    const stalled = Array.from({ length: STALLED }, (_, i) => stalledSubscriber(broker.url, i));
    const junk = Array.from({ length: JUNK }, (_, i) => junkPublisher(broker.url, i, storm));
    for (const c of [...stalled, ...junk]) cleanup.push(() => c.endAsync(true));
    // The storm is on once every stalled client has connected and stopped reading.
    await Promise.all(stalled.map(stalledClient));

    const started = performance.now();
    const result = await recoverNotifications(deps, { policy: { maxFailures: 1, backoffMs: 60_000 } });
    const took = performance.now() - started;
    // Measured while the storm is on and nobody has resumed reading.
    const stillPaused = stalled.filter((c) => c.stream.isPaused()).length;
    storm.on = false;
    console.log(
      `storm: ${STALLED} stalled, ${JUNK} junk; sweep of ${OWED} took ${Math.round(took)} ms; publish latency max ${Math.round(Math.max(...latencies))} ms`,
    );

    expect(result.results.filter((r) => r.outcome !== "sent")).toEqual([]);
    expect(result).toMatchObject({ owed: OWED, sent: OWED, failed: 0, quarantined: 0, not_tried: 0 });
    expect(stillPaused).toBe(STALLED);
    expect(Math.max(...latencies)).toBeLessThan(SERVICE_PUBLISH_BOUND_MS);
    for (const jobId of owed) await honest.waitFor((m) => m.topic === `mam/jobs/${jobId}/events`);
  }, 60_000);
});
