/** Seed section 5: the state engine's boundary. */
import {
  ACTIONS,
  bookkeeping,
  type Deps,
  isMamError,
  type JobRecord,
  OPERATOR,
  parseFlags,
  registerJob,
  settleNotification,
  TransitionConflict,
  transitionJob,
} from "@mam/core";
import { expect, it } from "vitest";
import { rejection } from "../support/rejection.ts";
import { describeBackends } from "./harness.ts";

async function completedJob(deps: Deps): Promise<JobRecord> {
  const job = await registerJob(deps, { prompt: "the original prompt", agent: "claude-code" });
  const running = await transitionJob(
    deps,
    job.job_id,
    { action: "claim", expectedSeq: job.transition_seq, fields: { agent_session: "herdr:%12" } },
    OPERATOR,
  );
  return transitionJob(deps, job.job_id, { action: "completed", expectedSeq: running.transition_seq, notify: true }, OPERATOR);
}

describeBackends("seed 5: the engine's boundary", (backend) => {
  it("B-41 bookkeeping may not merge anything but pending_notification; the record is unchanged and the legitimate settle works", async () => {
    const deps = backend().deps();
    const done = await completedJob(deps);
    const before = await deps.jobs.get(done.job_id);
    expect(before?.pending_notification).toBeDefined();

    const refused = await rejection(
      bookkeeping(deps, done.job_id, { pending_notification: null, prompt: "HACKED", agent_session: "herdr:attacker" }),
    );
    expect(isMamError(refused)).toBe(true);
    expect((refused as Error).message).toContain("may not merge");
    const after = await deps.jobs.get(done.job_id);
    expect(after).toEqual(before);
    expect(after?.prompt).toBe("the original prompt");
    expect(after?.agent_session).toBe("herdr:%12");
    expect(after?.pending_notification).toBeDefined();

    // the legitimate settle still works
    const intent = after?.pending_notification;
    if (intent === undefined) throw new Error("the intent survives a refused settle");
    expect(await settleNotification(deps, done.job_id, intent)).toBe(true);
    expect((await deps.jobs.get(done.job_id))?.pending_notification).toBeUndefined();
  });

  it("B-42 every state change is compare-and-swap on transition_seq: a stale writer loses and is told; a terminal record refuses every change", async () => {
    const b = backend();
    const deps = b.deps();
    const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
    const running = await transitionJob(deps, job.job_id, { action: "claim", expectedSeq: 0 }, OPERATOR);
    expect(running.transition_seq).toBe(1);

    // a writer still holding seq 0 loses, and is shown the record it lost to
    const stale = await rejection(
      transitionJob(deps, job.job_id, { action: "progress", expectedSeq: 0, fields: { progress: { step: 1 } } }, OPERATOR),
    );
    expect(stale).toBeInstanceOf(TransitionConflict);
    expect((stale as TransitionConflict).code).toBe("job.transitionConflict");
    expect((stale as TransitionConflict).current).toEqual(running);
    expect(await deps.jobs.get(job.job_id)).toEqual(running);

    // a terminal record accepts no further state change, whatever the action
    const done = await transitionJob(deps, job.job_id, { action: "completed", expectedSeq: 1 }, OPERATOR);
    for (const action of ACTIONS) {
      const refused = await rejection(transitionJob(deps, job.job_id, { action, expectedSeq: done.transition_seq }, OPERATOR));
      expect(isMamError(refused, "job.transitionRefused"), `${action}: ${String(refused)}`).toBe(true);
    }
    expect(await deps.jobs.get(job.job_id)).toEqual(done);

    // MAM_ENGINE_CAS=0: a stale seq wins (last writer wins), but a terminal record still refuses
    const rolledBack = b.deps(parseFlags({ MAM_ENGINE_CAS: "0" }));
    const other = await registerJob(rolledBack, { prompt: "p", agent: "claude-code" });
    await transitionJob(rolledBack, other.job_id, { action: "claim", expectedSeq: 0 }, OPERATOR);
    const won = await transitionJob(
      rolledBack,
      other.job_id,
      { action: "progress", expectedSeq: 0, fields: { progress: { step: 2 } } },
      OPERATOR,
    );
    expect(won.transition_seq).toBe(2);
    expect(won.progress).toEqual({ step: 2 });
    const finished = await transitionJob(rolledBack, other.job_id, { action: "error", expectedSeq: 0 }, OPERATOR);
    expect(finished.status).toBe("error");
    for (const action of ACTIONS) {
      const refused = await rejection(transitionJob(rolledBack, other.job_id, { action, expectedSeq: 0 }, OPERATOR));
      expect(isMamError(refused, "job.transitionRefused"), `${action}: ${String(refused)}`).toBe(true);
    }
    expect(await rolledBack.jobs.get(other.job_id)).toEqual(finished);
  });
});
