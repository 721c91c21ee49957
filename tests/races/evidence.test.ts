/**
 * The gate against every write its evidence depends on — finalize, report upload,
 * a newer dispatch — with each interleaving forced, not hoped for: a decorator
 * around the real ports holds one call at a chosen point until the racer's write
 * has landed (or the reverse). Every completed job is then checked the same way: the
 * pinned object, read through the store and hashed here, is what `completed_evidence`
 * names, and so is the live manifest.
 *
 * MAM_RACE_TRIALS sets the trials per interleaving (3 by default; the reliability
 * tier runs 100).
 */
import { createHash } from "node:crypto";
import {
  type Deps,
  evaluateJob,
  evidenceLocation,
  finalizeAttemptReport,
  isMamError,
  type JobRecord,
  type JobStore,
  parseFlags,
  publishAgentEvent,
  REPORT_NAME,
  type ReportStore,
  recordDispatch,
  STAGED_REPORT_NAME,
  stageAttemptReport,
  transitionJob,
} from "@mam/core";
import { afterAll, expect, it } from "vitest";
import { describeBackends, type SeedBackend } from "../seed/harness.ts";
import { MANIFEST_FILE, type ReadyJob, readyJob, utf8 } from "../seed/scenario.ts";
import { rejection } from "../support/rejection.ts";

const TRIALS = Number(process.env.MAM_RACE_TRIALS ?? 3);
/** Each test runs every trial in turn: a trial takes well under a second on either backend. */
const TIMEOUT = 30_000 + TRIALS * 1_500;
const ON = parseFlags({ MAM_AUTO_COMPLETE: "1" });

// ---- forcing interleavings

interface Held {
  /** Resolves when the held call has been reached (and is waiting). */
  readonly reached: Promise<void>;
  /** Lets the held call go on to the real port. */
  release(): void;
}

/**
 * Holds chosen calls of a port until released. Everything else passes straight to
 * the real adapter: this is a pause button, not a mock.
 */
class Holds {
  readonly #pending: { method: string; when: (args: unknown[]) => boolean; reached: () => void; gate: Promise<void> }[] = [];

  hold(method: string, when: (args: unknown[]) => boolean = () => true): Held {
    let reached!: () => void;
    let release!: () => void;
    const reachedP = new Promise<void>((r) => {
      reached = r;
    });
    const gate = new Promise<void>((r) => {
      release = r;
    });
    this.#pending.push({ method, when, reached, gate });
    return { reached: reachedP, release };
  }

  wrap<T extends object>(target: T): T {
    const pending = this.#pending;
    return new Proxy(target, {
      get(t, prop) {
        const value: unknown = Reflect.get(t, prop, t);
        if (typeof value !== "function") return value;
        return (...args: unknown[]) => {
          const i = pending.findIndex((h) => h.method === prop && h.when(args));
          if (i < 0) return (value as (...a: unknown[]) => unknown).apply(t, args);
          const [h] = pending.splice(i, 1);
          return (async () => {
            h?.reached();
            await h?.gate;
            return (value as (...a: unknown[]) => unknown).apply(t, args);
          })();
        };
      },
    });
  }
}

/** The backend's ports with holds in front of the job store and the report store. */
function heldDeps(backend: SeedBackend): { deps: Deps; holds: Holds } {
  const holds = new Holds();
  const base = backend.deps(ON);
  return { holds, deps: { ...base, jobs: holds.wrap<JobStore>(base.jobs), reports: holds.wrap<ReportStore>(base.reports) } };
}

const isGateCommit = (args: unknown[]): boolean => (args[2] as { set?: { completed_by?: string } }).set?.completed_by === "auto_complete";
const isFinalizeCommit = (args: unknown[]): boolean =>
  (args[1] as { set?: { finalized_report?: unknown } }).set?.finalized_report !== undefined;
const isDispatchCommit = (args: unknown[]): boolean => (args[1] as { guard?: { newAttempt?: number } }).guard?.newAttempt !== undefined;
const isLiveReportWrite = (args: unknown[]): boolean => args[1] === REPORT_NAME;
const isLiveReportCopy = (args: unknown[]): boolean => (args[1] as { name?: string }).name === REPORT_NAME;

