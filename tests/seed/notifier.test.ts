/** Seed section 4: notifications are durable intents, published after commit. */
import {
  bookkeeping,
  type Deps,
  flushNotification,
  jobTopic,
  type NotificationPayload,
  newIntent,
  OPERATOR,
  type Publisher,
  recoverNotifications,
  registerJob,
  transitionJob,
} from "@mam/core";
import { expect, it } from "vitest";
import { barrier } from "../support/subscriber.ts";
import { describeBackends } from "./harness.ts";

/** The seed's register, claim, then `completed` with notify. */
async function completedJob(deps: Deps): Promise<string> {
  const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
  const running = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: job.transition_seq }, OPERATOR);
  await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: running.transition_seq, notify: true }, OPERATOR);
  return job.job_id;
}

const parse = (payload: string): NotificationPayload => JSON.parse(payload) as NotificationPayload;

describeBackends("seed 4: notifications", (backend) => {
  it("B-35 a transition that notifies commits its intent with the state: intent seq == transition_seq", async () => {
    const deps = backend().deps();
    const jobId = await completedJob(deps);
    const record = await deps.jobs.get(jobId);
    expect(record?.status).toBe("completed");
    const intent = record?.pending_notification;
    expect(intent?.event).toBe("completed");
    expect(intent?.seq).toBe(record?.transition_seq);
    expect((await deps.jobs.listOwed(100)).map((r) => r.job_id)).toContain(jobId);
  });

  it("B-36 flushing publishes the intent then settles it; a second flush has nothing to do and publishes nothing", async () => {
    const b = backend();
    const deps = b.deps();
    const jobId = await completedJob(deps);
    const sub = await b.subscribe(jobTopic(jobId));

    const first = await flushNotification(deps, jobId);
    expect(first.outcome).toBe("sent");
    const message = await sub.waitFor(() => true);
    expect(parse(message.payload).event).toBe("completed");
    expect((await deps.jobs.get(jobId))?.pending_notification).toBeUndefined();

    const second = await flushNotification(deps, jobId);
    expect(second.outcome).toBe("nothing_owed");
    expect(await barrier(sub, deps.publisher, jobTopic(jobId))).toBe(1);
    expect(sub.received.filter((m) => m.payload.startsWith("{"))).toHaveLength(1);
  });

  it.each([
    { failure: "a broker that refuses the publish", publisher: (b: ReturnType<typeof backend>) => b.refusingPublisher() },
    { failure: "an unreachable broker", publisher: (b: ReturnType<typeof backend>) => b.unreachablePublisher() },
    {
      failure: "a publisher that throws",
      publisher: async (): Promise<Publisher> => ({
        publish() {
          throw new Error("EIO: the socket exploded");
        },
      }),
    },
  ])("B-37 a failed send ($failure) leaves the intent pending; the state stays committed", async ({ publisher }) => {
    const b = backend();
    const deps = b.deps(undefined, { publisher: await publisher(b) });
    const jobId = await completedJob(deps);
    const owed = (await deps.jobs.get(jobId))?.pending_notification;
    expect(owed).toBeDefined();

    const result = await flushNotification(deps, jobId);
    expect(result.outcome).toBe("failed");
    const record = await deps.jobs.get(jobId);
    expect(record?.pending_notification).toEqual(owed);
    expect(record?.status).toBe("completed");
  });

  it("B-38 recovery after a restart re-sends exactly the owed notifications, and afterwards nothing is owed", async () => {
    const b = backend();
    let deps = b.deps();
    const owed: string[] = [];
    for (let i = 0; i < 3; i++) owed.push(await completedJob(deps));
    const settled = await registerJob(deps, { prompt: "p", agent: "claude-code" });
    await transitionJob(deps, settled.job_id, { action: "claim", expectedSeq: settled.transition_seq }, OPERATOR);

    await b.restart();
    deps = b.deps();
    expect((await deps.jobs.listOwed(100)).map((r) => r.job_id).sort()).toEqual([...owed].sort());

    const sub = await b.subscribe("mam/jobs/+/events");
    const result = await recoverNotifications(deps);
    expect(result.owed).toBe(3);
    expect(result.sent).toBe(3);
    expect(result.failed).toBe(0);
    expect(result.results.map((r) => r.job_id).sort()).toEqual([...owed].sort());
    expect(result.results.every((r) => r.outcome === "sent")).toBe(true);

    await barrier(sub, deps.publisher, jobTopic(settled.job_id));
    const sentTo = sub.received.filter((m) => m.payload.startsWith("{")).map((m) => parse(m.payload).job_id);
    expect(sentTo.sort()).toEqual([...owed].sort());
    expect(await deps.jobs.listOwed(100)).toEqual([]);
  });

  it("B-39 settling is conditional on the intent that was sent: a newer intent written mid-send survives", async () => {
    const b = backend();
    const base = b.deps();
    const jobId = await completedJob(base);
    const sent = (await base.jobs.get(jobId))?.pending_notification;
    let raced = false;
    const racing: Publisher = {
      async publish(topic, payload) {
        if (!raced) {
          raced = true;
          await bookkeeping(base, jobId, { pending_notification: newIntent(base, "error", 999, "later") });
        }
        await base.publisher.publish(topic, payload);
      },
    };
    const deps = b.deps(undefined, { publisher: racing });
    const result = await flushNotification(deps, jobId);
    expect(raced).toBe(true);
    expect(result.outcome).toBe("sent");
    if (result.outcome === "sent") {
      expect(result.intent.id).toBe(sent?.id);
      expect(result.settled).toBe(false);
    }
    const stillOwed = (await deps.jobs.get(jobId))?.pending_notification;
    expect(stillOwed?.seq).toBe(999);
    expect(stillOwed?.event).toBe("error");
  });

  it("B-40 the payload carries the intent's identity, and the attempt is logged even when the broker refuses it", async () => {
    const b = backend();
    // delivered: the subscriber gets notification_intent {id, seq}
    const deps = b.deps();
    const jobId = await completedJob(deps);
    const intent = (await deps.jobs.get(jobId))?.pending_notification;
    const sub = await b.subscribe(jobTopic(jobId));
    await flushNotification(deps, jobId);
    const carried = parse((await sub.waitFor(() => true)).payload).data.notification_intent;
    expect(carried).toEqual({ id: intent?.id, seq: intent?.seq });

    // refused: the broker cannot be reached, yet the attempt is in the job's event log
    const down = b.deps(undefined, { publisher: await b.unreachablePublisher() });
    const other = await completedJob(down);
    const owed = (await down.jobs.get(other))?.pending_notification;
    expect((await flushNotification(down, other)).outcome).toBe("failed");
    const published = (await down.jobs.listEvents(other, { limit: 100 })).items.filter((e) => e.event === "published");
    expect(published.length).toBeGreaterThan(0);
    const last = published.at(-1)?.data as { outcome: string; payload: NotificationPayload } | undefined;
    expect(last?.outcome).toBe("failed");
    expect(last?.payload.data.notification_intent).toEqual({ id: owed?.id, seq: owed?.seq });
  });
});
