import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { packAgent } from "../scripts/package-agent.mjs";
import { fixed, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";
import { startMam, stop } from "./support/serve.ts";

/**
 * The cold start of `mam` where an agent runs it: a hook is a fresh process per
 * event, and Claude Code waits for it (the command hook must always exit 0 within
 * 2 s), so what counts is spawn-to-exit.
 *
 * The agent install is built (`npm run package:agent`'s packAgent) and installed with
 * `npm install -g --prefix <tmp> --offline`, as docs/agents.md says; `mam serve` runs
 * on a fresh data dir (bench/support/serve.ts), with a job registered and dispatched,
 * its agent token minted, before any timing. Then MAM_BENCH_HOOK_COLD_STARTS (20) runs
 * of each side, the sides in turn after one untimed run each, each spawned with the
 * payload on stdin and only PATH, HOME and the agent's MAM_API_URL/MAM_TOKEN in its
 * environment, timed from spawn to exit:
 * - baseline: `node -e 0` (Node's own start: the floor no command goes below);
 * - the agent install: `<prefix>/bin/mam <command>` (the link npm made; its
 *   `#!/usr/bin/env node` included, as a hook runs it);
 * - the repository's path, for comparison: `node packages/cli/bin/mam.js <command>`
 *   (TypeScript through tsx at run time).
 * Each side prints its median and spread (min-max) and its median as a ratio of the
 * baseline's. Every run must exit 0.
 *
 * Goal: every run of the agent install exits within 2 s (HOOK_LIMIT_MS).
 *
 * The command is HOOK_COMMAND below; the job is registered, dispatched and claimed
 * (the agent's `started`) before any timing.
 */

const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const RUNS = sizeFromEnv("MAM_BENCH_HOOK_COLD_STARTS", process.env.MAM_BENCH_HOOK_COLD_STARTS, 20);
const HOOK_LIMIT_MS = 2000;
const JOB_ID = "bench-hook-1";
const SESSION = "5d0f2c4e-7a1b-4c3d-9e8f-0a1b2c3d4e5f";

/**
 * What each cold start runs, with the agent's token: Claude Code's Stop hook, `mam hook
 * claude-code` with a Stop event on stdin (the job running, its dispatch's session), the
 * service answering 204. The hook always exits 0, so delivery is checked apart: its log
 * (MAM_HOOK_LOG, where it writes every event it could not deliver) must stay empty.
 */
const HOOK_COMMAND: { readonly name: string; readonly args: readonly string[]; readonly stdin: string } = {
  name: "mam hook claude-code (a Stop event on stdin)",
  args: ["hook", "claude-code"],
  stdin: JSON.stringify(stopPayload()),
};

/** A Claude Code Stop hook's input (what it writes on the hook's stdin). */
function stopPayload() {
  return {
    session_id: SESSION,
    transcript_path: `/home/agent/.claude/projects/bench/${SESSION}.jsonl`,
    cwd: "/home/agent/work",
    hook_event_name: "Stop",
    stop_hook_active: false,
    last_assistant_message: "Done: the tests pass.",
    background_tasks: [],
    session_crons: [],
  };
}

interface Side {
  readonly name: string;
  readonly command: string;
  readonly args: readonly string[];
  readonly cwd: string;
  readonly runs: number[];
}

function runOnce(side: Side, env: Record<string, string>, stdin: string): Promise<number> {
  const started = performance.now();
  const child = spawn(side.command, side.args, { cwd: side.cwd, env, stdio: ["pipe", "ignore", "pipe"] });
  let err = "";
  child.stderr.setEncoding("utf8").on("data", (s: string) => {
    err += s;
  });
  child.stdin.on("error", () => undefined); // a side that never reads its stdin may close it first
  child.stdin.end(stdin);
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => {
      const ms = performance.now() - started;
      if (code === 0) resolve(ms);
      else reject(new Error(`${side.name} exited ${code}: ${err.trim()}`));
    });
  });
}

