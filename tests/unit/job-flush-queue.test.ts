/** The change relay's queue: serial per job, in push order; concurrent across jobs up to its limit; idle and drain. */
import { JobFlushQueue } from "@mam/local";
import { describe, expect, it } from "vitest";

/** A task that records when it starts and ends, and finishes only when told. */
function gate(log: string[], name: string) {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  return {
    task: async () => {
      log.push(`start ${name}`);
      started();
      await opened;
      log.push(`end ${name}`);
    },
    running,
    open,
  };
}

describe("JobFlushQueue", () => {
  it("runs one job's flushes one at a time, in push order, while another job's run beside them", async () => {
    const log: string[] = [];
    const q = new JobFlushQueue(4);
    const a1 = gate(log, "a1");
    const a2 = gate(log, "a2");
    const b1 = gate(log, "b1");
    q.push("a", a1.task);
    q.push("a", a2.task);
    q.push("b", b1.task);
    await Promise.all([a1.running, b1.running]);
    // b1 started while a1 is still in flight; a2 waits for a1.
    expect(log).toEqual(["start a1", "start b1"]);
    a1.open();
    await a2.running;
    expect(log).toEqual(["start a1", "start b1", "end a1", "start a2"]);
    a2.open();
    b1.open();
    await q.idle();
    expect(log.filter((l) => l.startsWith("end")).sort()).toEqual(["end a1", "end a2", "end b1"]);
  });

  it("holds at most maxInFlight jobs in flight; a failing task does not stop the ones after it", async () => {
    const log: string[] = [];
    const q = new JobFlushQueue(1);
    const a = gate(log, "a");
    q.push("a", a.task);
    q.push("x", async () => {
      throw new Error("a flush that throws");
    });
    const b = gate(log, "b");
    q.push("b", b.task);
    await a.running;
    expect(log).toEqual(["start a"]);
    a.open();
    await b.running;
    b.open();
    await q.drain();
    expect(log).toEqual(["start a", "end a", "start b", "end b"]);
    // Drained: nothing more is taken.
    q.push("c", async () => {
      log.push("c");
    });
    await q.idle();
    expect(log).not.toContain("c");
  });
});
