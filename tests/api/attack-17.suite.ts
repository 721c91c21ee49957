import { createHash, randomUUID } from "node:crypto";
import type { JobStore, ReportStore } from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import { type ApiPorts, type Harness, type HarnessOptions, makeHarness, type PortsFactory } from "./harness.ts";
import type { ListPinnedCopies } from "./pins.suite.ts";

/**
 * Attacks on issue 17's quotas, leases and retires, through the API over every
 * adapter family. Interleavings are forced by holding one store call until the test
 * lets it go (never a sleep): `hold` arms a pause, `reached` says the request is
 * there, `go` lets it on.
 */
export function apiAttack17Suite(name: string, factory: PortsFactory, list: ListPinnedCopies): void {
  describe(`issue 17 attacks, over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });

    interface Pause {
      reached: Promise<void>;
      go: () => void;
    }
    /** Armed pauses: `afterGetDispatch` holds the first job read after a getDispatch (the events route's, then publishAgentEvent's own first read); `copyOnce` holds the next pin. */
    const armed: {
      afterGetDispatch?: PauseHandle | undefined;
      copyOnce?: PauseHandle | undefined;
      retire?: PauseHandle | undefined;
      putManifest?: PauseHandle | undefined;
      commitFinalize?: PauseHandle | undefined;
    } = {};
    interface PauseHandle {
      reach: () => void;
      wait: Promise<void>;
    }
    function arm(which: keyof typeof armed): Pause {
      let reach!: () => void;
      let go!: () => void;
      const reached = new Promise<void>((r) => {
        reach = r;
      });
      const wait = new Promise<void>((r) => {
        go = r;
      });
      armed[which] = { reach, wait };
      return { reached, go };
    }

    function holdingJobs(store: JobStore): JobStore {
      let nextGet: PauseHandle | undefined;
      return new Proxy(store, {
        get(target, prop) {
          const value: unknown = Reflect.get(target, prop, target);
          if (typeof value !== "function") return value;
          if (prop === "getDispatch") {
            return async (...args: unknown[]) => {
              const r = await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
              if (armed.afterGetDispatch !== undefined) {
                nextGet = armed.afterGetDispatch;
                armed.afterGetDispatch = undefined;
              }
              return r;
            };
          }
          if (prop === "recordEvidence") {
            return async (...args: unknown[]) => {
              const p = armed.commitFinalize;
              const change = args[1] as { set?: { finalized_report?: unknown } };
              if (p !== undefined && change.set?.finalized_report !== undefined) {
                armed.commitFinalize = undefined;
                p.reach();
                await p.wait;
              }
              return (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
            };
          }
          if (prop === "get") {
            return async (...args: unknown[]) => {
              const r = await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
              const p = nextGet;
              if (p !== undefined) {
                nextGet = undefined;
                p.reach();
                await p.wait;
              }
              return r;
            };
          }
          return value.bind(target);
        },
      });
    }

    function holdingReports(store: ReportStore): ReportStore {
      return new Proxy(store, {
        get(target, prop) {
          const value: unknown = Reflect.get(target, prop, target);
          if (typeof value !== "function") return value;
          if (prop !== "copyOnce" && prop !== "retire" && prop !== "put") return value.bind(target);
          return async (...args: unknown[]) => {
            const which =
              prop === "put" ? (args[1] === "report-manifest.json" ? "putManifest" : undefined) : (prop as "copyOnce" | "retire");
            const p = which === undefined ? undefined : armed[which];
            if (which !== undefined && p !== undefined) {
              armed[which] = undefined;
              p.reach();
              await p.wait;
            }
            return (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
          };
        },
      });
    }

    const harness = (opts: HarnessOptions = {}) =>
      makeHarness(
        async (o) => {
          const ports: ApiPorts = await factory(o);
          return { ...ports, close: () => ports.close(), jobs: holdingJobs(ports.jobs), reports: holdingReports(ports.reports) };
        },
        opts,
        cleanup,
      );

    async function register(h: Harness): Promise<string> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } });
      expect(reg.status, reg.text).toBe(201);
      return jobId;
    }
    async function dispatch(h: Harness, jobId: string, attempt: number): Promise<string> {
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: attempt, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      return res.body.agent_token;
    }
    const stage = (h: Harness, jobId: string, attempt: number, token: string, text: string) =>
      h.call("PUT", `/v1/jobs/${jobId}/attempts/${attempt}/report`, {
        token,
        body: text,
        headers: { "content-type": "text/markdown", "content-length": String(Buffer.byteLength(text)) },
      });
    const finalize = (h: Harness, jobId: string, token: string) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { token, json: { side_effects: [] } });
    const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");
    const live = async (h: Harness, evidence: string) =>
      (await list(h.ports, evidence))
        .filter((c) => !c.retired)
        .map((c) => c.name)
        .sort();

    it("attack-17 quota: a retired attempt's token, refused on every event, must not use up the job's event quota of the attempt that superseded it", async () => {
      const h = await harness({ env: { MAM_QUOTA_JOB_EVENTS: "4" } });
      const jobId = await register(h);
      const retired = await dispatch(h, jobId, 1);
      expect((await h.call("POST", `/v1/jobs/${jobId}/events`, { token: retired, json: { event: "started" } })).status).toBe(200);
      const current = await dispatch(h, jobId, 2);
      // The superseded agent (crashed, hung, replaced) keeps sending: each refused, its token retired.
      for (let i = 0; i < 3; i++) {
        const res = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: retired, json: { event: "progress" } });
        expect(res.status, res.text).toBe(403);
        expect(res.body.code).toBe("auth.forbidden");
      }
      // The current attempt's agent has sent nothing yet: its first events must be accepted.
      const mine = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: current, json: { event: "progress" } });
      expect(mine.status, mine.text).toBe(200);
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: current, json: { event: "progress" } });
      expect(done.status, done.text).toBe(200);
    });

    it("attack-17 quota: a retired attempt's token, refused on every event, must not use up the job's byte quota, so that the current attempt cannot stage its report", async () => {
      const h = await harness({ env: { MAM_QUOTA_JOB_BYTES: String(1024 * 1024), MAM_QUOTA_ATTEMPT_BYTES: String(1024 * 1024) } });
      const jobId = await register(h);
      const retired = await dispatch(h, jobId, 1);
      expect((await h.call("POST", `/v1/jobs/${jobId}/events`, { token: retired, json: { event: "started" } })).status).toBe(200);
      const current = await dispatch(h, jobId, 2);
      for (let i = 0; i < 2; i++) {
        const res = await h.call("POST", `/v1/jobs/${jobId}/events`, {
          token: retired,
          json: { event: "progress", data: { pad: "x".repeat(600_000) } },
        });
        expect(res.status, res.text).toBe(403);
      }
      const staged = await stage(h, jobId, 2, current, "# the current attempt's report\n");
      expect(staged.status, staged.text).toBe(201);
    });

    it("attack-17 retire: an event's finalize retires by the record it reads under its lease, so a route finalize that committed in between leaves no copy unreferenced", async () => {
      const h = await harness();
      const jobId = await register(h);
      const agent = await dispatch(h, jobId, 1);
      const evidence = `reports/${jobId}/1/evidence`;
      expect((await stage(h, jobId, 1, agent, "# X\n")).status).toBe(201);
      expect((await finalize(h, jobId, agent)).status).toBe(200);
      expect((await stage(h, jobId, 1, agent, "# Y\n")).status).toBe(201);
      // The event reads the record (pointer X) and is held before it takes the finalize lease.
      const pause = arm("afterGetDispatch");
      const event = h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: agent,
        json: { event: "started", finalize: { attempt_id: 1, side_effects: [] } },
      });
      await pause.reached;
      // Meanwhile a whole route finalize: pins Y, commits Y, retires X, releases its lease.
      const f = await finalize(h, jobId, agent);
      expect(f.status, f.text).toBe(200);
      expect(f.body.manifest.sha256).toBe(sha256("# Y\n"));
      expect(await live(h, evidence)).toEqual([sha256("# Y\n")]);
      expect((await stage(h, jobId, 1, agent, "# Z\n")).status).toBe(201);
      pause.go();
      const e = await event;
      expect(e.status, e.text).toBe(200);
      expect(e.body.finalized.manifest.sha256).toBe(sha256("# Z\n"));
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(job.body.finalized_report.report_sha256).toBe(sha256("# Z\n"));
      // Y is superseded by Z and named by nothing: by the rule it is retired. It stays.
      expect(await live(h, evidence)).toEqual([sha256("# Z\n")]);
    });

    it("attack-17 lease: a finalize releases only the declaration whose bytes it took; one declared while it ran stays in flight, and a second declaration is refused", async () => {
      const h = await harness();
      const jobId = await register(h);
      const agent = await dispatch(h, jobId, 1);
      expect((await stage(h, jobId, 1, agent, "# staged before the finalize\n")).status).toBe(201);
      const pause = arm("copyOnce");
      const running = finalize(h, jobId, agent);
      await pause.reached;
      const declared = "# declared while the finalize runs, never sent\n";
      const d = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, {
        token: agent,
        json: { sha256: sha256(declared), bytes: declared.length },
      });
      expect(d.status, d.text).toBe(200);
      const held = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.upload_in_flight;
      expect(held).toMatchObject({ declared: true, attempt_id: 1 });
      pause.go();
      const f = await running;
      expect(f.status, f.text).toBe(200);
      expect(f.body.manifest.sha256).toBe(sha256("# staged before the finalize\n"));
      // The finalize took other bytes than the declared ones: the declaration's upload is still in flight.
      const after = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.upload_in_flight;
      expect(after).toEqual(held);
      const second = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, {
        token: agent,
        json: { sha256: "b".repeat(64), bytes: 10 },
      });
      expect(second.status, second.text).toBe(409);
      expect(second.body.code).toBe("report.uploadInFlight");
    });
    it("attack-17 retire: a finalize past its lease retires nothing, so a copy a completion committed after its re-read names stays pinned and verifies", async () => {
      const h = await harness({ env: { MAM_FINALIZE_LEASE_SECONDS: "300" } });
      const jobId = await register(h);
      const agent = await dispatch(h, jobId, 1);
      const evidence = `reports/${jobId}/1/evidence`;
      const X = "# X, the bytes the completion will rest on\n";
      expect((await stage(h, jobId, 1, agent, X)).status).toBe(201);
      expect((await finalize(h, jobId, agent)).status).toBe(200);
      expect((await stage(h, jobId, 1, agent, "# Y\n")).status).toBe(201);
      // F1 commits Y, re-reads (X named by nothing) and is held just before it retires X.
      const pause = arm("retire");
      const f1 = finalize(h, jobId, agent);
      await pause.reached;
      // F1 outlives its lease (a slow store, a paused process): the next finalize may run.
      h.clock.advance(300_000);
      expect((await stage(h, jobId, 1, agent, X)).status).toBe(201);
      const f2 = await finalize(h, jobId, agent);
      expect(f2.status, f2.text).toBe(200);
      expect(f2.body.manifest.sha256).toBe(sha256(X));
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: agent,
        json: { event: "completed", finalize: { attempt_id: 1, side_effects: [] } },
      });
      expect(done.status, done.text).toBe(200);
      expect(done.body.record).toMatchObject({ status: "completed", completed_evidence: { report_sha256: sha256(X) } });
      pause.go();
      expect((await f1).status).toBe(200);
      // The completion's evidence cannot change afterwards: its pinned copy is still in force and verifies.
      expect(await live(h, evidence)).toContain(sha256(X));
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(v.body, v.text).toMatchObject({ ok: true, matches_completion: true, pinned: { ok: true } });
    });
    it("attack-17 retire: a finalize that re-reads after its lease expired does not retire the copy the next finalize is about to commit; the completion rests on a copy that is there and untagged", async () => {
      const h = await harness({ env: { MAM_FINALIZE_LEASE_SECONDS: "300" } });
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const reg = await h.call("POST", "/v1/jobs", {
        token: h.operator,
        json: { job_id: jobId, prompt: "p", agent: "codex", expected_artifacts: ["git_push"] },
      });
      expect(reg.status, reg.text).toBe(201);
      const agent = await dispatch(h, jobId, 1);
      const evidence = `reports/${jobId}/1/evidence`;
      const fin = () =>
        h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, {
          token: agent,
          json: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
        });
      const X = "# X, the bytes the completion will rest on\n";
      expect((await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "started" } })).status).toBe(200);
      expect((await stage(h, jobId, 1, agent, X)).status).toBe(201);
      expect((await fin()).status).toBe(200);
      expect((await stage(h, jobId, 1, agent, "# Y\n")).status).toBe(201);
      // F1 commits Y and is held writing its live names, before it re-reads the record.
      const p1 = arm("putManifest");
      const f1 = fin();
      await p1.reached;
      h.clock.advance(300_000);
      // F2 (F1's lease expired) pins X again (the copy still exists) and is held before its commit.
      expect((await stage(h, jobId, 1, agent, X)).status).toBe(201);
      const p2 = arm("commitFinalize");
      const f2 = fin();
      await p2.reached;
      // F1 goes on: its re-read names X nowhere (the pointer is Y).
      p1.go();
      expect((await f1).status).toBe(200);
      p2.go();
      const r2 = await f2;
      expect(r2.status, r2.text).toBe(200);
      expect(r2.body.manifest.sha256).toBe(sha256(X));
      // The agent completes on the finalized evidence, X.
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: agent,
        json: { event: "completed", expected_seq: job.body.transition_seq },
      });
      expect(done.status, done.text).toBe(200);
      expect(done.body.record).toMatchObject({ status: "completed", completed_evidence: { report_sha256: sha256(X) } });
      expect(await live(h, evidence)).toContain(sha256(X));
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(v.body, v.text).toMatchObject({ ok: true, matches_completion: true, pinned: { ok: true } });
    });
    it("attack-17 quota (held): ten parallel events against a quota of four: at most four are charged, at most four accepted", async () => {
      const h = await harness({ env: { MAM_QUOTA_JOB_EVENTS: "4" } });
      const jobId = await register(h);
      const agent = await dispatch(h, jobId, 1);
      expect((await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "started" } })).status).toBe(200);
      const all = await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "progress", data: { i } } }),
        ),
      );
      const accepted = all.filter((r) => r.status === 200).length;
      for (const r of all) expect([200, 409, 429, 503], r.text).toContain(r.status);
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(job.body.agent_usage.events).toBeLessThanOrEqual(4);
      expect(accepted).toBeLessThanOrEqual(3);
      const log = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
      expect((log.body.items as { event: string }[]).filter((e) => e.event === "publish_event").length).toBe(1 + accepted);
    });

    it("attack-17 lease (held): a retired attempt's declaration and finalize in progress block nothing of the attempt that superseded it", async () => {
      const h = await harness();
      const jobId = await register(h);
      const old = await dispatch(h, jobId, 1);
      const body = "# attempt 1, declared and never sent\n";
      const d = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, {
        token: old,
        json: { sha256: sha256(body), bytes: body.length },
      });
      expect(d.status, d.text).toBe(200);
      expect((await stage(h, jobId, 1, old, body)).status).toBe(201);
      const pause = arm("copyOnce");
      const f1 = finalize(h, jobId, old);
      await pause.reached;
      const current = await dispatch(h, jobId, 2);
      const body2 = "# attempt 2\n";
      const d2 = await h.call("POST", `/v1/jobs/${jobId}/attempts/2/report/upload`, {
        token: current,
        json: { sha256: sha256(body2), bytes: body2.length },
      });
      expect(d2.status, d2.text).toBe(200);
      expect((await stage(h, jobId, 2, current, body2)).status).toBe(201);
      const f2 = await h.call("POST", `/v1/jobs/${jobId}/attempts/2/finalize`, { token: current, json: { side_effects: [] } });
      expect(f2.status, f2.text).toBe(200);
      pause.go();
      const r1 = await f1;
      expect(r1.status, r1.text).toBe(409);
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(job.body.finalized_report).toMatchObject({ attempt_id: 2, report_sha256: sha256(body2) });
      expect(job.body.finalize_in_progress).toBeUndefined();
      // And a cancel with an upload declared in flight: nothing is held against it.
      const d3 = await h.call("POST", `/v1/jobs/${jobId}/attempts/2/report/upload`, {
        token: current,
        json: { sha256: "c".repeat(64), bytes: 5 },
      });
      expect(d3.status, d3.text).toBe(200);
      const cancel = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "cancel", expected_seq: job.body.transition_seq },
      });
      expect(cancel.status, cancel.text).toBe(200);
    });
    it("attack-17 quota: a declared upload within MAM_QUOTA_ATTEMPT_BYTES is charged once, by its declaration: its PUT through the report route is accepted", async () => {
      const MiB = 1024 * 1024;
      const h = await harness({ env: { MAM_QUOTA_ATTEMPT_BYTES: String(2 * MiB), MAM_QUOTA_JOB_BYTES: String(8 * MiB) } });
      const jobId = await register(h);
      const agent = await dispatch(h, jobId, 1);
      const bytes = new Uint8Array(1.5 * MiB).fill(0x61);
      const d = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, {
        token: agent,
        json: { sha256: createHash("sha256").update(bytes).digest("hex"), bytes: bytes.byteLength },
      });
      expect(d.status, d.text).toBe(200);
      if (h.deps.reports.uploadUrl !== undefined) return; // S3: the bytes go to the presigned address, never through the route
      const declaredLease = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.upload_in_flight;
      const put = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: agent,
        body: bytes,
        headers: { "content-type": "text/markdown", "content-length": String(bytes.byteLength) },
      });
      if (put.status !== 201) {
        // Whatever the answer, a refusal writes nothing: the declaration is still the upload in flight.
        expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.upload_in_flight).toEqual(declaredLease);
      }
      expect(put.status, put.text).toBe(201);
    });
  });
}
