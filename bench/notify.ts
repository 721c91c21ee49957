import { readFile } from "node:fs/promises";
import { startService } from "@mam/cli";
import { type JobRecord, type JobStore, OPERATOR, type Publisher, parseConfig, registerJob, transitionJob } from "@mam/core";
import { dataDirPaths } from "@mam/local";
import { connectAsync, type MqttClient } from "mqtt";
import { fixed, grouped, machineNote, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";

/**
 * How long a committed transition takes to reach a subscriber, and how many
 * committed-and-delivered intents per second `mam serve`'s composition sustains,
 * against raw mqtt.js on the same embedded broker.
 *
 * mam: `startService` (SQLite, the change relay, the embedded aedes broker) in this
 * process; transitions go through `transitionJob` over the service's own deps — the
 * same service function the API's route calls — and the relay publishes each intent
 * (job topic, then `mam/events`, each at QoS 1 in the broker's own process, done once
 * aedes has queued and delivered it), logs the publish and settles it. Raw: an
 * mqtt.js client with the service's login publishing the same payloads at QoS 1 to
 * the same broker. The subscriber is one mqtt.js client on
 * `mam/#` at QoS 1 in both.
 *
 * - latency: one at a time, from the moment the commit stands (transitionJob
 *   resolved; raw: the publish call) to the job topic's message at the subscriber;
 *   p50 and p99 over N. Goal: mam's p99 <= 3x raw's p99.
 * - rate: W workers, each on a job of its own, each committing and then waiting
 *   until both messages of its intent arrived (raw: publishing both, acknowledged,
 *   and waiting for both); intents per second. Goal: mam >= 0.5x raw.
 */

const N = sizeFromEnv("MAM_BENCH_NOTIFY", process.env.MAM_BENCH_NOTIFY, 10_000);
const RATE_INTENTS = sizeFromEnv("MAM_BENCH_NOTIFY_RATE", process.env.MAM_BENCH_NOTIFY_RATE, 10_000);
const WORKERS = sizeFromEnv("MAM_BENCH_NOTIFY_WORKERS", process.env.MAM_BENCH_NOTIFY_WORKERS, 32);
const WARMUP = Math.min(500, N);
const P99_GOAL = 3;
const RATE_GOAL = 0.5;

/** Where the time of a mam intent goes: the service's store and publisher, timed by wrapping the instances the relay uses. */
const spent = { transition: 0, get: 0, appendEvent: 0, settleNotification: 0, settlePublished: 0, publish: 0 };
type Timed = keyof typeof spent;
const STORE_WRITES: readonly Timed[] = ["transition", "appendEvent", "settleNotification", "settlePublished"];

function timeMethods<T extends object>(target: T, names: readonly (keyof T & Timed)[]): void {
  for (const name of names) {
    const original = (target[name] as (...a: unknown[]) => Promise<unknown>).bind(target);
    (target as Record<string, unknown>)[name] = async (...args: unknown[]) => {
      const started = performance.now();
      try {
        return await original(...args);
      } finally {
        spent[name] += performance.now() - started;
      }
    };
  }
}

/**
 * The publisher's time while at least one publish is in flight: an intent's two
 * topics may overlap, so summing each call's time would count an overlap twice.
 */
function timePublishes(publisher: Publisher): void {
  const original = publisher.publish.bind(publisher);
  let inFlight = 0;
  let since = 0;
  (publisher as { publish: Publisher["publish"] }).publish = async (...args) => {
    if (inFlight++ === 0) since = performance.now();
    try {
      return await original(...args);
    } finally {
      if (--inFlight === 0) spent.publish += performance.now() - since;
    }
  };
}

function resetSpent(): void {
  for (const k of Object.keys(spent) as Timed[]) spent[k] = 0;
}

function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

/** Arrivals at the subscriber, by key; a waiter resolves once its key has arrived `count` times. */
class Arrivals {
  readonly #seen = new Map<string, number>();
  readonly #waiters = new Map<string, { count: number; resolve: (at: number) => void }>();
  arrive(key: string): void {
    const n = (this.#seen.get(key) ?? 0) + 1;
    this.#seen.set(key, n);
    const w = this.#waiters.get(key);
    if (w !== undefined && n >= w.count) {
      this.#waiters.delete(key);
      this.#seen.delete(key);
      w.resolve(performance.now());
    }
  }
  wait(key: string, count: number): Promise<number> {
    return new Promise((resolve) => {
      if ((this.#seen.get(key) ?? 0) >= count) {
        this.#seen.delete(key);
        resolve(performance.now());
        return;
      }
      this.#waiters.set(key, { count, resolve });
    });
  }
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-notify-");
let subscriber: MqttClient | undefined;
let raw: MqttClient | undefined;
const service = await startService(
  parseConfig({ MAM_DATA_DIR: tmp.dir, MAM_PORT: "0", MAM_MQTT_PORT: "0", MAM_SWEEP_INTERVAL_SECONDS: "86400" }),
  () => undefined,
);
try {
  const deps = service.deps;
  timeMethods(deps.jobs as JobStore & Record<Timed, never>, ["transition", "get", "appendEvent", "settleNotification", "settlePublished"]);
  timePublishes(deps.publisher);

  // Job topic arrivals by "<intent id>", fan-in by "<intent id>+"; raw the same, with its own ids.
  const arrivals = new Arrivals();
  subscriber = await connectAsync(service.mqttUrl, { protocolVersion: 4, clean: true, reconnectPeriod: 0 });
  subscriber.on("message", (topic, payload) => {
    const id = (JSON.parse(payload.toString("utf8")) as { data: { notification_intent: { id: string } } }).data.notification_intent.id;
    arrivals.arrive(topic === "mam/events" ? `${id}+` : id);
  });
  await subscriber.subscribeAsync("mam/#", { qos: 1 });
  const login = JSON.parse(await readFile(dataDirPaths(tmp.dir).credentials, "utf8")).mqtt as { username: string; password: string };
  raw = await connectAsync(service.mqttUrl, { protocolVersion: 4, reconnectPeriod: 0, ...login });

  // ---- mam: one running job per worker (and one for the latency run)
  const jobs: { record: JobRecord }[] = [];
  for (let w = 0; w <= WORKERS; w++) {
    const job = await registerJob(deps, { job_id: `bench-notify-${w}`, prompt: "benchmark", agent: "claude" });
    const running = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
    jobs.push({ record: running });
  }
  /** One progress with notify: commit, then the instant it stood and the intent it carried. */
  const commit = async (slot: { record: JobRecord }, step: number): Promise<{ stood: number; id: string }> => {
    slot.record = await transitionJob(
      deps,
      slot.record.job_id,
      { action: "progress", expectedSeq: slot.record.transition_seq, fields: { progress: { step } }, notify: true },
      OPERATOR,
    );
    return { stood: performance.now(), id: slot.record.pending_notification?.id ?? "" };
  };
  let rawSeq = 0;
  const rawPayload = (id: string) =>
    JSON.stringify({
      event: "progress",
      job_id: "bench-raw",
      seq: 1,
      at: new Date().toISOString(),
      data: { notification_intent: { id, seq: 1 }, status: "running" },
    });

  // ---- latency, one at a time
  const latencyJob = jobs[WORKERS]!;
  const mamLatency = async (step: number): Promise<number> => {
    const { stood, id } = await commit(latencyJob, step);
    return (await arrivals.wait(id, 1)) - stood;
  };
  const rawLatency = async (): Promise<number> => {
    const id = `raw-${rawSeq++}`;
    const sent = performance.now();
    const arrived = arrivals.wait(id, 1);
    // Both messages, as the relay sends them; the latency is the first one's, as for mam.
    await raw!.publishAsync("mam/jobs/bench-raw/events", rawPayload(id), { qos: 1 });
    await raw!.publishAsync("mam/events", rawPayload(id), { qos: 1 });
    return (await arrived) - sent;
  };
  console.log(
    `latency: ${grouped(N)} transitions one at a time per side (after ${grouped(WARMUP)} warm-up each), sides alternating in blocks of 500`,
  );
  for (let i = 0; i < WARMUP; i++) {
    await mamLatency(-i);
    await rawLatency();
  }
  const mamMs: number[] = [];
  const rawMs: number[] = [];
  // One at a time, nothing overlaps: the timed store and publisher calls are the
  // relay's and the commit's own, so their sum against mam's wall time is a share.
  resetSpent();
  let mamWall = 0;
  for (let done = 0; done < N; done += 500) {
    for (let i = 0; i < Math.min(500, N - done); i++) rawMs.push(await rawLatency());
    const blockStarted = performance.now();
    for (let i = 0; i < Math.min(500, N - done); i++) mamMs.push(await mamLatency(done + i));
    mamWall += performance.now() - blockStarted;
  }
  const sequential = { ...spent };
  mamMs.sort((a, b) => a - b);
  rawMs.sort((a, b) => a - b);
  const [mam50, mam99, raw50, raw99] = [percentile(mamMs, 50), percentile(mamMs, 99), percentile(rawMs, 50), percentile(rawMs, 99)];
  console.log(`  mam: commit -> message p50 ${fixed(mam50, 2)} ms, p99 ${fixed(mam99, 2)} ms`);
  console.log(`  raw mqtt.js: publish -> message p50 ${fixed(raw50, 2)} ms, p99 ${fixed(raw99, 2)} ms`);
  const writes = STORE_WRITES.reduce((sum, k) => sum + sequential[k], 0);
  console.log(
    `  store writes (the commit, the published log line, the settle): ${fixed((100 * writes) / mamWall)}% of mam's wall time ` +
      `(${fixed((writes * 1000) / N, 0)} us per intent); per intent: ` +
      (Object.keys(sequential) as Timed[]).map((k) => `${k} ${fixed((sequential[k] * 1000) / N, 0)} us`).join(", "),
  );

  // ---- rate, WORKERS in parallel, each waiting for both messages of its intent
  resetSpent();
  let mamLeft = RATE_INTENTS;
  const mamWorker = async (slot: { record: JobRecord }) => {
    while (mamLeft > 0) {
      mamLeft--;
      const { id } = await commit(slot, mamLeft);
      await Promise.all([arrivals.wait(id, 1), arrivals.wait(`${id}+`, 1)]);
    }
  };
  let rawLeft = RATE_INTENTS;
  const rawWorker = async () => {
    while (rawLeft > 0) {
      rawLeft--;
      const id = `raw-${rawSeq++}`;
      const both = Promise.all([arrivals.wait(id, 1), arrivals.wait(`${id}+`, 1)]);
      await raw!.publishAsync("mam/jobs/bench-raw/events", rawPayload(id), { qos: 1 });
      await raw!.publishAsync("mam/events", rawPayload(id), { qos: 1 });
      await both;
    }
  };
  console.log(`rate: ${grouped(RATE_INTENTS)} intents per side, ${WORKERS} workers, each waiting for both messages of its intent`);
  let started = performance.now();
  await Promise.all(Array.from({ length: WORKERS }, () => rawWorker()));
  const rawRate = RATE_INTENTS / ((performance.now() - started) / 1000);
  resetSpent();
  started = performance.now();
  await Promise.all(jobs.slice(0, WORKERS).map((slot) => mamWorker(slot)));
  const mamElapsed = performance.now() - started;
  const mamRate = RATE_INTENTS / (mamElapsed / 1000);
  console.log(
    `  mam: ${grouped(mamRate)} intents/s committed and delivered; raw mqtt.js: ${grouped(rawRate)} intents/s (two QoS 1 messages each)`,
  );

  const p99Ratio = mam99 / raw99;
  const rateRatio = mamRate / rawRate;
  console.log(
    `notify latency: p99 ${fixed(p99Ratio, 2)}x raw mqtt.js (goal <= ${P99_GOAL}x) ${verdict(p99Ratio <= P99_GOAL)}; ` +
      `p50 ${fixed(mam50 / raw50, 2)}x; mam p99 ${fixed(mam99, 2)} ms, raw p99 ${fixed(raw99, 2)} ms`,
  );
  console.log(
    `notify rate: ${fixed(rateRatio, 2)}x raw mqtt.js (goal >= ${RATE_GOAL}x) ${verdict(rateRatio >= RATE_GOAL)}; ` +
      `mam ${grouped(mamRate)}/s, raw ${grouped(rawRate)}/s`,
  );
  if (p99Ratio > P99_GOAL || rateRatio < RATE_GOAL) {
    console.log(
      `where the time goes (one at a time, as shares of mam's wall time; they overlap, since the relay logs and settles an ` +
        `intent after its subscriber has it, while the next commit runs): store writes ${fixed((100 * writes) / mamWall)}%, ` +
        `the relay's read ${fixed((100 * sequential.get) / mamWall)}%, the two acknowledged publishes ` +
        `${fixed((100 * sequential.publish) / mamWall)}%. Raw mqtt.js does only the two publishes (one after the other, over ` +
        "its socket); mam publishes in the broker's process but also commits the transition (with its feed row and the owed " +
        "index) and logs the publish with its settle (with its feed row): two SQLite writes of several pages each per intent, " +
        "whose commits the store groups across the jobs that write in the same turn. What is left is those writes' page " +
        "work, not JavaScript: fewer rows or indexes per write would trade the feed's or the sweep's guarantees.",
    );
  }
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
} finally {
  await raw?.endAsync();
  await subscriber?.endAsync();
  await service.stop();
  await tmp.dispose();
}
