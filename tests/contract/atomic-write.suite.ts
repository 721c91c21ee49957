/**
 * An adapter's atomic multi-write (`writeAtomically`, the base's protected
 * primitive), by what it must mean (`AtomicWrite`, `AtomicOutcome`): every required
 * part or nothing; an optional record write only where its own conditions hold, told
 * back in order; a log line already there counted as written. Run on the memory
 * store (the reference), the SQL store on better-sqlite3 (tests/contract/local.test.ts)
 * and on D1 (tests/d1/job-store.test.ts); DynamoDB's is tests/engine/atomic-multi-write.test.ts.
 */
import type { AtomicOutcome, AtomicWrite, EventLogEntry, JobRecord, JobStore, NotificationIntent, RecordWrite } from "@mam/core";
import { describe, expect, it } from "vitest";
import { jobRecord } from "../support/records.ts";

export interface AtomicSubject {
  readonly store: JobStore;
  atomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome>;
  close(): Promise<void>;
}

// The fixtures, shared with DynamoDB's atomic-write tests (tests/engine/atomic-multi-write.test.ts).
const AT = "2030-01-01T00:00:00.000Z";
const intent = (id: string): NotificationIntent => ({ id, event: "completed", seq: 1, created_at: AT });
/** A completed job owing `intentId`. */
export const owing = (id: string, intentId: string): JobRecord =>
  jobRecord(id, { status: "completed", created_at: AT, updated_at: AT, transition_seq: 3, pending_notification: intent(intentId) });
/** A log line of `jobId`. */
export const line = (jobId: string, id: string, event = "published"): EventLogEntry => ({ job_id: jobId, at: AT, id, event });
/** The settle of `intentId`, as core builds it: only while that intent is owed. */
export const settle = (jobId: string, intentId: string): RecordWrite => ({
  jobId,
  conditions: [{ kind: "intentIs", id: intentId }],
  set: {},
  unset: ["pending_notification"],
  bump: [],
  keys: { owed: null },
  feed: {},
});

