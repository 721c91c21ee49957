/**
 * Issue 21, end to end: Claude Code and Codex wired to mam with nothing of the team's
 * own in between. `mam serve` in-process (SQLite, files, its MQTT broker) on the test
 * clock, with the documented rule `agent.claude-code.stop` turned on; `mam dispatch`
 * generates the session and hands over the agent's environment; the documented hook
 * payloads (fixtures/hooks/) of exactly the events `mam hook claude-code
 * --print-config` prints arrive in a real session's order — posted as Claude Code's
 * HTTP hook posts them, and through the real `mam hook claude-code` process as its
 * command hook runs it — and the service's own sweep completes the job as
 * agent-attested; a subscriber receives the completion. The tests wait on the
 * notification or on the answer, never on time.
 */
import { readFileSync } from "node:fs";
import { chmod, lstat, open, readFile, stat, symlink, writeFile } from "node:fs/promises";
import { type AddressInfo, createServer, type Socket } from "node:net";
import path from "node:path";
import { type RunningService, runCli } from "@mam/cli";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { TestClock } from "../support/clock.ts";
import { deadPort } from "../support/dead-port.ts";
import { MAM, runMam } from "../support/mam-process.ts";
import { serviceCaller, startTestService } from "../support/service-call.ts";
import { subscribe } from "../support/subscriber.ts";
import type { TempDir } from "../support/temp-dir.ts";

const FIXTURES = new URL("../../fixtures/hooks/", import.meta.url).pathname;
const OTHER_SESSION = "99999999-0000-4000-8000-000000000bad";
const WINDOW_MS = 30_000;
/** Control fields Claude Code reads in a hook's answer: none may appear but in a nudge. */
const CONTROL = ["continue", "decision", "permissionDecision", "hookSpecificOutput", "systemMessage", "stopReason"];

let tmp: TempDir;
let dataDir: string;
let service: RunningService;
let started: Awaited<ReturnType<typeof startTestService>> | undefined;
const clock = new TestClock(new Date().toISOString());

beforeAll(async () => {
  started = await startTestService("agent-hooks", clock, { MAM_AUTO_COMPLETE_SOURCES: "agent.claude-code.stop,watcher.pane_status" });
  ({ service, dataDir, tmp } = started);
});
afterAll(async () => {
  await started?.stop();
});

/** A fixture's text, its placeholders filled. */
function payload(name: string, vars: { session?: string | undefined; thread?: string | undefined } = {}): string {
  return readFileSync(path.join(FIXTURES, name), "utf8")
    .replaceAll("$SESSION", vars.session ?? "")
    .replaceAll("$OTHER_SESSION", OTHER_SESSION)
    .replaceAll("$THREAD", vars.thread ?? "");
}

const call = serviceCaller(() => service.url);

interface Agent {
  readonly jobId: string;
  readonly env: Record<string, string>;
  readonly envFile: string;
}

/** Register a job (auto-complete, optionally nudge) and `mam dispatch` it: the agent's environment, from its 0600 file. */
async function dispatched(jobId: string, opts: { nudge?: boolean; agent?: string } = {}): Promise<Agent> {
  const op = service.operatorToken;
  const registered = await call("POST", "/v1/jobs", op, {
    job_id: jobId,
    prompt: "fix the flaky test",
    agent: opts.agent ?? "claude-code",
    auto_complete: true,
    ...(opts.nudge === true ? { nudge_on_stop: true } : {}),
  });
  expect(registered.status, registered.text).toBe(201);
  const envFile = path.join(tmp.dir, `${jobId}.env`);
  const io = captureIo({ MAM_API_URL: service.url, MAM_TOKEN: op });
  expect(await runCli(["dispatch", "--job", jobId, "--attempt", "1", "--env-out", envFile], io), io.err.join("")).toBe(0);
  // The human answer names the launch line, never the token.
  const said = io.out.join("");
  expect(said).toContain('claude --session-id "$MAM_SESSION"');
  const text = await readFile(envFile, "utf8");
  expect(said).not.toContain(/MAM_TOKEN='([^']+)'/.exec(text)?.[1]);
  expect((await stat(envFile)).mode & 0o777).toBe(0o600);
  const env = Object.fromEntries([...text.matchAll(/^export (MAM_[A-Z_]+)='([^']*)'$/gm)].map((m) => [m[1] as string, m[2] as string]));
  expect(Object.keys(env).sort()).toEqual(["MAM_API_URL", "MAM_ATTEMPT", "MAM_JOB", "MAM_SESSION", "MAM_TOKEN"]);
  expect(env).toMatchObject({ MAM_API_URL: service.url, MAM_JOB: jobId, MAM_ATTEMPT: "1" });
  expect(env.MAM_SESSION).toMatch(/^[0-9a-f-]{36}$/);
  return { jobId, env, envFile };
}

