/**
 * How mam reads each documented hook payload (issue 21; fixtures/hooks/, the table in
 * docs/agents.md): every fixture through the scanner and the reader, as the service
 * reads it. Quiescent only for a Stop whose two arrays are present and empty; no
 * evidence when they are absent; SubagentStop and StopFailure never quiescent; a
 * permission prompt blocked; an idle prompt confirms; a prompt or a tool working.
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { HOOK_ALLOWLISTS, type HookEvent, MamError, readClaudeCodeEvent, readCodexEvent, scanHookJson } from "@mam/core";
import { describe, expect, it } from "vitest";

const FIXTURES = new URL("../../fixtures/hooks/", import.meta.url).pathname;
const SESSION = "0f8e2c1a-7b7d-4e0b-9a57-2b1f0c3d9e11";

async function read(agent: "claude-code" | "codex", name: string): Promise<HookEvent> {
  const text = readFileSync(path.join(FIXTURES, agent, name), "utf8")
    .replaceAll("$SESSION", SESSION)
    .replaceAll("$OTHER_SESSION", "other")
    .replaceAll("$THREAD", "thread-1");
  const scanned = await scanHookJson([new TextEncoder().encode(text)], HOOK_ALLOWLISTS[agent]);
  return agent === "claude-code" ? readClaudeCodeEvent(scanned) : readCodexEvent(scanned);
}

const reading = (e: HookEvent) => (e.reading.kind === "observe" ? `${e.reading.state} ${e.reading.sourceKind}` : e.reading.kind);

describe("Claude Code's events, read (issue 21)", () => {
  it("each documented payload reads as the table in docs/agents.md says", async () => {
    const table: Record<string, string> = {
      "session-start.json": "none",
      "user-prompt-submit.json": "working hook.activity",
      "pre-tool-use.json": "working hook.activity",
      "post-tool-use.json": "working hook.activity",
      "subagent-stop.json": "working hook.activity",
      "stop.json": "idle hook.stop",
      "stop-hook-active.json": "idle hook.stop",
      "stop-background-task.json": "working hook.stop",
      "stop-session-cron.json": "working hook.stop",
      "stop-no-registry.json": "none",
      "stop-failure.json": "blocked hook.stop_failure",
      "notification-permission.json": "blocked hook.notification",
      "notification-idle.json": "idle hook.notification",
      "session-start-clear.json": "end",
      "session-start-fork.json": "end",
      "session-end.json": "done hook.session_end",
    };
    // Every fixture is in the table, and every row has its fixture.
    expect(readdirSync(path.join(FIXTURES, "claude-code")).sort()).toEqual(Object.keys(table).sort());
    for (const [name, expected] of Object.entries(table)) expect(reading(await read("claude-code", name)), name).toBe(expected);
  });

  it("only a Stop with both arrays present and empty is the quiescent Stop (the one a nudge may answer)", async () => {
    const quiescent = [];
    for (const name of readdirSync(path.join(FIXTURES, "claude-code"))) {
      const e = await read("claude-code", name);
      if (e.reading.kind === "observe" && e.reading.quiescentStop === true) quiescent.push(name);
    }
    expect(quiescent.sort()).toEqual(["stop-hook-active.json", "stop.json"]);
  });

  it("keeps only the allowlisted details: the tasks' types and statuses, the crons' count, never a command, prompt, message or path", async () => {
    const bg = await read("claude-code", "stop-background-task.json");
    expect(bg.details).toEqual({
      event: "Stop",
      stop_hook_active: false,
      background_tasks: [{ type: "bash", status: "running" }],
      session_crons: 0,
    });
    const cron = await read("claude-code", "stop-session-cron.json");
    expect(cron.details).toEqual({ event: "Stop", stop_hook_active: false, background_tasks: [], session_crons: 1 });
    expect((await read("claude-code", "stop-failure.json")).details).toEqual({
      event: "StopFailure",
      error: "overloaded_error: Overloaded",
    });
    expect((await read("claude-code", "session-end.json")).details).toEqual({ event: "SessionEnd", reason: "prompt_input_exit" });
    for (const name of readdirSync(path.join(FIXTURES, "claude-code"))) {
      const e = await read("claude-code", name);
      expect(JSON.stringify(e), name).not.toMatch(/SECRET|\/home\/dev|transcript|npm run build|check the build/);
      expect(e).toMatchObject({ sessionField: "session_id", bindsSession: false });
    }
  });

  it("an event without its name or session is no event: input.invalid naming each missing field", async () => {
    const scanned = await scanHookJson([new TextEncoder().encode('{"hook_event_name": 7}')], HOOK_ALLOWLISTS["claude-code"]);
    let caught: unknown;
    try {
      readClaudeCodeEvent(scanned);
    } catch (e) {
      caught = e;
    }
    expect(caught).toBeInstanceOf(MamError);
    expect((caught as MamError).issues.map((i) => i.path)).toEqual(["body.hook_event_name", "body.session_id"]);
  });
});

describe("Codex's events, read (issue 21)", () => {
  it("notify's turn end and the Stop hook are a turn end (idle, turn_end); the prompt and tool hooks are working; the session is Codex's own, bound once", async () => {
    expect(reading(await read("codex", "notify-turn-complete.json"))).toBe("idle turn_end");
    expect(reading(await read("codex", "hook-stop.json"))).toBe("idle turn_end");
    expect(reading(await read("codex", "hook-user-prompt-submit.json"))).toBe("working hook.activity");
    expect(reading(await read("codex", "hook-post-tool-use.json"))).toBe("working hook.activity");
    expect(await read("codex", "notify-turn-complete.json")).toMatchObject({
      session: "thread-1",
      sessionField: "thread-id",
      bindsSession: true,
    });
    expect(await read("codex", "hook-stop.json")).toMatchObject({ session: "thread-1", sessionField: "session_id", bindsSession: true });
    for (const name of readdirSync(path.join(FIXTURES, "codex")))
      expect(JSON.stringify(await read("codex", name)), name).not.toContain("SECRET");
  });
});
