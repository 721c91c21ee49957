/**
 * Issue 20, part 4: stale and overdue jobs, under the test clock, over every backend
 * (SQLite and files; DynamoDB and S3). A running job with no activity for
 * MAM_STALE_AFTER_SECONDS is marked stale once, a job past its attempt's deadline
 * overdue once — each with a feed row and one notification, listed, cleared by the
 * next activity (stale) or dispatch (overdue), removed by a terminal write; the sweep
 * finds them through the attention index and reads no job that is not due.
 */
import {
  type Deps,
  newIntent,
  OPERATOR,
  parseFlags,
  recordDispatch,
  recoverNotifications,
  reviewAttention,
  transitionJob,
} from "@mam/core";
import { expect, it } from "vitest";
import { describeBackends } from "../seed/harness.ts";
import { type ReadyJob, readyJob } from "../seed/scenario.ts";
import { TestClock } from "../support/clock.ts";
import { before, SESSION, see } from "./observing.ts";

const STALE_S = 600;
const MINUTE = 60_000;

describeBackends("issue 20: stale and overdue jobs", (backend) => {
  async function ready(env: Record<string, string> = {}) {
    const b = backend();
    const clock = new TestClock("2026-11-20T10:10:00.000Z");
    const deps = b.deps(parseFlags({ MAM_STALE_AFTER_SECONDS: String(STALE_S), ...env }), { clock });
    return { b, deps, clock };
  }

  const listed = async (deps: Deps, mark: "stale" | "overdue") =>
    (await deps.jobs.list({ limit: 50, mark, dueBy: deps.clock.now().toISOString() })).items.map((j) => j.job_id);
  /**
   * The job's feed rows of `kind`, where the backend keeps its feed with the write (the
   * embedded one: the rows are in the write's own batch). The AWS backend's feed is
   * derived from the table's stream by the feed writer, which dynalite (its peer in npm
   * test) does not have; there `undefined`, and the rows a mark makes are core's rules
   * (`changeRowsOf`, the stream function's own code), held to the SQL compilation by
   * tests/unit/feed-rules.test.ts and tests/contract/sql-feed-rules.test.ts, which
   * generate these marks, and read from DynamoDB Local's stream by tests/engine.
   */
  const rows = async (deps: Deps, jobId: string, kind: string) =>
    backend().name === "embedded" ? (await deps.jobs.listChanges({ limit: 200, jobId })).items.filter((r) => r.kind === kind) : undefined;
  const expectRows = async (deps: Deps, jobId: string, kind: string, check: (found: readonly unknown[]) => void) => {
    const found = await rows(deps, jobId, kind);
    if (found !== undefined) check(found);
  };

  it("a running job with no activity for the stale window is marked stale once: one feed row, one notification, listed; a second pass marks nothing; activity clears it, and the next silence marks it again", async () => {
    const { deps, clock } = await ready();
    const job = await readyJob(deps, {});
    // The claim put the job in the attention index, due now: the first look sets its key.
    expect((await reviewAttention(deps)).results).toEqual([{ job_id: job.jobId, outcome: "rekeyed" }]);
    clock.advance(STALE_S * 1000 - MINUTE);
    expect((await reviewAttention(deps)).due).toBe(0);
    clock.advance(2 * MINUTE);
    const pass = await reviewAttention(deps);
    expect(pass).toMatchObject({ due: 1, stale: 1 });
    const marked = await deps.jobs.get(job.jobId);
    expect(marked).toMatchObject({ status: "running", stale_since: clock.now().toISOString() });
    expect(marked?.pending_notification).toMatchObject({ event: "stale", seq: marked?.transition_seq, by: "sweep" });
    await expectRows(deps, job.jobId, "job.stale", (found) =>
      expect(found).toEqual([
        expect.objectContaining({ kind: "job.stale", intent_id: marked?.pending_notification?.id, data: { since: marked?.stale_since } }),
      ]),
    );
    expect(await listed(deps, "stale")).toEqual([job.jobId]);
    // Looked at again later: still stale, not marked (nor notified) twice.
    clock.advance(STALE_S * 1000 + MINUTE);
    expect(await reviewAttention(deps)).toMatchObject({ due: 1, stale: 0, rekeyed: 1 });
    await expectRows(deps, job.jobId, "job.stale", (found) => expect(found).toHaveLength(1));
    expect((await deps.jobs.get(job.jobId))?.pending_notification?.id).toBe(marked?.pending_notification?.id);
    // A `working` sighted is activity: the mark goes, in the observation's own write.
    await see(deps, job, "working");
    expect((await deps.jobs.get(job.jobId))?.stale_since).toBeUndefined();
    expect(await listed(deps, "stale")).toEqual([]);
    // Silence again, past the window from that activity: marked again, once.
    clock.advance(STALE_S * 1000 + MINUTE);
    expect((await reviewAttention(deps)).stale).toBe(1);
    await expectRows(deps, job.jobId, "job.stale", (found) => expect(found).toHaveLength(2));
  });

  it("the stale notification is published once, at least once: the sweep sends it, on the job's topic", async () => {
    const { b, deps, clock } = await ready();
    const job = await readyJob(deps, {});
    await reviewAttention(deps);
    const sub = await b.subscribe(`mam/jobs/${job.jobId}/events`);
    try {
      clock.advance(STALE_S * 1000 + MINUTE);
      expect((await reviewAttention(deps)).stale).toBe(1);
      expect((await recoverNotifications(deps)).sent).toBe(1);
      const message = await sub.waitFor((m) => JSON.parse(m.payload).event === "stale", 10_000);
      expect(JSON.parse(message.payload)).toMatchObject({ event: "stale", job_id: job.jobId, data: { status: "running", by: "sweep" } });
      expect((await recoverNotifications(deps)).owed).toBe(0);
    } finally {
      await sub.close();
    }
  });

  it("a job past its attempt's deadline is marked overdue once, listed; a new dispatch clears it and brings its own deadline", async () => {
    const { deps, clock } = await ready({ MAM_DEADLINE_SECONDS: "900" });
    const job = await readyJob(deps, {});
    const record = await deps.jobs.get(job.jobId);
    expect(record?.deadline_at).toBeDefined();
    await reviewAttention(deps);
    // Active all along (a watcher every 5 minutes), so never stale; past the deadline, overdue.
    for (let i = 0; i < 4; i++) {
      clock.advance(5 * MINUTE);
      await see(deps, job, i % 2 === 0 ? "working" : "idle");
      await reviewAttention(deps);
    }
    const overdue = await deps.jobs.get(job.jobId);
    expect(overdue).toMatchObject({ overdue_since: expect.any(String), pending_notification: { event: "overdue" } });
    expect(overdue?.stale_since).toBeUndefined();
    await expectRows(deps, job.jobId, "job.overdue", (found) =>
      expect(found).toEqual([expect.objectContaining({ data: { deadline_at: record?.deadline_at } })]),
    );
    expect(await listed(deps, "overdue")).toEqual([job.jobId]);
    clock.advance(5 * MINUTE);
    await reviewAttention(deps);
    await expectRows(deps, job.jobId, "job.overdue", (found) => expect(found).toHaveLength(1));
    // The next attempt: its own deadline (its dispatch's), the mark gone.
    const d = await recordDispatch(
      deps,
      job.jobId,
      { attempt_id: 2, agent_session_uuid: SESSION, pane_process_generation: 3, deadline_seconds: 3600 },
      OPERATOR,
    );
    const next = await deps.jobs.get(job.jobId);
    expect(next?.overdue_since).toBeUndefined();
    expect(next?.deadline_at).toBe(d.deadline_at);
    expect(d.deadline_at).toBe(new Date(Date.parse(d.recorded_at) + 3600_000).toISOString());
    expect(await listed(deps, "overdue")).toEqual([]);
  });

  it("a mark never supersedes an owed notification unsent: a job both overdue and stale is marked overdue, and stale only once the overdue notification went out", async () => {
    const { deps, clock } = await ready({ MAM_DEADLINE_SECONDS: "900" });
    const job = await readyJob(deps, {});
    await reviewAttention(deps);
    clock.advance(16 * MINUTE);
    expect(await reviewAttention(deps)).toMatchObject({ overdue: 1, stale: 0 });
    const overdue = (await deps.jobs.get(job.jobId))?.pending_notification;
    expect(overdue?.event).toBe("overdue");
    // The next pass, before the overdue notification went out (a publisher lagging, a
    // broker down): still stale, but marking it now would drop the overdue one unsent.
    clock.advance(MINUTE);
    expect((await reviewAttention(deps)).stale).toBe(0);
    expect((await deps.jobs.get(job.jobId))?.pending_notification?.id).toBe(overdue?.id);
    expect((await recoverNotifications(deps)).sent).toBe(1);
    clock.advance(2 * MINUTE);
    expect((await reviewAttention(deps)).stale).toBe(1);
    expect((await deps.jobs.get(job.jobId))?.pending_notification?.event).toBe("stale");
  });

  it("a completed job carries no mark: the terminal write removes the stale mark and the attention key; the index no longer holds it", async () => {
    const { deps, clock } = await ready();
    const job = await readyJob(deps, {});
    await reviewAttention(deps);
    clock.advance(STALE_S * 1000 + MINUTE);
    expect((await reviewAttention(deps)).stale).toBe(1);
    const current = await deps.jobs.get(job.jobId);
    await transitionJob(deps, job.jobId, { action: "completed", expectedSeq: current?.transition_seq ?? -1 }, OPERATOR);
    const done = await deps.jobs.get(job.jobId);
    expect(done?.status).toBe("completed");
    for (const mark of ["stale_since", "overdue_since", "attention_at", "candidate_at"] as const)
      expect(done?.[mark], mark).toBeUndefined();
    clock.advance(10 * STALE_S * 1000);
    expect((await reviewAttention(deps)).due).toBe(0);
    expect(await listed(deps, "stale")).toEqual([]);
  });

  it("an activity landing while the sweep marks wins: the mark is conditional on what the sweep read, and nothing is written", async () => {
    const { deps, clock } = await ready();
    const job = await readyJob(deps, {});
    await reviewAttention(deps);
    clock.advance(STALE_S * 1000 + MINUTE);
    // A coalesced `working` (no sequence bumped): only the observation set's rev moves.
    await see(deps, job, "working");
    clock.advance(STALE_S * 1000 + MINUTE);
    const racing = before(deps, "markAttention", async () => {
      await see(deps, job, "working");
    });
    const pass = await reviewAttention(racing);
    expect(pass.results).toEqual([{ job_id: job.jobId, outcome: "lost_race" }]);
    const record = await deps.jobs.get(job.jobId);
    expect(record?.stale_since).toBeUndefined();
    expect(record?.pending_notification?.event).not.toBe("stale");
    await expectRows(deps, job.jobId, "job.stale", (found) => expect(found).toEqual([]));
  });

  it("two sweeps marking one job at once (a scheduled pass and an operator's, or an index read lagging the mark) mark it once: the mark is conditional on the attention key read, which it moves", async () => {
    const { deps, clock } = await ready();
    const job = await readyJob(deps, {});
    await reviewAttention(deps);
    clock.advance(STALE_S * 1000 + MINUTE);
    let inner: Awaited<ReturnType<typeof reviewAttention>> | undefined;
    const racing = before(deps, "markAttention", async () => {
      if (inner === undefined) inner = await reviewAttention(deps);
    });
    const outer = await reviewAttention(racing);
    expect(inner?.results).toEqual([{ job_id: job.jobId, outcome: "stale" }]);
    expect(outer.results).toEqual([{ job_id: job.jobId, outcome: "lost_race" }]);
    const record = await deps.jobs.get(job.jobId);
    expect(record?.pending_notification?.event).toBe("stale");
    await expectRows(deps, job.jobId, "job.stale", (found) => expect(found).toHaveLength(1));
    await expectRows(deps, job.jobId, "intent.superseded", (found) => expect(found).toEqual([]));
  });

  it("an intent owed while the sweep marks (an operator's, landing between its read and its write) is never superseded unsent: the mark is conditional on the owed intent it read", async () => {
    const { deps, clock } = await ready();
    const job = await readyJob(deps, {});
    await reviewAttention(deps);
    clock.advance(STALE_S * 1000 + MINUTE);
    const operators = newIntent(deps, "progress", 1, "an operator's own notice", "operator");
    const racing = before(deps, "markAttention", async () => {
      await deps.jobs.replaceNotification(job.jobId, operators);
    });
    expect((await reviewAttention(racing)).results).toEqual([{ job_id: job.jobId, outcome: "lost_race" }]);
    const record = await deps.jobs.get(job.jobId);
    expect(record?.pending_notification?.id).toBe(operators.id);
    expect(record?.stale_since).toBeUndefined();
  });

  it("the sweep reads only the jobs whose look is due: an active job is looked at once a window, a silent one marked, and a job not yet due is never read", async () => {
    const { deps, clock } = await ready();
    const jobs: ReadyJob[] = [];
    for (let i = 0; i < 30; i++) jobs.push(await readyJob(deps, {}));
    expect((await reviewAttention(deps)).due).toBe(30);
    clock.advance(STALE_S * 1000 - MINUTE);
    // All but three were active a minute before the window closed.
    for (const job of jobs.slice(3)) await see(deps, job, "working");
    // Ten more claimed now: not due for a window, so never read below.
    const later: ReadyJob[] = [];
    for (let i = 0; i < 10; i++) later.push(await readyJob(deps, {}));
    expect((await reviewAttention(deps)).due).toBe(10);
    clock.advance(2 * MINUTE);
    const pass = await reviewAttention(deps);
    expect(pass).toMatchObject({ due: 30, stale: 3, rekeyed: 27 });
    expect(
      pass.results
        .filter((r) => r.outcome === "stale")
        .map((r) => r.job_id)
        .sort(),
    ).toEqual(
      jobs
        .slice(0, 3)
        .map((j) => j.jobId)
        .sort(),
    );
    expect(pass.results.some((r) => later.some((j) => j.jobId === r.job_id))).toBe(false);
    // Looked at: nothing is due again until the next window.
    expect((await reviewAttention(deps)).due).toBe(0);
  });
});