/** Claude Code's HTTP hook: the event's JSON as the POST body, the token from MAM_TOKEN. */
async function httpHook(agent: Agent, fixture: string, agentKind = "claude-code") {
  // A real session's events are seconds apart; the test clock stands still between requests.
  clock.advance(1_000);
  const res = await call(
    "POST",
    `/v1/hooks/${agentKind}`,
    agent.env.MAM_TOKEN as string,
    payload(fixture, { session: agent.env.MAM_SESSION, thread: "thread-1" }),
  );
  return res;
}

/** Claude Code's command hook: the real `mam hook claude-code` process, the event on stdin, the agent's environment. */
async function commandHook(agent: Agent, fixture: string, extra: string[] = []) {
  clock.advance(1_000);
  const args = ["hook", "claude-code", ...extra];
  // The token travels in the environment, never on the command line another process can read.
  expect(args.join(" ")).not.toContain(agent.env.MAM_TOKEN);
  return runMam(args, {
    env: { ...agent.env, HOME: tmp.dir, MAM_HOOK_LOG: path.join(tmp.dir, `${agent.jobId}.hook.log`) },
    stdin: payload(fixture, { session: agent.env.MAM_SESSION }),
    killAfterMs: 10_000,
  });
}

async function claim(agent: Agent) {
  const claimed = await call("POST", `/v1/jobs/${agent.jobId}/transitions`, agent.env.MAM_TOKEN as string, {
    action: "claim",
    expected_seq: 0,
  });
  expect(claimed.status, claimed.text).toBe(200);
}

async function finalize(agent: Agent) {
  const token = agent.env.MAM_TOKEN as string;
  expect((await call("PUT", `/v1/jobs/${agent.jobId}/attempts/1/report`, token, "# Report\n\nfixed\n", "text/markdown")).status).toBe(201);
  const finalized = await call("POST", `/v1/jobs/${agent.jobId}/attempts/1/finalize`, token, { side_effects: [] });
  expect(finalized.status, finalized.text).toBe(200);
}

/** What the store holds of a job: its record (observations, candidate mark, sequences included) and its feed rows. */
async function fingerprint(jobId: string): Promise<string> {
  // The sweep timer runs beside the test and moves the key it looks at the job by
  // (attention_at, its own mark); everything a hook's write could touch is kept.
  const { attention_at: _looked, ...record } = (await service.deps.jobs.get(jobId)) ?? {};
  const feed = await service.deps.jobs.listChanges({ limit: 1000 });
  return JSON.stringify({ record, feed: feed.items.filter((row) => row.job_id === jobId) });
}

function expectNoControl(text: string, where: string) {
  if (text.trim() === "") return;
  const body = JSON.parse(text) as Record<string, unknown>;
  for (const field of CONTROL) expect(Object.keys(body), `${where}: ${text}`).not.toContain(field);
}

async function gate(jobId: string) {
  return (await call("GET", `/v1/jobs/${jobId}/gate`, service.operatorToken)).body;
}

