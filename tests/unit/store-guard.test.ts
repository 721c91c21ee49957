/**
 * core's guardJobStore: the rules every store keeps, checked before the adapter is
 * asked. The contract suite (tests/contract/job-store.suite.ts) shows the same
 * refusals on every adapter; this shows that a refused call never reaches one, and
 * what the adapter receives when a call passes.
 */
import {
  guardJobStore,
  isGuardedJobStore,
  type JobRecord,
  type JobStore,
  MamError,
  MemoryJobStore,
  type NotificationIntent,
} from "@mam/core";
import { beforeEach, describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";
import { rejection } from "../support/rejection.ts";

const AT = "2025-01-15T12:00:00.000Z";

const intent: NotificationIntent = { id: "i-1", event: "completed", seq: 1, created_at: AT };

/** A store that records every call it is asked, then answers from memory. */
function recording(): { store: JobStore; calls: { method: string; args: unknown[] }[] } {
  const calls: { method: string; args: unknown[] }[] = [];
  const inner = new MemoryJobStore();
  const store = new Proxy(inner, {
    get(target, prop) {
      const value: unknown = Reflect.get(target, prop, target);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        calls.push({ method: String(prop), args: structuredClone(args) });
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { store, calls };
}

let inner: ReturnType<typeof recording>;
let store: JobStore;
beforeEach(() => {
  inner = recording();
  store = guardJobStore(inner.store);
});

describe("guardJobStore", () => {
  it("refuses a bad job id on every call that names a job before the adapter is asked", async () => {
    const id = "../escape";
    const calls = [
      store.create(job(id)),
      store.get(id),
      store.transition(id, 0, { from: ["pending"], set: { status: "running" } }),
      store.recordEvidence(id, { guard: { newAttempt: 1 } }),
      store.replaceNotification(id, intent),
      store.reviseNotification(id, intent),
      store.settleNotification(id, "i-1"),
      store.holdLease(id, "finalize", null, { heldBy: "l-1" }),
      store.recordDispatch({
        job_id: id,
        attempt_id: 1,
        agent_session_uuid: "s",
        pane_process_generation: 0,
        anchor: { started_at: AT },
        recorded_at: AT,
      }),
      store.getDispatch(id, 1),
      store.appendEvent({ job_id: id, id: "e", at: AT, event: "started" }),
      store.listEvents(id, { limit: 1 }),
    ];
    for (const call of calls) {
      const err = await rejection(call);
      expect(err).toBeInstanceOf(MamError);
      expect(err).toMatchObject({ code: "input.jobId", issues: [{ path: "job_id", message: expect.any(String) }] });
    }
    // A job id that is not even a string is refused the same way, not with a TypeError.
    expect(await rejection(store.create({ ...job("x"), job_id: undefined as never }))).toMatchObject({ code: "input.jobId" });
    expect(inner.calls).toEqual([]);
  });

  it("refuses a bad limit, a cursor of another listing, an invalid record or dispatch, and a bad change, before the adapter is asked", async () => {
    const refused = [
      store.list({ limit: 0 }),
      store.listOwed(-1),
      store.listQuarantined({ limit: 1.5 }),
      store.listEvents("j", { limit: Number.NaN }),
      store.list({ limit: 1, cursor: "garbage" }),
      store.create({ ...job("j"), status: "finished" as never }),
      store.recordDispatch({
        job_id: "j",
        attempt_id: 0,
        agent_session_uuid: "s",
        pane_process_generation: 0,
        anchor: { started_at: AT },
        recorded_at: AT,
      }),
      store.transition("j", 0, { from: ["pending"], set: { progress: { a: 1 } }, unset: ["progress"] }),
      store.transition("j", 0, { from: ["pending"], set: { created_at: AT } as never }),
      store.transition("j", 0, { from: ["pending"], set: {}, unset: ["prompt"] as never }),
      store.recordEvidence("j", { guard: {}, set: { latest_attempt: 3 } as never }),
    ];
    const codes = [];
    for (const call of refused) codes.push(((await rejection(call)) as MamError).code);
    expect(codes).toEqual([
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "internal",
      "internal",
      "internal",
      "internal",
    ]);
    // No dispatch of an attempt the schema refuses can exist: nothing to ask either.
    expect(await store.getDispatch("j", 0)).toBeUndefined();
    expect(inner.calls).toEqual([]);
  });

  it("refuses a lease write that is not core's (an unknown kind, an invalid lease, a release not by id, no expectation) before the adapter is asked", async () => {
    await store.create(job("j"));
    inner.calls.length = 0;
    const lease = { id: "l-1", attempt_id: 1, since: AT, expires_at: AT };
    const refusals = [
      store.holdLease("j", "lock" as never, lease, { freeAt: AT }),
      store.holdLease("j", "finalize", { ...lease, attempt_id: 0 }, { freeAt: AT }),
      store.holdLease("j", "finalize", { ...lease, extra: 1 } as never, { freeAt: AT }),
      store.holdLease("j", "finalize", null, { freeAt: AT }),
      store.holdLease("j", "finalize", lease, { freeAt: "yesterday" }),
      store.holdLease("j", "finalize", lease, {} as never),
    ];
    for (const refused of refusals) {
      const e = await rejection(refused);
      expect(e instanceof MamError && e.code === "internal", String(e)).toBe(true);
    }
    expect(inner.calls).toEqual([]);
    expect(await store.holdLease("j", "finalize", lease, { freeAt: AT })).toBe(true);
    expect(inner.calls.map((c) => c.method)).toEqual(["holdLease"]);
  });

  it("hands the adapter the checked record and a change without absent values", async () => {
    const { evidence_seq: _legacy, ...withoutEvidenceSeq } = job("j");
    await store.create(withoutEvidenceSeq as JobRecord);
    await store.transition("j", 0, {
      from: ["pending"],
      set: { status: "running", agent_session: undefined },
      unset: ["progress", "progress"],
    });
    expect(inner.calls).toEqual([
      { method: "create", args: [job("j")] },
      { method: "transition", args: ["j", 0, { from: ["pending"], set: { status: "running" }, unset: ["progress"] }] },
    ]);
  });

  it("wraps the adapter's position in a cursor naming its listing, and hands the adapter its own position back", async () => {
    for (const id of ["a", "b", "c"]) await store.create(job(id, { updated_at: `2025-01-15T12:0${id.charCodeAt(0) - 96}:00.000Z` }));
    const first = await store.list({ limit: 1 });
    const ownPosition = JSON.stringify(["2025-01-15T12:03:00.000Z", "c"]);
    expect(JSON.parse(Buffer.from(first.cursor ?? "", "base64url").toString("utf8"))).toEqual({ l: "jobs", c: ownPosition });
    inner.calls.length = 0;
    const second = await store.list({ limit: 1, cursor: first.cursor ?? "" });
    expect(second.items.map((j) => j.job_id)).toEqual(["b"]);
    expect(inner.calls).toEqual([{ method: "list", args: [{ limit: 1, cursor: ownPosition }] }]);
    // The same position under another listing's name is not a cursor of this one.
    const forged = Buffer.from(JSON.stringify({ l: "jobs/pending", c: ownPosition })).toString("base64url");
    expect(await rejection(store.list({ limit: 1, cursor: forged }))).toMatchObject({ code: "input.invalid" });
    expect((await store.list({ status: "pending", limit: 5, cursor: forged })).items.map((j) => j.job_id)).toEqual(["b", "a"]);
  });

  it("is applied once: guarding a guarded store returns it, and a composition root can tell", () => {
    expect(guardJobStore(store)).toBe(store);
    expect(isGuardedJobStore(store)).toBe(true);
    expect(isGuardedJobStore(inner.store)).toBe(false);
  });
});