export function atomicWriteContract(name: string, open: () => Promise<AtomicSubject>): void {
  describe(`writeAtomically: ${name}`, () => {
    async function withSubject(body: (s: AtomicSubject) => Promise<void>): Promise<void> {
      const subject = await open();
      try {
        await body(subject);
      } finally {
        await subject.close();
      }
    }
    const events = async (s: AtomicSubject, jobId: string) => (await s.store.listEvents(jobId, { limit: 10 })).items;

    it("a line and a required update that holds: both", () =>
      withSubject(async (s) => {
        await s.store.create(owing("j", "n-1"));
        expect(
          await s.atomically([
            { kind: "insertEvent", entry: line("j", "e-1") },
            { kind: "update", write: settle("j", "n-1") },
          ]),
        ).toEqual({
          committed: true,
          held: [],
        });
        expect((await s.store.get("j"))?.pending_notification).toBeUndefined();
        expect(await events(s, "j")).toEqual([line("j", "e-1")]);
      }));

    it("a required update that does not hold: nothing, the line included", () =>
      withSubject(async (s) => {
        const record = owing("j", "n-2");
        await s.store.create(record);
        expect(
          await s.atomically([
            { kind: "insertEvent", entry: line("j", "e-1") },
            { kind: "update", write: settle("j", "n-1") },
          ]),
        ).toEqual({
          committed: false,
        });
        expect(await s.store.get("j")).toEqual(record);
        expect(await events(s, "j")).toEqual([]);
      }));

    it("an optional update that does not hold: the line alone, and held says false", () =>
      withSubject(async (s) => {
        const record = owing("j", "n-2");
        await s.store.create(record);
        const outcome = await s.atomically([
          { kind: "insertEvent", entry: line("j", "e-1") },
          { kind: "update", write: settle("j", "n-1"), optional: true },
        ]);
        expect(outcome).toEqual({ committed: true, held: [false] });
        expect(await s.store.get("j")).toEqual(record);
        expect(await events(s, "j")).toEqual([line("j", "e-1")]);
      }));

    it("two required updates and an optional one: the optional's outcome alone, or nothing when a required one fails", () =>
      withSubject(async (s) => {
        for (const [id, n] of [
          ["a", "n-a"],
          ["b", "n-b"],
          ["c", "n-c"],
        ] as const)
          await s.store.create(owing(id, n));
        expect(
          await s.atomically([
            { kind: "update", write: settle("a", "n-a") },
            { kind: "update", write: settle("c", "n-other"), optional: true },
            { kind: "update", write: settle("b", "n-b") },
            { kind: "insertEvent", entry: line("a", "e-1") },
          ]),
        ).toEqual({ committed: true, held: [false] });
        expect((await s.store.get("a"))?.pending_notification).toBeUndefined();
        expect((await s.store.get("b"))?.pending_notification).toBeUndefined();
        expect((await s.store.get("c"))?.pending_notification?.id).toBe("n-c");
        await s.store.create(owing("d", "n-d"));
        await s.store.create(owing("e", "n-e"));
        expect(
          await s.atomically([
            { kind: "update", write: settle("d", "n-d"), optional: true },
            { kind: "update", write: settle("e", "n-e") },
            { kind: "update", write: settle("c", "n-other") },
            { kind: "insertEvent", entry: line("d", "e-1") },
          ]),
        ).toEqual({ committed: false });
        expect((await s.store.get("d"))?.pending_notification?.id).toBe("n-d");
        expect((await s.store.get("e"))?.pending_notification?.id).toBe("n-e");
        expect(await events(s, "d")).toEqual([]);
      }));

    it("a required update the feed does not tell (no note) and a line: both", () =>
      withSubject(async (s) => {
        await s.store.create(owing("j", "n-1"));
        const { feed: _, ...quiet } = settle("j", "n-1");
        expect(
          await s.atomically([
            { kind: "insertEvent", entry: line("j", "e-1") },
            { kind: "update", write: quiet },
          ]),
        ).toEqual({ committed: true, held: [] });
        expect((await s.store.get("j"))?.pending_notification).toBeUndefined();
        expect(await events(s, "j")).toEqual([line("j", "e-1")]);
      }));

    it("parts are decided in order: a required update an earlier optional one made fail fails the whole write", () =>
      withSubject(async (s) => {
        const record = owing("j", "n-1");
        await s.store.create(record);
        expect(
          await s.atomically([
            { kind: "insertEvent", entry: line("j", "e-1") },
            { kind: "update", write: settle("j", "n-1"), optional: true },
            { kind: "update", write: settle("j", "n-1") },
          ]),
        ).toEqual({ committed: false });
        expect(await s.store.get("j")).toEqual(record);
        expect(await events(s, "j")).toEqual([]);
      }));

    it("parts are decided in order: two required updates of which the first makes the second fail: nothing", () =>
      withSubject(async (s) => {
        const record = owing("j", "n-1");
        await s.store.create(record);
        expect(
          await s.atomically([
            { kind: "update", write: settle("j", "n-1") },
            { kind: "update", write: settle("j", "n-1") },
            { kind: "insertEvent", entry: line("j", "e-1") },
          ]),
        ).toEqual({ committed: false });
        expect(await s.store.get("j")).toEqual(record);
        expect(await events(s, "j")).toEqual([]);
      }));

    it("a line already in the log counts as written: it stays as it was, and the update commits", () =>
      withSubject(async (s) => {
        await s.store.create(owing("j", "n-1"));
        await s.store.appendEvent(line("j", "e-1", "first"));
        expect(
          await s.atomically([
            { kind: "insertEvent", entry: line("j", "e-1", "second") },
            { kind: "update", write: settle("j", "n-1"), optional: true },
          ]),
        ).toEqual({ committed: true, held: [true] });
        expect((await s.store.get("j"))?.pending_notification).toBeUndefined();
        expect(await events(s, "j")).toEqual([line("j", "e-1", "first")]);
      }));
  });
}
