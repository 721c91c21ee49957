/**
 * The engine's whole transition table, on core's in-memory store (behind the guard,
 * as every composition root puts its store; the real stores pass the same contract
 * suite, tests/contract): every status x every
 * action x every actor, the field permissions, CAS, and the notify default. The
 * expected table is written here from DESIGN.md, not read from the engine.
 */
import {
  type Action,
  type Actor,
  bookkeeping,
  type Deps,
  type Flags,
  isMamError,
  type JobRecord,
  type JobStore,
  MemoryJobStore,
  newIntent,
  OPERATOR,
  parseFlags,
  randomIds,
  registerJob,
  type Status,
  TransitionConflict,
  type TransitionInput,
  transitionJob,
} from "@mam/core";
import { beforeEach, describe, expect, it } from "vitest";
import { tickingClock } from "../support/clock.ts";
import { rejection } from "../support/rejection.ts";

type Bundle = Pick<Deps, "jobs" | "clock" | "ids" | "flags">;
type ActorKind = Actor["kind"];

const STATUSES: readonly Status[] = ["pending", "running", "completed", "error", "cancelled"];
const ACTION_LIST: readonly Action[] = ["claim", "progress", "completed", "error", "cancel"];
const ACTOR_KINDS: readonly ActorKind[] = ["agent", "operator"];

/** DESIGN.md, "Data": the transitions, who may take them, and what they notify. */
const EXPECTED: Record<Action, { from: readonly Status[]; to: Status; actors: readonly ActorKind[]; event: string }> = {
  claim: { from: ["pending"], to: "running", actors: ["agent", "operator"], event: "running" },
  progress: { from: ["running"], to: "running", actors: ["agent", "operator"], event: "progress" },
  completed: { from: ["pending", "running"], to: "completed", actors: ["agent", "operator"], event: "completed" },
  error: { from: ["pending", "running"], to: "error", actors: ["agent", "operator"], event: "error" },
  cancel: { from: ["pending", "running"], to: "cancelled", actors: ["operator"], event: "cancelled" },
};
const TERMINAL_STATUSES: readonly Status[] = ["completed", "error", "cancelled"];

let store: JobStore;
let deps: Bundle;

function bundle(flags: Flags): Bundle {
  return { jobs: store, clock: tickingClock("2026-11-20T12:00:00.000Z"), ids: randomIds, flags };
}

beforeEach(() => {
  store = new MemoryJobStore();
  deps = bundle(parseFlags({}));
});

const actorFor = (kind: ActorKind, jobId: string): Actor => (kind === "operator" ? OPERATOR : { kind: "agent", jobId, attemptId: 1 });

const step = (d: Bundle, job: JobRecord, input: Omit<TransitionInput, "expectedSeq">, actor: Actor = OPERATOR) =>
  transitionJob(d, job.job_id, { ...input, expectedSeq: job.transition_seq }, actor);

/** A fresh job, brought to `status` by the operator through the engine itself. */
async function jobIn(status: Status, d: Bundle = deps): Promise<JobRecord> {
  const job = await registerJob(d, { prompt: "p", agent: "claude-code" });
  switch (status) {
    case "pending":
      return job;
    case "running":
      return step(d, job, { action: "claim" });
    case "completed":
    case "error":
      return step(d, await step(d, job, { action: "claim" }), { action: status });
    case "cancelled":
      return step(d, job, { action: "cancel" });
    default:
      return status satisfies never;
  }
}

describe("registration", () => {
  it("a registered job is pending at transition_seq 0, iteration 1, a Worker, not opted in, expecting nothing", async () => {
    const job = await registerJob(deps, { prompt: "p", agent: "codex" });
    expect(job).toMatchObject({
      status: "pending",
      transition_seq: 0,
      iteration: 1,
      role: "Worker",
      auto_complete: false,
      expected_artifacts: [],
      agent: "codex",
    });
    expect(job).not.toHaveProperty("pending_notification");
    expect(await store.get(job.job_id)).toEqual(job);
  });
});

