import { readFile } from "node:fs/promises";
import { createTokenService } from "@mam/api";
import { startService } from "@mam/cli";
import { type JobRecord, OPERATOR, parseConfig, registerJob, systemClock, transitionJob } from "@mam/core";
import { dataDirPaths } from "@mam/local";
import { connectAsync, type MqttClient } from "mqtt";
import { junkPublisher, stalled as stalledClient, stalledSubscriber } from "../tests/support/hostile-mqtt.ts";
import { fixed, grouped, machineNote, sizeFromEnv, tempDir } from "./support/measure.ts";

/**
 * How long a committed transition takes to reach an honest subscriber of `mam serve`
 * while other clients take what they can of the embedded broker (issue 17), against
 * the same measurement with no one else connected, in the same run:
 *
 * - baseline: the honest subscriber alone (anonymous, clean, on `mam/jobs/+/events`);
 * - storm: STALLED anonymous clients subscribed to everything that stop reading their
 *   sockets (dropped, they come back and stall again) beside JUNK clients publishing
 *   60 KB junk outside mam/ (the broker refuses it) — the attack of issue 17, item 4;
 * - at the session cap: SESSIONS persistent (clean: false) sessions of logged-in
 *   subscribers (read tokens with a name, 16 sessions a name: `mam serve`'s
 *   MAM_MQTT_MAX_SESSIONS_PER_NAME), each subscribed to `mam/#` at QoS 1 and then
 *   away, so the broker queues every notification for each of them — the most a
 *   subscriber population can make a publish cost once the cap (MAM_MQTT_MAX_SESSIONS,
 *   1,000) holds; before issue 17 anonymous clients could open any number.
 *
 * Each phase: N transitions one at a time (`transitionJob` over the service's deps, as
 * the API's route calls it; the change relay publishes), each timed from the commit
 * to the job topic's message at the honest subscriber; p50 and p99, and each as a
 * ratio to the baseline's. Nothing is judged: the bound this shows is that the storm
 * cannot hold a notification past the publish timeout, and what the cap leaves.
 */

const N = sizeFromEnv("MAM_BENCH_SUBSCRIBERS_N", process.env.MAM_BENCH_SUBSCRIBERS_N, 500);
const STALLED = sizeFromEnv("MAM_BENCH_SUBSCRIBERS_STALLED", process.env.MAM_BENCH_SUBSCRIBERS_STALLED, 12);
const JUNK = sizeFromEnv("MAM_BENCH_SUBSCRIBERS_JUNK", process.env.MAM_BENCH_SUBSCRIBERS_JUNK, 4);
const SESSIONS = sizeFromEnv("MAM_BENCH_SUBSCRIBERS_SESSIONS", process.env.MAM_BENCH_SUBSCRIBERS_SESSIONS, 1000);
const PER_NAME = 16;
const WARMUP = Math.min(100, N);