describe("Claude Code wired to mam (issue 21)", () => {
  it("the HTTP hook: SessionStart, UserPromptSubmit, PostToolUse and a Stop with empty arrays, the report finalized, the window past: the sweep completes the job, agent-attested, and a subscriber receives it", async () => {
    const agent = await dispatched("cc-http");
    const sub = await subscribe(service.mqttUrl, `mam/jobs/${agent.jobId}/events`);
    try {
      for (const fixture of ["claude-code/session-start.json", "claude-code/user-prompt-submit.json"]) {
        const res = await httpHook(agent, fixture);
        expect(res.status, `${fixture}: ${res.text}`).toBe(204);
        expect(res.text).toBe("");
      }
      await claim(agent);
      expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
      await finalize(agent);
      clock.advance(5_000);
      expect((await httpHook(agent, "claude-code/stop.json")).status).toBe(204);
      clock.advance(WINDOW_MS + 1_000);
      const message = await sub.waitFor((m) => JSON.parse(m.payload).event === "completed", 20_000);
      expect(JSON.parse(message.payload)).toMatchObject({
        event: "completed",
        job_id: agent.jobId,
        data: {
          completed_by: "auto_complete",
          rule: "agent.claude-code.stop",
          sources: ["agent:claude-code"],
          quiescence: "agent-attested",
        },
      });
      const record = (await call("GET", `/v1/jobs/${agent.jobId}`, service.operatorToken)).body;
      expect(record).toMatchObject({
        status: "completed",
        completed_evidence: { quiescence: "agent-attested", rule: "agent.claude-code.stop" },
      });
      // Only the allowlist was stored: no prompt, tool input or output, message, path.
      const stored = await fingerprint(agent.jobId);
      for (const secret of ["SECRET", "transcript", "/home/dev", "npm test"]) expect(stored).not.toContain(secret);
      expect(record.observations.entries.map((e: { source_kind: string; state: string }) => `${e.source_kind}:${e.state}`)).toEqual([
        "hook.activity:working",
        "hook.stop:idle",
      ]);
      expect(record.observations.entries[1].hook).toEqual({
        event: "Stop",
        stop_hook_active: false,
        background_tasks: [],
        session_crons: 0,
      });
    } finally {
      await sub.close();
    }
  }, 60_000);

  it("the command hook: the same session through the real `mam hook claude-code`: nothing on stdout, exit 0, the job completed agent-attested", async () => {
    const agent = await dispatched("cc-command");
    const sub = await subscribe(service.mqttUrl, `mam/jobs/${agent.jobId}/events`);
    try {
      for (const fixture of ["claude-code/session-start.json", "claude-code/user-prompt-submit.json", "claude-code/post-tool-use.json"]) {
        const run = await commandHook(agent, fixture);
        expect(run, fixture).toMatchObject({ status: 0, stdout: "" });
        if (fixture.endsWith("user-prompt-submit.json")) await claim(agent);
      }
      await finalize(agent);
      const stop = await commandHook(agent, "claude-code/stop.json");
      expect(stop).toMatchObject({ status: 0, stdout: "" });
      clock.advance(WINDOW_MS + 1_000);
      const message = await sub.waitFor((m) => JSON.parse(m.payload).event === "completed", 20_000);
      expect(JSON.parse(message.payload).data).toMatchObject({ rule: "agent.claude-code.stop", quiescence: "agent-attested" });
      // Nothing went wrong, so the log holds nothing.
      await expect(stat(path.join(tmp.dir, `${agent.jobId}.hook.log`))).rejects.toThrow();
    } finally {
      await sub.close();
    }
  }, 60_000);

  it("a Stop with a running background task (or a session cron) is work in flight: the job does not complete", async () => {
    const agent = await dispatched("cc-background");
    await claim(agent);
    expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
    await finalize(agent);
    expect((await httpHook(agent, "claude-code/stop-background-task.json")).status).toBe(204);
    clock.advance(WINDOW_MS + 1_000);
    const dry = await gate(agent.jobId);
    expect(dry.would_commit).toBe(false);
    expect(dry.reason).toMatch(/never observed working|no agent hook.stop observation saw it quiescent/);
    const record = await service.deps.jobs.get(agent.jobId);
    expect(record?.status).toBe("running");
    expect(record?.observations?.entries.at(-1)).toMatchObject({ source_kind: "hook.stop", state: "working" });
    expect(record?.observations?.entries.at(-1)?.hook?.background_tasks).toEqual([{ type: "bash", status: "running" }]);
    // A Stop whose arrays are absent (the registry unreachable) is no evidence at all: nothing recorded.
    const before = await fingerprint(agent.jobId);
    expect((await httpHook(agent, "claude-code/stop-no-registry.json")).status).toBe(204);
    expect(JSON.parse(await fingerprint(agent.jobId))).toEqual(JSON.parse(before));
  });

  it("a SessionStart with source clear ends the attempt's quiescence evidence: the built scenario says so and the gate holds until a new dispatch", async () => {
    const agent = await dispatched("cc-clear");
    await claim(agent);
    expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
    await finalize(agent);
    expect((await httpHook(agent, "claude-code/stop.json")).status).toBe(204);
    // /clear: a new conversation, under a new session id, on the same token.
    expect((await httpHook(agent, "claude-code/session-start-clear.json")).status).toBe(204);
    clock.advance(WINDOW_MS + 1_000);
    const dry = await gate(agent.jobId);
    expect(dry.would_commit).toBe(false);
    expect(dry.scenario.evidence_ended).toMatchObject({ cause: "clear", source: "agent:claude-code" });
    expect(dry.reason).toContain("cleared");
    expect(dry.reason).toContain("record a new dispatch");
    // The cleared session's later events are another session's: refused, naming the field, writing nothing.
    const before = await fingerprint(agent.jobId);
    const later = await call(
      "POST",
      "/v1/hooks/claude-code",
      agent.env.MAM_TOKEN as string,
      payload("claude-code/stop.json", { session: OTHER_SESSION }),
    );
    expect(later.status).toBe(409);
    expect(later.body.errors).toEqual([expect.objectContaining({ path: "body.session_id" })]);
    expect(JSON.parse(await fingerprint(agent.jobId))).toEqual(JSON.parse(before));
    expect((await service.deps.jobs.get(agent.jobId))?.status).toBe("running");
  });

  it("the Stop nudge: a Stop with no finalized report is answered decision: block once; the agent finalizes, stops again, and the job completes", async () => {
    const agent = await dispatched("cc-nudge", { nudge: true });
    const sub = await subscribe(service.mqttUrl, `mam/jobs/${agent.jobId}/events`);
    try {
      await claim(agent);
      expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
      const nudged = await httpHook(agent, "claude-code/stop.json");
      expect(nudged.status).toBe(200);
      expect(nudged.body).toEqual({ decision: "block", reason: expect.stringContaining("mam finalize") });
      // The reason names the attempt and the command, never a field of the job.
      expect(nudged.body.reason).toContain("attempt 1");
      expect(nudged.body.reason).not.toContain(agent.jobId);
      expect(nudged.body.reason).not.toContain("fix the flaky test");
      // Claude Code's continuation carries stop_hook_active: never nudged again for it.
      expect((await httpHook(agent, "claude-code/stop-hook-active.json")).status).toBe(204);
      // The agent goes back to work, and stops again still without a report: MAM_NUDGE_MAX (1) was answered.
      expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
      const again = await httpHook(agent, "claude-code/stop.json");
      expect(again.status, again.text).toBe(204);
      expect((await service.deps.jobs.get(agent.jobId))?.observations?.nudges).toBe(1);
      // Through the command hook the nudge is the one thing on stdout.
      // (A new attempt would get a nudge of its own; here the answer is counted once per attempt.)
      expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
      await finalize(agent);
      expect((await httpHook(agent, "claude-code/stop.json")).status).toBe(204);
      clock.advance(WINDOW_MS + 1_000);
      const message = await sub.waitFor((m) => JSON.parse(m.payload).event === "completed", 20_000);
      expect(JSON.parse(message.payload).data).toMatchObject({ rule: "agent.claude-code.stop" });
    } finally {
      await sub.close();
    }
  }, 60_000);

  it("a nudged Stop is no quiescence: the agent mam sent back to work, finalizing in the middle of its tool call a window later, is not completed before that call returns", async () => {
    const agent = await dispatched("cc-nudge-window", { nudge: true });
    await claim(agent);
    expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
    // The report is written but not finalized: the Stop is answered with a nudge, and the agent goes back to work.
    const nudged = await httpHook(agent, "claude-code/stop.json");
    expect(nudged.status).toBe(200);
    // It thinks for longer than the settle window, then runs `mam finalize` in a Bash tool call:
    // the manifest is committed while the call runs; its PostToolUse comes when the call returns.
    clock.advance(WINDOW_MS + 1_000);
    await finalize(agent);
    const dry = await gate(agent.jobId);
    expect(dry.would_commit, dry.reason).toBe(false);
    expect((await service.deps.jobs.get(agent.jobId))?.status).toBe("running");
    // When the call returns and the agent stops again, the quiescence begins.
    expect((await httpHook(agent, "claude-code/post-tool-use.json")).status).toBe(204);
    expect((await httpHook(agent, "claude-code/stop.json")).status).toBe(204);
    clock.advance(WINDOW_MS + 1_000);
    expect((await gate(agent.jobId)).would_commit).toBe(true);
  }, 30_000);

  it("the command hook passes a nudge to stdout as Claude Code reads it, and nothing else", async () => {
    const agent = await dispatched("cc-nudge-command", { nudge: true });
    await claim(agent);
    expect((await commandHook(agent, "claude-code/post-tool-use.json")).stdout).toBe("");
    const run = await commandHook(agent, "claude-code/stop.json");
    expect(run.status).toBe(0);
    const answer = JSON.parse(run.stdout);
    expect(answer).toEqual({ decision: "block", reason: expect.stringContaining("mam finalize") });
  }, 30_000);

  it("a nudge written to a stdout whose reader went away (EPIPE): still exit 0, no stack trace", async () => {
    const agent = await dispatched("cc-nudge-epipe", { nudge: true });
    await claim(agent);
    clock.advance(1_000);
    const run = await runMam(["hook", "claude-code"], {
      env: { ...agent.env, HOME: tmp.dir, MAM_HOOK_LOG: path.join(tmp.dir, `${agent.jobId}.hook.log`) },
      stdin: payload("claude-code/stop.json", { session: agent.env.MAM_SESSION }),
      closeStdout: true,
      killAfterMs: 10_000,
    });
    // The service answered the nudge (counted); the agent was not there to read it.
    expect((await service.deps.jobs.get(agent.jobId))?.observations?.nudges).toBe(1);
    expect(run.stderr).toBe("");
    expect(run.status).toBe(0);
  }, 30_000);

  it("refusals write nothing: another session on the token, malformed hook JSON (the command exits 0 and logs a line), a retired token", async () => {
    const agent = await dispatched("cc-refusals");
    await claim(agent);
    // The claim marks the job due now; the sweep timer finds it held and clears the mark: a write of its own, awaited.
    await vi.waitFor(async () => expect((await service.deps.jobs.get(agent.jobId))?.candidate_at).toBeUndefined(), { timeout: 10_000 });
    const before = await fingerprint(agent.jobId);
    const answers: string[] = [];

    const other = await call(
      "POST",
      "/v1/hooks/claude-code",
      agent.env.MAM_TOKEN as string,
      payload("claude-code/stop.json", { session: OTHER_SESSION }),
    );
    expect(other.status).toBe(409);
    expect(other.body.errors).toEqual([expect.objectContaining({ path: "body.session_id" })]);
    answers.push(other.text);

    const malformed = await call("POST", "/v1/hooks/claude-code", agent.env.MAM_TOKEN as string, '{"session_id": "x", "hook_event_name": ');
    expect(malformed.status).toBe(400);
    answers.push(malformed.text);
    const operator = await call(
      "POST",
      "/v1/hooks/claude-code",
      service.operatorToken,
      payload("claude-code/stop.json", { session: agent.env.MAM_SESSION }),
    );
    expect(operator.status).toBe(403);
    answers.push(operator.text);
    expect(JSON.parse(await fingerprint(agent.jobId))).toEqual(JSON.parse(before));

    const log = path.join(tmp.dir, `${agent.jobId}.hook.log`);
    const run = await runMam(["hook", "claude-code"], {
      env: { ...agent.env, HOME: tmp.dir, MAM_HOOK_LOG: log },
      stdin: '{"session_id": "x", "tool_response": "SECRET-TOOL-OUTPUT',
      killAfterMs: 10_000,
    });
    expect(run).toMatchObject({ status: 0, stdout: "" });
    const logged = await readFile(log, "utf8");
    expect(logged.trim().split("\n")).toHaveLength(1);
    expect(logged).toContain("not one JSON object");
    expect((await stat(log)).mode & 0o777).toBe(0o600);
    expect(JSON.parse(await fingerprint(agent.jobId))).toEqual(JSON.parse(before));

    // A newer dispatch retires the token: its events are refused (403) and write nothing.
    const io = captureIo({ MAM_API_URL: service.url, MAM_TOKEN: service.operatorToken });
    expect(await runCli(["dispatch", "--job", agent.jobId, "--attempt", "2", "--json"], io), io.err.join("")).toBe(0);
    const retiredBefore = await fingerprint(agent.jobId);
    const retired = await httpHook(agent, "claude-code/stop.json");
    expect(retired.status).toBe(403);
    answers.push(retired.text);
    expect(JSON.parse(await fingerprint(agent.jobId))).toEqual(JSON.parse(retiredBefore));
    const unreachable = await runMam(["hook", "claude-code"], {
      env: { ...agent.env, MAM_API_URL: `http://127.0.0.1:${await deadPort()}`, HOME: tmp.dir, MAM_HOOK_LOG: log },
      stdin: payload("claude-code/stop.json", { session: agent.env.MAM_SESSION }),
      killAfterMs: 10_000,
    });
    expect(unreachable).toMatchObject({ status: 0, stdout: "" });
    expect(await readFile(log, "utf8")).toContain("could not be reached");

    // No answer but a nudge carries a control field; no log line, answer or stdout carries the token or the payload.
    for (const text of answers) expectNoControl(text, "a refusal");
    const everything = [
      ...answers,
      logged,
      await readFile(log, "utf8"),
      run.stdout,
      run.stderr,
      unreachable.stdout,
      unreachable.stderr,
    ].join("\n");
    expect(everything).not.toContain(agent.env.MAM_TOKEN);
    expect(everything).not.toContain("SECRET");
  }, 60_000);

  it("a hook body whose keys are named like inherited properties (constructor, __proto__) is read as any other: no 5xx, no stack trace", async () => {
    const agent = await dispatched("cc-proto-keys");
    await claim(agent);
    for (const key of ["constructor", "__proto__", "toString"]) {
      const body = `{"hook_event_name":"PostToolUse","session_id":"${agent.env.MAM_SESSION}",${JSON.stringify(key)}:[{"type":"SECRET"}]}`;
      const res = await call("POST", "/v1/hooks/claude-code", agent.env.MAM_TOKEN as string, body);
      expect(res.status, `${key}: ${res.text}`).toBe(204);
    }
    expect(JSON.stringify(await service.deps.jobs.get(agent.jobId))).not.toContain("SECRET");
  });

  it("mam dispatch --env-out never lets the token out through what was at the path: a 0644 file a reader already holds open, a symlink planted there", async () => {
    const op = service.operatorToken;
    for (const jobId of ["cc-env-open", "cc-env-link"]) {
      const registered = await call("POST", "/v1/jobs", op, { job_id: jobId, prompt: "p", agent: "claude-code" });
      expect(registered.status, registered.text).toBe(201);
    }
    const dispatch = async (jobId: string, envFile: string) => {
      const io = captureIo({ MAM_API_URL: service.url, MAM_TOKEN: op });
      expect(await runCli(["dispatch", "--job", jobId, "--attempt", "1", "--env-out", envFile], io), io.err.join("")).toBe(0);
      const text = await readFile(envFile, "utf8");
      expect((await lstat(envFile)).isFile()).toBe(true);
      expect((await stat(envFile)).mode & 0o777).toBe(0o600);
      return /MAM_TOKEN='([^']+)'/.exec(text)?.[1] as string;
    };

    // Another local user opened the old 0644 file while it could, and keeps the descriptor.
    const openFile = path.join(tmp.dir, "open.env");
    await writeFile(openFile, "", { mode: 0o644 });
    await chmod(openFile, 0o644);
    const reader = await open(openFile, "r");
    try {
      const token = await dispatch("cc-env-open", openFile);
      expect(token).toMatch(/\S{20,}/);
      const { buffer, bytesRead } = await reader.read(Buffer.alloc(4096), 0, 4096, 0);
      expect(buffer.subarray(0, bytesRead).toString()).not.toContain(token);
    } finally {
      await reader.close();
    }

    // A symlink planted at the path: the file it points at is not written.
    const target = path.join(tmp.dir, "planted-target.txt");
    await writeFile(target, "someone else's file\n", { mode: 0o644 });
    const linked = path.join(tmp.dir, "linked.env");
    await symlink(target, linked);
    const token = await dispatch("cc-env-link", linked);
    expect(await readFile(target, "utf8")).toBe("someone else's file\n");
    expect(await readFile(target, "utf8")).not.toContain(token);
    expect((await stat(target)).mode & 0o777).toBe(0o644);
  });

  it("--print-config prints exactly the events to hook, async on all but Stop, referring to $MAM_TOKEN and never its value", async () => {
    const agent = await dispatched("cc-config");
    for (const form of [[], ["--http"]]) {
      const run = await runMam(["hook", "claude-code", "--print-config", ...form], { env: { ...agent.env }, killAfterMs: 10_000 });
      expect(run.status).toBe(0);
      expect(run.stdout).not.toContain(agent.env.MAM_TOKEN);
      const { hooks } = JSON.parse(run.stdout) as { hooks: Record<string, { matcher?: string; hooks: Record<string, unknown>[] }[]> };
      expect(Object.keys(hooks)).toEqual([
        "SessionStart",
        "UserPromptSubmit",
        "PostToolUse",
        "Stop",
        "StopFailure",
        "Notification",
        "SessionEnd",
      ]);
      for (const [event, groups] of Object.entries(hooks)) {
        const handler = groups[0]?.hooks[0] ?? {};
        expect(handler.async, event).toBe(event === "Stop" ? undefined : true);
        if (form.length === 0) expect(handler).toMatchObject({ type: "command", command: "mam hook claude-code" });
        else {
          expect(handler).toMatchObject({
            type: "http",
            url: `${service.url}/v1/hooks/claude-code`,
            headers: { Authorization: "Bearer $MAM_TOKEN" },
            allowedEnvVars: ["MAM_TOKEN"],
          });
        }
      }
    }
    // The printed command is what an agent's machine runs: `mam` on PATH (here, the repo's).
    expect(MAM).toMatch(/bin\/mam\.js$/);
  }, 30_000);
});