describe("the transition table", () => {
  const cases = STATUSES.flatMap((status) => ACTION_LIST.flatMap((action) => ACTOR_KINDS.map((actor) => ({ status, action, actor }))));

  it.each(cases)("$status --$action--> by $actor", async ({ status, action, actor }) => {
    const before = await jobIn(status);
    const rule = EXPECTED[action];
    const attempt = step(deps, before, { action }, actorFor(actor, before.job_id));

    if (!rule.actors.includes(actor)) {
      const e = await rejection(attempt);
      expect(isMamError(e, "job.actionForbidden"), String(e)).toBe(true);
      expect(await store.get(before.job_id)).toEqual(before);
      return;
    }
    if (!rule.from.includes(status)) {
      const e = await rejection(attempt);
      expect(e).toBeInstanceOf(TransitionConflict);
      expect((e as TransitionConflict).code).toBe("job.transitionRefused");
      expect((e as TransitionConflict).message).toContain(status);
      expect((e as TransitionConflict).current).toEqual(before);
      expect(await store.get(before.job_id)).toEqual(before);
      return;
    }
    const after = await attempt;
    expect(after.status).toBe(rule.to);
    expect(after.transition_seq).toBe(before.transition_seq + 1);
    if (TERMINAL_STATUSES.includes(rule.to)) {
      expect(after.pending_notification).toMatchObject({ event: rule.event, seq: after.transition_seq });
    } else {
      expect(after.pending_notification).toBeUndefined();
    }
    expect(await store.get(before.job_id)).toEqual(after);
  });

  it("every status x action x actor is covered (50 cases)", () => {
    expect(cases).toHaveLength(50);
  });
});

describe("field permissions", () => {
  it.each(["claim", "progress"] as const)("an agent may set its free-form progress and agent_session on %s", async (action) => {
    const job = await jobIn(action === "claim" ? "pending" : "running");
    const after = await step(
      deps,
      job,
      { action, fields: { progress: { step: 3, note: "tests green" }, agent_session: "herdr:%12" } },
      actorFor("agent", job.job_id),
    );
    expect(after.progress).toEqual({ step: 3, note: "tests green" });
    expect(after.agent_session).toBe("herdr:%12");
  });

  it.each([
    { field: "auto_complete", fields: { auto_complete: true } },
    { field: "role", fields: { role: "Reviewer" as const } },
    { field: "expected_artifacts", fields: { expected_artifacts: ["git_push"] } },
  ])("an agent may not set $field (operator only); nothing is written", async ({ field, fields }) => {
    for (const action of ["claim", "progress"] as const) {
      const job = await jobIn(action === "claim" ? "pending" : "running");
      const e = await rejection(step(deps, job, { action, fields }, actorFor("agent", job.job_id)));
      expect(isMamError(e, "job.fieldNotAllowed"), String(e)).toBe(true);
      expect((e as Error).message).toContain(field);
      expect(await store.get(job.job_id)).toEqual(job);
    }
  });

  it("an operator may set auto_complete, role and expected_artifacts", async () => {
    const job = await jobIn("running");
    const after = await step(deps, job, {
      action: "progress",
      fields: { auto_complete: true, role: "Reviewer", expected_artifacts: ["git_push", "api_call"] },
    });
    expect(after).toMatchObject({ auto_complete: true, role: "Reviewer", expected_artifacts: ["git_push", "api_call"] });
  });

  it.each(["completed", "error", "cancel"] as const)("%s writes no fields: any field is refused, nothing is written", async (action) => {
    const job = await jobIn("running");
    const e = await rejection(step(deps, job, { action, fields: { progress: { last: true } } }));
    expect(isMamError(e, "job.fieldNotAllowed"), String(e)).toBe(true);
    expect(await store.get(job.job_id)).toEqual(job);
  });

  it("an agent bound to another job may not touch this one", async () => {
    const job = await jobIn("pending");
    const e = await rejection(step(deps, job, { action: "claim" }, { kind: "agent", jobId: "someone-else", attemptId: 1 }));
    expect(isMamError(e, "auth.forbidden"), String(e)).toBe(true);
    expect(await store.get(job.job_id)).toEqual(job);
  });
});

