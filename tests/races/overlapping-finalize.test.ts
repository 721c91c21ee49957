/**
 * One agent's overlapping finalizes of one attempt, through the API (issue 17, items 1
 * and 6): before finalizes were serialized, 10 of 75 trials left a live tree that does
 * not verify and 1 of 75 a live pair `finalized_report` does not name. Each trial
 * stages a report, then sends a finalize and, at once, a re-stage and a second
 * finalize; whatever each answers (200, or 409 `report.finalizeInProgress`), the live
 * tree must verify and be the one `finalized_report` names. Two ways per trial:
 * - forced: the first finalize is held (a pause button on the report store, not a
 *   mock) after its commit, just before it writes the live names, while the report is
 *   re-staged and a second finalize is sent; then it is let go. Before serializing,
 *   the second committed and wrote its tree, and the first then overwrote it: a live
 *   tree `finalized_report` does not name, every trial.
 * - free: both sent at once, as the scheduler interleaves them, nothing held or slept for.
 *
 * MAM_RACE_TRIALS sets the trials per backend (3 by default; the reliability tier runs 100).
 */
import { randomUUID } from "node:crypto";
import { REPORT_NAME } from "@mam/core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type ApiPorts, type Harness, makeHarness, type PortsFactory } from "../api/harness.ts";
import { MANIFEST_FILE } from "../seed/scenario.ts";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { localPorts } from "../support/local-backend.ts";

const TRIALS = Number(process.env.MAM_RACE_TRIALS ?? 3);
const TIMEOUT = 30_000 + TRIALS * 2_000;

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

const BACKENDS: [string, () => PortsFactory][] = [
  ["SQLite and files", () => localPorts],
  ["DynamoDB (dynalite) and S3 (s3rver)", () => (opts) => peers.ports(opts)],
];

describe.each(BACKENDS)("overlapping finalizes of one attempt by one agent, on %s", (_name, factoryOf) => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  /** Holds the first write of the live report (or manifest) after `arm()`, until `let go`. */
  function holding(ports: ApiPorts) {
    let armed: { reached: () => void; go: Promise<void> } | undefined;
    const reports = new Proxy(ports.reports, {
      get(target, prop) {
        const value: unknown = Reflect.get(target, prop, target);
        if (typeof value !== "function") return value;
        if (prop !== "put" && prop !== "copy") return value.bind(target);
        return async (...args: unknown[]) => {
          const name = prop === "put" ? args[1] : (args[1] as { name: string }).name;
          if ((name === REPORT_NAME || name === MANIFEST_FILE) && armed !== undefined) {
            const a = armed;
            armed = undefined;
            a.reached();
            await a.go;
          }
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    });
    return {
      ports: { ...ports, reports, close: () => ports.close() },
      arm(): { reached: Promise<void>; letGo: () => void } {
        let letGo!: () => void;
        const go = new Promise<void>((r) => {
          letGo = r;
        });
        const reached = new Promise<void>((r) => {
          armed = { reached: r, go };
        });
        return { reached, letGo };
      },
    };
  }

  async function trial(
    h: Harness,
    n: number,
    arm?: () => { reached: Promise<void>; letGo: () => void },
  ): Promise<{ statuses: number[]; problem?: string; lost?: string }> {
    const jobId = `race-${n}-${randomUUID().slice(0, 8)}`;
    expect((await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex" } })).status).toBe(
      201,
    );
    const dispatched = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
      token: h.operator,
      json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
    });
    const agent: string = dispatched.body.agent_token;
    const stage = (text: string) =>
      h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: agent,
        body: new TextEncoder().encode(text),
        headers: { "content-type": "text/markdown" },
      });
    const finalize = () => h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, { token: agent, json: { side_effects: [] } });
    expect((await stage(`# first ${n}\n`)).status).toBe(201);
    const [a, b] = await (arm === undefined ? free() : forced(arm()));
    async function forced(hold: { reached: Promise<void>; letGo: () => void }) {
      const first = finalize();
      await hold.reached;
      const again = await stage(`# second ${n}, longer than the first\n`);
      expect(again.status, again.text).toBe(201);
      const second = await finalize();
      hold.letGo();
      return [await first, second] as const;
    }
    function free() {
      return Promise.all([
        finalize(),
        (async () => {
          const again = await stage(`# second ${n}, longer than the first\n`);
          expect(again.status, again.text).toBe(201);
          return finalize();
        })(),
      ]);
    }
    const statuses = [a.status, b.status];
    // The second finalize, overlapping the first, is 409 report.finalizeInProgress. The
    // first may also lose its staged bytes to the re-stage racing it (an upload is not a
    // finalize: they do not exclude each other): then it is refused fail-closed, as
    // report.changed (hashed one version, pinned another) or report.notFound (s3rver's
    // copy onto an existing key leaves a moment with no object; S3's does not).
    expect(b.status === 200 || b.body.code === "report.finalizeInProgress", `the second finalize: ${b.text}`).toBe(true);
    expect(a.status === 200 || ["report.finalizeInProgress", "report.changed", "report.notFound"].includes(a.body.code), a.text).toBe(true);
    const record = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
    const verification = (await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator })).body;
    if (!verification.ok) return { statuses, problem: `trial ${n}: the live tree does not verify: ${verification.reason}` };
    if (verification.manifest_sha256 !== record.finalized_report?.manifest_sha256) {
      return {
        statuses,
        problem: `trial ${n}: the live manifest ${verification.manifest_sha256} is not the one finalized_report names (${record.finalized_report?.manifest_sha256})`,
      };
    }
    if (record.finalize_in_progress !== undefined) return { statuses, problem: `trial ${n}: a finalize lease outlived its request` };
    return { statuses, ...(a.status === 200 || a.body.code === "report.finalizeInProgress" ? {} : { lost: a.body.code }) };
  }

  it(
    `in ${TRIALS} trials, the live tree always verifies and is the one finalized_report names; the second finalize is served after the first or 409`,
    async () => {
      let held: ReturnType<typeof holding> | undefined;
      const h = await makeHarness(
        async (o) => {
          held = holding(await factoryOf()(o));
          return held.ports;
        },
        {},
        cleanup,
      );
      const problems: string[] = [];
      let refused = 0;
      let served = 0;
      const lost: string[] = [];
      for (let n = 0; n < 2 * TRIALS; n++) {
        const r = await trial(h, n, n % 2 === 0 ? held?.arm : undefined);
        refused += r.statuses.filter((s) => s === 409).length - (r.lost === "report.changed" ? 1 : 0);
        if (r.lost !== undefined) lost.push(r.lost);
        served += r.statuses.filter((s) => s === 200).length;
        if (r.problem !== undefined) problems.push(r.problem);
      }
      console.log(
        `overlapping finalizes on ${_name}: ${TRIALS} trials forced and ${TRIALS} free, ${served} finalizes served, ${refused} refused 409 report.finalizeInProgress, ${lost.length} first finalizes lost their bytes to the re-stage (${lost.join(", ") || "none"}), ${problems.length} trials failed`,
      );
      expect(problems).toEqual([]);
    },
    TIMEOUT,
  );
});
