/**
 * The recovery sweep as EventBridge Scheduler runs it: the recorded scheduled event
 * into the handler, against dynalite (jobs owing notifications, found through the
 * sparse index) and the IoT stand-in in front of a broker that refuses one topic.
 */
import type { JobRecord } from "@mam/core";
import type { ScheduledEvent } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRecoverySweepHandler } from "../../functions/compose.ts";
import { CREDENTIALS, lambdaContext, lambdaFixture, memoryLog, type Peers, startPeers } from "./support.ts";

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
  return {
    job_id: jobId,
    prompt: `Work on ${jobId}`,
    agent: "codex",
    role: "Worker",
    status: "completed",
    iteration: 0,
    transition_seq: 2,
    evidence_seq: 0,
    expected_artifacts: [],
    auto_complete: false,
    created_at: "2025-01-15T11:00:00.000Z",
    updated_at: at,
    ...(owes ? { pending_notification: { id: `intent-${jobId}`, event: "completed", seq: 2, created_at: at } } : {}),
  };
}

describe("recovery sweep (EventBridge schedule -> every owed notification)", () => {
  it("sends what it can, counts what it cannot, logs {owed, sent, failed} as one JSON line, and throws nothing", async () => {
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
    try {
      const sweep = createRecoverySweepHandler(peers.env(table), { credentials: CREDENTIALS, log: log.sink });

      expect(await sweep(scheduled(), lambdaContext("mam-dev-recoverySweep"))).toEqual({ owed: 3, sent: 2, failed: 1 });
      expect(log.lines).toHaveLength(1);
      expect(JSON.parse(log.lines[0] ?? "")).toEqual({ event: "recovery_sweep", owed: 3, sent: 2, failed: 1 });
      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["sweep-refused"]);

      // The next run retries only what is still owed.
      expect(await sweep(scheduled())).toEqual({ owed: 1, sent: 0, failed: 1 });
      peers.refusedTopics.delete("mam/jobs/sweep-refused/events");
      expect(await sweep(scheduled())).toEqual({ owed: 1, sent: 1, failed: 0 });
      expect(await sweep(scheduled())).toEqual({ owed: 0, sent: 0, failed: 0 });
      expect(log.entries().map((e) => e.owed)).toEqual([3, 1, 1, 0]);
    } finally {
      peers.refusedTopics.delete("mam/jobs/sweep-refused/events");
    }
  });

  it("a store it cannot reach fails the run (EventBridge retries it; nothing was half done)", async () => {
    const sweep = createRecoverySweepHandler(
      { ...peers.env("mam-missing-table"), MAM_DYNAMODB_ENDPOINT: "http://127.0.0.1:9" },
      { credentials: CREDENTIALS, log: () => undefined },
    );
    await expect(sweep(scheduled())).rejects.toMatchObject({ code: "store.unavailable" });
  });
});
