/**
 * One publish per intent, per topic, per process (issue 11, item 1): every kind of
 * commit that carries a notification intent reaches a real subscriber exactly once on
 * the job's topic and once on the fan-in `mam/events` — or is superseded by a newer
 * intent of its job before anything sent it, and counted as such, never silently
 * dropped. Two of the three publish paths run here:
 *
 * - `mam serve`'s own composition (`startService`, in-process so the test clock drives
 *   the sweep's grace): the change relay publishes every commit; the request that
 *   committed answers without `published`.
 * - the `mam` command in `--data-dir` mode, which publishes inline itself.
 *
 * The third (the stream publisher on AWS) is in tests/engine/publish-count.test.ts.
 *
 * How a count is made without waiting on time: run a sweep (it must find nothing
 * fresh: the grace period leaves fresh intents to the relay), wait until the relay
 * has handled every commit so far (`relayed()`: each publish acknowledged by the
 * broker, an event), then commit a sentinel and wait until its message has arrived.
 * The broker had taken every earlier publish before the sentinel's was sent, and it
 * delivers to a subscriber in the order it took them, so once the sentinel is in,
 * everything before it is in too: only then count.
 */
import { randomUUID } from "node:crypto";
import { readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type RunningService, runCli, startService } from "@mam/cli";
import { bookkeeping, type JobRecord, parseConfig, transitionJob } from "@mam/core";
import { dataDirPaths, openDataDir } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CANDIDATE_DISPATCH, candidateScenario } from "../api/harness.ts";
import { captureIo, publishCompletedArgs } from "../support/cli-io.ts";
import { type TestClock, tickingClock } from "../support/clock.ts";
import { type Committed, expectDeliveredOrSuperseded, supersededIn, tally } from "../support/publish-count.ts";
import { type Subscription, subscribe } from "../support/subscriber.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const GRACE_SECONDS = 5;
describe("publish count: one message per topic per intent (B-13, B-40 unchanged)", () => {
  let dir: TempDir;
  let clock: TestClock;
  let service: RunningService;
  let sub: Subscription;
  let operator: string;
  const committed: Committed[] = [];

  beforeAll(async () => {
    dir = await tempDir("publish-count");
    clock = tickingClock(new Date().toISOString());
    const config = parseConfig({
      MAM_DATA_DIR: dir.dir,
      MAM_PORT: "0",
      MAM_MQTT_PORT: "0",
      MAM_AUTO_COMPLETE: "1",
      MAM_SWEEP_GRACE_SECONDS: String(GRACE_SECONDS),
      // The timer never fires during the test: sweeps are asked for, so they can be counted.
      MAM_SWEEP_INTERVAL_SECONDS: "86400",
    });
    service = await startService(config, () => undefined, { clock });
    operator = JSON.parse(await readFile(dataDirPaths(dir.dir).credentials, "utf8")).operator_token;
    sub = await subscribe(service.mqttUrl, "mam/#");
  });

  afterAll(async () => {
    await sub?.close();
    await service?.stop();
    await dir?.remove();
  });

  const call = async (
    token: string,
    method: string,
    path: string,
    body?: unknown,
    raw?: string,
    // biome-ignore lint/suspicious/noExplicitAny: the test walks JSON answers whose shape each assertion states
  ): Promise<{ status: number; body: any }> => {
    const res = await fetch(new URL(path, service.url), {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body !== undefined ? { "content-type": "application/json" } : {}),
        ...(raw !== undefined ? { "content-type": "text/markdown" } : {}),
      },
      ...(body !== undefined ? { body: JSON.stringify(body) } : raw !== undefined ? { body: raw } : {}),
    });
    return { status: res.status, body: await res.json() };
  };

  /** A commit through the API; records the intent it carried, if it carried a new one. */
  const commit = async (what: string, token: string, path: string, body: unknown, expectIntent: boolean): Promise<JobRecord> => {
    const res = await call(token, "POST", path, body);
    expect(res.status, `${what}: ${JSON.stringify(res.body)}`).toBe(200);
    const record: JobRecord = res.body.record ?? res.body;
    noteIntent(what, record, expectIntent);
    return record;
  };

  const lastIntentOf = new Map<string, string | undefined>();
  const noteIntent = (what: string, record: JobRecord, expectIntent: boolean): void => {
    const id = record.pending_notification?.id;
    const fresh = id !== undefined && id !== lastIntentOf.get(record.job_id);
    expect(fresh, `${what}: ${expectIntent ? "carries" : "carries no"} new intent`).toBe(expectIntent);
    if (fresh) committed.push({ job: record.job_id, intent: id, what });
    lastIntentOf.set(record.job_id, id);
  };

  const register = async (extra: Record<string, unknown> = {}): Promise<string> => {
    const res = await call(operator, "POST", "/v1/jobs", { prompt: "p", agent: "claude-code", ...extra });
    expect(res.status).toBe(201);
    return res.body.job_id as string;
  };

  const transition = (what: string, job: string, seq: number, action: string, extra: Record<string, unknown>, intent: boolean) =>
    commit(what, operator, `/v1/jobs/${job}/transitions`, { action, expected_seq: seq, ...extra }, intent);

  /** Sweep with the service's grace, then a sentinel; resolves with its job once the sentinel arrived. */
  const sweepThenSentinel = async (): Promise<string> => {
    const sweep = await call(operator, "POST", "/v1/recovery-sweeps", {});
    expect(sweep.status).toBe(200);
    // Everything owed is fresh (younger than the grace): the relay's, not the sweep's.
    expect(sweep.body).toMatchObject({ sent: 0, failed: 0 });
    await service.relayed();
    const sentinel = await register();
    const record = await transition("sentinel claim", sentinel, 0, "claim", { notify: true }, true);
    const id = record.pending_notification?.id;
    await sub.waitFor((m) => m.topic === "mam/events" && m.payload.includes(`"${id}"`), 10_000);
    return sentinel;
  };

  it("the relay of mam serve: transitions of every action with and without notify, agent events, finalize+event, the gate, cancel, bookkeeping", async () => {
    // claim, progress: notify only when asked; completed, error, cancel: unless told not to (with a reason).
    const a = await register();
    let r = await transition("claim", a, 0, "claim", {}, false);
    r = await transition("progress", a, r.transition_seq, "progress", { fields: { progress: { step: 1 } } }, false);
    r = await transition("progress notify", a, r.transition_seq, "progress", { notify: true }, true);
    await transition("completed", a, r.transition_seq, "completed", {}, true);

    const b = await register();
    r = await transition("claim notify", b, 0, "claim", { notify: true }, true);
    await transition("error", b, r.transition_seq, "error", {}, true);

    const c = await register();
    await transition("operator cancel", c, 0, "cancel", {}, true);

    const d = await register();
    r = await transition("claim (d)", d, 0, "claim", {}, false);
    // Suppressing a terminal notification takes a stated reason; without one, nothing is written.
    const unexplained = await call(operator, "POST", `/v1/jobs/${d}/transitions`, {
      action: "completed",
      expected_seq: r.transition_seq,
      notify: false,
    });
    expect(unexplained.status).toBe(400);
    await transition("completed, notify: false", d, r.transition_seq, "completed", { notify: false, reason: "rerun" }, false);
    const e = await register();
    await transition("cancel, notify: false", e, 0, "cancel", { notify: false, reason: "duplicate job" }, false);

    // Agent events over POST /events: committed once, published once (by the relay alone).
    const f = await register();
    const dispatch = await call(operator, "POST", `/v1/jobs/${f}/dispatches`, CANDIDATE_DISPATCH);
    expect(dispatch.status).toBe(201);
    const agent = dispatch.body.agent_token as string;
    for (const event of ["started", "progress"] as const) {
      const res = await call(agent, "POST", `/v1/jobs/${f}/events`, { event });
      expect(res.status).toBe(200);
      // The relay publishes; the request does not know whether it has yet, and does not say.
      expect(res.body).not.toHaveProperty("published");
      noteIntent(`POST /events ${event}`, res.body.record, true);
    }
    expect((await call(agent, "PUT", `/v1/jobs/${f}/attempts/1/report`, undefined, "# done\n")).status).toBe(201);
    const fin = await call(agent, "POST", `/v1/jobs/${f}/events`, { event: "completed", finalize: { attempt_id: 1, side_effects: [] } });
    expect(fin.status, JSON.stringify(fin.body)).toBe(200);
    expect(fin.body).not.toHaveProperty("published");
    noteIntent("POST /events completed with finalize", fin.body.record, true);

    // The gate's completion.
    const g = await register({ auto_complete: true });
    const gd = await call(operator, "POST", `/v1/jobs/${g}/dispatches`, CANDIDATE_DISPATCH);
    const gAgent = gd.body.agent_token as string;
    await commit("agent claim", gAgent, `/v1/jobs/${g}/transitions`, { action: "claim", expected_seq: 0 }, false);
    expect((await call(gAgent, "PUT", `/v1/jobs/${g}/attempts/1/report`, undefined, "# Report\n\nFixed.\n")).status).toBe(201);
    expect((await call(gAgent, "POST", `/v1/jobs/${g}/attempts/1/finalize`, { side_effects: [] })).status).toBe(200);
    const gate = await call(operator, "POST", `/v1/jobs/${g}/evaluations`, { scenario: candidateScenario(g) });
    expect(gate.body.committed, gate.body.reason).toBe(true);
    noteIntent("the gate's completion", gate.body.record, true);

    // Bookkeeping: an operator's replacement intent (no API route; core's function over the service's store).
    const h = await register();
    r = await transition("cancel (h)", h, 0, "cancel", { notify: false, reason: "to re-announce" }, false);
    const replacement = {
      id: randomUUID(),
      event: "cancelled",
      seq: r.transition_seq,
      created_at: clock.now().toISOString(),
      by: "operator",
    };
    await bookkeeping(service.deps, h, { pending_notification: replacement });
    committed.push({ job: h, intent: replacement.id, what: "bookkeeping replace" });

    // Two notifying commits back to back: the second may supersede the first before the relay sent it.
    const s = await register();
    let rec = await transitionJob(service.deps, s, { action: "claim", expectedSeq: 0, notify: true }, { kind: "operator" });
    noteIntent("claim notify (s)", rec, true);
    rec = await transitionJob(service.deps, s, { action: "progress", expectedSeq: rec.transition_seq, notify: true }, { kind: "operator" });
    noteIntent("progress notify right after (s)", rec, true);

    await sweepThenSentinel();
    const counts = await expectDeliveredOrSuperseded(sub, committed, supersededIn(service.deps.jobs));
    expect(counts.delivered + counts.superseded).toBe(committed.length);
  });

  it("the sweep leaves a fresh intent alone for its grace period, then sends what the relay missed, once", async () => {
    // A commit by another process on the same data dir: this service's relay never sees it.
    const job = await register();
    const other = openDataDir(dir.dir);
    let missed: string;
    try {
      const rec = await transitionJob(
        { ...service.deps, jobs: other.jobs, clock },
        job,
        { action: "claim", expectedSeq: 0, notify: true },
        { kind: "operator" },
      );
      missed = rec.pending_notification?.id ?? "";
      committed.push({ job, intent: missed, what: "claim by another process" });
    } finally {
      other.close();
    }
    const early = await call(operator, "POST", "/v1/recovery-sweeps", {});
    expect(early.body).toMatchObject({ owed: 0, sent: 0 });
    clock.advance(GRACE_SECONDS * 1000);
    const due = await call(operator, "POST", "/v1/recovery-sweeps", {});
    expect(due.body).toMatchObject({ owed: 1, sent: 1, results: [{ job_id: job, intent_id: missed, outcome: "sent" }] });
    const again = await call(operator, "POST", "/v1/recovery-sweeps", { grace_seconds: 0 });
    expect(again.body).toMatchObject({ owed: 0, sent: 0 });
    await sweepThenSentinel();
    const { byIntent } = tally(sub);
    expect(byIntent.get(missed)).toEqual({ job: 1, fanIn: 1 });
  });

  it("the mam command in --data-dir mode publishes what it commits itself, once (the service's relay does not see it)", async () => {
    const mqttPort = new URL(service.mqttUrl).port;
    const tree = await tempDir("publish-count-agent");
    try {
      const jobs = [await register(), await register()];
      const cli = async (args: string[]): Promise<JobRecord> => {
        const io = captureIo({ MAM_MQTT_PORT: mqttPort });
        const code = await runCli([...args, "--data-dir", dir.dir, "--json"], io);
        expect(code, io.err.join("")).toBe(0);
        const doc = JSON.parse(io.out.join(""));
        // B-13: this command is the publish path here, and it knows: published.
        expect(doc.published).toBe(true);
        return doc.record;
      };
      for (const event of ["started", "progress", "error"]) {
        noteIntent(`cli ${event}`, await cli(["publish-event", "--job", jobs[0] as string, "--event", event]), true);
      }
      noteIntent(`cli started (2)`, await cli(["publish-event", "--job", jobs[1] as string, "--event", "started"]), true);
      await writeFile(join(tree.dir, "report-final.md.tmp"), "# done\n");
      const report = join(tree.dir, "report-final.md");
      noteIntent("cli finalize+completed", await cli(publishCompletedArgs(jobs[1] as string, report, "git_push=a1b2c3d")), true);
      const sentinel = await sweepThenSentinel();
      const store = openDataDir(dir.dir);
      try {
        const counts = await expectDeliveredOrSuperseded(sub, committed, supersededIn(store.jobs));
        expect(counts.delivered + counts.superseded).toBe(committed.length);
        // Nothing is left owed (the sentinel's settle may still be on its way).
        expect((await store.jobs.listOwed(100)).map((j) => j.job_id).filter((j) => j !== sentinel)).toEqual([]);
      } finally {
        store.close();
      }
    } finally {
      await rm(tree.dir, { recursive: true, force: true });
    }
  });
});