// ---- what every completed job must show

async function sha256Of(stream: AsyncIterable<Uint8Array> | undefined): Promise<string> {
  if (stream === undefined) throw new Error("the pinned object is missing");
  const hash = createHash("sha256");
  for await (const chunk of stream) hash.update(chunk);
  return hash.digest("hex");
}

/** The pinned object and the live manifest are exactly what `completed_evidence` names. */
async function expectPinned(deps: Deps, ready: ReadyJob, expectedBody: string): Promise<JobRecord> {
  const record = await deps.jobs.get(ready.jobId);
  expect(record?.status).toBe("completed");
  const evidence = record?.completed_evidence;
  expect(evidence, "a completion names its evidence").toBeDefined();
  if (evidence === undefined || record === undefined) throw new Error("unreachable");
  const pinned = await sha256Of(await deps.reports.read(evidenceLocation(ready.reportLocation), evidence.report_sha256));
  expect(pinned).toBe(evidence.report_sha256);
  expect(evidence.report_sha256).toBe(createHash("sha256").update(expectedBody).digest("hex"));
  const manifest = await deps.reports.getBytes(ready.reportLocation, MANIFEST_FILE);
  expect(manifest && createHash("sha256").update(manifest).digest("hex")).toBe(evidence.manifest_sha256);
  expect(evidence.evidence_location).toBe(deps.reports.describe(evidenceLocation(ready.reportLocation), evidence.report_sha256));
  return record;
}

async function stage(deps: Deps, ready: ReadyJob, body: string, attempt = ready.attemptId) {
  return stageAttemptReport(deps, ready.jobId, attempt, utf8(body));
}

/** An upload that sends `first`, then holds its stream open until `finish()`, then sends `last`. */
function slowUpload(deps: Deps, ready: ReadyJob, first: string, last: string): { done: Promise<unknown>; finish(): void } {
  let finish!: () => void;
  const released = new Promise<void>((resolve) => {
    finish = resolve;
  });
  async function* body(): AsyncGenerator<Uint8Array> {
    yield utf8(first);
    await released;
    yield utf8(last);
  }
  return { done: stageAttemptReport(deps, ready.jobId, ready.attemptId, body()), finish };
}

/** A job ready for the gate on v1 (expecting `git_push`), with v2 staged, behind holds. */
async function readyWithV2Staged(backend: SeedBackend): Promise<{ deps: Deps; holds: Holds; r: ReadyJob }> {
  const { deps, holds } = heldDeps(backend);
  const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
  await stage(deps, r, "v2\n");
  return { deps, holds, r };
}

const finalizeV2 = (deps: Deps, r: ReadyJob) => finalizeAttemptReport(deps, r.jobId, r.attemptId, [{ kind: "git_push", reference: "v2" }]);

const hits: Record<string, number> = {};
const hit = (backend: string, name: string) => {
  const key = `${backend}: ${name}`;
  hits[key] = (hits[key] ?? 0) + 1;
};
afterAll(() => {
  console.log(`evidence races, ${TRIALS} trial(s) per interleaving:`);
  for (const [k, n] of Object.entries(hits).sort()) console.log(`  ${String(n).padStart(4)}  ${k}`);
  for (const n of Object.values(hits)) expect(n).toBe(TRIALS);
});

const trials = Array.from({ length: TRIALS }, (_, i) => i + 1);