describe("compare-and-swap", () => {
  it("expected_seq is required while MAM_ENGINE_CAS is on", async () => {
    const job = await jobIn("pending");
    const e = await rejection(transitionJob(deps, job.job_id, { action: "claim" }, OPERATOR));
    expect(isMamError(e, "input.invalid"), String(e)).toBe(true);
    expect((e as { issues: { path: string }[] }).issues.map((i) => i.path)).toContain("expected_seq");
    expect(await store.get(job.job_id)).toEqual(job);
  });

  it("a stale expected_seq loses with job.transitionConflict carrying the current record", async () => {
    const job = await jobIn("running");
    const e = await rejection(transitionJob(deps, job.job_id, { action: "progress", expectedSeq: job.transition_seq - 1 }, OPERATOR));
    expect(e).toBeInstanceOf(TransitionConflict);
    expect((e as TransitionConflict).code).toBe("job.transitionConflict");
    expect((e as TransitionConflict).current).toEqual(job);
    expect((e as TransitionConflict).details.current).toEqual(job);
  });

  it("a future expected_seq loses too", async () => {
    const job = await jobIn("running");
    const e = await rejection(transitionJob(deps, job.job_id, { action: "progress", expectedSeq: job.transition_seq + 5 }, OPERATOR));
    expect(isMamError(e, "job.transitionConflict"), String(e)).toBe(true);
  });

  it("with MAM_ENGINE_CAS=0 no expected_seq is needed and a stale one wins, but the status still rules", async () => {
    const rolledBack = bundle(parseFlags({ MAM_ENGINE_CAS: "0" }));
    const job = await registerJob(rolledBack, { prompt: "p", agent: "claude-code" });
    const claimed = await transitionJob(rolledBack, job.job_id, { action: "claim" }, OPERATOR);
    expect(claimed.transition_seq).toBe(1);
    const done = await transitionJob(rolledBack, job.job_id, { action: "completed", expectedSeq: 0 }, OPERATOR);
    expect(done.status).toBe("completed");
    expect(done.pending_notification?.seq).toBe(done.transition_seq);
    const e = await rejection(transitionJob(rolledBack, job.job_id, { action: "error" }, OPERATOR));
    expect(isMamError(e, "job.transitionRefused"), String(e)).toBe(true);
  });

  it("an unknown job is job.notFound; a malformed id is input.jobId", async () => {
    expect(
      isMamError(await rejection(transitionJob(deps, "no-such-job", { action: "claim", expectedSeq: 0 }, OPERATOR)), "job.notFound"),
    ).toBe(true);
    expect(
      isMamError(await rejection(transitionJob(deps, "../etc/passwd", { action: "claim", expectedSeq: 0 }, OPERATOR)), "input.jobId"),
    ).toBe(true);
  });
});

describe("notify", () => {
  it.each([
    { action: "completed" as const, event: "completed" },
    { action: "error" as const, event: "error" },
    { action: "cancel" as const, event: "cancelled" },
  ])(
    "a terminal action ($action) commits an intent ($event) whose seq is the new transition_seq, by default",
    async ({ action, event }) => {
      const job = await jobIn("running");
      const after = await step(deps, job, { action, reason: "why not" });
      expect(after.pending_notification).toMatchObject({ event, seq: after.transition_seq, reason: "why not" });
      expect(after.pending_notification?.id).toMatch(/^[0-9a-f-]{36}$/);
      expect((await store.listOwed(10)).map((r) => r.job_id)).toEqual([job.job_id]);
    },
  );

  it.each(["claim", "progress"] as const)("%s commits no intent by default", async (action) => {
    const job = await jobIn(action === "claim" ? "pending" : "running");
    const after = await step(deps, job, { action });
    expect(after.pending_notification).toBeUndefined();
    expect(await store.listOwed(10)).toEqual([]);
  });

  it("notify: true on progress commits a progress intent; notify: false on completed commits none", async () => {
    const running = await jobIn("running");
    const progressed = await step(deps, running, { action: "progress", notify: true });
    expect(progressed.pending_notification).toMatchObject({ event: "progress", seq: progressed.transition_seq });

    const other = await jobIn("running");
    const quiet = await step(deps, other, { action: "completed", notify: false, reason: "superseded by a rerun" });
    expect(quiet.status).toBe("completed");
    expect(quiet.pending_notification).toBeUndefined();
  });

  it("an operator suppresses a terminal notification only with a stated reason; without one nothing is written", async () => {
    for (const reason of [undefined, " "]) {
      const running = await jobIn("running");
      await expect(
        step(deps, running, { action: "cancel", notify: false, ...(reason === undefined ? {} : { reason }) }),
      ).rejects.toMatchObject({ code: "input.invalid", issues: [{ path: "reason" }] });
      expect(await store.get(running.job_id)).toEqual(running);
    }
  });
});

describe("bookkeeping", () => {
  it("replaces pending_notification only, without bumping transition_seq", async () => {
    const done = await jobIn("completed");
    const intent = newIntent(deps, "error", 999, "later");
    await bookkeeping(deps, done.job_id, { pending_notification: intent });
    expect(await store.get(done.job_id)).toEqual({ ...done, pending_notification: intent });
  });

  it.each([
    { case: "another field", fields: { pending_notification: undefined, prompt: "HACKED" }, code: "bookkeeping.fieldRefused" },
    { case: "a null intent (clearing is settleNotification's)", fields: { pending_notification: null }, code: "bookkeeping.fieldRefused" },
    { case: "no intent at all", fields: {}, code: "input.invalid" },
  ])("refuses $case and writes nothing", async ({ fields, code }) => {
    const done = await jobIn("completed");
    const e = await rejection(bookkeeping(deps, done.job_id, fields));
    expect(isMamError(e, code), String(e)).toBe(true);
    expect(await store.get(done.job_id)).toEqual(done);
  });
});
