import { createHash, randomUUID } from "node:crypto";
import type { JobStore, ReportStore } from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import { type ApiPorts, type Harness, makeHarness, type PortsFactory } from "./harness.ts";

/** One pinned copy under an attempt's `evidence/`, as the backend shows it. */
export interface PinnedCopy {
  readonly name: string;
  /** Marked for the store's expiry but still there (S3's `mam-retired=true` tag); a store that removes never lists one. */
  readonly retired: boolean;
}

/** Every object under `<location>/evidence/`, read from the backend itself (a directory listing, a bucket listing). */
export type ListPinnedCopies = (ports: ApiPorts, evidenceLocation: string) => Promise<PinnedCopy[]>;

/**
 * Unreferenced pinned copies (issue 17, item 1): every finalize pins its bytes to a
 * write-once `evidence/<sha256>`; once a newer finalize of the attempt supersedes it,
 * or its own commit is refused, and the record names it neither as the current
 * finalize nor as the completion, the store retires it (files: removed; S3: tagged
 * for the bucket's lifecycle rule). Through the API, over every adapter family: the
 * copies are counted on the backend itself, never through the service.
 */
export function apiPinnedCopiesSuite(name: string, factory: PortsFactory, list: ListPinnedCopies): void {
  describe(`unreferenced pinned copies, over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });

    /** Runs once, just before the next commit of a finalize's pointer reaches the store, then disarms. */
    let beforeFinalizeCommit: (() => Promise<void>) | undefined;
    /** `retireFails`: the store's retire throws (fault injection; every other call reaches the adapter). */
    const harness = (opts: { retireFails?: boolean } = {}) =>
      makeHarness(
        async (portsOpts) => {
          const ports = await factory(portsOpts);
          const reports = opts.retireFails ? failingRetire(ports.reports) : ports.reports;
          return { ...ports, reports, jobs: interleaving(ports.jobs, () => beforeFinalizeCommit) };
        },
        {},
        cleanup,
      );

    async function dispatchedJob(h: Harness): Promise<{ jobId: string; agent: string; evidence: string }> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } });
      expect(reg.status, reg.text).toBe(201);
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      return { jobId, agent: res.body.agent_token, evidence: `reports/${jobId}/1/evidence` };
    }

    const stage = (h: Harness, jobId: string, token: string, text: string) =>
      h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, { token, body: text, headers: { "content-type": "text/markdown" } });
    const finalize = (h: Harness, jobId: string, token: string) =>
      h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, {
        token,
        json: { side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] },
      });

    async function cycle(h: Harness, jobId: string, token: string, text: string): Promise<string> {
      expect((await stage(h, jobId, token, text)).status).toBe(201);
      const f = await finalize(h, jobId, token);
      expect(f.status, f.text).toBe(200);
      expect(f.body.manifest.sha256).toBe(sha256(text));
      return f.body.manifest.sha256;
    }

    /** The copies still in force: what a store that removes lists, and what a store that marks lists unmarked. */
    const live = async (h: Harness, evidence: string) =>
      (await list(h.ports, evidence))
        .filter((c) => !c.retired)
        .map((c) => c.name)
        .sort();

    it("16 finalize cycles of changing bytes leave exactly the referenced copy in force, and it verifies", async () => {
      const h = await harness();
      const { jobId, agent, evidence } = await dispatchedJob(h);
      const shas: string[] = [];
      for (let i = 1; i <= 16; i++) shas.push(await cycle(h, jobId, agent, `# Report, take ${i}\n\n${"x".repeat(i * 100)}\n`));
      const referenced = shas.at(-1) as string;
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(job.body.finalized_report).toMatchObject({ attempt_id: 1, report_sha256: referenced });
      const all = await list(h.ports, evidence);
      // Before issue 17: 16 copies, one referenced. A store that marks keeps the other 15 until its lifecycle rule expires them.
      expect(await live(h, evidence)).toEqual([referenced]);
      expect(all.length === 1 || all.filter((c) => c.retired).length === 15, JSON.stringify(all)).toBe(true);
      const verification = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(verification.body).toMatchObject({ ok: true });
    });

    it("a finalize carried by a progress event retires by the same rule; a completion's finalize retires nothing", async () => {
      const h = await harness();
      const { jobId, agent, evidence } = await dispatchedJob(h);
      const withFinalize = (event: string) => ({
        token: agent,
        json: { event, finalize: { attempt_id: 1, side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] } },
      });
      let last = "";
      for (let i = 1; i <= 4; i++) {
        expect((await stage(h, jobId, agent, `# Report, progress ${i}\n`)).status).toBe(201);
        const res = await h.call("POST", `/v1/jobs/${jobId}/events`, withFinalize(i === 1 ? "started" : "progress"));
        expect(res.status, res.text).toBe(200);
        last = res.body.finalized.manifest.sha256;
        expect(await live(h, evidence)).toEqual([last]);
      }
      expect((await stage(h, jobId, agent, "# Report, completed\n")).status).toBe(201);
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, withFinalize("completed"));
      expect(done.status, done.text).toBe(200);
      const completed = done.body.record.completed_evidence.report_sha256;
      // The completion superseded the last progress finalize, and left its copy: completing never removes evidence.
      expect(await live(h, evidence)).toEqual([last, completed].sort());
    });

    it("a retire that fails never fails the finalize: the commit stands, and the copy stays for want of it", async () => {
      const h = await harness({ retireFails: true });
      const { jobId, agent, evidence } = await dispatchedJob(h);
      const first = await cycle(h, jobId, agent, "# Report\n\nfirst\n");
      const second = await cycle(h, jobId, agent, "# Report\n\nsecond\n");
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(job.body.finalized_report).toMatchObject({ report_sha256: second });
      expect(await live(h, evidence)).toEqual([first, second].sort());
      const verification = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(verification.body).toMatchObject({ ok: true });
    });

    it("a finalize of identical bytes twice keeps its copy: content-addressed, it is the current finalize's", async () => {
      const h = await harness();
      const { jobId, agent, evidence } = await dispatchedJob(h);
      const text = "# Report\n\nthe same bytes, finalized twice\n";
      const first = await cycle(h, jobId, agent, text);
      expect(await cycle(h, jobId, agent, text)).toBe(first);
      // And once more without staging: the live report finalized again.
      expect((await finalize(h, jobId, agent)).body.manifest.sha256).toBe(first);
      expect(await live(h, evidence)).toEqual([first]);
      // A change, then back to the first bytes: the copy retired in between is pinned again, in force.
      const second = await cycle(h, jobId, agent, `${text}changed\n`);
      expect(await live(h, evidence)).toEqual([second]);
      expect(await cycle(h, jobId, agent, text)).toBe(first);
      expect(await live(h, evidence)).toEqual([first]);
    });

    it("a completed job's pinned copy is never retired by anything after: refused finalizes, re-sent completions", async () => {
      const h = await harness();
      const { jobId, agent, evidence } = await dispatchedJob(h);
      await cycle(h, jobId, agent, "# Report\n\nan earlier take\n");
      const pinned = await cycle(h, jobId, agent, "# Report\n\nthe take the completion pins\n");
      const done = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: agent,
        json: { event: "completed", finalize: { attempt_id: 1, side_effects: [{ kind: "git_push", reference: "a1b2c3d" }] } },
      });
      expect(done.status, done.text).toBe(200);
      expect(done.body.record).toMatchObject({ status: "completed", completed_evidence: { attempt_id: 1, report_sha256: pinned } });
      // Staging other bytes and finalizing them is refused (the tree is frozen); a re-sent finalize is told it is done.
      expect((await stage(h, jobId, agent, "# Report\n\nafter the completion\n")).status).toBe(409);
      const again = await finalize(h, jobId, agent);
      expect(again.status, again.text).toBe(200);
      expect(again.body).toMatchObject({ already_completed: true });
      expect(await live(h, evidence)).toEqual([pinned]);
      const verification = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(verification.body).toMatchObject({ ok: true, matches_completion: true, pinned: { ok: true, report_sha256: pinned } });
    });

    it("a finalize whose commit is refused (the job cancelled after its copy was pinned) leaves no unreferenced copy, and the current one stays", async () => {
      const h = await harness();
      const { jobId, agent, evidence } = await dispatchedJob(h);
      const current = await cycle(h, jobId, agent, "# Report\n\nthe committed finalize\n");
      expect((await stage(h, jobId, agent, "# Report\n\nthe finalize that loses\n")).status).toBe(201);
      beforeFinalizeCommit = async () => {
        const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
        const cancel = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
          token: h.operator,
          json: { action: "cancel", expected_seq: job.body.transition_seq },
        });
        expect(cancel.status, cancel.text).toBe(200);
      };
      const refused = await finalize(h, jobId, agent);
      expect(beforeFinalizeCommit).toBeUndefined();
      expect(refused.status, refused.text).toBe(409);
      // Before issue 17: the losing finalize's copy stayed, named by nothing.
      expect(await live(h, evidence)).toEqual([current]);
    });

    it("a refused finalize of the bytes the record already names keeps that copy", async () => {
      const h = await harness();
      const { jobId, agent, evidence } = await dispatchedJob(h);
      const current = await cycle(h, jobId, agent, "# Report\n\nnamed by the record\n");
      beforeFinalizeCommit = async () => {
        const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
        await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
          token: h.operator,
          json: { action: "cancel", expected_seq: job.body.transition_seq },
        });
      };
      // The live report finalized again: the same bytes, the same copy.
      const refused = await finalize(h, jobId, agent);
      expect(refused.status, refused.text).toBe(409);
      expect(await live(h, evidence)).toEqual([current]);
    });

    function failingRetire(store: ReportStore): ReportStore {
      return new Proxy(store, {
        get(target, prop) {
          const value: unknown = Reflect.get(target, prop, target);
          if (prop === "retire") return async () => Promise.reject(new Error("the store refused to retire"));
          return typeof value === "function" ? value.bind(target) : value;
        },
      });
    }

    /** A pass-through over the real store that runs `hook()` once just before a finalize's pointer is committed: a cancel landing in between. */
    function interleaving(store: JobStore, hook: () => (() => Promise<void>) | undefined): JobStore {
      return new Proxy(store, {
        get(target, prop) {
          const value: unknown = Reflect.get(target, prop, target);
          if (typeof value !== "function") return value;
          if (prop !== "recordEvidence") return value.bind(target);
          return async (...args: Parameters<JobStore["recordEvidence"]>) => {
            const run = hook();
            if (run !== undefined && args[1].set?.finalized_report !== undefined) {
              beforeFinalizeCommit = undefined;
              await run();
            }
            return target.recordEvidence(...args);
          };
        },
      });
    }
  });
}

const sha256 = (text: string): string => createHash("sha256").update(text).digest("hex");
