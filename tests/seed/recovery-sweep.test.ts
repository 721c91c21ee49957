/**
 * Beyond the seed (issue 8, "a sweep no record can stop"), on every seed backend:
 * the recovery sweep handles each owed intent on its own. One that keeps failing for
 * a reason of its own backs off and is quarantined after N failures, without
 * delaying anyone else; an unreachable broker counts against nobody.
 */
import {
  type Deps,
  type JobStore,
  jobTopic,
  MamError,
  type NotificationPayload,
  newIntent,
  OPERATOR,
  type Publisher,
  type RecoverOptions,
  recoverNotifications,
  registerJob,
  releaseNotification,
  type SweepPolicy,
  transitionJob,
} from "@mam/core";
import { expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import type { Subscription } from "../support/subscriber.ts";
import { CLOCK_START, describeBackends, type SeedBackend } from "./harness.ts";

const MINUTE = 60_000;

/**
 * Register, claim, complete with notify: the job owes its `completed` intent. The
 * clock moves a second first, so jobs owe in the order they were made.
 */
async function completedJob(deps: Deps & { clock: TestClock }): Promise<string> {
  deps.clock.advance(1000);
  const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
  const running = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
  await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: running.transition_seq, notify: true }, OPERATOR);
  return job.job_id;
}

async function owedIntentId(deps: Deps, jobId: string): Promise<string> {
  const id = (await deps.jobs.get(jobId))?.pending_notification?.id;
  if (id === undefined) throw new Error(`job ${jobId} owes nothing`);
  return id;
}

/** Resolves once the subscriber has this job's notification of this intent on the job's topic. */
function delivered(sub: Subscription, jobId: string, intentId: string): Promise<unknown> {
  return sub.waitFor((m) => {
    if (m.topic !== jobTopic(jobId)) return false;
    return (JSON.parse(m.payload) as NotificationPayload).data.notification_intent.id === intentId;
  });
}

function sweepWith(policy: SweepPolicy, extra: Partial<RecoverOptions> = {}) {
  const logged: Record<string, unknown>[] = [];
  const run = (deps: Deps) => recoverNotifications(deps, { policy, log: (e) => logged.push({ ...e }), ...extra });
  return { run, logged };
}