describeBackends("races: the gate against the evidence it verified", (backend) => {
  it(
    "gate verified v1, then a finalize of v2 lands before its commit: the gate loses; evaluated again it completes on v2",
    async () => {
      for (const _ of trials) {
        const { deps, holds } = heldDeps(backend());
        const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
        const held = holds.hold("transition", isGateCommit);
        const gate = evaluateJob(deps, r.jobId, r.scenario);
        await held.reached;
        await stage(deps, r, "v2\n");
        await finalizeV2(deps, r);
        held.release();
        const lost = await gate;
        expect(lost.committed).toBe(false);
        expect(lost.reason).toContain("moved while the gate was deciding");
        expect((await deps.jobs.get(r.jobId))?.status).toBe("running");
        const again = await evaluateJob(deps, r.jobId, r.scenario);
        expect(again.committed, again.reason).toBe(true);
        await expectPinned(deps, r, "v2\n");
        hit(backend().name, "finalize landed between verify and commit");
      }
    },
    TIMEOUT,
  );

  it(
    "a finalize of v2 prepared, then the gate completes on v1 before the finalize commits: the finalize is refused and nothing live changes",
    async () => {
      for (const _ of trials) {
        const { deps, holds, r } = await readyWithV2Staged(backend());
        const held = holds.hold("recordEvidence", isFinalizeCommit);
        const finalize = finalizeV2(deps, r);
        await held.reached;
        const gate = await evaluateJob(deps, r.jobId, r.scenario);
        expect(gate.committed, gate.reason).toBe(true);
        held.release();
        const refused = await rejection(finalize);
        expect(isMamError(refused, "report.frozen"), String(refused)).toBe(true);
        await expectPinned(deps, r, "v1\n");
        const live = await deps.reports.getBytes(r.reportLocation, REPORT_NAME);
        expect(new TextDecoder().decode(live)).toBe("v1\n");
        hit(backend().name, "gate committed between finalize's prepare and its commit");
      }
    },
    TIMEOUT,
  );

  it(
    "a finalize of v2 committed but not yet written live when the gate verifies: the gate refuses, and completes on v2 once it is",
    async () => {
      for (const _ of trials) {
        const { deps, holds, r } = await readyWithV2Staged(backend());
        // The live report is written from the pinned copy by the store's `copy` where it has one (S3), else by `put`.
        const held = deps.reports.copy === undefined ? holds.hold("put", isLiveReportWrite) : holds.hold("copy", isLiveReportCopy);
        const finalize = finalizeV2(deps, r);
        await held.reached;
        const gate = await evaluateJob(deps, r.jobId, r.scenario);
        expect(gate.committed).toBe(false);
        expect(gate.reason).toContain("latest finalize committed");
        held.release();
        await finalize;
        const again = await evaluateJob(deps, r.jobId, r.scenario);
        expect(again.committed, again.reason).toBe(true);
        await expectPinned(deps, r, "v2\n");
        hit(backend().name, "finalize committed, live names not yet written");
      }
    },
    TIMEOUT,
  );

  it(
    "an upload lands while a finalize pins v2: the live report is the pinned v2, and v3 stays staged for the next finalize",
    async () => {
      for (const _ of trials) {
        const { deps, holds, r } = await readyWithV2Staged(backend());
        // held once v2 is pinned, before the finalize commits and writes the live names
        const held = holds.hold("recordEvidence", isFinalizeCommit);
        const finalize = finalizeV2(deps, r);
        await held.reached;
        await stage(deps, r, "v3, staged while v2 was being pinned\n");
        held.release();
        const { manifest } = await finalize;
        expect(manifest.sha256).toBe(createHash("sha256").update("v2\n").digest("hex"));
        expect(new TextDecoder().decode(await deps.reports.getBytes(r.reportLocation, REPORT_NAME))).toBe("v2\n");
        expect(new TextDecoder().decode(await deps.reports.getBytes(r.reportLocation, STAGED_REPORT_NAME))).toBe(
          "v3, staged while v2 was being pinned\n",
        );
        const gate = await evaluateJob(deps, r.jobId, r.scenario);
        expect(gate.committed, gate.reason).toBe(true);
        await expectPinned(deps, r, "v2\n");
        hit(backend().name, "upload landed while a finalize pinned its bytes");
      }
    },
    TIMEOUT,
  );

  it(
    "an agent's completion with finalize, racing its own upload, completes on v2 and leaves the live report v2",
    async () => {
      for (const _ of trials) {
        const { deps, holds, r } = await readyWithV2Staged(backend());
        // held once v2 is pinned, before the completion commits and writes the live names
        const held = holds.hold("transition", (args) => (args[2] as { set?: { status?: string } }).set?.status === "completed");
        const agent = { kind: "agent", jobId: r.jobId, attemptId: r.attemptId } as const;
        const finalize = { location: r.reportLocation, attemptId: r.attemptId, sideEffects: [{ kind: "git_push", reference: "v2" }] };
        const completion = publishAgentEvent(deps, r.jobId, { event: "completed", finalize }, agent);
        await held.reached;
        await stage(deps, r, "v3, staged while the completion was being prepared\n");
        held.release();
        const done = await completion;
        expect(done.record).toMatchObject({ status: "completed" });
        expect(done.record).not.toHaveProperty("completed_by");
        expect(done.warnings).toEqual([]);
        await expectPinned(deps, r, "v2\n");
        expect(new TextDecoder().decode(await deps.reports.getBytes(r.reportLocation, REPORT_NAME))).toBe("v2\n");
        hit(backend().name, "upload landed while an agent's completion pinned its bytes");
      }
    },
    TIMEOUT,
  );

  it(
    "an upload lands between a finalize's hash and its pinned copy: the finalize is refused (report.changed) and writes nothing",
    async () => {
      for (const _ of trials) {
        const { deps, holds, r } = await readyWithV2Staged(backend());
        const held = holds.hold("copyOnce");
        const finalize = finalizeV2(deps, r);
        await held.reached;
        await stage(deps, r, "v3, staged after v2 was hashed\n");
        // Held mid-finalize, the record carries the finalize's lease (issue 17); the refused
        // finalize releases it, and writes nothing else.
        const { finalize_in_progress: lease, ...before } = (await deps.jobs.get(r.jobId)) ?? {};
        expect(lease).toMatchObject({ attempt_id: r.attemptId });
        held.release();
        const refused = await rejection(finalize);
        expect(isMamError(refused, "report.changed"), String(refused)).toBe(true);
        expect(await deps.jobs.get(r.jobId)).toEqual(before);
        const v2 = createHash("sha256").update("v2\n").digest("hex");
        expect(await deps.reports.exists(evidenceLocation(r.reportLocation), v2)).toBe(false);
        expect(new TextDecoder().decode(await deps.reports.getBytes(r.reportLocation, REPORT_NAME))).toBe("v1\n");
        hit(backend().name, "upload landed between a finalize's hash and its copy");
      }
    },
    TIMEOUT,
  );

  it(
    "an agent checks the job, an operator adds expected_artifacts, the agent commits on the seq it predicted: refused, nothing completed",
    async () => {
      for (const _ of trials) {
        const { deps, holds } = heldDeps(backend());
        const r = await readyJob(deps, { body: "v1\n" });
        const before = await deps.jobs.get(r.jobId);
        if (before === undefined) throw new Error("unreachable");
        const agent = { kind: "agent", jobId: r.jobId, attemptId: r.attemptId } as const;
        // The agent sends the seq the operator's write will leave, hoping to commit on it
        // after checking a record that expected nothing.
        const held = holds.hold("transition", (args) => (args[2] as { set?: { status?: string } }).set?.status === "completed");
        const completion = transitionJob(deps, r.jobId, { action: "completed", expectedSeq: before.transition_seq + 1 }, agent);
        const settled = completion.then(
          () => "settled" as const,
          () => "settled" as const,
        );
        const first = await Promise.race([held.reached.then(() => "held" as const), settled]);
        await transitionJob(
          deps,
          r.jobId,
          { action: "progress", expectedSeq: before.transition_seq, fields: { expected_artifacts: ["git_push"] } },
          { kind: "operator" },
        );
        held.release();
        const refused = await rejection(completion);
        expect(isMamError(refused, "job.transitionConflict"), String(refused)).toBe(true);
        expect(await deps.jobs.get(r.jobId)).toMatchObject({ status: "running", expected_artifacts: ["git_push"] });
        // refused at its check, before it could reach the write
        expect(first).toBe("settled");
        hit(backend().name, "operator changed the job between an agent's check and its commit");
      }
    },
    TIMEOUT,
  );

  it(
    "gate verified, then an upload for the attempt lands before its commit: the gate loses",
    async () => {
      for (const _ of trials) {
        const { deps, holds } = heldDeps(backend());
        const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
        const held = holds.hold("transition", isGateCommit);
        const gate = evaluateJob(deps, r.jobId, r.scenario);
        await held.reached;
        await stage(deps, r, "v2, staged while the gate decided\n");
        held.release();
        const lost = await gate;
        expect(lost.committed).toBe(false);
        expect((await deps.jobs.get(r.jobId))?.status).toBe("running");
        hit(backend().name, "upload landed between verify and commit");
      }
    },
    TIMEOUT,
  );

  it(
    "a slow upload begun before the completion and finished after it is refused, and leaves nothing staged",
    async () => {
      for (const _ of trials) {
        const b = backend();
        const deps = b.deps(ON);
        const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
        const upload = slowUpload(deps, r, "the first half, sent before the completion; ", "the second half, after it\n");
        const gate = await evaluateJob(deps, r.jobId, r.scenario);
        expect(gate.committed, gate.reason).toBe(true);
        upload.finish();
        const refused = await rejection(upload.done);
        expect(isMamError(refused, "report.frozen"), String(refused)).toBe(true);
        expect(await deps.reports.exists(r.reportLocation, STAGED_REPORT_NAME)).toBe(false);
        await expectPinned(deps, r, "v1\n");
        hit(b.name, "upload open across the completion");
      }
    },
    TIMEOUT,
  );

  it(
    "an upload whose attempt is superseded by a newer dispatch while it streams is refused at its last byte",
    async () => {
      for (const _ of trials) {
        const b = backend();
        const deps = b.deps(ON);
        const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
        const upload = slowUpload(deps, r, "begun under attempt 1; ", "finished after attempt 2 was dispatched\n");
        await recordDispatch(deps, r.jobId, { attempt_id: r.attemptId + 1, agent_session_uuid: "next", pane_process_generation: 9 });
        upload.finish();
        const refused = await rejection(upload.done);
        expect(isMamError(refused, "report.notLatest"), String(refused)).toBe(true);
        expect(await deps.reports.exists(r.reportLocation, STAGED_REPORT_NAME)).toBe(false);
        hit(b.name, "upload's attempt superseded while it streamed");
      }
    },
    TIMEOUT,
  );

  it(
    "gate verified attempt 1, then attempt 2 is dispatched before its commit: the gate loses",
    async () => {
      for (const _ of trials) {
        const { deps, holds } = heldDeps(backend());
        const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
        const held = holds.hold("transition", isGateCommit);
        const gate = evaluateJob(deps, r.jobId, r.scenario);
        await held.reached;
        await recordDispatch(deps, r.jobId, { attempt_id: r.attemptId + 1, agent_session_uuid: "next", pane_process_generation: 9 });
        held.release();
        const lost = await gate;
        expect(lost.committed).toBe(false);
        expect(await deps.jobs.get(r.jobId)).toMatchObject({ status: "running", latest_attempt: r.attemptId + 1 });
        hit(backend().name, "newer dispatch between verify and commit");
      }
    },
    TIMEOUT,
  );

  it(
    "a newer dispatch read the job, then the gate completes before the dispatch commits: the dispatch is refused",
    async () => {
      for (const _ of trials) {
        const { deps, holds } = heldDeps(backend());
        const r = await readyJob(deps, { artifacts: ["git_push"], body: "v1\n" });
        const held = holds.hold("recordEvidence", isDispatchCommit);
        const dispatch = recordDispatch(deps, r.jobId, {
          attempt_id: r.attemptId + 1,
          agent_session_uuid: "next",
          pane_process_generation: 9,
        });
        await held.reached;
        const gate = await evaluateJob(deps, r.jobId, r.scenario);
        expect(gate.committed, gate.reason).toBe(true);
        held.release();
        const refused = await rejection(dispatch);
        expect(isMamError(refused, "job.transitionRefused"), String(refused)).toBe(true);
        expect(await deps.jobs.getDispatch(r.jobId, r.attemptId + 1)).toBeUndefined();
        await expectPinned(deps, r, "v1\n");
        hit(backend().name, "gate committed between a dispatch's read and its commit");
      }
    },
    TIMEOUT,
  );
});
