/**
 * One agent fills the disk (issue 17), for real: a 48 MiB tmpfs the test mounts (so it
 * needs root; CI runs as root), `mam serve` as a subprocess with its data dir there, and
 * one agent that sends 15 KiB events, 4 MiB report bodies and upload declarations
 * until it is refused.
 *
 *   phase 1  MAM_DISK_FLOOR_BYTES = 8 MiB   the agent is refused 507 once the floor is reached;
 *                                           operators, other agents' transitions and the
 *                                           service's settles go on (an owed intent of
 *                                           another job is published and settled)
 *   phase 2  restarted with the floor at 0  the agent fills the disk for real (SQLITE_FULL, ENOSPC):
 *                                           every answer a 503 store.unavailable with
 *                                           Retry-After or a success, never a 500, never a hang
 *   then     more room (remount), restart   every write that was answered 2xx is there
 *
 * Before the floor and the 503 mapping, the same disk answered other agents'
 * transitions and a registration 500 (`SqliteError: database or disk is full`, ENOSPC).
 */
import { execFileSync } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { RETRY_AFTER_SECONDS } from "@mam/api";
import { dataDirPaths } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from "vitest";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { type Subscription, subscribe } from "../support/subscriber.ts";

const SIZE = "48m";
const FLOOR = 8 * 1024 * 1024;
/** Longer than any answer may take: past it, the request hung. */
const HANG_MS = 30_000;

interface Answer {
  readonly status: number;
  readonly retryAfter: string | null;
  // biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field
  readonly body: any;
}

/**
 * One request on a connection of its own (node:http, no keep-alive pool): a refusal
 * answered before a large body was read ends its connection, and must not take the
 * next request with it. Past HANG_MS without an answer, the request hung.
 */
function call(base: string, method: string, route: string, token: string, body?: unknown): Promise<Answer> {
  const payload = body === undefined ? undefined : body instanceof Uint8Array ? body : Buffer.from(JSON.stringify(body));
  const headers: Record<string, string> = { authorization: `Bearer ${token}` };
  if (payload !== undefined) {
    headers["content-type"] = body instanceof Uint8Array ? "text/markdown" : "application/json";
    headers["content-length"] = String(payload.byteLength);
  }
  return new Promise<Answer>((resolve, reject) => {
    const req = http.request(`${base}${route}`, { method, headers, agent: false, timeout: HANG_MS }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let parsed: unknown = text;
        try {
          parsed = JSON.parse(text);
        } catch {}
        const retryAfter = res.headers["retry-after"];
        resolve({ status: res.statusCode ?? 0, retryAfter: typeof retryAfter === "string" ? retryAfter : null, body: parsed });
      });
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error(`${method} ${route}: no answer within ${HANG_MS} ms`)));
    req.on("error", (e) => reject(new Error(`${method} ${route}: ${String(e)}`)));
    req.end(payload);
  });
}

/** Tallies answers by what they were, for the figures printed at the end. */
class Tally {
  readonly counts = new Map<string, number>();
  add(what: string, a: Answer): void {
    const key = `${what}: ${a.status}${typeof a.body === "object" && a.body?.code ? ` ${a.body.code}` : ""}`;
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
  }
  print(title: string): void {
    console.log(`disk full, ${title}:\n${[...this.counts].map(([k, n]) => `  ${k} ×${n}`).join("\n")}`);
  }
}

/** A 2xx, a 507 below the floor, or a 503 store.unavailable with Retry-After: never a 500, never another answer. */
function expectOneOfTheAnswers(a: Answer, what: string, allowed: readonly number[]): void {
  expect(allowed, `${what}: ${a.status} ${JSON.stringify(a.body)}`).toContain(a.status >= 200 && a.status < 300 ? 200 : a.status);
  if (a.status === 503) {
    expect(a.body.code, what).toBe("store.unavailable");
    expect(a.retryAfter, what).toBe(String(RETRY_AFTER_SECONDS));
  }
  if (a.status === 507) {
    expect(a.body.code, what).toBe("store.insufficientSpace");
    expect(a.retryAfter, what).toBe(String(RETRY_AFTER_SECONDS));
    expect(a.body.detail, what).toContain("MAM_DISK_FLOOR_BYTES");
  }
}

