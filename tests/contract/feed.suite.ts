import { type ChangeRow, type FeedPage, type JobStore, MamError, type NotificationIntent, TransitionConflict } from "@mam/core";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";

/**
 * The ChangeFeed contract: every write kind a JobStore takes produces its row (core's
 * `changeRowsOf`), in commit order, readable after an opaque cursor — observed through
 * the port alone, behind core's guard. `make` returns a fresh, empty store.
 */
export function changeFeedContract(name: string, make: () => Promise<{ store: JobStore; close(): Promise<void> }>): void {
  describe(`ChangeFeed contract: ${name}`, () => {
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

    /** Every row of the feed (or one job's), paged `limit` at a time. */
    const readAll = async (limit = 1000, jobId?: string): Promise<ChangeRow[]> => {
      const rows: ChangeRow[] = [];
      let after: string | undefined;
      for (;;) {
        const page: FeedPage = await store.listChanges({ limit, ...(after === undefined ? {} : { after }), ...(jobId ? { jobId } : {}) });
        rows.push(...page.items);
        expect(page.cursor).toEqual(expect.any(String));
        if (page.items.length === 0) return rows;
        after = page.cursor;
      }
    };
    const kinds = (rows: readonly ChangeRow[]) => rows.map((r) => r.kind);
    const operator = { actor: { type: "operator", token_id: "tok-op" } } as const;
    const agent = { actor: { type: "agent", token_id: "tok-agent" } } as const;

    it("an empty feed answers no rows and a cursor to continue from", async () => {
      const page = await store.listChanges({ limit: 10 });
      expect(page.items).toEqual([]);
      expect(page.cursor).toEqual(expect.any(String));
      await store.create(job("late"));
      const next = await store.listChanges({ limit: 10, after: page.cursor });
      expect(kinds(next.items)).toEqual(["job.registered"]);
    });

    it("a registration is a job.registered row with its actor, job and commit time", async () => {
      await store.create(job("reg-1"), operator);
      const [row, ...rest] = await readAll();
      expect(rest).toEqual([]);
      expect(row).toMatchObject({ job_id: "reg-1", kind: "job.registered", actor: { type: "operator", token_id: "tok-op" } });
      expect(Number.isNaN(Date.parse(row!.at))).toBe(false);
    });

    it("a write without a note is the service's own", async () => {
      await store.create(job("svc-1"));
      expect((await readAll())[0]?.actor).toEqual({ type: "service" });
    });

    it("a transition is job.transitioned with its action, status, seq and the intent it committed", async () => {
      await store.create(job("tr-1"));
      const claim = intent("claim-intent", "running", 1);
      await store.transition("tr-1", 0, { from: ["pending"], set: { status: "running", pending_notification: claim }, note: agent });
      await store.transition("tr-1", 1, { from: ["running"], set: { status: "running", progress: { step: 1 } }, note: agent });
      const rows = await readAll();
      expect(rows.slice(1).map((r) => [r.kind, r.intent_id, r.data, r.actor])).toEqual([
        ["job.transitioned", "claim-intent", { action: "claim", status: "running", transition_seq: 1 }, agent.actor],
        ["job.transitioned", undefined, { action: "progress", status: "running", transition_seq: 2 }, agent.actor],
      ]);
    });

    it("a notifying commit over an owed, unsettled intent records the older one as superseded by the newer", async () => {
      await store.create(job("sup-1", { status: "running", transition_seq: 1 }));
      await store.transition("sup-1", 1, {
        from: ["running"],
        set: { status: "running", pending_notification: intent("older", "progress", 2) },
      });
      await store.transition("sup-1", 2, {
        from: ["running"],
        set: { status: "completed", pending_notification: intent("newer", "completed", 3) },
      });
      const rows = (await readAll()).filter((r) => r.kind !== "job.registered");
      expect(rows.map((r) => [r.kind, r.intent_id, r.data?.by])).toEqual([
        ["job.transitioned", "older", undefined],
        ["job.transitioned", "newer", undefined],
        ["intent.superseded", "older", "newer"],
      ]);
    });

    it("a settled intent is not superseded: published, then the next commit owes a fresh one", async () => {
      await store.create(job("pub-1", { status: "running", transition_seq: 1 }));
      await store.transition("pub-1", 1, {
        from: ["running"],
        set: { status: "running", pending_notification: intent("first", "progress", 2) },
      });
      expect(await store.settleNotification("pub-1", "first")).toBe(true);
      await store.transition("pub-1", 2, {
        from: ["running"],
        set: { status: "error", pending_notification: intent("second", "error", 3) },
      });
      expect(kinds(await readAll())).toEqual(["job.registered", "job.transitioned", "intent.published", "job.transitioned"]);
    });

    it("settlePublished (the published line and the settle in one) is intent.published, like settleNotification", async () => {
      await store.create(job("pub-2", { status: "running", transition_seq: 1 }));
      await store.transition("pub-2", 1, {
        from: ["running"],
        set: { status: "running", pending_notification: intent("only", "progress", 2) },
      });
      const line = { job_id: "pub-2", id: "line-1", at: at(3), event: "published", data: { outcome: "acknowledged" } };
      expect(await store.settlePublished(line, "only")).toBe(true);
      expect(await store.settlePublished({ ...line, id: "line-2" }, "only")).toBe(false);
      const rows = await readAll();
      expect(kinds(rows)).toEqual(["job.registered", "job.transitioned", "intent.published"]);
      expect(rows.at(-1)?.intent_id).toBe("only");
    });

    it("dispatch, report stage and finalize are dispatch.recorded, report.staged and report.finalized", async () => {
      await store.create(job("ev-1"));
      await store.recordEvidence("ev-1", { guard: { newAttempt: 1 }, note: operator });
      await store.recordEvidence("ev-1", { guard: { attempt: 1 }, note: { ...agent, staged: { sha256: "a".repeat(64), bytes: 12 } } });
      const finalized = { attempt_id: 1, report_sha256: "b".repeat(64), manifest_sha256: "c".repeat(64), finalized_at: at(3) };
      await store.recordEvidence("ev-1", { guard: { attempt: 1 }, set: { finalized_report: finalized }, note: agent });
      const rows = (await readAll()).slice(1);
      expect(rows.map((r) => [r.kind, r.data, r.actor.type])).toEqual([
        ["dispatch.recorded", { attempt_id: 1 }, "operator"],
        ["report.staged", { attempt_id: 1, sha256: "a".repeat(64), bytes: 12 }, "agent"],
        ["report.finalized", { attempt_id: 1, sha256: "b".repeat(64) }, "agent"],
      ]);
    });

    it("issue 17: an upload declaration is report.upload_declared with what was declared, by its actor; the stage after it report.staged", async () => {
      await store.create(job("decl-1"));
      await store.recordEvidence("decl-1", { guard: { newAttempt: 1 }, note: operator });
      await store.recordEvidence("decl-1", { guard: { attempt: 1 }, note: { ...agent, declared: { sha256: "d".repeat(64), bytes: 40 } } });
      await store.recordEvidence("decl-1", { guard: { attempt: 1 }, note: { ...agent, staged: { sha256: "d".repeat(64), bytes: 40 } } });
      const rows = (await readAll()).slice(2);
      expect(rows.map((r) => [r.kind, r.data, r.actor])).toEqual([
        ["report.upload_declared", { attempt_id: 1, sha256: "d".repeat(64), bytes: 40 }, agent.actor],
        ["report.staged", { attempt_id: 1, sha256: "d".repeat(64), bytes: 40 }, agent.actor],
      ]);
    });

    it("issue 20: a new observation is observation.recorded, an overflow observation.overflowed, by their actor; a coalesced repeat writes no row", async () => {
      await store.create(job("obs-1"));
      await store.recordEvidence("obs-1", { guard: { newAttempt: 1 }, note: operator });
      const entry = {
        seq: 1,
        source: "watcher:herdr-1",
        source_kind: "pane_status",
        state: "idle" as const,
        agent_session_uuid: "s-1",
        pane_process_generation: 1,
        observed_at: at(1),
        received_at: at(1),
        last_seen_received_at: at(1),
        sightings: 1,
      };
      const observed = { source: "watcher:herdr-1", source_kind: "pane_status", state: "idle" };
      await store.writeObservations(
        "obs-1",
        0,
        { attempt_id: 1, rev: 1, entries: [entry] },
        { bump: true, note: { ...operator, observed } },
      );
      const repeat = { ...entry, last_seen_received_at: at(2), sightings: 2 };
      await store.writeObservations("obs-1", 1, { attempt_id: 1, rev: 2, entries: [repeat] }, { bump: false });
      const overflow = { source: "agent:codex", bound: "count" as const, at: at(3) };
      await store.writeObservations(
        "obs-1",
        2,
        { attempt_id: 1, rev: 3, entries: [repeat], overflow },
        { bump: true, note: { ...agent, overflowed: { source: "agent:codex", bound: "count" } } },
      );
      const rows = (await readAll()).slice(2);
      expect(rows.map((r) => [r.kind, r.data, r.actor])).toEqual([
        ["observation.recorded", { attempt_id: 1, ...observed }, operator.actor],
        ["observation.overflowed", { attempt_id: 1, source: "agent:codex", bound: "count" }, agent.actor],
      ]);
    });

    it("a finalize committed with a transition is report.finalized and job.transitioned, in one write", async () => {
      await store.create(job("fin-1", { status: "running", transition_seq: 1, latest_attempt: 1 }));
      const finalized = { attempt_id: 1, report_sha256: "d".repeat(64), manifest_sha256: "e".repeat(64), finalized_at: at(4) };
      await store.transition("fin-1", 1, {
        from: ["running"],
        set: { status: "completed", finalized_report: finalized, pending_notification: intent("done", "completed", 2) },
        evidence: { attempt: 1, bump: true },
      });
      expect(kinds((await readAll()).slice(1))).toEqual(["report.finalized", "job.transitioned"]);
    });

    it("the sweep's marks are intent.failed, intent.quarantined and an operator's release intent.released", async () => {
      const owed = intent("owed-1", "completed", 1);
      await store.create(job("mk-1", { status: "completed", transition_seq: 1, pending_notification: owed }));
      const error = { code: "publish.refused", message: "no", at: at(2) };
      expect(await store.reviseNotification("mk-1", { ...owed, failures: 1, retry_at: at(3), last_error: error })).toBe(true);
      expect(await store.reviseNotification("mk-1", { ...owed, failures: 2, quarantined_at: at(4), last_error: error })).toBe(true);
      expect(await store.reviseNotification("mk-1", owed, operator)).toBe(true);
      const rows = (await readAll()).slice(1);
      expect(rows.map((r) => [r.kind, r.intent_id, r.data?.code, r.actor.type])).toEqual([
        ["intent.failed", "owed-1", "publish.refused", "service"],
        ["intent.quarantined", "owed-1", "publish.refused", "service"],
        ["intent.released", "owed-1", undefined, "operator"],
      ]);
    });

    it("bookkeeping that replaces an owed intent records it superseded", async () => {
      await store.create(job("bk-1", { pending_notification: intent("was", "running", 0) }));
      await store.replaceNotification("bk-1", intent("now", "running", 0), operator);
      expect((await readAll()).slice(1).map((r) => [r.kind, r.intent_id, r.data?.by])).toEqual([["intent.superseded", "was", "now"]]);
    });

    it("a refused write writes no row: a stale transition, a settle of another intent, a revise of a settled one", async () => {
      await store.create(job("ref-1", { pending_notification: intent("owed", "running", 0) }));
      await expect(store.transition("ref-1", 7, { from: ["pending"], set: { status: "running" } })).rejects.toBeInstanceOf(
        TransitionConflict,
      );
      expect(await store.settleNotification("ref-1", "someone-else")).toBe(false);
      await expect(store.create(job("ref-1"))).rejects.toMatchObject({ code: "job.exists" });
      expect(kinds(await readAll())).toEqual(["job.registered"]);
    });

    it("pages in commit order with opaque cursors; a row's cursor resumes right after it", async () => {
      for (let i = 0; i < 7; i++) await store.create(job(`page-${i}`));
      const all = await readAll(3);
      expect(all.map((r) => r.job_id)).toEqual([0, 1, 2, 3, 4, 5, 6].map((i) => `page-${i}`));
      const fromFourth = await store.listChanges({ limit: 10, after: all[3]!.cursor });
      expect(fromFourth.items.map((r) => r.job_id)).toEqual(["page-4", "page-5", "page-6"]);
      const end = await store.listChanges({ limit: 10, after: fromFourth.cursor });
      expect(end.items).toEqual([]);
      expect(end.cursor).toBe(fromFourth.cursor);
    });

    it("one job's rows, in order, with cursors that also resume the whole feed", async () => {
      await store.create(job("mine"));
      await store.create(job("theirs"));
      await store.transition("mine", 0, { from: ["pending"], set: { status: "running" } });
      await store.transition("theirs", 0, { from: ["pending"], set: { status: "running" } });
      const mine = await readAll(1, "mine");
      expect(mine.map((r) => [r.job_id, r.kind])).toEqual([
        ["mine", "job.registered"],
        ["mine", "job.transitioned"],
      ]);
      const after = await store.listChanges({ limit: 10, after: mine[0]!.cursor });
      expect(after.items.map((r) => r.job_id)).toEqual(["theirs", "mine", "theirs"]);
    });

    /** Every row after `after` (of one job's listing, with `jobId`), paged `limit` at a time. */
    const readAfter = async (after: string, limit = 2, jobId?: string): Promise<ChangeRow[]> => {
      const rows: ChangeRow[] = [];
      for (let cursor = after; ; ) {
        const page = await store.listChanges({ limit, after: cursor, ...(jobId ? { jobId } : {}) });
        rows.push(...page.items);
        if (page.items.length === 0) return rows;
        cursor = page.cursor;
      }
    };

    it("issue 22: the head of an empty feed is a cursor after which the first rows come", async () => {
      const head = await store.feedHead();
      const page = await store.listChanges({ limit: 10, after: head });
      expect(page.items).toEqual([]);
      expect(page.cursor).toBe(head);
      await store.create(job("head-first"));
      expect((await readAfter(head)).map((r) => [r.job_id, r.kind])).toEqual([["head-first", "job.registered"]]);
    });

    it("issue 22: the head after N rows is past them all: after it, exactly the M rows committed later, in order", async () => {
      for (let i = 0; i < 3; i++) await store.create(job(`old-${i}`));
      await store.transition("old-0", 0, { from: ["pending"], set: { status: "running" } });
      const head = await store.feedHead();
      expect(await readAfter(head)).toEqual([]);
      await store.create(job("new-0"));
      await store.transition("old-1", 0, { from: ["pending"], set: { status: "running" } });
      await store.create(job("new-1"));
      const later = await readAfter(head);
      expect(later.map((r) => [r.job_id, r.kind])).toEqual([
        ["new-0", "job.registered"],
        ["old-1", "job.transitioned"],
        ["new-1", "job.registered"],
      ]);
      expect(later).toEqual((await readAll()).slice(4));
    });

    it("issue 22: a job's head: after it, that job's listing reads only the job's rows committed later", async () => {
      await store.create(job("head-mine"));
      await store.create(job("head-theirs"));
      const head = await store.feedHead({ jobId: "head-mine" });
      const unknown = await store.feedHead({ jobId: "head-nobody" });
      await store.transition("head-theirs", 0, { from: ["pending"], set: { status: "running" } });
      await store.transition("head-mine", 0, { from: ["pending"], set: { status: "running" } });
      expect((await readAfter(head, 1, "head-mine")).map((r) => [r.job_id, r.kind])).toEqual([["head-mine", "job.transitioned"]]);
      expect(await readAfter(unknown, 1, "head-nobody")).toEqual([]);
      await store.create(job("head-nobody"));
      expect((await readAfter(unknown, 1, "head-nobody")).map((r) => r.kind)).toEqual(["job.registered"]);
      const refused = await store.feedHead({ jobId: "not an id" }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((refused as MamError).code).toBe("input.jobId");
    });

    it("a cursor it did not hand out is input.invalid naming query.after: garbage, another listing's, a forged position", async () => {
      await store.create(job("cur-1"));
      await store.create(job("cur-2"));
      const listing = await store.list({ limit: 1 });
      const forged = Buffer.from(JSON.stringify({ l: "feed", c: "not-a-position" })).toString("base64url");
      for (const after of ["garbage!", listing.cursor!, forged]) {
        const refused = await store.listChanges({ limit: 5, after }).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(refused, after).toBeInstanceOf(MamError);
        expect((refused as MamError).code).toBe("input.invalid");
        expect((refused as MamError).issues.map((i) => i.path)).toEqual(["query.after"]);
      }
    });
  });
}

function at(minute: number): string {
  return new Date(Date.UTC(2025, 0, 15, 12, minute)).toISOString();
}

function intent(id: string, event: string, seq: number): NotificationIntent {
  return { id, event, seq, created_at: at(seq) };
}
