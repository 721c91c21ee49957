import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { open, readdir } from "node:fs/promises";
import path from "node:path";
import { RETRY_AFTER_SECONDS } from "@mam/api";
import { FileReportStore, statfsDiskSpace } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { localPorts } from "../support/local-backend.ts";
import { type Harness, type HarnessOptions, makeHarness, type PortsFactory, type Res } from "./harness.ts";

const PROBLEM = /^application\/problem\+json/;

/** Every file under `dir`, as paths relative to it. */
async function filesUnder(dir: string): Promise<string[]> {
  if (!existsSync(dir)) return [];
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  return entries.filter((e) => e.isFile()).map((e) => path.relative(dir, path.join(e.parentPath, e.name)));
}

describe("the disk floor and a full report disk (issue 17), over the local adapters", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  async function dispatchedJob(h: Harness): Promise<[string, string]> {
    const jobId = `job-${randomUUID().slice(0, 12)}`;
    const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } });
    expect(reg.status, reg.text).toBe(201);
    const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
      token: h.operator,
      json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
    });
    expect(res.status, res.text).toBe(201);
    return [jobId, res.body.agent_token];
  }

  /** The job as the store holds it, its event log and its feed rows: what a refusal must leave as it was. */
  async function fingerprint(h: Harness, jobId: string): Promise<unknown> {
    const record = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
    const events = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
    const feed = await h.call("GET", "/v1/events?limit=1000", { token: h.operator });
    expect(feed.status, feed.text).toBe(200);
    return { record: record.body, events: events.body, feed: (feed.body.items as { job_id: string }[]).filter((r) => r.job_id === jobId) };
  }

  describe("below MAM_DISK_FLOOR_BYTES (the data dir's real statfs, under a floor no disk reaches)", () => {
    let reportRoot = "";
    const floored: PortsFactory = async (opts) => {
      const ports = await localPorts(opts);
      reportRoot = ports.reportRoot;
      return { ...ports, disk: statfsDiskSpace(ports.reportRoot) };
    };
    const FLOOR = 2 ** 50;
    const harness = (opts: HarnessOptions = {}) => makeHarness(floored, { ...opts, env: { MAM_DISK_FLOOR_BYTES: String(FLOOR) } }, cleanup);

    function expectBelowFloor(res: Res, what: string): void {
      expect(res.status, `${what}: ${res.text}`).toBe(507);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.headers.get("retry-after")).toBe(String(RETRY_AFTER_SECONDS));
      expect(res.body).toMatchObject({
        status: 507,
        code: "store.insufficientSpace",
        type: "https://mam.dev/problems/store.insufficientSpace",
        floor_bytes: FLOOR,
        variable: "MAM_DISK_FLOOR_BYTES",
      });
      expect(res.body.free_bytes).toBeGreaterThan(0);
      expect(res.body.detail).toContain(`${res.body.free_bytes} bytes free`);
      expect(res.body.detail).toContain(`floor of ${FLOOR} bytes`);
      expect(res.body.detail).toContain("MAM_DISK_FLOOR_BYTES");
      expect(res.body.detail).toContain("nothing was written");
    }

    it("an agent's event, report body, upload declaration and finalize are 507 store.insufficientSpace naming the free bytes, the floor and the variable, and write nothing", async () => {
      const h = await harness();
      const [jobId, agent] = await dispatchedJob(h);
      const before = await fingerprint(h, jobId);
      const filesBefore = await filesUnder(reportRoot);

      expectBelowFloor(await h.call("POST", `/v1/jobs/${jobId}/events`, { token: agent, json: { event: "started" } }), "an event");
      expectBelowFloor(
        await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
          token: agent,
          body: "# done\n",
          headers: { "content-type": "text/markdown" },
        }),
        "a report body",
      );
      expectBelowFloor(
        await h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, { token: agent, json: { sha256: "a".repeat(64), bytes: 1024 } }),
        "an upload declaration",
      );
      expect(await fingerprint(h, jobId)).toEqual(before);
      expect(await filesUnder(reportRoot)).toEqual(filesBefore);
      // An agent's finalize pins a copy: refused too (the operator stages the report it would pin).
      const staged = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: h.operator,
        body: "# done\n",
        headers: { "content-type": "text/markdown" },
      });
      expect(staged.status, staged.text).toBe(201);
      const stagedPrint = await fingerprint(h, jobId);
      const stagedFiles = await filesUnder(reportRoot);
      expectBelowFloor(
        await h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { token: agent, json: { side_effects: [] } }),
        "a finalize",
      );
      expect(await fingerprint(h, jobId)).toEqual(stagedPrint);
      expect(await filesUnder(reportRoot)).toEqual(stagedFiles);
      // Nothing: not the job record (not even its agent_usage), its log, its feed, a report file.
      // Reads stay open to the agent.
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: agent })).status).toBe(200);
    });

    it("operators' writes and the service's own records are never refused by it: a registration, a dispatch, a report, a cancel, and its notification published and settled", async () => {
      const h = await harness();
      const [jobId] = await dispatchedJob(h);
      const staged = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: h.operator,
        body: "# operator's report\n",
        headers: { "content-type": "text/markdown" },
      });
      expect(staged.status, staged.text).toBe(201);
      const job = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      const cancel = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "cancel", expected_seq: job.body.transition_seq },
      });
      expect(cancel.status, cancel.text).toBe(200);
      const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: { grace_seconds: 0 } });
      expect(sweep.status, sweep.text).toBe(200);
      const after = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(after.body.status).toBe("cancelled");
      expect(after.body.pending_notification).toBeUndefined();
      const log = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
      expect((log.body.items as { event: string }[]).some((e) => e.event === "published")).toBe(true);
    });

    it("statfsDiskSpace reads bavail * bsize of the dir's disk, and a dir that cannot be asked is store.unavailable", async () => {
      const h = await harness();
      const free = await statfsDiskSpace(reportRoot).freeBytes();
      expect(Number.isSafeInteger(free) && free > 0).toBe(true);
      expect(h.deps.disk).toBeDefined();
      await expect(statfsDiskSpace(path.join(reportRoot, "no-such-dir")).freeBytes()).rejects.toMatchObject({ code: "store.unavailable" });
    });
  });

  describe("a report disk that answers ENOSPC mid-write (Linux's /dev/full: the kernel's own ENOSPC, no mount, no root)", () => {
    /** The file store as `mam serve` has it, except that while `full` is set each temp file it creates is backed by /dev/full. */
    const full = { on: false };
    let reportRoot = "";
    const fullable: PortsFactory = async (opts) => {
      const ports = await localPorts(opts);
      reportRoot = ports.reportRoot;
      const reports = new FileReportStore(ports.reportRoot, {
        allowAbsolute: false,
        async createTemp(file, mode) {
          const handle = await open(file, "wx", mode);
          if (!full.on) return handle;
          // The temp file exists, as on a disk that filled while it was written; its bytes go where there is no room.
          await handle.close();
          return open("/dev/full", "w");
        },
      });
      return { ...ports, reports };
    };

    it("a report PUT answers 503 store.unavailable with Retry-After, leaves no partial file, and writes nothing on the job record but the agent's reservation", async () => {
      expect(existsSync("/dev/full"), "this test needs Linux's /dev/full").toBe(true);
      const h = await makeHarness(fullable, {}, cleanup);
      const [jobId, agent] = await dispatchedJob(h);
      const before = (await fingerprint(h, jobId)) as { record: Record<string, unknown> };
      const filesBefore = await filesUnder(reportRoot);
      full.on = true;
      try {
        const body = new Uint8Array(3 * 64 * 1024).fill(0x61);
        for (const [who, token] of [
          ["the operator", h.operator],
          ["the agent", agent],
        ] as const) {
          const res = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
            token,
            body,
            headers: { "content-type": "text/markdown" },
          });
          expect(res.status, `${who}: ${res.text}`).toBe(503);
          expect(res.headers.get("content-type")).toMatch(PROBLEM);
          expect(res.headers.get("retry-after")).toBe(String(RETRY_AFTER_SECONDS));
          expect(res.body).toMatchObject({ status: 503, code: "store.unavailable" });
          expect(res.body.detail).toContain("no space is left on the report store's disk");
          expect(res.body.detail).not.toContain(reportRoot);
          // Logged as a 503, never a 500 with a stack.
          expect(h.lines.map((l) => JSON.parse(l)).filter((l) => l.status === 500 || l.stack !== undefined)).toEqual([]);
          // No partial file, no temp, no staged name.
          expect(await filesUnder(reportRoot)).toEqual(filesBefore);
        }
      } finally {
        full.on = false;
      }
      const after = (await fingerprint(h, jobId)) as { record: Record<string, unknown> };
      // The agent's bytes were reserved before the write failed (fail closed: a reservation is never given back);
      // nothing else moved: no evidence_seq, no staged note, no event, no feed row.
      const { agent_usage, ...rest } = after.record;
      const { agent_usage: priorUsage, ...priorRest } = before.record;
      expect(priorUsage).toBeUndefined();
      // (Its Content-Length, else the route's limit: what the body could be.)
      expect(agent_usage).toMatchObject({ events: 0, attempt_id: 1 });
      expect((agent_usage as { bytes: number }).bytes).toBeGreaterThanOrEqual(3 * 64 * 1024);
      expect({ ...after, record: rest }).toEqual({ ...before, record: priorRest });
      // Room again: the same PUT is staged.
      const retry = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: agent,
        body: "# done\n",
        headers: { "content-type": "text/markdown" },
      });
      expect(retry.status, retry.text).toBe(201);
    });
  });
});
