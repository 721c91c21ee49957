import {
  type DispatchRecord,
  EVENT_PAGE_MAX_BYTES,
  type EventLogEntry,
  FREE_FORM_MAX_BYTES,
  type JobRecord,
  type JobStore,
  MamError,
  NO_CONCURRENCY_CHECK,
  type NotificationIntent,
  TransitionConflict,
} from "@mam/core";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { maxFreeForm } from "../support/free-form.ts";
import { jobRecord as job } from "../support/records.ts";

/**
 * The JobStore contract: what every adapter (SQLite, DynamoDB, core's in-memory
 * reference) must do on core's `JobStoreBase`, observed through the port alone:
 * the rules every store keeps (the guard's) and what each adapter translates. `make`
 * returns a fresh, empty store for each test, as a composition root makes it.
 */
export function jobStoreContract(name: string, make: () => Promise<{ store: JobStore; close(): Promise<void> }>): void {
  describe(`JobStore contract: ${name}`, () => {
    let store: JobStore;
    let close: () => Promise<void>;

    beforeEach(async () => {
      const made = await make();
      store = made.store;
      close = () => made.close();
    });
    afterEach(async () => {
      await close();
    });

    it("create then get round-trips the whole record, optional fields included", async () => {
      const record = job("round-trip", {
        agent_session: "sess-1",
        progress: { step: 2, notes: ["a", "b"], nested: { ok: true } },
        pending_notification: intent("i-1", "running", 0, at(1)),
        expected_artifacts: ["commit", "report"],
        auto_complete: true,
        role: "Reviewer",
      });
      await store.create(record);
      expect(await store.get("round-trip")).toEqual(record);
    });

    it("create of an existing id fails with job.exists and keeps the first record", async () => {
      const first = job("dup", { prompt: "first" });
      await store.create(first);
      await expectMamError(store.create(job("dup", { prompt: "second" })), "job.exists");
      expect(await store.get("dup")).toEqual(first);
    });

    it("get of an unknown id returns undefined", async () => {
      expect(await store.get("nobody-here")).toBeUndefined();
    });

    it("transition commits, bumps transition_seq by exactly 1, replaces set fields whole and removes unset ones, touching nothing else", async () => {
      const before = job("t1", {
        agent_session: "old-session",
        progress: { a: 1, b: 2 },
        iteration: 4,
        expected_artifacts: ["commit"],
      });
      await store.create(before);
      const after = await store.transition("t1", 0, {
        from: ["pending"],
        set: { status: "running", updated_at: at(5), progress: { b: 3 } },
        unset: ["agent_session"],
      });
      const { agent_session: _dropped, ...rest } = before;
      const expected: JobRecord = {
        ...rest,
        status: "running",
        updated_at: at(5),
        progress: { b: 3 }, // replaced, never merged with { a: 1, b: 2 }
        transition_seq: 1,
        // Every transition is activity, at its updated_at (issue 20).
        activity_at: at(5),
      };
      expect(after).toEqual(expected);
      expect(await store.get("t1")).toEqual(expected);

      const again = await store.transition("t1", 1, { from: ["running"], set: { iteration: 5, updated_at: at(6) } });
      expect(again.transition_seq).toBe(2);
      expect(again).toEqual({ ...expected, iteration: 5, updated_at: at(6), transition_seq: 2, activity_at: at(6) });
    });

    it("a stale expectedSeq throws TransitionConflict (job.transitionConflict) carrying the current record, and writes nothing", async () => {
      await store.create(job("stale"));
      const current = await store.transition("stale", 0, { from: ["pending"], set: { status: "running", updated_at: at(2) } });
      const err = await rejection(
        store.transition("stale", 0, { from: ["pending", "running"], set: { status: "completed", updated_at: at(3) } }),
      );
      expect(err).toBeInstanceOf(TransitionConflict);
      expect((err as TransitionConflict).code).toBe("job.transitionConflict");
      expect((err as TransitionConflict).current).toEqual(current);
      expect(await store.get("stale")).toEqual(current);
    });

    it("a status not in `from` throws job.transitionRefused carrying the current record, and writes nothing", async () => {
      const record = job("refused", { status: "completed" });
      await store.create(record);
      const err = await rejection(
        store.transition("refused", 0, { from: ["pending", "running"], set: { status: "error", updated_at: at(9) } }),
      );
      expect(err).toBeInstanceOf(TransitionConflict);
      expect((err as TransitionConflict).code).toBe("job.transitionRefused");
      expect((err as TransitionConflict).current).toEqual(record);
      expect(await store.get("refused")).toEqual(record);
    });

    it("NO_CONCURRENCY_CHECK (expectedSeq) skips only the seq check: it commits at any seq, and the status is still checked", async () => {
      await store.create(job("nocas", { transition_seq: 7 }));
      const after = await store.transition("nocas", NO_CONCURRENCY_CHECK, {
        from: ["pending"],
        set: { status: "running", updated_at: at(2) },
      });
      expect(after.transition_seq).toBe(8);
      expect(after.status).toBe("running");

      const err = await rejection(
        store.transition("nocas", NO_CONCURRENCY_CHECK, { from: ["pending"], set: { status: "cancelled", updated_at: at(3) } }),
      );
      expect((err as MamError).code).toBe("job.transitionRefused");
      expect((err as TransitionConflict).current).toEqual(after);
      expect(await store.get("nocas")).toEqual(after);
    });

    it("transition of an unknown job throws job.notFound", async () => {
      await expectMamError(store.transition("ghost", 0, { from: ["pending"], set: { status: "running" } }), "job.notFound");
      await expectMamError(
        store.transition("ghost", NO_CONCURRENCY_CHECK, { from: ["pending"], set: { status: "running" } }),
        "job.notFound",
      );
    });

    it("pending_notification set by a transition appears in listOwed; a transition that unsets it removes the job", async () => {
      await store.create(job("owes"));
      await store.create(job("owes-nothing"));
      const owed = intent("intent-a", "running", 1, at(3));
      await store.transition("owes", 0, { from: ["pending"], set: { status: "running", updated_at: at(3), pending_notification: owed } });

      const listed = await store.listOwed(10);
      expect(listed.map((j) => j.job_id)).toEqual(["owes"]);
      expect(listed[0]?.pending_notification).toEqual(owed);

      await store.transition("owes", 1, { from: ["running"], set: { updated_at: at(4) }, unset: ["pending_notification"] });
      expect(await store.listOwed(10)).toEqual([]);
      expect((await store.get("owes"))?.pending_notification).toBeUndefined();
    });

    it("listOwed lists oldest intent first and honours the limit", async () => {
      for (const [id, minute] of [
        ["late", 30],
        ["early", 10],
        ["middle", 20],
      ] as const) {
        await store.create(job(id, { pending_notification: intent(`i-${id}`, "completed", 1, at(minute)) }));
      }
      await store.create(job("clean"));
      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["early", "middle", "late"]);
      expect((await store.listOwed(2)).map((j) => j.job_id)).toEqual(["early", "middle"]);
    });

    it("replaceNotification writes only pending_notification: it bumps neither transition_seq nor updated_at", async () => {
      const record = job("bk", {
        status: "completed",
        transition_seq: 3,
        updated_at: at(7),
        pending_notification: intent("first", "completed", 3, at(7)),
      });
      await store.create(record);
      const second = intent("second", "completed", 3, at(8));
      await store.replaceNotification("bk", second);
      expect(await store.get("bk")).toEqual({ ...record, pending_notification: second });
      expect((await store.listOwed(10)).map((j) => j.pending_notification?.id)).toEqual(["second"]);
      // The seq a caller read before the bookkeeping is still good for its transition.
      const next = await store.transition("bk", 3, { from: ["completed"], set: { updated_at: at(9) } });
      expect(next.transition_seq).toBe(4);
    });

    it("chargeUsage writes agent_usage iff the stored counts are the prior's (absent: 0), bumping nothing; a lost charge writes nothing; an unknown job is job.notFound", async () => {
      const record = job("usage", { status: "running", transition_seq: 2, evidence_seq: 1, updated_at: at(3) });
      await store.create(record);
      const first = { events: 1, bytes: 100, attempt_id: 1, attempt_bytes: 100 };
      expect(await store.chargeUsage("usage", undefined, first)).toBe(true);
      expect(await store.get("usage")).toEqual({ ...record, agent_usage: first });
      // Two charges read at the same counts: the second loses and writes nothing.
      const second = { events: 2, bytes: 150, attempt_id: 1, attempt_bytes: 150 };
      const rival = { events: 1, bytes: 900, attempt_id: 1, attempt_bytes: 900 };
      expect(await store.chargeUsage("usage", first, second)).toBe(true);
      expect(await store.chargeUsage("usage", first, rival)).toBe(false);
      expect(await store.chargeUsage("usage", undefined, rival)).toBe(false);
      expect(await store.get("usage")).toEqual({ ...record, agent_usage: second });
      // The transition seq a caller read is still good.
      expect((await store.transition("usage", 2, { from: ["running"], set: { updated_at: at(4) } })).agent_usage).toEqual(second);
      await expectMamError(store.chargeUsage("nobody-here", undefined, first), "job.notFound");
    });

    it("holdLease takes a lease iff it is free (absent, expired by freeAt, an older attempt's; the job not terminal) and releases or hands it over only by its id, bumping nothing; a refused write writes nothing; an unknown job is job.notFound", async () => {
      const record = job("lease", { status: "running", transition_seq: 2, evidence_seq: 1, updated_at: at(3) });
      await store.create(record);
      const lease = (id: string, attempt: number, since: string, expires: string) => ({
        id,
        attempt_id: attempt,
        since,
        expires_at: expires,
        actor: { type: "agent" as const, token_id: "jti-1" },
      });
      const first = lease("l-1", 1, at(4), at(9));
      expect(await store.holdLease("lease", "finalize", first, { freeAt: at(4) })).toBe(true);
      expect(await store.get("lease")).toEqual({ ...record, finalize_in_progress: first });
      // Held: a second take before it expires writes nothing; the other kind is its own field.
      expect(await store.holdLease("lease", "finalize", lease("l-2", 1, at(5), at(10)), { freeAt: at(8) })).toBe(false);
      const upload = { ...lease("u-1", 1, at(5), at(6)), declared: true as const };
      expect(await store.holdLease("lease", "upload", upload, { freeAt: at(5) })).toBe(true);
      expect(await store.get("lease")).toEqual({ ...record, finalize_in_progress: first, upload_in_flight: upload });
      // Expired by the clock the caller read (expires_at <= freeAt): taken.
      const second = lease("l-2", 1, at(9), at(14));
      expect(await store.holdLease("lease", "finalize", second, { freeAt: at(9) })).toBe(true);
      // A newer attempt takes an older attempt's lease at once.
      const newer = lease("l-3", 2, at(10), at(15));
      expect(await store.holdLease("lease", "finalize", newer, { freeAt: at(10) })).toBe(true);
      // Released or handed over only by its id.
      expect(await store.holdLease("lease", "finalize", null, { heldBy: "l-2" })).toBe(false);
      const handed = lease("u-2", 1, at(6), at(7));
      expect(await store.holdLease("lease", "upload", handed, { heldBy: "u-other" })).toBe(false);
      expect(await store.holdLease("lease", "upload", handed, { heldBy: "u-1" })).toBe(true);
      expect(await store.get("lease")).toEqual({ ...record, finalize_in_progress: newer, upload_in_flight: handed });
      expect(await store.holdLease("lease", "finalize", null, { heldBy: "l-3" })).toBe(true);
      expect(await store.holdLease("lease", "upload", null, { heldBy: "u-2" })).toBe(true);
      expect(await store.holdLease("lease", "upload", null, { heldBy: "u-2" })).toBe(false);
      expect(await store.get("lease")).toEqual(record);
      // The seq a caller read is still good: a lease is not a transition, nor evidence.
      const moved = await store.transition("lease", 2, { from: ["running"], set: { status: "cancelled", updated_at: at(11) } });
      expect(moved.evidence_seq).toBe(1);
      // A terminal job takes no new lease.
      expect(await store.holdLease("lease", "finalize", lease("l-4", 2, at(12), at(17)), { freeAt: at(12) })).toBe(false);
      expect((await store.get("lease"))?.finalize_in_progress).toBeUndefined();
      await expectMamError(store.holdLease("nobody-here", "finalize", first, { freeAt: at(4) }), "job.notFound");
    });

    it("writeObservations writes the set iff the job is not terminal, its latest attempt is the set's and the stored rev is the one expected; it bumps evidence_seq only when asked, never transition_seq; a refused write writes nothing; an unknown job is job.notFound", async () => {
      const record = job("obs", { status: "running", transition_seq: 2, evidence_seq: 1, latest_attempt: 1, updated_at: at(3) });
      await store.create(record);
      const entry = (seq: number, state: "working" | "idle", received: string, lastSeen = received) => ({
        seq,
        source: "watcher:herdr-1",
        source_kind: "pane_status",
        state,
        agent_session_uuid: "sess-1",
        pane_process_generation: 3,
        pane_id: "%12",
        observed_at: received,
        received_at: received,
        last_seen_received_at: lastSeen,
        sightings: 1,
      });
      const first = { attempt_id: 1, rev: 1, entries: [entry(1, "working", at(4))] };
      const written = await store.writeObservations("obs", 0, first, { bump: true });
      expect(written).toEqual({ ...record, evidence_seq: 2, observations: first });
      expect(await store.get("obs")).toEqual({ ...record, evidence_seq: 2, observations: first });
      // A writer that read rev 0 lost: nothing written.
      expect(await store.writeObservations("obs", 0, { ...first, entries: [] }, { bump: true })).toBeUndefined();
      // A repeat (no bump): the set moves, no counter does.
      const repeat = { attempt_id: 1, rev: 2, entries: [{ ...entry(1, "working", at(4), at(5)), sightings: 2 }] };
      expect(await store.writeObservations("obs", 1, repeat, { bump: false })).toEqual({
        ...record,
        evidence_seq: 2,
        observations: repeat,
      });
      // Another attempt than the latest: refused, whatever the rev.
      expect(await store.writeObservations("obs", 2, { attempt_id: 2, rev: 3, entries: [] }, { bump: true })).toBeUndefined();
      // The seq a caller read is still good: observations are evidence, never a transition.
      const cancelled = await store.transition("obs", 2, { from: ["running"], set: { status: "cancelled", updated_at: at(6) } });
      expect(cancelled.observations).toEqual(repeat);
      // A terminal job takes no observation.
      expect(await store.writeObservations("obs", 2, { ...repeat, rev: 3 }, { bump: true })).toBeUndefined();
      expect(await store.get("obs")).toEqual(cancelled);
      await expectMamError(store.writeObservations("nobody-here", 0, first, { bump: true }), "job.notFound");
      // A set whose rev does not follow the one expected is core's own bug: refused before any storage is asked.
      await expectMamError(store.writeObservations("obs", 5, first, { bump: true }), "internal");
    });

    it("the candidate mark (issue 20): set by an observation write or an evidence write, listed by due time oldest first only once due, cleared only against the evidence read, removed by a terminal write and a new dispatch; no mark bumps a sequence; a transition never sets one", async () => {
      const base = { status: "running" as const, transition_seq: 1, evidence_seq: 1, latest_attempt: 1 };
      for (const id of ["cand-a", "cand-b", "cand-c", "cand-d"]) await store.create(job(id, base));
      const set = (rev: number) => ({ attempt_id: 1, rev, entries: [] });
      // Due at 12:08, 12:05 and (planted by a finalize-shaped evidence write) 12:07; cand-d at 13:00.
      expect((await store.writeObservations("cand-a", 0, set(1), { bump: true, candidate: at(8) }))?.candidate_at).toBe(at(8));
      expect((await store.writeObservations("cand-b", 0, set(1), { bump: false, candidate: at(5) }))?.evidence_seq).toBe(1);
      const evidence = await store.recordEvidence("cand-c", { guard: { attempt: 1 }, candidate: at(7) });
      expect(evidence).toMatchObject({ candidate_at: at(7), transition_seq: 1, evidence_seq: 2 });
      await store.writeObservations("cand-d", 0, set(1), { bump: true, candidate: "2025-01-15T13:00:00.000Z" });
      const due = async (by: string) => (await store.listCandidates(10, { dueBy: by })).map((j) => j.job_id);
      expect(await due(at(4))).toEqual([]);
      expect(await due(at(7))).toEqual(["cand-b", "cand-c"]);
      expect(await due(at(9))).toEqual(["cand-b", "cand-c", "cand-a"]);
      expect((await store.listCandidates(2, { dueBy: at(9) })).map((j) => j.job_id)).toEqual(["cand-b", "cand-c"]);
      // A repeat leaving the mark as it is (candidate absent) keeps it; one removing it (null) removes it.
      expect((await store.writeObservations("cand-a", 1, set(2), { bump: false }))?.candidate_at).toBe(at(8));
      expect((await store.writeObservations("cand-a", 2, set(3), { bump: true, candidate: null }))?.candidate_at).toBeUndefined();
      expect(await due(at(9))).toEqual(["cand-b", "cand-c"]);
      // The clear is conditional on the evidence sequence, the observation rev and the transition sequence read.
      const before = await store.get("cand-b");
      const transitionSeq = before?.transition_seq ?? -1;
      expect(await store.clearCandidate("cand-b", { evidenceSeq: 1, observationsRev: 0, transitionSeq })).toBe(false);
      expect(await store.clearCandidate("cand-b", { evidenceSeq: 2, observationsRev: 1, transitionSeq })).toBe(false);
      expect(await store.clearCandidate("cand-b", { evidenceSeq: 1, observationsRev: 1, transitionSeq: transitionSeq + 1 })).toBe(false);
      expect(await store.clearCandidate("cand-b", { evidenceSeq: 1, observationsRev: 1, transitionSeq })).toBe(true);
      const { candidate_at: _gone, ...rest } = before as JobRecord;
      expect(await store.get("cand-b")).toEqual(rest);
      await expectMamError(store.clearCandidate("nobody-here", { evidenceSeq: 0, observationsRev: 0, transitionSeq: 0 }), "job.notFound");
      // Postponing moves only the mark read: not one an evidence write moved meanwhile.
      expect(await store.postponeCandidate("cand-c", at(1), at(9))).toBe(false);
      expect(await store.postponeCandidate("cand-c", at(7), "2025-01-15T12:30:00.000Z")).toBe(true);
      expect((await store.get("cand-c"))?.candidate_at).toBe("2025-01-15T12:30:00.000Z");
      expect(await due(at(9))).toEqual([]);
      expect(await store.postponeCandidate("cand-b", at(5), at(9))).toBe(false);
      // A terminal write removes it; so does a new dispatch's evidence write.
      const done = await store.transition("cand-c", 1, { from: ["running"], set: { status: "completed", updated_at: at(9) } });
      expect(done.candidate_at).toBeUndefined();
      const redispatched = await store.recordEvidence("cand-d", { guard: { newAttempt: 2 } });
      expect(redispatched.candidate_at).toBeUndefined();
      expect(await due("2025-01-15T14:00:00.000Z")).toEqual([]);
      await expectMamError(store.transition("cand-a", 1, { from: ["running"], set: { candidate_at: at(9) } as never }), "internal");
    });

    it("a marked listing (issue 20: stale, overdue, candidate due) lists the running jobs carrying the mark, newest update first, paged; no other job", async () => {
      const running = { status: "running" as const, transition_seq: 1 };
      await store.create(job("m-stale", { ...running, updated_at: at(3), stale_since: at(2) }));
      await store.create(job("m-both", { ...running, updated_at: at(4), stale_since: at(2), overdue_since: at(3) }));
      await store.create(job("m-overdue", { ...running, updated_at: at(5), overdue_since: at(4) }));
      await store.create(job("m-due", { ...running, updated_at: at(6), candidate_at: at(5) }));
      await store.create(job("m-later", { ...running, updated_at: at(7), candidate_at: "2025-01-15T13:00:00.000Z" }));
      await store.create(job("m-plain", { ...running, updated_at: at(8) }));
      await store.create(job("m-pending", { status: "pending", updated_at: at(9), stale_since: at(2) }));
      const ids = async (mark: "stale" | "overdue" | "candidate", limit = 10, cursor?: string) => {
        const page = await store.list({ mark, limit, dueBy: at(9), ...(cursor === undefined ? {} : { cursor }) });
        return { ids: page.items.map((j) => j.job_id), cursor: page.cursor };
      };
      expect((await ids("stale")).ids).toEqual(["m-both", "m-stale"]);
      expect((await ids("overdue")).ids).toEqual(["m-overdue", "m-both"]);
      expect((await ids("candidate")).ids).toEqual(["m-due"]);
      const first = await ids("stale", 1);
      expect(first.ids).toEqual(["m-both"]);
      expect((await ids("stale", 1, first.cursor)).ids).toEqual(["m-stale"]);
      // A marked listing's cursor is its own.
      await expectMamError(
        store.list({ limit: 1, status: "running", ...(first.cursor === undefined ? {} : { cursor: first.cursor }) }),
        "input.invalid",
      );
    });

    it("a transition never sets the observations: they are core's writeObservations' alone", async () => {
      await store.create(job("obs-set", { status: "running", transition_seq: 1, latest_attempt: 1 }));
      await expectMamError(
        store.transition("obs-set", 1, { from: ["running"], set: { observations: { attempt_id: 1, rev: 1, entries: [] } } as never }),
        "internal",
      );
      expect((await store.get("obs-set"))?.observations).toBeUndefined();
    });

    it("a transition never sets a lease: the fields are core's holdLease's alone", async () => {
      await store.create(job("lease-set", { status: "running", transition_seq: 1 }));
      const forged = { id: "x", attempt_id: 1, since: at(1), expires_at: at(2) };
      await expectMamError(
        store.transition("lease-set", 1, { from: ["running"], set: { finalize_in_progress: forged } as never }),
        "internal",
      );
      expect((await store.get("lease-set"))?.finalize_in_progress).toBeUndefined();
    });

    it("settleNotification with a different intent id returns false and leaves the intent owed", async () => {
      const record = job("settle-other", { pending_notification: intent("kept", "completed", 0, at(2)) });
      await store.create(record);
      expect(await store.settleNotification("settle-other", "someone-else")).toBe(false);
      expect(await store.get("settle-other")).toEqual(record);
      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["settle-other"]);
    });

    it("settleNotification with the right intent id clears it, bumps nothing, and listOwed no longer lists the job", async () => {
      const settled = job("settle-right", { transition_seq: 2, updated_at: at(4) });
      await store.create({ ...settled, pending_notification: intent("the-one", "completed", 2, at(4)) });
      expect(await store.settleNotification("settle-right", "the-one")).toBe(true);
      expect(await store.get("settle-right")).toEqual(settled);
      expect(await store.listOwed(10)).toEqual([]);
      expect(await store.settleNotification("settle-right", "the-one")).toBe(false);
      expect((await store.transition("settle-right", 2, { from: ["pending"], set: { updated_at: at(5) } })).transition_seq).toBe(3);
    });

    it("settlePublished appends the published line and clears the exact intent; for another intent it logs the line and settles nothing", async () => {
      const settled = job("pub-settle", { transition_seq: 2, updated_at: at(4) });
      await store.create({ ...settled, pending_notification: intent("sent", "completed", 2, at(4)) });
      const line = event("pub-settle", "log-1", at(5), "published", { outcome: "acknowledged" });
      expect(await store.settlePublished(line, "sent")).toBe(true);
      expect(await store.get("pub-settle")).toEqual(settled);
      expect(await store.listOwed(10)).toEqual([]);
      expect((await store.listEvents("pub-settle", { limit: 10 })).items).toEqual([line]);

      // Settled or superseded meanwhile: the line is still logged, the newer intent stays owed.
      const owed = job("pub-other", { pending_notification: intent("newer", "completed", 0, at(2)) });
      await store.create(owed);
      const late = event("pub-other", "log-2", at(6), "published", { outcome: "acknowledged" });
      expect(await store.settlePublished(late, "older")).toBe(false);
      expect(await store.get("pub-other")).toEqual(owed);
      expect((await store.listEvents("pub-other", { limit: 10 })).items).toEqual([late]);
      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["pub-other"]);
    });

    it("list returns newest first (updated_at, then job_id), pages by cursor across 3 pages, and filters by status", async () => {
      // Seven jobs; two share an updated_at so the job_id tie-break is pinned too.
      const specs: [string, number, "pending" | "running"][] = [
        ["j-a", 1, "pending"],
        ["j-b", 2, "running"],
        ["j-c", 3, "pending"],
        ["j-d", 4, "running"],
        ["j-e", 4, "pending"],
        ["j-f", 6, "running"],
        ["j-g", 7, "pending"],
      ];
      for (const [id, minute, status] of specs) await store.create(job(id, { status, updated_at: at(minute) }));
      const newestFirst = ["j-g", "j-f", "j-e", "j-d", "j-c", "j-b", "j-a"];

      const pages: string[][] = [];
      let cursor: string | undefined;
      do {
        const page = await store.list(cursor === undefined ? { limit: 3 } : { limit: 3, cursor });
        pages.push(page.items.map((j) => j.job_id));
        cursor = page.cursor;
      } while (cursor !== undefined && pages.length < 10);
      expect(pages).toEqual([newestFirst.slice(0, 3), newestFirst.slice(3, 6), newestFirst.slice(6)]);

      const running = await store.list({ status: "running", limit: 2 });
      expect(running.items.map((j) => j.job_id)).toEqual(["j-f", "j-d"]);
      expect(running.cursor).toBeDefined();
      const rest = await store.list({ status: "running", limit: 2, ...(running.cursor === undefined ? {} : { cursor: running.cursor }) });
      expect(rest.items.map((j) => j.job_id)).toEqual(["j-b"]);
      expect(rest.cursor).toBeUndefined();
      expect((await store.list({ status: "completed", limit: 5 })).items).toEqual([]);
      const whole = (await store.list({ limit: 100 })).items;
      expect(whole.find((j) => j.job_id === "j-c")).toEqual(job("j-c", { status: "pending", updated_at: at(3) }));
    });

    it("recordDispatch is write-once per attempt: a second record of the same attempt fails with dispatch.exists and the first is kept", async () => {
      const first = dispatch("dj", 1, "session-one");
      await store.recordDispatch(first);
      await expectMamError(store.recordDispatch(dispatch("dj", 1, "session-two")), "dispatch.exists");
      expect(await store.getDispatch("dj", 1)).toEqual(first);
    });

    it("getDispatch returns the recorded attempt, undefined for an unknown one", async () => {
      const d = { ...dispatch("gd", 2, "s"), pane_id: "%3", anchor: { started_at: at(1), workspace_revision: "abc123" } };
      await store.recordDispatch(d);
      expect(await store.getDispatch("gd", 2)).toEqual(d);
      expect(await store.getDispatch("gd", 1)).toBeUndefined();
      expect(await store.getDispatch("other", 2)).toBeUndefined();
    });

    it("recordEvidence with newAttempt moves latest_attempt up and bumps evidence_seq only; an attempt not above the latest is dispatch.outOfOrder and writes nothing", async () => {
      await store.create(job("ev-order"));
      const first = await store.recordEvidence("ev-order", { guard: { newAttempt: 5 } });
      expect(first).toMatchObject({ latest_attempt: 5, evidence_seq: 1, transition_seq: 0 });
      const stale = await expectMamError(store.recordEvidence("ev-order", { guard: { newAttempt: 3 } }), "dispatch.outOfOrder");
      expect(stale.message).toContain("latest dispatched attempt 5");
      await expectMamError(store.recordEvidence("ev-order", { guard: { newAttempt: 5 } }), "dispatch.outOfOrder");
      expect(await store.get("ev-order")).toEqual(first);
      expect(await store.recordEvidence("ev-order", { guard: { newAttempt: 10 } })).toMatchObject({ latest_attempt: 10, evidence_seq: 2 });
    });

    it("recordEvidence for an attempt requires it to be the latest and the job not terminal, and sets only what it names", async () => {
      await store.create(job("ev-attempt", { latest_attempt: 2 }));
      const pointer = { attempt_id: 2, report_sha256: "a".repeat(64), manifest_sha256: "b".repeat(64), finalized_at: at(3) };
      const after = await store.recordEvidence("ev-attempt", { guard: { attempt: 2 }, set: { finalized_report: pointer } });
      expect(after).toEqual({ ...job("ev-attempt", { latest_attempt: 2 }), evidence_seq: 1, finalized_report: pointer });
      await expectMamError(store.recordEvidence("ev-attempt", { guard: { attempt: 1 } }), "report.notLatest");
      await store.transition("ev-attempt", 0, { from: ["pending"], set: { status: "cancelled" } });
      const frozen = await store.get("ev-attempt");
      await expectMamError(store.recordEvidence("ev-attempt", { guard: { attempt: 2 } }), "report.frozen");
      await expectMamError(store.recordEvidence("ev-attempt", { guard: { newAttempt: 3 } }), "report.frozen");
      expect(await store.get("ev-attempt")).toEqual(frozen);
    });

    it("a transition guarded on evidence commits only at that evidence_seq and attempt, and can bump evidence_seq in the same write", async () => {
      await store.create(job("ev-guard", { latest_attempt: 1, evidence_seq: 4 }));
      await expectMamError(
        store.transition("ev-guard", 0, { from: ["pending"], set: { status: "running" }, evidence: { seq: 3 } }),
        "job.evidenceConflict",
      );
      await expectMamError(
        store.transition("ev-guard", 0, { from: ["pending"], set: { status: "running" }, evidence: { seq: 4, attempt: 2 } }),
        "report.notLatest",
      );
      expect(await store.get("ev-guard")).toEqual(job("ev-guard", { latest_attempt: 1, evidence_seq: 4 }));
      const moved = await store.transition("ev-guard", 0, {
        from: ["pending"],
        set: { status: "running" },
        evidence: { seq: 4, attempt: 1, bump: true },
      });
      expect(moved).toMatchObject({ status: "running", transition_seq: 1, evidence_seq: 5 });
    });

    it("16 concurrent evidence writes and a transition guarded on the evidence it read: the transition commits only if it read the final evidence_seq", async () => {
      await store.create(job("ev-race", { latest_attempt: 1 }));
      const results = await Promise.allSettled([
        store.transition("ev-race", 0, { from: ["pending"], set: { status: "cancelled" }, evidence: { seq: 0 } }),
        ...Array.from({ length: 16 }, () => store.recordEvidence("ev-race", { guard: { attempt: 1 } })),
      ]);
      const final = await store.get("ev-race");
      const cancelled = results[0]?.status === "fulfilled";
      // Either the cancel came first (every evidence write after it was refused, frozen)
      // or an evidence write came first (the cancel lost on evidence_seq).
      if (cancelled) expect(final).toMatchObject({ status: "cancelled", evidence_seq: 0 });
      else expect(final).toMatchObject({ status: "pending", evidence_seq: 16 });
      const evidenceWins = results.slice(1).filter((r) => r.status === "fulfilled").length;
      expect(evidenceWins).toBe(cancelled ? 0 : 16);
    });

    it("appendEvent then listEvents returns the job's own entries, oldest first, up to the limit", async () => {
      const e2 = event("ev", "0002", at(2), "progress", { step: 2 });
      const e1 = event("ev", "0001", at(1), "started");
      const e3 = event("ev", "0003", at(3), "completed", { ok: true });
      for (const e of [e2, e3, e1]) await store.appendEvent(e);
      await store.appendEvent(event("ev-other", "0001", at(0), "started"));
      expect(await store.listEvents("ev", { limit: 10 })).toEqual({ items: [e1, e2, e3] });
      expect((await store.listEvents("ev", { limit: 2 })).items).toEqual([e1, e2]);
      expect(await store.listEvents("nobody", { limit: 10 })).toEqual({ items: [] });
    });

    it("listEvents pages by count through opaque cursors: every entry once, in order; the last page has no cursor", async () => {
      const all = Array.from({ length: 7 }, (_, i) => event("pg", `id-${i}`, at(i), "progress", { i }));
      for (const e of [...all].reverse()) await store.appendEvent(e);
      await store.appendEvent(event("pg-other", "id-0", at(0), "started"));
      const pages: EventLogEntry[][] = [];
      let cursor: string | undefined;
      do {
        const page = await store.listEvents("pg", { limit: 3, ...(cursor === undefined ? {} : { cursor }) });
        pages.push([...page.items]);
        cursor = page.cursor;
      } while (cursor !== undefined);
      expect(pages.map((p) => p.length)).toEqual([3, 3, 1]);
      expect(pages.flat()).toEqual(all);
      // A limit that ends exactly at the last entry: no cursor, no empty page after it.
      expect(await store.listEvents("pg", { limit: 7 })).toEqual({ items: all });
    });

    it("listEvents pages by bytes: many max-size events, each page within EVENT_PAGE_MAX_BYTES, all reachable through cursors", async () => {
      const data = maxFreeForm(FREE_FORM_MAX_BYTES.eventData);
      const all = Array.from({ length: 150 }, (_, i) => event("big", `id-${String(i).padStart(3, "0")}`, at(i), "progress", { i, data }));
      for (const e of all) await store.appendEvent(e);
      const sizes: number[] = [];
      const seen: EventLogEntry[] = [];
      let cursor: string | undefined;
      do {
        const page = await store.listEvents("big", { limit: 1000, ...(cursor === undefined ? {} : { cursor }) });
        const bytes = page.items.reduce((n, e) => n + Buffer.byteLength(JSON.stringify(e)), 0);
        expect(page.items.length).toBeGreaterThan(0);
        expect(bytes).toBeLessThanOrEqual(EVENT_PAGE_MAX_BYTES);
        sizes.push(bytes);
        seen.push(...page.items);
        cursor = page.cursor;
      } while (cursor !== undefined);
      console.log(
        `listEvents by bytes: ${all.length} events of ${Buffer.byteLength(JSON.stringify(all[0]))} bytes in ${sizes.length} pages of ${sizes.join(", ")} bytes`,
      );
      expect(sizes.length).toBeGreaterThanOrEqual(3);
      // Full pages are full: the next entry would not have fitted.
      for (const bytes of sizes.slice(0, -1)) expect(bytes).toBeGreaterThan(EVENT_PAGE_MAX_BYTES - 2 * FREE_FORM_MAX_BYTES.eventData);
      expect(seen).toEqual(all);
    });

    it("listEvents refuses a cursor it did not hand out: input.invalid naming query.cursor, before reading", async () => {
      await store.appendEvent(event("cur", "id-0", at(0), "started"));
      await store.appendEvent(event("cur", "id-1", at(1), "started"));
      await store.create(job("cur-a", { updated_at: at(1) }));
      await store.create(job("cur-b", { updated_at: at(2) }));
      const listCursor = (await store.list({ limit: 1 })).cursor!;
      expect(listCursor).toBeDefined();
      const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
      for (const bad of ["not-a-cursor", "%%%", b64({ e: 5 }), b64([at(0), "id-0"]), b64({ e: ["x"] }), b64(null), listCursor]) {
        for (const jobId of ["cur", "nobody"]) {
          const err = await expectMamError(store.listEvents(jobId, { limit: 1, cursor: bad }), "input.invalid");
          expect(err.issues).toEqual([{ path: "query.cursor", message: "not a cursor of this listing" }]);
        }
      }
    });

    it("a job with max-size, max-depth progress and event data is readable, listable and transitionable (cancel) afterwards", async () => {
      const progress = maxFreeForm(FREE_FORM_MAX_BYTES.progress);
      const data = maxFreeForm(FREE_FORM_MAX_BYTES.eventData);
      const record = job("edge", { prompt: "p".repeat(FREE_FORM_MAX_BYTES.prompt), status: "running", progress });
      await store.create(record);
      expect(await store.get("edge")).toEqual(record);
      const moved = await store.transition("edge", 0, { from: ["running"], set: { progress, updated_at: at(1) } });
      expect(moved.progress).toEqual(progress);
      // The agent's data as the publish-event path records it: two levels inside the item.
      const e = event("edge", "id-0", at(1), "publish_event", { event: "progress", transition_seq: 1, data });
      await store.appendEvent(e);
      expect((await store.listEvents("edge", { limit: 10 })).items).toEqual([e]);
      const cancelled = await store.transition("edge", 1, {
        from: ["pending", "running"],
        set: { status: "cancelled", updated_at: at(2), pending_notification: intent("i-edge", "cancelled", 2, at(2)) },
      });
      expect(cancelled).toMatchObject({ status: "cancelled", transition_seq: 2, progress });
      expect(await store.settleNotification("edge", "i-edge")).toBe(true);
      expect(await store.get("edge")).toEqual({ ...record, status: "cancelled", transition_seq: 2, updated_at: at(2), activity_at: at(2) });
    });

    it("reviseNotification rewrites the owed intent iff its id matches, bumping nothing; a settled or superseded intent is left alone", async () => {
      const owed = intent("owed", "completed", 3, at(7));
      const record = job("rev", { status: "completed", transition_seq: 3, updated_at: at(7), pending_notification: owed });
      await store.create(record);
      const marked: NotificationIntent = {
        ...owed,
        failures: 1,
        retry_at: at(9),
        last_error: { code: "publish.refused", message: "no", at: at(8) },
      };
      expect(await store.reviseNotification("rev", marked)).toBe(true);
      expect(await store.get("rev")).toEqual({ ...record, pending_notification: marked });

      // Superseded: a newer intent is owed; a revision of the old one writes nothing.
      const newer = intent("newer", "error", 999, at(10));
      await store.replaceNotification("rev", newer);
      expect(await store.reviseNotification("rev", { ...marked, failures: 2 })).toBe(false);
      expect((await store.get("rev"))?.pending_notification).toEqual(newer);

      // Settled: nothing owed, nothing written (and an unknown job is simply false).
      expect(await store.settleNotification("rev", "newer")).toBe(true);
      expect(await store.reviseNotification("rev", { ...newer, failures: 1 })).toBe(false);
      expect((await store.get("rev"))?.pending_notification).toBeUndefined();
      expect(await store.reviseNotification("nobody-here", marked)).toBe(false);
    });

    it("listOwed orders by when each intent is next due (retry_at, else created_at); dueBy reads only those due by then", async () => {
      for (const [id, minute] of [
        ["a", 1],
        ["b", 2],
        ["c", 3],
      ] as const) {
        await store.create(job(id, { status: "completed", pending_notification: intent(`i-${id}`, "completed", 1, at(minute)) }));
      }
      // a failed and backs off until minute 10: it moves behind b and c.
      const backingOff = { ...intent("i-a", "completed", 1, at(1)), failures: 1, retry_at: at(10) };
      expect(await store.reviseNotification("a", backingOff)).toBe(true);

      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["b", "c", "a"]);
      expect((await store.listOwed(10, { dueBy: at(5) })).map((j) => j.job_id)).toEqual(["b", "c"]);
      expect((await store.listOwed(10, { dueBy: at(2) })).map((j) => j.job_id)).toEqual(["b"]);
      expect((await store.listOwed(10, { dueBy: at(10) })).map((j) => j.job_id)).toEqual(["b", "c", "a"]);
      expect((await store.listOwed(1, { dueBy: at(10) })).map((j) => j.job_id)).toEqual(["b"]);
      expect((await store.listOwed(10, { dueBy: at(10) }))[2]?.pending_notification).toEqual(backingOff);
      // The same instant written with another offset is the same instant.
      expect((await store.listOwed(10, { dueBy: "2025-01-15T13:05:00+01:00" })).map((j) => j.job_id)).toEqual(["b", "c"]);
    });

    it("a quarantined intent leaves listOwed for listQuarantined (newest first, paged); releasing or settling it, or a newer intent, ends it", async () => {
      const ids = ["q1", "q2", "q3", "fine"];
      for (const [i, id] of ids.entries()) {
        await store.create(job(id, { status: "running", transition_seq: 1, pending_notification: intent(`i-${id}`, "running", 1, at(i)) }));
      }
      const quarantine = (id: string, minute: number): NotificationIntent => ({
        ...intent(`i-${id}`, "running", 1, at(ids.indexOf(id))),
        failures: 5,
        quarantined_at: at(minute),
        last_error: { code: "publish.refused", message: "refused", at: at(minute) },
      });
      for (const [id, minute] of [
        ["q1", 20],
        ["q2", 22],
        ["q3", 21],
      ] as const) {
        expect(await store.reviseNotification(id, quarantine(id, minute))).toBe(true);
      }

      expect((await store.listOwed(10)).map((j) => j.job_id)).toEqual(["fine"]);
      expect((await store.listOwed(10, { dueBy: at(60) })).map((j) => j.job_id)).toEqual(["fine"]);
      const first = await store.listQuarantined({ limit: 2 });
      expect(first.items.map((j) => j.job_id)).toEqual(["q2", "q3"]);
      expect(first.items[0]?.pending_notification).toEqual(quarantine("q2", 22));
      expect(first.cursor).toBeDefined();
      const second = await store.listQuarantined({ limit: 2, cursor: first.cursor! });
      expect(second.items.map((j) => j.job_id)).toEqual(["q1"]);
      expect(second.cursor).toBeUndefined();

      // Released (the marks cleared by a revision): due again at its created_at.
      expect(await store.reviseNotification("q1", intent("i-q1", "running", 1, at(0)))).toBe(true);
      // Settled.
      expect(await store.settleNotification("q2", "i-q2")).toBe(true);
      // Superseded by a transition's newer intent: the newer one is not born quarantined.
      await store.transition("q3", 1, {
        from: ["running"],
        set: { status: "completed", pending_notification: intent("i-q3-next", "completed", 2, at(30)) },
      });

      expect((await store.listQuarantined({ limit: 10 })).items).toEqual([]);
      expect((await store.listOwed(10, { dueBy: at(30) })).map((j) => j.job_id)).toEqual(["q1", "fine", "q3"]);
    });

    // ---- The rules every store keeps (core's guard). Before the guard, SQLite and
    // DynamoDB answered each of these differently; each case names how.

    it("a change naming a field in both set and unset is refused (internal), and writes nothing", async () => {
      // Was: SQLite committed it (set won), DynamoDB refused it.
      const record = job("both", { status: "running", agent_session: "s-1", progress: { step: 1 } });
      await store.create(record);
      const err = await expectMamError(
        store.transition("both", 0, { from: ["running"], set: { agent_session: "s-2" }, unset: ["agent_session"] }),
        "internal",
      );
      expect(err.message).toContain("both set and unset agent_session");
      // Neither a fixed field nor one outside the record is written, in set or unset.
      await expectMamError(store.transition("both", 0, { from: ["running"], set: { transition_seq: 9 } as never }), "internal");
      await expectMamError(store.transition("both", 0, { from: ["running"], set: { pk: "JOB#other" } as never }), "internal");
      await expectMamError(store.transition("both", 0, { from: ["running"], set: {}, unset: ["status"] as never }), "internal");
      await expectMamError(store.recordEvidence("both", { guard: {}, set: { status: "completed" } as never }), "internal");
      expect(await store.get("both")).toEqual(record);
      // Absent values in set are not writes: unsetting the field they name is fine.
      const moved = await store.transition("both", 0, { from: ["running"], set: { progress: undefined }, unset: ["progress"] });
      expect(moved).toEqual({ ...record, progress: undefined, transition_seq: 1 });
      expect(moved.progress).toBeUndefined();
    });

    it("list and listQuarantined refuse a cursor they did not hand out (garbage, another listing's, another status's): input.invalid naming query.cursor", async () => {
      // Was: SQLite named query.cursor but took another listing's cursor as a position;
      // DynamoDB named cursor.
      for (const [id, minute, status] of [
        ["c-a", 1, "pending"],
        ["c-b", 2, "running"],
        ["c-c", 3, "running"],
        ["c-d", 4, "pending"],
      ] as const) {
        await store.create(job(id, { status, updated_at: at(minute) }));
      }
      await store.appendEvent(event("c-a", "e-0", at(0), "started"));
      await store.appendEvent(event("c-a", "e-1", at(1), "started"));
      const all = (await store.list({ limit: 1 })).cursor!;
      const running = (await store.list({ status: "running", limit: 1 })).cursor!;
      const events = (await store.listEvents("c-a", { limit: 1 })).cursor!;
      for (const c of [all, running, events]) expect(c).toEqual(expect.any(String));
      const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
      const garbage = ["not-a-cursor", "%%%", b64(null), b64([at(1), "c-a"]), b64({ l: "jobs" }), b64({ l: "jobs", c: 5 })];
      const refusals: Promise<unknown>[] = [];
      for (const bad of [...garbage, running, events]) refusals.push(store.list({ limit: 1, cursor: bad }));
      for (const bad of [...garbage, all, events]) refusals.push(store.list({ status: "running", limit: 1, cursor: bad }));
      for (const bad of [...garbage, running]) refusals.push(store.list({ status: "pending", limit: 1, cursor: bad }));
      for (const bad of [...garbage, all, running, events]) refusals.push(store.listQuarantined({ limit: 1, cursor: bad }));
      for (const bad of [all, running]) refusals.push(store.listEvents("c-a", { limit: 1, cursor: bad }));
      refusals.push(store.listEvents("c-b", { limit: 1, cursor: events }));
      for (const refusal of refusals) {
        const err = await expectMamError(refusal, "input.invalid");
        expect(err.issues).toEqual([{ path: "query.cursor", message: "not a cursor of this listing" }]);
      }
      // The cursors themselves still work where they were handed out.
      expect((await store.list({ limit: 10, cursor: all })).items.map((j) => j.job_id)).toEqual(["c-c", "c-b", "c-a"]);
      expect((await store.list({ status: "running", limit: 10, cursor: running })).items.map((j) => j.job_id)).toEqual(["c-b"]);
      expect((await store.listEvents("c-a", { limit: 10, cursor: events })).items.map((e) => e.id)).toEqual(["e-1"]);
    });

    it("a limit that is not a positive integer is refused by every listing the same way: input.invalid naming query.limit", async () => {
      // Was: SQLite refused with no field named; DynamoDB named limit.
      await store.create(job("lim", { pending_notification: intent("i-lim", "completed", 0, at(1)) }));
      await store.appendEvent(event("lim", "e-0", at(0), "started"));
      for (const limit of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 60]) {
        for (const refusal of [
          store.list({ limit }),
          store.list({ status: "pending", limit }),
          store.listOwed(limit),
          store.listOwed(limit, { dueBy: at(5) }),
          store.listQuarantined({ limit }),
          store.listEvents("lim", { limit }),
        ]) {
          const err = await expectMamError(refusal, "input.invalid");
          expect(err.issues).toEqual([{ path: "query.limit", message: "a positive integer" }]);
        }
      }
      expect((await store.listOwed(1)).map((j) => j.job_id)).toEqual(["lim"]);
    });

    it("create refuses a record that is not a job record (input.invalid naming record.<field>), and stores nothing", async () => {
      // Was: SQLite refused it; DynamoDB stored it, for every later reader to trip on.
      const good = job("valid");
      const bad: [Record<string, unknown>, string][] = [
        [{ ...good, status: "done" }, "record.status"],
        [{ ...good, transition_seq: -1 }, "record.transition_seq"],
        [{ ...good, surprise: true }, "record.surprise"],
        [{ ...good, pending_notification: { id: "i", seq: 0, created_at: at(1) } }, "record.pending_notification.event"],
        [{ ...good, progress: { ["k".repeat(65)]: 1 } }, "record.progress"],
        [{ ...good, updated_at: "yesterday" }, "record.updated_at"],
      ];
      for (const [record, path] of bad) {
        const err = await expectMamError(store.create(record as unknown as JobRecord), "input.invalid");
        expect(err.issues.map((i) => i.path)).toContainEqual(expect.stringMatching(new RegExp(`^${path.replaceAll(".", "\\.")}`)));
      }
      const { prompt: _missing, ...noPrompt } = good;
      expect((await expectMamError(store.create(noPrompt as JobRecord), "input.invalid")).issues.map((i) => i.path)).toEqual([
        "record.prompt",
      ]);
      expect(await store.get("valid")).toBeUndefined();
      expect((await store.list({ limit: 10 })).items).toEqual([]);
      expect(await store.listOwed(10)).toEqual([]);
      // A dispatch is held to its schema the same way (an attempt is 1..1,000,000).
      for (const attempt of [0, 1.5, 1_000_001]) {
        const err = await expectMamError(store.recordDispatch(dispatch("valid", attempt, "s")), "input.invalid");
        expect(err.issues.map((i) => i.path)).toContain("dispatch.attempt_id");
        expect(await store.getDispatch("valid", attempt)).toBeUndefined();
      }
    });

    it("every call naming a job refuses an id that is not a job id (input.jobId), and writes nothing", async () => {
      // Was: SQLite stored dispatches and event lines for any id and answered the rest
      // as unknown jobs; DynamoDB answered job.notFound, undefined, false or an empty
      // page, by method.
      await store.create(job("real"));
      const badIds = ["../escape", "", "a/b", "a#b", "-leading-dash", "x".repeat(65), "é"];
      for (const id of badIds) {
        const calls: [string, Promise<unknown>][] = [
          ["create", store.create(job(id))],
          ["get", store.get(id)],
          ["transition", store.transition(id, 0, { from: ["pending"], set: { status: "running" } })],
          ["recordEvidence", store.recordEvidence(id, { guard: { newAttempt: 1 } })],
          ["replaceNotification", store.replaceNotification(id, intent("i", "completed", 0, at(1)))],
          ["reviseNotification", store.reviseNotification(id, intent("i", "completed", 0, at(1)))],
          ["settleNotification", store.settleNotification(id, "i")],
          ["settlePublished", store.settlePublished(event(id, "e", at(1), "published"), "i")],
          ["recordDispatch", store.recordDispatch(dispatch(id, 1, "s"))],
          ["getDispatch", store.getDispatch(id, 1)],
          ["appendEvent", store.appendEvent(event(id, "e", at(1), "started"))],
          ["listEvents", store.listEvents(id, { limit: 10 })],
        ];
        for (const [method, call] of calls) {
          const err = await rejection(call);
          expect(err, `${method}(${JSON.stringify(id)})`).toBeInstanceOf(MamError);
          expect((err as MamError).code, `${method}(${JSON.stringify(id)})`).toBe("input.jobId");
        }
      }
      expect((await store.list({ limit: 10 })).items.map((j) => j.job_id)).toEqual(["real"]);
      expect(await store.get("real")).toEqual(job("real"));
    });

    it("an intent's delivery marks place it in the owed index the same way whichever write stored it (create, transition, replace)", async () => {
      // Was: SQLite indexed a created or transitioned intent by its created_at alone,
      // so a quarantined or backing-off intent written that way was due at once.
      const quarantined = { ...intent("i-q", "completed", 0, at(1)), failures: 5, quarantined_at: at(2) };
      const backingOff = { ...intent("i-b", "completed", 0, at(1)), failures: 1, retry_at: at(30) };
      await store.create(job("made-quarantined", { pending_notification: quarantined }));
      await store.create(job("made-backing-off", { pending_notification: backingOff }));
      await store.create(job("moved"));
      await store.transition("moved", 0, {
        from: ["pending"],
        set: { status: "cancelled", pending_notification: { ...quarantined, id: "i-m" } },
      });
      await store.create(job("replaced"));
      await store.replaceNotification("replaced", { ...backingOff, id: "i-r" });
      expect((await store.listOwed(10, { dueBy: at(10) })).map((j) => j.job_id)).toEqual([]);
      expect((await store.listOwed(10, { dueBy: at(30) })).map((j) => j.job_id)).toEqual(["made-backing-off", "replaced"]);
      expect((await store.listQuarantined({ limit: 10 })).items.map((j) => j.job_id).sort()).toEqual(["made-quarantined", "moved"]);
    });

    it("16 concurrent transitions from the same seq commit exactly once; the others lose with job.transitionConflict", async () => {
      // In one process this shows that the write is conditional (no read-then-write
      // window in the adapter), not a real race; races across processes are tested
      // elsewhere.
      await store.create(job("race"));
      const results = await Promise.allSettled(
        Array.from({ length: 16 }, (_, i) =>
          store.transition("race", 0, { from: ["pending"], set: { status: "running", updated_at: at(1), iteration: i + 1 } }),
        ),
      );
      const won = results.filter((r): r is PromiseFulfilledResult<JobRecord> => r.status === "fulfilled");
      const lost = results.filter((r): r is PromiseRejectedResult => r.status === "rejected");
      expect(won).toHaveLength(1);
      expect(lost).toHaveLength(15);
      for (const l of lost) expect((l.reason as MamError).code).toBe("job.transitionConflict");
      const stored = await store.get("race");
      expect(stored?.transition_seq).toBe(1);
      expect(stored).toEqual(won[0]?.value);
    });
  });
}

const BASE = Date.UTC(2025, 0, 15, 12, 0, 0);
/** A fixed instant, `minute` minutes after the base: tests never read the clock. */
function at(minute: number): string {
  return new Date(BASE + minute * 60_000).toISOString();
}

function intent(id: string, event: string, seq: number, createdAt: string): NotificationIntent {
  return { id, event, seq, created_at: createdAt };
}

function dispatch(jobId: string, attempt: number, session: string): DispatchRecord {
  return {
    job_id: jobId,
    attempt_id: attempt,
    agent_session_uuid: session,
    pane_process_generation: attempt,
    anchor: { started_at: at(attempt) },
    recorded_at: at(attempt),
  };
}

function event(jobId: string, id: string, when: string, name: string, data?: NonNullable<EventLogEntry["data"]>): EventLogEntry {
  return { job_id: jobId, id, at: when, event: name, ...(data === undefined ? {} : { data }) };
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected the call to reject, but it resolved");
}

async function expectMamError(p: Promise<unknown>, code: MamError["code"]): Promise<MamError> {
  const err = await rejection(p);
  expect(err).toBeInstanceOf(MamError);
  expect((err as MamError).code).toBe(code);
  return err as MamError;
}
