/**
 * The broker outage (issue 11, Reliability): `mam serve` publishes to an external
 * broker in a process of its own (MAM_MQTT_URL; the same hardened aedes broker,
 * keeping sessions on disk with the same persistence library), and a `clean: false`
 * subscriber is on it. During a load of commits the broker is killed (SIGKILL) for
 * 10 s — the outage's length, as the issue sets it — and started again on the same
 * port and the same disk. The API answers throughout (every commit answered, 2xx
 * or 4xx, never a 5xx or a hang; during the outage with `published: false`), and
 * afterwards nothing committed is lost: every intent reached the subscriber or was
 * superseded, the ones owed since the outage delivered by the sweep.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { dataDirPaths, MqttPublisher } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { type BrokerProcess, brokerSubscriberToken, startBrokerProcess } from "../support/broker-process.ts";
import { deadPort } from "../support/dead-port.ts";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { barrier, subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";
import {
  acknowledgedIds,
  checkAgainstFeed,
  feedRows,
  Ledger,
  latestDelivered,
  printTally,
  registerJobs,
  runWriters,
  type ServiceHandle,
  seededRandom,
  soakSeed,
  tally,
} from "./ledger.ts";

const JOBS = 20;
const COMMITS_PER_JOB = 60;
const WRITERS = 4;
/** The outage starts after this many commits. */
const OUTAGE_AFTER = 100;
/** How long the broker stays down: the figure, not a wait for an event. */
const OUTAGE_MS = 10_000;

describe("reliability: the external broker killed for 10 s under load", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  it("the API answers throughout, 0 lost, every owed intent delivered by the sweep once the broker is back", async () => {
    const seed = soakSeed();
    console.log(`broker outage: seed ${seed} (MAM_SOAK_SEED=${seed} replays it)`);
    const serveDir = await tempDir("outage-serve");
    const brokerDir = await tempDir("outage-broker");
    cleanup.push(
      () => serveDir.remove(),
      () => brokerDir.remove(),
    );
    const port = await deadPort();
    const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
    const signingKey = randomBytes(32).toString("hex");
    const brokerOptions = { port, sessionsDir: brokerDir.dir, credentials, signingKey };
    let broker: BrokerProcess = await startBrokerProcess(brokerOptions);
    cleanup.push(() => broker.stop("SIGKILL"));

    const served: ServeProcess = await startServeProcess(serveDir.dir, {
      MAM_MQTT_URL: broker.url,
      MAM_MQTT_USERNAME: credentials.username,
      MAM_MQTT_PASSWORD: credentials.password,
      MAM_SWEEP_INTERVAL_SECONDS: "1",
    });
    cleanup.push(() => served.stop("SIGKILL"));
    const token = JSON.parse(await readFile(dataDirPaths(serveDir.dir).credentials, "utf8")).operator_token;
    const service: ServiceHandle = { up: async () => served.url, token };

    const sub = await subscribe(broker.url, "mam/jobs/+/events", {
      clientId: "outage-subscriber",
      clean: false,
      reconnectPeriodMs: 100,
      token: brokerSubscriberToken(signingKey, "outage-subscriber"),
    });
    cleanup.push(() => sub.close());
    const jobs = await registerJobs(service, JOBS);

    // The outage: SIGKILL after OUTAGE_AFTER commits, the same broker back OUTAGE_MS later.
    type Phase = "before" | "during" | "after";
    let phase: Phase = "before";
    const answers: Record<Phase, { total: number; claimsPublished: number; statuses: Set<number> }> = {
      before: { total: 0, claimsPublished: 0, statuses: new Set() },
      during: { total: 0, claimsPublished: 0, statuses: new Set() },
      after: { total: 0, claimsPublished: 0, statuses: new Set() },
    };
    let outage: Promise<void> | undefined;
    const startOutage = () => {
      phase = "during";
      outage = (async () => {
        await broker.stop("SIGKILL");
        await new Promise((resolve) => setTimeout(resolve, OUTAGE_MS));
        broker = await startBrokerProcess(brokerOptions);
        phase = "after";
      })();
    };
    const ledger = new Ledger();
    await runWriters({
      service,
      jobs,
      commitsPerJob: COMMITS_PER_JOB,
      writers: WRITERS,
      random: seededRandom(seed),
      ledger,
      // The service never goes away here: a request without an answer is a failure.
      resolveUnanswered: false,
      onAnswer: (answer, commits) => {
        const a = answers[phase];
        a.total++;
        a.statuses.add(answer.status);
        // mam serve's requests do not publish (the relay does): an answer never claims to know.
        if (answer.body !== undefined && answer.body !== null && "published" in answer.body) a.claimsPublished++;
        if (outage === undefined && commits + 1 >= OUTAGE_AFTER) startOutage();
      },
    });
    await outage;
    console.log(
      `broker outage: answers ${JSON.stringify(Object.fromEntries(Object.entries(answers).map(([k, v]) => [k, { ...v, statuses: [...v.statuses] }])))}`,
    );
    // The load spanned the outage, and the API answered throughout, 2xx or 4xx (runWriters refuses a hang).
    expect(answers.during.total).toBeGreaterThan(0);
    for (const a of Object.values(answers)) expect(a.claimsPublished).toBe(0);
    for (const a of Object.values(answers)) expect([...a.statuses].filter((s) => s >= 500 || s < 200)).toEqual([]);
    expect(ledger.byId.size).toBe(JOBS * COMMITS_PER_JOB);

    // What the outage left owed goes out by the sweep: each job's newest intent arrives.
    await latestDelivered(sub, ledger, 60_000);
    const publisher = new MqttPublisher({ url: broker.url, clientId: "outage-barrier", ...credentials });
    cleanup.push(() => publisher.close());
    await barrier(sub, publisher, "mam/jobs/barrier/events");
    // The sweep logs what it sent once its pass is over, which may be after its last
    // message arrived: wait for that line, then count every pass's sends.
    await served.line((l) => l.includes('"msg":"sweep"') && Number(JSON.parse(l).sent ?? 0) > 0, 60_000);
    const swept = served
      .stdout()
      .split("\n")
      .filter((l) => l.includes('"msg":"sweep"'))
      .reduce((n, l) => n + Number(JSON.parse(l).sent ?? 0), 0);

    const rows = await feedRows(service, ledger);
    const feed = checkAgainstFeed(ledger, rows);
    const t = tally(ledger, sub.received, await acknowledgedIds(service, jobs), feed.superseded);
    printTally("broker outage", t, {
      seed,
      outage_ms: OUTAGE_MS,
      answered_during_outage: answers.during.total,
      answers_claiming_published: answers.before.claimsPublished + answers.during.claimsPublished + answers.after.claimsPublished,
      sent_by_the_sweep: swept,
      subscriber_connections: sub.connections(),
      judged_against: "the feed",
    });
    expect(t.unknown).toBe(0);
    expect(t.lostIds).toEqual([]);
    expect(t.delivered + t.superseded).toBe(t.committed);
    expect(swept).toBeGreaterThan(0);
    expect(feed.missing).toEqual([]);
  }, 600_000);
});