describe("reliability: one agent fills the data dir's disk (a tmpfs the test mounts)", () => {
  let mnt = "";
  let mounted = false;
  let served: ServeProcess | undefined;
  const subs: Subscription[] = [];

  beforeAll(async () => {
    // No skip: the tier must run it. Mounting needs root, which CI has.
    if (process.getuid?.() !== 0) {
      throw new Error(
        "tests/reliability/disk-full.test.ts mounts a tmpfs and needs root (CI runs as root): run npm run test:reliability as root",
      );
    }
    mnt = await mkdtemp(path.join(tmpdir(), "mam-disk-full-"));
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${SIZE},mode=0700`, "tmpfs", mnt]);
    mounted = true;
  });

  afterAll(async () => {
    for (const s of subs) await s.close().catch(() => undefined);
    await served?.stop("SIGKILL");
    if (mounted) {
      try {
        execFileSync("umount", [mnt]);
      } catch {
        execFileSync("umount", ["-l", mnt]);
      }
    }
    if (mnt !== "") await rm(mnt, { recursive: true, force: true });
  });

  it("the filler is refused 507 at the floor and 503 when full; every other client gets a 503, a 507 or a success, never a 500 or a hang; settles are written; nothing acknowledged is lost", async () => {
    const dir = path.join(mnt, "data");
    await mkdir(dir, { mode: 0o700 });
    const start = (floor: number) =>
      startServeProcess(dir, { MAM_DISK_FLOOR_BYTES: String(floor), MAM_SWEEP_GRACE_SECONDS: "0" }, { cwd: dir, broker: true });
    served = await start(FLOOR);
    // A failure says what the service said last.
    const died = () =>
      `\n--- mam serve (exit ${served?.child.exitCode}) stderr:\n${served?.stderr().slice(-3000)}\n--- stdout:\n${served?.stdout().slice(-3000)}`;
    onTestFailed(() => console.log(died()));
    const op = (JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8")) as { operator_token: string }).operator_token;
    const api = () => served!.url;

    // What was acknowledged: every 2xx write, to read back after the restart.
    const registered: string[] = [];
    const staged = new Map<string, string>();
    const register = async (tally: Tally): Promise<Answer> => {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const a = await call(api(), "POST", "/v1/jobs", op, { job_id: jobId, prompt: "fix the bug", agent: "codex" });
      tally.add("an operator's registration", a);
      if (a.status === 201) registered.push(jobId);
      return a;
    };
    const dispatched = async (): Promise<[string, string]> => {
      const a = await register(new Tally());
      expect(a.status).toBe(201);
      const jobId = registered.at(-1)!;
      const d = await call(api(), "POST", `/v1/jobs/${jobId}/dispatches`, op, {
        attempt_id: 1,
        agent_session_uuid: randomUUID(),
        pane_process_generation: 1,
      });
      expect(d.status, JSON.stringify(d.body)).toBe(201);
      return [jobId, d.body.agent_token as string];
    };
    // Events answered 200: their commits (transition_seq), and those whose log line was written too (no warning).
    const committed = new Map<string, number[]>();
    const logged = new Map<string, number[]>();
    const event = async (tally: Tally, what: string, jobId: string, token: string, kind: string, data?: unknown): Promise<Answer> => {
      const a = await call(api(), "POST", `/v1/jobs/${jobId}/events`, token, { event: kind, ...(data === undefined ? {} : { data }) });
      tally.add(what, a);
      if (a.status === 200) {
        const seq = a.body.record.transition_seq as number;
        committed.set(jobId, [...(committed.get(jobId) ?? []), seq]);
        if (a.body.warnings === undefined) logged.set(jobId, [...(logged.get(jobId) ?? []), seq]);
      }
      return a;
    };
    const putReport = async (tally: Tally, what: string, jobId: string, token: string, bytes: Uint8Array): Promise<Answer> => {
      const a = await call(api(), "PUT", `/v1/jobs/${jobId}/attempts/1/report`, token, bytes);
      tally.add(what, a);
      if (a.status === 201) staged.set(jobId, a.body.sha256 as string);
      return a;
    };
    const declare = async (tally: Tally, what: string, jobId: string, token: string): Promise<Answer> => {
      const a = await call(api(), "POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, token, {
        sha256: "a".repeat(64),
        bytes: 1024 * 1024,
      });
      tally.add(what, a);
      return a;
    };
    const blob = (i: number) => ({ blob: "x".repeat(15 * 1024), i });
    const report = (i: number) => new Uint8Array(4 * 1024 * 1024).fill(0x61 + (i % 26));

    const [filler, fillerToken] = await dispatched();
    const others = await Promise.all(Array.from({ length: 4 }, () => dispatched()));
    // A job whose owed intent the service must publish and settle below the floor.
    const [owed] = await dispatched();

    // ---- phase 1: the floor
    const p1 = new Tally();
    let refusedAt = -1;
    for (let i = 0; i < 10_000 && refusedAt < 0; i++) {
      const a = await event(p1, "the filler's event", filler, fillerToken, i === 0 ? "started" : "progress", blob(i));
      expectOneOfTheAnswers(a, "the filler's event", [200, 507]);
      if (i % 200 === 0)
        expectOneOfTheAnswers(
          await putReport(p1, "the filler's report", filler, fillerToken, report(i)),
          "the filler's report",
          [200, 507],
        );
      if (a.status === 507) refusedAt = i;
    }
    expect(refusedAt, "the floor was never reached").toBeGreaterThan(0);
    // Below it, each kind of agent upload is refused, writing nothing.
    expect((await putReport(p1, "the filler's report", filler, fillerToken, report(1))).status).toBe(507);
    expect((await declare(p1, "the filler's declaration", filler, fillerToken)).status).toBe(507);
    const sub = await subscribe(served.mqttUrl, "mam/jobs/+/events");
    subs.push(sub);
    // Every other client.
    for (const [jobId, token] of others) {
      const claim = await call(api(), "POST", `/v1/jobs/${jobId}/transitions`, token, { action: "claim", expected_seq: 0 });
      p1.add("another agent's claim", claim);
      expectOneOfTheAnswers(claim, "another agent's claim", [200]);
      expectOneOfTheAnswers(await event(p1, "another agent's event", jobId, token, "progress"), "another agent's event", [200, 507]);
      expectOneOfTheAnswers(
        await putReport(p1, "another agent's report", jobId, token, new TextEncoder().encode("# done\n")),
        "another agent's report",
        [200, 507],
      );
    }
    expectOneOfTheAnswers(await register(p1), "an operator's registration", [200]);
    expectOneOfTheAnswers(await call(api(), "GET", "/v1/jobs", op), "an operator's listing", [200]);
    // The service's own records: the operator's cancel owes an intent, the relay publishes it and settles it.
    const job = await call(api(), "GET", `/v1/jobs/${owed}`, op);
    const cancel = await call(api(), "POST", `/v1/jobs/${owed}/transitions`, op, {
      action: "cancel",
      expected_seq: job.body.transition_seq,
    });
    p1.add("an operator's cancel", cancel);
    expect(cancel.status, JSON.stringify(cancel.body)).toBe(200);
    await sub.waitFor((m) => m.topic === `mam/jobs/${owed}/events` && m.payload.includes("cancelled"), 15_000);
    let settled = false;
    for (let i = 0; i < 300 && !settled; i++) {
      const after = await call(api(), "GET", `/v1/jobs/${owed}`, op);
      settled = after.body.pending_notification === undefined;
      if (!settled) await new Promise((r) => setTimeout(r, 50));
    }
    expect(settled, "the cancel's intent was published but never settled").toBe(true);
    p1.print(`phase 1 (floor ${FLOOR} bytes): the filler refused after ${refusedAt} events`);

    // ---- phase 2: no floor, the disk really full
    await served.stop();
    served = await start(0);
    const p2 = new Tally();
    let full = false;
    for (let i = 0; i < 10_000 && !full; i++) {
      const a = await event(p2, "the filler's event", filler, fillerToken, "progress", blob(i));
      expectOneOfTheAnswers(a, "the filler's event", [200, 503]);
      if (a.status === 503) full = true;
    }
    for (let i = 0; i < 20; i++) {
      const a = await putReport(p2, "the filler's report", filler, fillerToken, report(i));
      expectOneOfTheAnswers(a, "the filler's report", [200, 503]);
      if (a.status === 503) break;
    }
    expect(full, "the disk never filled").toBe(true);
    for (const [jobId, token] of others) {
      const job = await call(api(), "GET", `/v1/jobs/${jobId}`, op);
      expectOneOfTheAnswers(job, "the operator's read", [200]);
      const t = await call(api(), "POST", `/v1/jobs/${jobId}/transitions`, token, {
        action: "progress",
        expected_seq: job.body.transition_seq,
        fields: { progress: { step: "tests" } },
      });
      p2.add("another agent's transition", t);
      expectOneOfTheAnswers(t, "another agent's transition", [200, 503]);
      expectOneOfTheAnswers(await event(p2, "another agent's event", jobId, token, "progress"), "another agent's event", [200, 503]);
      const put = await putReport(p2, "another agent's report", jobId, token, new TextEncoder().encode("# done\n"));
      expectOneOfTheAnswers(put, "another agent's report", [200, 503]);
      // A PUT refused 503 after its reservation was written keeps the reservation (by
      // design: it expires, or the agent's next PUT takes it over; tests/api/disk-floor
      // "a report PUT answers 503 … writes nothing on the job record but the agent's
      // reservation"): a declaration then is refused 409 report.uploadInFlight, naming it.
      // Whether the reservation found room depends on where the disk filled.
      const declared = await declare(p2, "another agent's declaration", jobId, token);
      expectOneOfTheAnswers(declared, "another agent's declaration", put.status === 503 ? [200, 409, 503] : [200, 503]);
      if (declared.status === 409) expect(declared.body.code, "another agent's declaration").toBe("report.uploadInFlight");
    }
    for (let i = 0; i < 5; i++) expectOneOfTheAnswers(await register(p2), "an operator's registration", [200, 503]);
    // Without the floor the service's own records have no room either: an operator's cancel commits or is refused 503; nothing settles a commit that could not be written.
    const [lastJob] = others.at(-1)!;
    const last = await call(api(), "GET", `/v1/jobs/${lastJob}`, op);
    const lastCancel = await call(api(), "POST", `/v1/jobs/${lastJob}/transitions`, op, {
      action: "cancel",
      expected_seq: last.body.transition_seq,
    });
    p2.add("an operator's cancel", lastCancel);
    expectOneOfTheAnswers(lastCancel, "an operator's cancel", [200, 503]);
    expectOneOfTheAnswers(await call(api(), "GET", "/v1/jobs", op), "an operator's listing", [200, 503]);
    const lines = served
      .stdout()
      .split("\n")
      .filter((l) => l.startsWith("{"));
    const fivehundreds = lines
      .map((l) => JSON.parse(l) as { status?: number; stack?: unknown })
      .filter((l) => l.status === 500 || l.stack !== undefined);
    expect(fivehundreds, "the service logged a 500").toEqual([]);
    p2.print("phase 2 (no floor, the disk full)");

    // ---- room again, restarted on the same dir: everything acknowledged is there
    await served.stop();
    // A figure, not a bound: whether the service comes back on the disk while it is still full.
    try {
      served = await start(0);
      const read = await call(api(), "GET", `/v1/jobs/${filler}`, op);
      console.log(`disk full: restarted on the full disk: it serves (a read answered ${read.status})`);
      await served.stop();
    } catch (e) {
      console.log(`disk full: restarted on the full disk: it does not start (${String(e).split("\n")[0]})`);
    }
    execFileSync("mount", ["-o", "remount,size=96m", mnt]);
    served = await start(FLOOR);
    for (const jobId of registered) expect((await call(api(), "GET", `/v1/jobs/${jobId}`, op)).status, jobId).toBe(200);
    let events = 0;
    for (const [jobId, seqs] of committed) {
      const job = await call(api(), "GET", `/v1/jobs/${jobId}`, op);
      expect(job.status).toBe(200);
      expect(job.body.transition_seq, jobId).toBeGreaterThanOrEqual(Math.max(...seqs));
      const lines = new Set<number>();
      for (let after: string | undefined, page = 0; page < 100; page++) {
        const q = `limit=1000${after === undefined ? "" : `&cursor=${encodeURIComponent(after)}`}`;
        const res = await call(api(), "GET", `/v1/jobs/${jobId}/events?${q}`, op);
        expect(res.status).toBe(200);
        for (const e of res.body.items as { data?: { transition_seq?: number } }[]) {
          if (e.data?.transition_seq !== undefined) lines.add(e.data.transition_seq);
        }
        after = res.body.next_cursor ?? undefined;
        if (after === undefined) break;
      }
      for (const seq of logged.get(jobId) ?? []) expect(lines.has(seq), `${jobId}: the log line of seq ${seq}`).toBe(true);
      events += seqs.length;
    }
    for (const [jobId, sha] of staged) {
      const bytes = await readFile(path.join(dir, "reports", jobId, "1", "report-final.md.tmp"));
      expect(createHash("sha256").update(bytes).digest("hex"), `${jobId}'s staged report`).toBe(sha);
    }
    console.log(
      `disk full: after a restart, ${registered.length} registrations, ${events} acknowledged events and ${staged.size} staged reports all read back`,
    );
  }, 600_000);
});