/** A pass-through over the real store whose event-log append fails for one job only. */
function logFailsFor(jobs: JobStore, jobId: string): JobStore {
  return new Proxy(jobs, {
    get(target, prop) {
      const value: unknown = Reflect.get(target, prop, target);
      if (prop === "appendEvent") {
        return async (entry: Parameters<JobStore["appendEvent"]>[0]) => {
          if (entry.job_id === jobId) throw new Error("EIO: the event log of this job cannot be written");
          return target.appendEvent(entry);
        };
      }
      if (prop === "settlePublished") {
        return async (entry: Parameters<JobStore["settlePublished"]>[0], intentId: string) => {
          if (entry.job_id === jobId) throw new Error("EIO: the event log of this job cannot be written");
          return target.settlePublished(entry, intentId);
        };
      }
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/**
 * A job owing a notification whose record cannot be flushed for a reason of its own:
 * on SQLite a record past its JSON depth limit (it publishes, but can never be
 * settled); on DynamoDB an owed intent that is not a readable intent (no event).
 */
async function unflushableJob(b: SeedBackend, deps: Deps & { clock: TestClock }): Promise<string> {
  deps.clock.advance(1000);
  const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
  if (b.name === "embedded") {
    let deep: unknown = 1;
    for (let i = 0; i < 999; i++) deep = [deep];
    // A legacy record (no write of the store makes one now: its batch would fail whole),
    // planted around the store, as an older version left it.
    await b.plantJob({
      ...job,
      status: "completed",
      transition_seq: 1,
      progress: { deep },
      pending_notification: newIntent(deps, "completed", 1),
    });
  } else {
    const { event: _dropped, ...unreadable } = newIntent(deps, "completed", 1);
    // Planted around the store, whose base would refuse it: a corrupt item, as no caller of the port can write one.
    await b.plantJob({ ...job, job_id: `${job.job_id}-x`, pending_notification: unreadable });
    return `${job.job_id}-x`;
  }
  return job.job_id;
}

describeBackends("recovery sweep: no record can stop it", (backend) => {
  it("a notification the broker refuses does not block the others; it backs off, is quarantined after N failures, listed, skipped until released, then delivered", async () => {
    const b = backend();
    const clock = new TestClock(CLOCK_START);
    const deps = { ...b.deps(undefined, { clock }), clock };
    const { run, logged } = sweepWith({ maxFailures: 3, backoffMs: MINUTE });

    // The refused job is the oldest: first in line, and it must not hold the others up.
    const refused = await completedJob(deps);
    const first = await completedJob(deps);
    const second = await completedJob(deps);
    const [refusedIntent, firstIntent, secondIntent] = [
      await owedIntentId(deps, refused),
      await owedIntentId(deps, first),
      await owedIntentId(deps, second),
    ];
    const before = await deps.jobs.get(refused);
    b.refusedTopics.add(jobTopic(refused));
    const sub = await b.subscribe("mam/jobs/+/events");

    const sweptAt = clock.now().getTime();
    const r1 = await run(deps);
    expect(r1).toMatchObject({ owed: 3, sent: 2, failed: 1, quarantined: 0, not_tried: 0 });
    expect(r1.results).toEqual([
      {
        job_id: refused,
        intent_id: refusedIntent,
        outcome: "failed",
        error: { code: "publish.refused", message: expect.any(String) },
        failures: 1,
        retry_at: new Date(sweptAt + MINUTE).toISOString(),
      },
      { job_id: first, intent_id: firstIntent, outcome: "sent" },
      { job_id: second, intent_id: secondIntent, outcome: "sent" },
    ]);
    await delivered(sub, first, firstIntent);
    await delivered(sub, second, secondIntent);
    // The failure is bookkeeping on the intent: the same intent, the state untouched.
    const marked = await deps.jobs.get(refused);
    expect(marked?.pending_notification).toMatchObject({ id: refusedIntent, failures: 1, last_error: { code: "publish.refused" } });
    expect(marked?.transition_seq).toBe(before?.transition_seq);
    expect(marked?.updated_at).toBe(before?.updated_at);

    // Backing off: not read before its retry_at, then tried again with a doubled wait.
    expect(await run(deps)).toMatchObject({ owed: 0, results: [] });
    clock.advance(MINUTE);
    const r3 = await run(deps);
    expect(r3.results).toEqual([expect.objectContaining({ job_id: refused, outcome: "failed", failures: 2 })]);
    clock.advance(MINUTE);
    expect((await run(deps)).owed).toBe(0);
    clock.advance(MINUTE);
    expect(logged).toEqual([]);

    // The N-th failure quarantines it, with one log line.
    const r4 = await run(deps);
    expect(r4).toMatchObject({ owed: 1, sent: 0, failed: 0, quarantined: 1 });
    expect(r4.results).toEqual([
      {
        job_id: refused,
        intent_id: refusedIntent,
        outcome: "quarantined",
        error: expect.objectContaining({ code: "publish.refused" }),
        failures: 3,
      },
    ]);
    expect(logged).toEqual([
      {
        level: "warn",
        event: "notification_quarantined",
        job_id: refused,
        intent_id: refusedIntent,
        failures: 3,
        error: expect.objectContaining({ code: "publish.refused" }),
      },
    ]);
    expect(await deps.jobs.listOwed(100)).toEqual([]);
    const listed = await deps.jobs.listQuarantined({ limit: 10 });
    expect(listed.items.map((j) => j.job_id)).toEqual([refused]);
    expect(listed.items[0]?.pending_notification).toMatchObject({
      id: refusedIntent,
      failures: 3,
      quarantined_at: clock.now().toISOString(),
    });

    // Still owed, never tried again: not a day later, not once the broker accepts again.
    clock.advance(24 * 60 * MINUTE);
    expect((await run(deps)).owed).toBe(0);
    b.refusedTopics.delete(jobTopic(refused));
    expect((await run(deps)).owed).toBe(0);

    // Released by an operator: the next sweep delivers it, once.
    const release = await releaseNotification(deps, refused);
    expect(release.released).toBe(true);
    // Failures, backoff and quarantine cleared; why it last failed is kept for the reader.
    expect(release.record.pending_notification).toEqual({
      ...before?.pending_notification,
      last_error: expect.objectContaining({ code: "publish.refused" }),
    });
    expect((await deps.jobs.get(refused))?.pending_notification).toEqual(release.record.pending_notification);
    expect((await deps.jobs.listQuarantined({ limit: 10 })).items).toEqual([]);
    const r6 = await run(deps);
    expect(r6).toMatchObject({ owed: 1, sent: 1, failed: 0, quarantined: 0 });
    await delivered(sub, refused, refusedIntent);
    expect(sub.received.filter((m) => m.topic === jobTopic(refused))).toHaveLength(1);
    expect((await deps.jobs.get(refused))?.pending_notification).toBeUndefined();
    expect(await releaseNotification(deps, refused)).toMatchObject({
      released: false,
      reason: expect.stringContaining("owes no notification"),
    });
  });

  it("an unreachable broker counts against nobody: each intent is deferred, no failure recorded, and the pass's time budget leaves the rest not_tried", async () => {
    const b = backend();
    const clock = new TestClock(CLOCK_START);
    const live = { ...b.deps(undefined, { clock }), clock };
    const down = { ...b.deps(undefined, { clock, publisher: await b.unreachablePublisher() }), clock };
    const { run, logged } = sweepWith({ maxFailures: 2, backoffMs: MINUTE });
    const jobs = [await completedJob(live), await completedJob(live), await completedJob(live)];
    const owedBefore = await Promise.all(jobs.map(async (j) => (await live.jobs.get(j))?.pending_notification));

    for (let sweep = 0; sweep < 3; sweep++) {
      const r = await run(down);
      expect(r).toMatchObject({ owed: 3, sent: 0, failed: 3, quarantined: 0, not_tried: 0 });
      expect(r.results.map((x) => x.outcome)).toEqual(["deferred", "deferred", "deferred"]);
      expect(r.results.map((x) => x.error?.code)).toEqual(["publish.unreachable", "publish.unreachable", "publish.unreachable"]);
      clock.advance(60 * MINUTE);
    }
    // A pass whose budget is spent after two intents (a monotonic clock of its own, 10 ms a look).
    let looks = 0;
    const budgeted = await recoverNotifications(down, { budgetMs: 25, elapsedClock: () => 10 * looks++ });
    expect(budgeted.results.map((x) => x.outcome)).toEqual(["deferred", "deferred", "not_tried"]);
    // Nothing counted, nothing backed off, nothing quarantined.
    expect(await Promise.all(jobs.map(async (j) => (await live.jobs.get(j))?.pending_notification))).toEqual(owedBefore);
    expect(logged).toEqual([]);

    const sub = await b.subscribe("mam/jobs/+/events");
    expect(await run(live)).toMatchObject({ owed: 3, sent: 3, failed: 0 });
    for (const [i, j] of jobs.entries()) await delivered(sub, j, owedBefore[i]?.id ?? "");
  });

  it("a publish that times out under congestion defers its intent alone: the sweep goes on and sends the others (issue 17)", async () => {
    const b = backend();
    const clock = new TestClock(CLOCK_START);
    const live = { ...b.deps(undefined, { clock }), clock };
    const jobs = [await completedJob(live), await completedJob(live), await completedJob(live)];
    const ids = await Promise.all(jobs.map((j) => owedIntentId(live, j)));
    const congested = jobTopic(jobs[0] ?? "");
    // The real publisher, but the first job's publish meets a congested broker (as the storm of issue 17 did).
    const publisher: Publisher = {
      publish: (topic, payload) =>
        topic === congested
          ? Promise.reject(new MamError("publish.unreachable", "the broker did not finish the publish within 5000 ms"))
          : live.publisher.publish(topic, payload),
    };
    const sub = await b.subscribe("mam/jobs/+/events");
    const { run, logged } = sweepWith({ maxFailures: 1, backoffMs: MINUTE });
    const r = await run({ ...live, publisher });
    expect(r.results.map((x) => x.outcome)).toEqual(["deferred", "sent", "sent"]);
    expect(r).toMatchObject({ owed: 3, sent: 2, quarantined: 0, not_tried: 0 });
    for (const [i, j] of jobs.entries()) if (i > 0) await delivered(sub, j, ids[i] ?? "");
    // Not counted, though one failure would quarantine: it is owed as it was, and goes out next pass.
    expect((await live.jobs.get(jobs[0] ?? ""))?.pending_notification?.failures).toBeUndefined();
    expect(logged).toEqual([]);
    expect(await run(live)).toMatchObject({ owed: 1, sent: 1, quarantined: 0 });
  });

  it("a record whose event-log line cannot be appended fails for itself alone and is quarantined after N sweeps", async () => {
    const b = backend();
    const clock = new TestClock(CLOCK_START);
    const base = { ...b.deps(undefined, { clock }), clock };
    const broken = await completedJob(base);
    const healthy = await completedJob(base);
    const deps: Deps = { ...base, jobs: logFailsFor(base.jobs, broken) };
    const { run, logged } = sweepWith({ maxFailures: 2, backoffMs: MINUTE });

    const r1 = await run(deps);
    expect(r1).toMatchObject({ owed: 2, sent: 1, failed: 1 });
    // The answer and the record say `internal`; what went wrong is in the log alone.
    expect(r1.results[0]).toMatchObject({ job_id: broken, outcome: "failed", failures: 1, error: { code: "internal" } });
    expect(JSON.stringify(r1.results)).not.toContain("EIO");
    expect((await deps.jobs.get(broken))?.pending_notification?.last_error).toMatchObject({ code: "internal" });
    expect(r1.results[1]).toMatchObject({ job_id: healthy, outcome: "sent" });
    expect(logged).toEqual([
      expect.objectContaining({
        level: "error",
        event: "notification_sweep_error",
        job_id: broken,
        error: expect.objectContaining({ message: expect.stringContaining("EIO") }),
      }),
    ]);

    clock.advance(MINUTE);
    const r2 = await run(deps);
    expect(r2.results).toEqual([expect.objectContaining({ job_id: broken, outcome: "quarantined", failures: 2 })]);
    expect(logged.map((e) => e.event)).toEqual(["notification_sweep_error", "notification_sweep_error", "notification_quarantined"]);
    expect((await deps.jobs.listQuarantined({ limit: 10 })).items.map((j) => j.job_id)).toEqual([broken]);
  });

  it("a record that cannot be flushed (unwritable or unreadable) is counted for itself, quarantined after N, and never stops the sweep", async () => {
    const b = backend();
    const clock = new TestClock(CLOCK_START);
    const deps = { ...b.deps(undefined, { clock }), clock };
    const { run } = sweepWith({ maxFailures: 2, backoffMs: MINUTE });
    const bad = await unflushableJob(b, deps);
    const sub = await b.subscribe("mam/jobs/+/events");

    const healthy = await completedJob(deps);
    const r1 = await run(deps);
    expect(r1.results.map((r) => [r.job_id, r.outcome])).toEqual([
      [bad, "failed"],
      [healthy, "sent"],
    ]);
    expect(r1.results[0]).toMatchObject({ failures: 1, error: { code: "internal" } });
    await delivered(sub, healthy, r1.results[1]?.intent_id ?? "");

    clock.advance(MINUTE);
    const later = await completedJob(deps);
    const r2 = await run(deps);
    expect(r2.results.map((r) => [r.job_id, r.outcome])).toEqual([
      [bad, "quarantined"],
      [later, "sent"],
    ]);
    expect((await deps.jobs.listQuarantined({ limit: 10 })).items.map((j) => j.job_id)).toEqual([bad]);
    clock.advance(60 * MINUTE);
    expect((await run(deps)).owed).toBe(0);
  });

  it("more than `limit` failing intents cannot starve a healthy one: each failure moves behind what is due", async () => {
    const b = backend();
    const clock = new TestClock(CLOCK_START);
    const deps = { ...b.deps(undefined, { clock }), clock };
    const { run } = sweepWith({ maxFailures: 5, backoffMs: MINUTE }, { limit: 2 });
    const refused = [await completedJob(deps), await completedJob(deps), await completedJob(deps)];
    for (const j of refused) b.refusedTopics.add(jobTopic(j));
    const healthy = await completedJob(deps);
    const healthyIntent = await owedIntentId(deps, healthy);
    const sub = await b.subscribe("mam/jobs/+/events");

    const r1 = await run(deps);
    expect(r1.results.map((r) => [r.job_id, r.outcome])).toEqual([
      [refused[0], "failed"],
      [refused[1], "failed"],
    ]);
    // The same instant: the two that failed are no longer due; the healthy one is reached.
    const r2 = await run(deps);
    expect(r2.results.map((r) => [r.job_id, r.outcome])).toEqual([
      [refused[2], "failed"],
      [healthy, "sent"],
    ]);
    await delivered(sub, healthy, healthyIntent);
  });
});