describe("mam dispatch (issue 21)", () => {
  it("in data-dir mode it records the dispatch on the store and signs the agent's token with the data dir's key: the service takes it", async () => {
    const op = service.operatorToken;
    expect((await call("POST", "/v1/jobs", op, { job_id: "dd-dispatch", prompt: "p", agent: "claude-code" })).status).toBe(201);
    const io = captureIo({});
    expect(
      await runCli(
        ["dispatch", "--job", "dd-dispatch", "--attempt", "1", "--pane", "w1-p3", "--terminal", "t-7", "--data-dir", dataDir, "--json"],
        io,
      ),
      io.err.join(""),
    ).toBe(0);
    const answer = JSON.parse(io.out.join(""));
    expect(answer.dispatch).toMatchObject({
      job_id: "dd-dispatch",
      attempt_id: 1,
      pane_id: "w1-p3",
      terminal_id: "t-7",
      agent_session_uuid: answer.env.MAM_SESSION,
    });
    expect(answer.env).toMatchObject({ MAM_JOB: "dd-dispatch", MAM_ATTEMPT: "1" });
    expect(answer.launch["claude-code"]).toBe('claude --session-id "$MAM_SESSION"');
    const read = await call("GET", "/v1/jobs/dd-dispatch", answer.env.MAM_TOKEN);
    expect(read.status, read.text).toBe(200);
  });

  it("without --env-out or --json it refuses before dispatching: nothing recorded", async () => {
    const op = service.operatorToken;
    expect((await call("POST", "/v1/jobs", op, { job_id: "no-env", prompt: "p", agent: "claude-code" })).status).toBe(201);
    const before = await fingerprint("no-env");
    const io = captureIo({ MAM_API_URL: service.url, MAM_TOKEN: op });
    expect(await runCli(["dispatch", "--job", "no-env", "--attempt", "1"], io)).toBe(1);
    expect(io.err.join("")).toContain("--env-out PATH");
    expect(io.out.join("")).toBe("");
    expect(await fingerprint("no-env")).toBe(before);
  });
});

