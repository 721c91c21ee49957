/**
 * The load generator of bench/observe.ts, in a process of its own (never the
 * server's): `connections` closed loops over keep-alive connections (Node's fetch),
 * each taking the plan's jobs in turn and sending each of them `perJob` POSTs, one
 * after the other (a job's requests never overlap: a transition expects the seq the
 * previous one answered).
 *
 *   node --import tsx bench/support/post-load.ts '<json PostPlan>'
 *
 * Modes: `progress` (`POST .../transitions`, a progress on the seq the last answer
 * gave), `observe-new` (`POST .../observations`, working and idle in turn: each one a
 * new observation) and `observe-repeat` (idle every time: the first new, the rest
 * coalesced). Prints one line `MAM_POST {...}` (PostResult) at the end.
 */

export interface PostPlan {
  readonly base: string;
  readonly mode: "progress" | "observe-new" | "observe-repeat";
  /** The operator's token (transitions) or the watcher's (observations). */
  readonly token: string;
  readonly jobs: readonly { readonly id: string; readonly seq: number; readonly session: string }[];
  readonly perJob: number;
  readonly connections: number;
}

export interface PostResult {
  readonly requests: number;
  readonly errors: number;
  readonly firstError?: string;
  readonly seconds: number;
  readonly rps: number;
}

const plan = JSON.parse(process.argv[2] ?? "{}") as PostPlan;
const headers = { authorization: `Bearer ${plan.token}`, "content-type": "application/json" };
let errors = 0;
let requests = 0;
let firstError: string | undefined;

async function one(job: PostPlan["jobs"][number], i: number, seq: number): Promise<number> {
  const progress = plan.mode === "progress";
  const path = progress ? `/v1/jobs/${job.id}/transitions` : `/v1/jobs/${job.id}/observations`;
  const body = progress
    ? { action: "progress", expected_seq: seq, fields: { progress: { step: i } } }
    : {
        state: plan.mode === "observe-new" && i % 2 === 0 ? "working" : "idle",
        source_kind: "pane_status",
        attempt_id: 1,
        agent_session_uuid: job.session,
        pane_process_generation: 1,
        observed_at: new Date().toISOString(),
      };
  const res = await fetch(`${plan.base}${path}`, { method: "POST", headers, body: JSON.stringify(body) });
  const text = await res.text();
  requests++;
  if (res.status >= 300) {
    errors++;
    firstError ??= `${res.status} ${text.slice(0, 300)}`;
    return seq;
  }
  return progress ? (JSON.parse(text) as { transition_seq: number }).transition_seq : seq;
}

async function loop(c: number): Promise<void> {
  for (let j = c; j < plan.jobs.length; j += plan.connections) {
    const job = plan.jobs[j] as PostPlan["jobs"][number];
    let seq = job.seq;
    for (let i = 0; i < plan.perJob; i++) seq = await one(job, i, seq);
  }
}

const started = performance.now();
await Promise.all(Array.from({ length: plan.connections }, (_, c) => loop(c)));
const seconds = (performance.now() - started) / 1000;
const result: PostResult = { requests, errors, ...(firstError === undefined ? {} : { firstError }), seconds, rps: requests / seconds };
console.log(`MAM_POST ${JSON.stringify(result)}`);
