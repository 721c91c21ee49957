/**
 * The restart soak (issue 11, Reliability): a subscriber with a persistent session
 * (`clean: false`, QoS 1, a fixed client id) on `mam serve`'s embedded broker; 2,000
 * commits over 20 jobs by 4 concurrent writers over the HTTP API, while `mam serve`
 * is killed with SIGKILL three times at seeded random points and restarted on the
 * same data dir and MQTT port. A request the kill left without an answer is
 * resolved from the job record and its event log. Afterwards every committed intent
 * has reached the subscriber at least once or was superseded (never acknowledged by
 * the broker, and a newer intent on its job), duplicates carry the same id, and
 * nothing committed is missing from the feed. `MAM_SOAK_SEED` replays a run.
 */
import { readFile } from "node:fs/promises";
import { dataDirPaths, MqttPublisher } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { deadPort } from "../support/dead-port.ts";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { barrier, dataDirSubscriberToken, subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";
import {
  acknowledgedIds,
  checkAgainstFeed,
  feedRows,
  intentIdOf,
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
const COMMITS_PER_JOB = 100;
const WRITERS = 4;
const KILLS = 3;

describe("reliability: mam serve killed three times under load, a persistent-session subscriber misses nothing", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  it("2,000 commits over 20 jobs, SIGKILL ×3 at seeded points: every committed intent delivered or superseded, lost = 0", async () => {
    const seed = soakSeed();
    console.log(`restart soak: seed ${seed} (MAM_SOAK_SEED=${seed} replays it)`);
    const random = seededRandom(seed);
    const total = JOBS * COMMITS_PER_JOB;
    // Three distinct kill points among the commits, away from both ends.
    const killAt = new Set<number>();
    while (killAt.size < KILLS) killAt.add(100 + Math.floor(random() * (total - 200)));
    const killPoints = [...killAt].sort((a, b) => a - b);
    console.log(`restart soak: SIGKILL after commit ${killPoints.join(", ")}`);

    const tmp = await tempDir("soak");
    cleanup.push(() => tmp.remove());
    const dir = tmp.dir;
    const mqttPort = await deadPort();
    const env = { MAM_MQTT_PORT: String(mqttPort) };
    let served: ServeProcess = await startServeProcess(dir, env, { cwd: dir, broker: true });
    cleanup.push(() => served.stop("SIGKILL"));
    const credentials = JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8"));

    let up: Promise<string> = Promise.resolve(served.url);
    let kills = 0;
    const service: ServiceHandle = { up: () => up, token: credentials.operator_token };
    const ledger = new Ledger();
    const killedAtLedger: number[] = [];
    const killAndRestart = () => {
      kills++;
      killedAtLedger.push(ledger.byId.size);
      const dying = served;
      // Set before the kill: a writer that loses its answer waits on the new process.
      up = (async () => {
        await dying.stop("SIGKILL");
        served = await startServeProcess(dir, env, { cwd: dir, broker: true });
        return served.url;
      })();
    };

    const sub = await subscribe(served.mqttUrl, "mam/jobs/+/events", {
      clientId: "soak-subscriber",
      clean: false,
      reconnectPeriodMs: 100,
      token: await dataDirSubscriberToken(dir, "soak-subscriber"),
    });
    cleanup.push(() => sub.close());
    const jobs = await registerJobs(service, JOBS);
    await runWriters({
      service,
      jobs,
      commitsPerJob: COMMITS_PER_JOB,
      writers: WRITERS,
      random,
      ledger,
      resolveUnanswered: true,
      onAnswer: (_answer, commits) => {
        if (kills < KILLS && commits + 1 >= (killPoints[kills] as number)) killAndRestart();
      },
    });
    await up;
    expect(kills).toBe(KILLS);
    expect(ledger.byId.size).toBe(total);

    // Each job's newest intent is owed until delivered; once all have arrived, a
    // marker published now arrives after anything still queued before it.
    await latestDelivered(sub, ledger, 60_000);
    const publisher = new MqttPublisher({ url: served.mqttUrl, clientId: "soak-barrier", ...credentials.mqtt });
    cleanup.push(() => publisher.close());
    await barrier(sub, publisher, "mam/jobs/barrier/events");

    // Duplicates share ids: every copy names the job and seq its commit gave it.
    for (const m of sub.received) {
      const id = intentIdOf(m);
      if (id === undefined) continue;
      const intent = ledger.byId.get(id);
      const payload = JSON.parse(m.payload);
      expect(intent === undefined ? undefined : [payload.job_id, payload.data.notification_intent.seq]).toEqual(
        intent === undefined ? undefined : [intent.jobId, intent.seq],
      );
    }

    const rows = await feedRows(service, ledger);
    const feed = checkAgainstFeed(ledger, rows);
    const acknowledged = await acknowledgedIds(service, jobs);
    const t = tally(ledger, sub.received, acknowledged, feed.superseded);
    if (t.lost > 0) {
      const order = [...ledger.byId.keys()];
      const where = t.lostIds.map((id) => ({ ...ledger.byId.get(id), at: order.indexOf(id), acknowledged: acknowledged.has(id) }));
      console.log(`restart soak: lost ${JSON.stringify(where)}; kills at ledger sizes ${killedAtLedger.join(", ")}`);
    }
    printTally("restart soak", t, {
      seed,
      kills,
      unanswered_requests_resolved: ledger.unanswered,
      subscriber_connections: sub.connections(),
      judged_against: "the feed",
    });
    expect(t.unknown).toBe(0);
    expect(t.lostIds).toEqual([]);
    expect(t.delivered + t.superseded).toBe(t.committed);
    expect(feed.missing).toEqual([]);
  }, 600_000);
});
