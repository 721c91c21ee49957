/**
 * The recovery sweep as EventBridge Scheduler runs it: the recorded scheduled event
 * into the handler, against dynalite (jobs owing notifications, found through the
 * sparse index) and the IoT stand-in in front of a broker that refuses one topic.
 */
import { awsDeps } from "@mam/aws/deps";
import { type JobRecord, parseConfig, releaseNotification } from "@mam/core";
import type { ScheduledEvent } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRecoverySweepHandler } from "../../functions/compose.ts";
import { see } from "../evidence/observing.ts";
import { readyJob } from "../seed/scenario.ts";
import { TestClock } from "../support/clock.ts";
import { jobRecord } from "../support/records.ts";
import { CREDENTIALS, lambdaContext, lambdaFixture, memoryLog, type Peers, startPeers, TRANSACTIONS } from "./support.ts";

let peers: Peers;

beforeAll(async () => {
  peers = await startPeers();
});

afterAll(async () => {
  await peers?.close();
});

const scheduled = (): ScheduledEvent => lambdaFixture<ScheduledEvent>("eventbridge-scheduled.json");

function job(jobId: string, owes: boolean, minute: number): JobRecord {
  const at = `2025-01-15T12:0${minute}:00.000Z`;
  return jobRecord(jobId, {
    prompt: `Work on ${jobId}`,
    agent: "codex",
    status: "completed",
    transition_seq: 2,
    created_at: "2025-01-15T11:00:00.000Z",
    updated_at: at,
    ...(owes ? { pending_notification: { id: `intent-${jobId}`, event: "completed", seq: 2, created_at: at } } : {}),
  });
}

describe("recovery sweep (EventBridge schedule -> every owed notification)", () => {
  it("sends what it can, counts what it cannot, backs off and quarantines what keeps failing, logs JSON lines, and throws nothing", async () => {
    const table = await peers.newTable();
    const store = peers.store(table);
    for (const [id, owes, minute] of [
      ["sweep-a", true, 1],
      ["sweep-refused", true, 2],
      ["sweep-b", true, 3],
      ["sweep-settled", false, 4],
    ] as const) {
      await store.create(job(id, owes, minute));
    }
    peers.refusedTopics.add("mam/jobs/sweep-refused/events");
    const log = memoryLog();
    const clock = new TestClock("2025-01-15T12:10:00.000Z");
    // MAM_AUTO_COMPLETE is off here: the pass's evaluation part reads nothing.
    const off = { due: 0, completed: 0, held: 0, kept: 0, failed: 0, not_tried: 0, bytes_hashed: 0, disabled: true };
    const counts = (owed: number, sent: number, failed: number, quarantined = 0) => ({
      owed,
      sent,
      failed,
      quarantined,
      not_tried: 0,
      candidates: off,
      attention: { due: 0, stale: 0, overdue: 0, rekeyed: 0, lost_race: 0, failed: 0 },
    });
    try {
      const env = peers.env(table, { MAM_SWEEP_MAX_FAILURES: "2", MAM_SWEEP_BACKOFF_SECONDS: "60" });
      const sweep = createRecoverySweepHandler(env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: log.sink, clock });

      expect(await sweep(scheduled(), lambdaContext("mam-dev-recoverySweep"))).toEqual(counts(3, 2, 1));
      expect(log.entries()).toEqual([{ level: "info", msg: "recovery_sweep", event: "recovery_sweep", ...counts(3, 2, 1) }]);
      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["sweep-refused"]);

      // Backing off: the next run reads nothing until its retry_at.
      expect(await sweep(scheduled())).toEqual(counts(0, 0, 0));
      // Due at its retry_at, and taken once the sweep's grace (MAM_SWEEP_GRACE_SECONDS, 5 s) has passed it too.
      clock.advance(60_000);
      expect(await sweep(scheduled())).toEqual(counts(0, 0, 0));
      clock.advance(5_000);
      // The second failure of its own quarantines it (MAM_SWEEP_MAX_FAILURES=2): one more line.
      expect(await sweep(scheduled())).toEqual(counts(1, 0, 0, 1));
      expect(log.entries().at(-2)).toMatchObject({
        event: "notification_quarantined",
        job_id: "sweep-refused",
        intent_id: "intent-sweep-refused",
        failures: 2,
        error: { code: "publish.refused" },
      });
      peers.refusedTopics.delete("mam/jobs/sweep-refused/events");
      clock.advance(86_400_000);
      expect(await sweep(scheduled())).toEqual(counts(0, 0, 0));
      expect((await store.listQuarantined({ limit: 10 })).items.map((j) => j.job_id)).toEqual(["sweep-refused"]);

      // Released: the next run sends it.
      expect((await releaseNotification({ jobs: store }, "sweep-refused")).released).toBe(true);
      expect(await sweep(scheduled())).toEqual(counts(1, 1, 0));
      expect(await sweep(scheduled())).toEqual(counts(0, 0, 0));
      expect(
        log
          .entries()
          .filter((e) => e.event === "recovery_sweep")
          .map((e) => e.owed),
      ).toEqual([3, 0, 0, 1, 0, 1, 0]);
    } finally {
      peers.refusedTopics.delete("mam/jobs/sweep-refused/events");
    }
  });

  it("then evaluates the due candidates (issue 20): a job a watcher saw settle completes on recorded evidence, its S3 report re-hashed, and the counts say so; a hold clears the mark", async () => {
    const table = await peers.newTable();
    const clock = new TestClock(new Date().toISOString());
    const env = peers.env(table, { MAM_AUTO_COMPLETE: "1" });
    // The same composition the functions use, for the set-up: a ready job, its report in S3, a watcher's observations.
    const deps = awsDeps(parseConfig(env), { credentials: CREDENTIALS, transactions: TRANSACTIONS, clock });
    const settled = await readyJob(deps, {});
    const unsettled = await readyJob(deps, {});
    for (const job of [settled, unsettled]) {
      await see(deps, job, "working");
      clock.advance(1_000);
      await see(deps, job, "idle");
    }
    clock.advance(31_000);
    await see(deps, settled, "idle");
    const log = memoryLog();
    const sweep = createRecoverySweepHandler(env, { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: log.sink, clock });
    const counts = await sweep(scheduled(), lambdaContext("mam-dev-recoverySweep"));
    expect(counts.candidates).toMatchObject({ due: 2, completed: 1, held: 1, failed: 0, not_tried: 0 });
    expect(counts.candidates.bytes_hashed).toBeGreaterThan(0);
    expect(log.entries().at(-1)).toMatchObject({ event: "recovery_sweep", candidates: { due: 2, completed: 1, held: 1 } });
    const store = peers.store(table);
    expect(await store.get(settled.jobId)).toMatchObject({
      status: "completed",
      completed_evidence: { evidence: "recorded", rule: "watcher.pane_status", sources: ["watcher:herdr-1"] },
    });
    const held = await store.get(unsettled.jobId);
    expect(held?.status).toBe("running");
    expect(held?.candidate_at).toBeUndefined();
    expect((await sweep(scheduled())).candidates.due).toBe(0);
  });

  it("a store it cannot reach fails the run (EventBridge retries it; nothing was half done)", async () => {
    const sweep = createRecoverySweepHandler(
      { ...peers.env("mam-missing-table"), MAM_DYNAMODB_ENDPOINT: "http://127.0.0.1:9" },
      { credentials: CREDENTIALS, transactions: TRANSACTIONS, log: () => undefined },
    );
    await expect(sweep(scheduled())).rejects.toMatchObject({ code: "store.unavailable" });
  });
});