function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-subscribers-");
const clients: MqttClient[] = [];
const storm = { on: false };
const service = await startService(
  parseConfig({
    MAM_DATA_DIR: tmp.dir,
    MAM_PORT: "0",
    MAM_MQTT_PORT: "0",
    MAM_SWEEP_INTERVAL_SECONDS: "86400",
    MAM_MQTT_MAX_SESSIONS: String(Math.max(SESSIONS, 1)),
  }),
  () => undefined,
);
try {
  const deps = service.deps;
  const arrived = new Map<string, (at: number) => void>();
  const honest = await connectAsync(service.mqttUrl, { protocolVersion: 4, clean: true, reconnectPeriod: 0 });
  clients.push(honest);
  honest.on("message", (_topic, payload) => {
    const id = (JSON.parse(payload.toString("utf8")) as { data: { notification_intent: { id: string } } }).data.notification_intent.id;
    arrived.get(id)?.(performance.now());
    arrived.delete(id);
  });
  await honest.subscribeAsync("mam/jobs/+/events", { qos: 1 });

  const registered = await registerJob(deps, { job_id: "bench-subscribers", prompt: "benchmark", agent: "claude" });
  let record: JobRecord = await transitionJob(
    deps,
    registered.job_id,
    { action: "claim", expectedSeq: registered.transition_seq },
    OPERATOR,
  );
  let step = 0;
  /** One progress with notify: from the instant its commit stands to its message at the honest subscriber. */
  const latency = async (): Promise<number> => {
    record = await transitionJob(
      deps,
      record.job_id,
      { action: "progress", expectedSeq: record.transition_seq, fields: { progress: { step: step++ } }, notify: true },
      OPERATOR,
    );
    const stood = performance.now();
    const id = record.pending_notification?.id ?? "";
    const at = await new Promise<number>((resolve) => arrived.set(id, resolve));
    return at - stood;
  };
  const phase = async (name: string) => {
    const ms: number[] = [];
    for (let i = 0; i < N; i++) ms.push(await latency());
    await service.relayed();
    ms.sort((a, b) => a - b);
    const figures = { name, p50: percentile(ms, 50), p99: percentile(ms, 99), max: ms[ms.length - 1]! };
    console.log(`  ${name}: p50 ${fixed(figures.p50, 2)} ms, p99 ${fixed(figures.p99, 2)} ms, max ${fixed(figures.max, 1)} ms`);
    return figures;
  };

  console.log(`latency: ${grouped(N)} transitions one at a time per phase (after ${grouped(WARMUP)} warm-up), commit -> message`);
  for (let i = 0; i < WARMUP; i++) await latency();
  const baseline = await phase("baseline (the honest subscriber alone)");

  // ---- the storm
  storm.on = true;
  const stalled = Array.from({ length: STALLED }, (_, i) => stalledSubscriber(service.mqttUrl, i));
  clients.push(...stalled, ...Array.from({ length: JUNK }, (_, i) => junkPublisher(service.mqttUrl, i, storm)));
  await Promise.all(stalled.map(stalledClient));
  const stormed = await phase(`storm (${STALLED} stalled subscribers, ${JUNK} junk publishers)`);
  storm.on = false;
  for (const c of clients.splice(1)) await c.endAsync(true);

  // ---- at the session cap: logged-in persistent sessions, all away
  const { signing_key } = JSON.parse(await readFile(dataDirPaths(tmp.dir).credentials, "utf8")) as { signing_key: string };
  const tokens = createTokenService({ signingKey: signing_key, clock: systemClock });
  const opened = performance.now();
  for (let s = 0; s < SESSIONS; s += 50) {
    await Promise.all(
      Array.from({ length: Math.min(50, SESSIONS - s) }, async (_, k) => {
        const i = s + k;
        const c = await connectAsync(service.mqttUrl, {
          protocolVersion: 4,
          clean: false,
          reconnectPeriod: 0,
          clientId: `away-${i}`,
          username: "subscriber",
          password: tokens.mintOperator(["read"], { name: `dashboards-${Math.floor(i / PER_NAME)}` }),
        });
        await c.subscribeAsync("mam/#", { qos: 1 });
        await c.endAsync();
      }),
    );
  }
  console.log(`  (${grouped(SESSIONS)} persistent sessions opened and left in ${fixed((performance.now() - opened) / 1000, 1)} s)`);
  const capped = await phase(`at the session cap (${grouped(SESSIONS)} persistent sessions away, each queueing mam/#)`);

  for (const p of [stormed, capped]) {
    console.log(
      `subscribers: ${p.name}: p50 ${fixed(p.p50 / baseline.p50, 2)}x, p99 ${fixed(p.p99 / baseline.p99, 2)}x the baseline ` +
        `(p50 ${fixed(p.p50, 2)} ms, p99 ${fixed(p.p99, 2)} ms; baseline p50 ${fixed(baseline.p50, 2)} ms, p99 ${fixed(baseline.p99, 2)} ms)`,
    );
  }
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
} finally {
  storm.on = false;
  for (const c of clients) await c.endAsync(true).catch(() => undefined);
  await service.stop();
  await tmp.dispose();
}
