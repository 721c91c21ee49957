import { type JobStore, type StatusCounts, TransitionConflict } from "@mam/core";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";

/**
 * The counts per status (issue 22), part of the JobStore contract: what
 * `countByStatus` answers after creates, status-changing writes, writes that change no
 * status and lost races, on every adapter. `make` returns a fresh, empty store and,
 * where the counts are derived after the write (DynamoDB: the feed writer over the
 * table's stream), `settle`: what brings them up to date (the stream pumped through
 * the feed writer); `racers` gives more stores on the same data (other connections),
 * for the race.
 */
export interface CountsSubject {
  readonly store: JobStore;
  /** Runs what derives the counts after the writes (the feed writer), where they are `eventual`. */
  readonly settle?: () => Promise<void>;
  /** `n` more stores on the same data, each with its own connection. */
  readonly racers?: (n: number) => JobStore[];
  close(): Promise<void>;
}

export function statusCountsContract(name: string, consistency: StatusCounts["consistency"], make: () => Promise<CountsSubject>): void {
  describe(`JobStore contract, counts per status: ${name}`, () => {
    let subject: CountsSubject;
    const counted = async () => {
      await subject.settle?.();
      return subject.store.countByStatus();
    };
    const zero = { pending: 0, running: 0, completed: 0, error: 0, cancelled: 0 };

    beforeEach(async () => {
      subject = await make();
    });
    afterEach(async () => {
      await subject.close();
    });

    it("an empty store counts 0 for every status, and says how current its counts are", async () => {
      expect(await counted()).toEqual({ counts: zero, consistency });
    });

    it("a create counts its status; a status-changing transition moves one; a write that changes no status, or a refused create, moves none", async () => {
      const { store } = subject;
      await store.create(job("c-1"));
      await store.create(job("c-2"));
      await store.create(job("c-3", { status: "running", transition_seq: 1 }));
      expect((await counted()).counts).toEqual({ ...zero, pending: 2, running: 1 });

      await store.transition("c-1", 0, { from: ["pending"], set: { status: "running" } });
      await store.transition("c-3", 1, { from: ["running"], set: { status: "completed" } });
      // progress: running -> running; bookkeeping; an evidence write: no move.
      await store.transition("c-1", 1, { from: ["running"], set: { status: "running", progress: { step: 1 } } });
      await store.replaceNotification("c-2", {
        id: "i-1",
        event: "progress",
        seq: 0,
        created_at: "2025-01-15T12:00:01.000Z",
      });
      await expect(store.create(job("c-2", { status: "error" }))).rejects.toMatchObject({ code: "job.exists" });
      expect((await counted()).counts).toEqual({ ...zero, pending: 1, running: 1, completed: 1 });

      await store.transition("c-2", 0, { from: ["pending", "running"], set: { status: "cancelled" } });
      await store.transition("c-1", 2, { from: ["pending", "running"], set: { status: "error" } });
      expect((await counted()).counts).toEqual({ ...zero, completed: 1, error: 1, cancelled: 1 });
    });

    it("a lost transition (stale seq, or a status the change does not allow) moves no count", async () => {
      const { store } = subject;
      await store.create(job("l-1"));
      await store.transition("l-1", 0, { from: ["pending"], set: { status: "running" } });
      await expect(store.transition("l-1", 0, { from: ["pending"], set: { status: "running" } })).rejects.toBeInstanceOf(
        TransitionConflict,
      );
      await expect(store.transition("l-1", 1, { from: ["pending"], set: { status: "cancelled" } })).rejects.toBeInstanceOf(
        TransitionConflict,
      );
      expect((await counted()).counts).toEqual({ ...zero, running: 1 });
    });

    it("transitions racing for one job from the same seq move the counts exactly once", async () => {
      const racers = subject.racers?.(16) ?? Array.from({ length: 16 }, () => subject.store);
      const { store } = subject;
      for (let trial = 0; trial < 4; trial++) {
        const id = `race-${trial}`;
        await store.create(job(id));
        await store.transition(id, 0, { from: ["pending"], set: { status: "running" } });
        const outcomes = await Promise.allSettled(
          racers.map((racer, i) =>
            racer.transition(id, 1, { from: ["running"], set: { status: i % 2 === 0 ? "completed" : "error", agent_session: `r-${i}` } }),
          ),
        );
        expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(1);
      }
      const { counts } = await counted();
      expect(counts.completed + counts.error).toBe(4);
      expect({ ...counts, completed: 0, error: 0 }).toEqual(zero);
      for (const racer of racers) if (racer !== store) await (racer as { close?: () => Promise<void> }).close?.();
    });
  });
}