console.log(machineNote());
const tmp = await tempDir("mam-bench-hook-");
const dataDir = path.join(tmp.dir, "data");
const mam = await startMam(dataDir, path.join(tmp.dir, "requests.log"));
try {
  const packed = await packAgent({ outDir: path.join(tmp.dir, "build") });
  const home = path.join(tmp.dir, "agent-home");
  mkdirSync(home);
  const prefix = path.join(home, "prefix");
  const PATH = `${path.dirname(process.execPath)}:${process.env.PATH ?? "/usr/bin:/bin"}`;
  await runOnce(
    {
      name: "npm install -g",
      command: "npm",
      args: ["install", "-g", "--prefix", prefix, "--offline", "--no-audit", "--no-fund", "--no-update-notifier", packed.tarball],
      cwd: home,
      runs: [],
    },
    { PATH, HOME: home, npm_config_cache: path.join(tmp.dir, "npm-cache") },
    "",
  );
  console.log(
    `agent install: ${path.basename(packed.tarball)} (${fixed(packed.tarballBytes / 1024)} KiB), installed offline into a temp prefix; ` +
      `a command loads ${fixed(packed.loadedBytes / 1024)} KiB of bundle, ${fixed(packed.lazyBytes / 1024)} KiB more only on first use`,
  );

  const { operator_token: operator } = JSON.parse(readFileSync(path.join(dataDir, "credentials.json"), "utf8")) as {
    operator_token: string;
  };
  const call = async (route: string, body: unknown): Promise<Record<string, unknown>> => {
    const res = await fetch(`${mam.url}${route}`, {
      method: "POST",
      headers: { authorization: `Bearer ${operator}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status >= 300) throw new Error(`POST ${route}: ${res.status} ${text}`);
    return JSON.parse(text) as Record<string, unknown>;
  };
  await call("/v1/jobs", { job_id: JOB_ID, prompt: "bench the hook", agent: "claude-code" });
  const dispatched = await call(`/v1/jobs/${JOB_ID}/dispatches`, {
    attempt_id: 1,
    agent_session_uuid: SESSION,
    pane_process_generation: 1,
  });
  const agentToken = String(dispatched.agent_token);
  const claimed = await fetch(`${mam.url}/v1/jobs/${JOB_ID}/events`, {
    method: "POST",
    headers: { authorization: `Bearer ${agentToken}`, "content-type": "application/json" },
    body: JSON.stringify({ event: "started" }),
  });
  if (!claimed.ok) throw new Error(`the agent's started event: ${claimed.status} ${await claimed.text()}`);
  const hookLog = path.join(home, "hook.log");
  const env = { PATH, HOME: home, NO_COLOR: "1", MAM_API_URL: mam.url, MAM_TOKEN: agentToken, MAM_HOOK_LOG: hookLog };
  /** What the hook could not deliver (it exits 0 regardless): nothing, or the benchmark stops. */
  const undelivered = () => {
    const log = existsSync(hookLog) ? readFileSync(hookLog, "utf8").trim() : "";
    if (log !== "") throw new Error(`the hook did not deliver every event; its log:\n${log}`);
  };

  const sides: Side[] = [
    { name: "baseline: node -e 0", command: process.execPath, args: ["-e", "0"], cwd: home, runs: [] },
    { name: "agent install: mam", command: path.join(prefix, "bin", "mam"), args: HOOK_COMMAND.args, cwd: home, runs: [] },
    {
      name: "repo (tsx): node packages/cli/bin/mam.js",
      command: process.execPath,
      args: [path.join(ROOT, "packages", "cli", "bin", "mam.js"), ...HOOK_COMMAND.args],
      cwd: ROOT,
      runs: [],
    },
  ];
  console.log(
    `\ncommand: ${HOOK_COMMAND.name}, with the agent's token, against mam serve on ${mam.url}; ` +
      `${RUNS} runs per side, the sides in turn after one untimed run each; spawn to exit, the payload (${HOOK_COMMAND.stdin.length} bytes) on stdin`,
  );
  for (const side of sides) await runOnce(side, env, HOOK_COMMAND.stdin);
  undelivered();
  for (let run = 0; run < RUNS; run++) for (const side of sides) side.runs.push(await runOnce(side, env, HOOK_COMMAND.stdin));
  undelivered();
  console.log(`  every event delivered: the service answered each of the ${2 * (RUNS + 1)} hook runs 204 (the hook's log is empty)`);

  const base = median(sides[0]!.runs);
  for (const side of sides) {
    const m = median(side.runs);
    console.log(
      `  ${side.name.padEnd(42)} median ${fixed(m).padStart(7)} ms (spread ${fixed(Math.min(...side.runs))}-${fixed(Math.max(...side.runs))} ms), ` +
        `${(m / base).toFixed(2)}x node -e 0`,
    );
  }
  const agent = sides[1]!;
  const repo = sides[2]!;
  console.log(
    `  the agent install is ${(median(repo.runs) / median(agent.runs)).toFixed(1)}x faster than the repo's tsx path, ` +
      `${fixed(median(agent.runs) - base)} ms above Node's own start`,
  );
  const slowest = Math.max(...agent.runs);
  console.log(
    `hook exits: slowest of ${RUNS} agent-install runs ${fixed(slowest)} ms, median ${fixed(median(agent.runs))} ms ` +
      `(goal <= ${HOOK_LIMIT_MS} ms, every run): ${verdict(slowest <= HOOK_LIMIT_MS)}`,
  );
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
} finally {
  await stop(mam.child);
  await tmp.dispose();
}