/** A peer on a loopback port that takes connections and, as `mode` says, never answers or answers a byte at a time, forever. */
async function stuckPeer(mode: "silent" | "slow-body"): Promise<{ url: string; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => undefined);
    let timer: NodeJS.Timeout | undefined;
    socket.once("data", () => {
      if (mode === "silent") return;
      socket.write('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{"decision":"block",');
      timer = setInterval(() => socket.write(" "), 50);
    });
    socket.on("close", () => {
      clearInterval(timer);
      sockets.delete(socket);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe("the command hook fails open, within its time (issue 21)", () => {
  /** The hook as Claude Code runs it, timed from its spawn: the 2 s a hook may take are the process's, start-up included. */
  async function timedHook(env: Record<string, string>, stdin: string, keepStdinOpen = false) {
    const log = path.join(tmp.dir, `fail-open-${Math.random().toString(16).slice(2)}.log`);
    const started = performance.now();
    const run = await runMam(["hook", "claude-code"], {
      env: { MAM_TOKEN: "not-a-real-token", HOME: tmp.dir, MAM_HOOK_LOG: log, ...env },
      stdin,
      keepStdinOpen,
      killAfterMs: 10_000,
    });
    return { run, ms: performance.now() - started, log: await readFile(log, "utf8").catch(() => "") };
  }
  /**
   * The most a hook may take here, from its spawn: 2 s, or, on a machine so loaded that
   * loading the command (`mam hook --help`, just measured) nears that alone, 1.5 s past it.
   */
  async function hookBudgetMs(): Promise<number> {
    const started = performance.now();
    expect((await runMam(["hook", "--help"], { killAfterMs: 10_000 })).status).toBe(0);
    return Math.max(2_000, performance.now() - started + 1_500);
  }
  const STOP = '{"hook_event_name":"Stop","session_id":"s-1","background_tasks":[],"session_crons":[]}';

  it("an event whose stdin is never closed: exit 0 within 2 s of the spawn, nothing on stdout, one line logged", async () => {
    const budget = await hookBudgetMs();
    const { run, ms, log } = await timedHook({ MAM_API_URL: service.url }, STOP.slice(0, 20), true);
    expect(run).toMatchObject({ status: 0, stdout: "" });
    expect(log.trim().split("\n")).toHaveLength(1);
    expect(log).toContain("took longer");
    expect(ms).toBeLessThan(budget);
  }, 20_000);

  for (const mode of ["silent", "slow-body"] as const) {
    it(`a service that takes the connection and then ${mode === "silent" ? "never answers" : "sends its answer a byte at a time"}: exit 0 within 2 s of the spawn, nothing on stdout`, async () => {
      const peer = await stuckPeer(mode);
      try {
        const budget = await hookBudgetMs();
        const { run, ms, log } = await timedHook({ MAM_API_URL: peer.url }, STOP);
        expect(run).toMatchObject({ status: 0, stdout: "" });
        expect(log).toContain("no answer within");
        expect(ms).toBeLessThan(budget);
      } finally {
        await peer.close();
      }
    }, 20_000);
  }
});

describe("Codex wired to mam (issue 21)", () => {
  it("notify's JSON argument binds the thread to the attempt; another thread is refused, naming thread-id; a turn end never completes the job alone", async () => {
    const agent = await dispatched("codex-notify", { agent: "codex" });
    await claim(agent);
    const hookEnv = { ...agent.env, HOME: tmp.dir, MAM_HOOK_LOG: path.join(tmp.dir, "codex.hook.log") };
    const working = await runMam(["hook", "codex"], {
      env: hookEnv,
      stdin: payload("codex/hook-post-tool-use.json", { thread: "thread-1" }),
      killAfterMs: 10_000,
    });
    expect(working).toMatchObject({ status: 0, stdout: "" });
    await finalize(agent);
    const notify = await runMam(["hook", "codex", payload("codex/notify-turn-complete.json", { thread: "thread-1" })], {
      env: hookEnv,
      killAfterMs: 10_000,
    });
    expect(notify).toMatchObject({ status: 0, stdout: "" });
    const record = await service.deps.jobs.get(agent.jobId);
    expect(record?.observations?.bound_session).toMatchObject({ id: "thread-1", field: "session_id" });
    expect(record?.observations?.entries.map((e) => `${e.source_kind}:${e.state}`)).toEqual(["hook.activity:working", "turn_end:idle"]);
    // The dispatch record is write-once: the binding lives in the attempt's evidence.
    const dispatch = await call("GET", `/v1/jobs/${agent.jobId}/dispatches/1`, service.operatorToken);
    expect(dispatch.body.agent_session_uuid).toBe(agent.env.MAM_SESSION);

    const before = await fingerprint(agent.jobId);
    const other = await call(
      "POST",
      "/v1/hooks/codex",
      agent.env.MAM_TOKEN as string,
      payload("codex/notify-turn-complete.json", { thread: "thread-2" }),
    );
    expect(other.status).toBe(409);
    expect(other.body.errors).toEqual([expect.objectContaining({ path: "body.thread-id" })]);
    expect(JSON.parse(await fingerprint(agent.jobId))).toEqual(JSON.parse(before));

    clock.advance(WINDOW_MS + 1_000);
    const dry = await gate(agent.jobId);
    expect(dry.would_commit).toBe(false);
    expect(dry.reason).toContain("watcher.pane_status");
    expect(JSON.stringify(await service.deps.jobs.get(agent.jobId))).not.toContain("SECRET");
  }, 30_000);
});
