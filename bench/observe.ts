import { readFileSync } from "node:fs";
import path from "node:path";
import { createTokenService } from "@mam/api";
import { systemClock } from "@mam/core";
import { fixed, grouped, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";
import type { PostPlan, PostResult } from "./support/post-load.ts";
import { LOAD_CPU, spawnNode, startMam, stop, waitForLine } from "./support/serve.ts";

/**
 * Observations per second on `mam serve` (issue 20), against the same server's
 * `progress` transitions: the load generator (bench/support/post-load.ts, a process
 * of its own, on CPU 1 where it can be pinned; the server on CPU 0) sends
 * MAM_BENCH_OBSERVE_JOBS (100) fresh running jobs MAM_BENCH_OBSERVE_PER_JOB (60)
 * POSTs each over 8 keep-alive connections, in three modes per round, the order
 * turned every round, MAM_BENCH_OBSERVE_ROUNDS (3) rounds after one uncounted pass of each:
 * - `progress`: a progress transition on the seq the last answer gave (the operator's token);
 * - `observe-new`: a watcher token's observations, working and idle in turn, each one
 *   new (an `evidence_seq` bump and a feed row); 60 a job stays inside the watcher
 *   class's bound of 64;
 * - `observe-repeat`: idle every time: the first new, the rest coalesced (one
 *   conditional write of the observation set, nothing bumped, no feed row).
 *
 * Goals: new observations >= 0.5x the progress rate, coalesced repeats >= 1x (the
 * medians of the rounds' ratios).
 */

const JOBS = sizeFromEnv("MAM_BENCH_OBSERVE_JOBS", process.env.MAM_BENCH_OBSERVE_JOBS, 100);
const PER_JOB = sizeFromEnv("MAM_BENCH_OBSERVE_PER_JOB", process.env.MAM_BENCH_OBSERVE_PER_JOB, 60);
const ROUNDS = sizeFromEnv("MAM_BENCH_OBSERVE_ROUNDS", process.env.MAM_BENCH_OBSERVE_ROUNDS, 3);
const CONNECTIONS = 8;
const NEW_GOAL = 0.5;
const REPEAT_GOAL = 1;
const MODES = ["progress", "observe-new", "observe-repeat"] as const;
type Mode = (typeof MODES)[number];

if (PER_JOB > 64) throw new Error("MAM_BENCH_OBSERVE_PER_JOB is at most 64: the watcher class's bound per attempt");

const tmp = await tempDir("mam-bench-observe-");
const dataDir = path.join(tmp.dir, "data");
const mam = await startMam(dataDir, path.join(tmp.dir, "requests.log"));
try {
  const credentials = JSON.parse(readFileSync(path.join(dataDir, "credentials.json"), "utf8")) as {
    operator_token: string;
    signing_key: string;
  };
  const operator = credentials.operator_token;
  const watcher = createTokenService({ signingKey: credentials.signing_key, clock: systemClock }).mintOperator(["observe"], {
    name: "bench-watcher",
  });

  const call = async (method: string, route: string, body: unknown): Promise<Record<string, unknown>> => {
    const res = await fetch(`${mam.url}${route}`, {
      method,
      headers: { authorization: `Bearer ${operator}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status >= 300) throw new Error(`${method} ${route}: ${res.status} ${text}`);
    return JSON.parse(text) as Record<string, unknown>;
  };

  /** Fresh running jobs, each dispatched once: what a mode's requests go to. */
  let made = 0;
  const freshJobs = async (): Promise<PostPlan["jobs"]> => {
    const jobs: PostPlan["jobs"][number][] = [];
    for (let i = 0; i < JOBS; i++) {
      const id = `bench-observe-${made++}`;
      const session = `session-${id}`;
      await call("POST", "/v1/jobs", { job_id: id, prompt: "p", agent: "claude-code" });
      await call("POST", `/v1/jobs/${id}/dispatches`, { attempt_id: 1, agent_session_uuid: session, pane_process_generation: 1 });
      const claimed = await call("POST", `/v1/jobs/${id}/transitions`, { action: "claim", expected_seq: 0 });
      jobs.push({ id, seq: claimed.transition_seq as number, session });
    }
    return jobs;
  };

  const drive = async (mode: Mode): Promise<PostResult> => {
    const plan: PostPlan = {
      base: mam.url,
      mode,
      token: mode === "progress" ? operator : watcher,
      jobs: await freshJobs(),
      perJob: PER_JOB,
      connections: CONNECTIONS,
    };
    const load = spawnNode(LOAD_CPU, ["--import", "tsx", "bench/support/post-load.ts", JSON.stringify(plan)], {
      cwd: path.dirname(path.dirname(new URL(import.meta.url).pathname)),
      stdio: ["ignore", "pipe", "inherit"],
    });
    const line = await waitForLine(load, "stdout", /MAM_POST (\{.*\})/, "the load generator");
    await stop(load);
    const result = JSON.parse(line) as PostResult;
    if (result.errors > 0)
      throw new Error(`${mode}: ${result.errors} of ${result.requests} requests failed, the first: ${result.firstError}`);
    return result;
  };

  console.log(
    `observe: ${grouped(JOBS)} fresh jobs x ${PER_JOB} POSTs per mode, ${CONNECTIONS} connections, ${ROUNDS} rounds; ${machineNote()}`,
  );
  // One pass of each mode first, not counted: the server's code paths warm up before any round is timed.
  for (const mode of MODES) await drive(mode);
  const rates: Record<Mode, number[]> = { progress: [], "observe-new": [], "observe-repeat": [] };
  for (let round = 0; round < ROUNDS; round++) {
    const order = [...MODES.slice(round % MODES.length), ...MODES.slice(0, round % MODES.length)];
    for (const mode of order) rates[mode].push((await drive(mode)).rps);
    console.log(
      `round ${round + 1} (${order.join(", ")}): progress ${grouped(rates.progress.at(-1) as number)}/s, ` +
        `new observations ${grouped(rates["observe-new"].at(-1) as number)}/s, coalesced repeats ${grouped(rates["observe-repeat"].at(-1) as number)}/s`,
    );
  }
  const ratio = (mode: Mode) => median(rates[mode].map((r, i) => r / (rates.progress[i] as number)));
  const spread = (mode: Mode) => {
    const r = rates[mode].map((x, i) => x / (rates.progress[i] as number));
    return `${fixed(Math.min(...r), 2)}-${fixed(Math.max(...r), 2)}x`;
  };
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
  console.log(
    `observe: new observations ${fixed(ratio("observe-new"), 2)}x the progress rate (goal >= ${NEW_GOAL}x; rounds ${spread("observe-new")}) ` +
      `${verdict(ratio("observe-new") >= NEW_GOAL)}; ${grouped(median(rates["observe-new"]))}/s vs ${grouped(median(rates.progress))}/s`,
  );
  console.log(
    `observe: coalesced repeats ${fixed(ratio("observe-repeat"), 2)}x the progress rate (goal >= ${REPEAT_GOAL}x; rounds ${spread("observe-repeat")}) ` +
      `${verdict(ratio("observe-repeat") >= REPEAT_GOAL)}; ${grouped(median(rates["observe-repeat"]))}/s`,
  );
} finally {
  await stop(mam.child);
  await tmp.dispose();
}
