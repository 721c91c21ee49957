import type { Actor } from "./actor.ts";
import type { Using } from "./deps.ts";
import { MamError } from "./errors.ts";
import type { HookAllowlist, ScannedHook } from "./hook-scanner.ts";
import { nudgeReason } from "./nudge.ts";
import { checkObservedSession, type ObservationOptions, recordObservation } from "./observations.ts";
import type { DispatchRecords, JobRecords } from "./ports.ts";
import type { HookDetails, ObservedState } from "./schemas.ts";

/**
 * Agent hooks (issue 21): what Claude Code's and Codex's hook events say, read as
 * observations of the attempt the agent's token is bound to. The agent's own word:
 * every observation here is recorded as `agent:<backend>` (a claim, agent-attested),
 * and only the documented rule `agent.claude-code.stop` reads any of it as
 * quiescence, when MAM_AUTO_COMPLETE_SOURCES names it.
 *
 * Versions the mapping follows (fixtures/hooks/README.md): Claude Code's hooks
 * reference (code.claude.com/docs/en/hooks, Claude Code 2.1) and Codex's `notify`
 * and hooks (developers.openai.com/codex, Codex CLI 0.6x).
 */
export const HOOK_AGENTS = ["claude-code", "codex"] as const;
export type HookAgent = (typeof HOOK_AGENTS)[number];

/** The fields kept of each agent's events; everything else (tool input and output, prompts, messages) is dropped unread. */
export const HOOK_ALLOWLISTS: Readonly<Record<HookAgent, HookAllowlist>> = {
  "claude-code": {
    scalars: ["hook_event_name", "session_id", "stop_hook_active", "notification_type", "error", "reason", "source"],
    records: { background_tasks: ["type", "status"] },
    counts: ["session_crons"],
  },
  // `notify`'s JSON (type, thread-id, turn-id) and the hooks' (Claude-shaped).
  codex: { scalars: ["type", "thread-id", "hook_event_name", "session_id", "stop_hook_active", "source"] },
};

/**
 * How mam reads one event:
 * - `observe`: an observation of `state`, by a signal of `sourceKind`;
 * - `end`: a `SessionStart` of `clear` or `fork`: the dispatched conversation is over;
 * - `none`: no evidence (`why` says why); the session is still checked.
 */
export type HookReading =
  | { readonly kind: "observe"; readonly state: ObservedState; readonly sourceKind: string; readonly quiescentStop?: true }
  | { readonly kind: "end"; readonly cause: "clear" | "fork" }
  | { readonly kind: "none"; readonly why: string };

/** One event as mam keeps it: its reading, the session it names (and in which field), its allowlisted details. */
export interface HookEvent {
  readonly reading: HookReading;
  readonly session: string;
  readonly sessionField: string;
  /** The session is the agent's own, bound by its first event (Codex), not one mam dispatched (Claude Code's `--session-id`). */
  readonly bindsSession: boolean;
  readonly details: HookDetails;
  readonly stopHookActive: boolean;
}

/** Signals of activity: every one of them is `working`, coalesced into one entry per turn. */
export const ACTIVITY_KIND = "hook.activity";

/**
 * Claude Code's events, written down (docs/agents.md has the same table):
 *
 * | event                         | reading                                                                 |
 * |-------------------------------|-------------------------------------------------------------------------|
 * | UserPromptSubmit, PreToolUse, PostToolUse, SubagentStop | working (`hook.activity`; a subagent's stop returns to the main agent's turn) |
 * | Stop, both arrays present and empty | idle (`hook.stop`): what the documented rule reads as quiescence; working when answered with a nudge (the agent goes back to work) |
 * | Stop, a background task or a session cron | working (`hook.stop`): work still in flight |
 * | Stop, an array absent         | none: the task registry was unreachable, so nothing is known            |
 * | StopFailure                   | blocked (`hook.stop_failure`): the turn ended on an API error           |
 * | Notification permission_prompt, elicitation_dialog; PermissionRequest | blocked (`hook.notification`) |
 * | Notification idle_prompt      | idle (`hook.notification`): confirms a quiescence, never makes one      |
 * | SessionStart clear, fork      | end: another conversation than the dispatched one                        |
 * | SessionEnd                    | done (`hook.session_end`): confirms, never makes one                     |
 * | anything else                 | none                                                                    |
 */
export function readClaudeCodeEvent(scanned: ScannedHook): HookEvent {
  const { name, session } = identity(scanned, "hook_event_name", "session_id");
  const s = scanned.scalars;
  const text = (key: string, max: number): string | undefined =>
    typeof s[key] === "string" ? (s[key] as string).slice(0, max) : undefined;
  const tasks = scanned.records.background_tasks;
  const crons = scanned.counts.session_crons;
  const stopHookActive = s.stop_hook_active === true;
  const details: HookDetails = {
    event: name,
    ...(typeof s.stop_hook_active === "boolean" ? { stop_hook_active: s.stop_hook_active } : {}),
    ...optional("notification_type", text("notification_type", 64)),
    ...optional("error", text("error", 256)),
    ...optional("reason", text("reason", 64)),
    ...optional("source", text("source", 32)),
    ...(tasks === undefined
      ? {}
      : {
          background_tasks: tasks.items.slice(0, 16).map((t) => ({
            ...optional("type", typeof t.type === "string" ? t.type.slice(0, 64) : undefined),
            ...optional("status", typeof t.status === "string" ? t.status.slice(0, 32) : undefined),
          })),
          ...(tasks.length > 16 ? { background_task_count: tasks.length } : {}),
        }),
    ...(crons === undefined ? {} : { session_crons: crons }),
  };
  return {
    reading: claudeReading(name, details, tasks?.length, crons),
    session,
    sessionField: "session_id",
    bindsSession: false,
    details,
    stopHookActive,
  };
}

function claudeReading(name: string, d: HookDetails, tasks: number | undefined, crons: number | undefined): HookReading {
  switch (name) {
    case "UserPromptSubmit":
    case "PreToolUse":
    case "PostToolUse":
    case "SubagentStop":
      return { kind: "observe", state: "working", sourceKind: ACTIVITY_KIND };
    case "Stop":
      if (tasks === undefined || crons === undefined) {
        return {
          kind: "none",
          why: "a Stop without background_tasks and session_crons: the task registry was unreachable, so it says nothing of work in flight",
        };
      }
      if (tasks > 0 || crons > 0) return { kind: "observe", state: "working", sourceKind: "hook.stop" };
      return { kind: "observe", state: "idle", sourceKind: "hook.stop", quiescentStop: true };
    case "StopFailure":
      return { kind: "observe", state: "blocked", sourceKind: "hook.stop_failure" };
    case "PermissionRequest":
      return { kind: "observe", state: "blocked", sourceKind: "hook.notification" };
    case "Notification":
      if (d.notification_type === "permission_prompt" || d.notification_type === "elicitation_dialog") {
        return { kind: "observe", state: "blocked", sourceKind: "hook.notification" };
      }
      if (d.notification_type === "idle_prompt") return { kind: "observe", state: "idle", sourceKind: "hook.notification" };
      return {
        kind: "none",
        why: `a notification of type ${JSON.stringify(d.notification_type ?? null)} says nothing of the agent's state`,
      };
    case "SessionStart":
      if (d.source === "clear" || d.source === "fork") return { kind: "end", cause: d.source };
      return { kind: "none", why: `a session start (${d.source ?? "no source"}) binds the session; it says nothing of the agent's state` };
    case "SessionEnd":
      return { kind: "observe", state: "done", sourceKind: "hook.session_end" };
    default:
      return { kind: "none", why: `mam does not read Claude Code's ${name} event` };
  }
}

/**
 * Codex's events: `notify`'s `agent-turn-complete` and the `Stop` hook mark the end
 * of a turn (idle, `turn_end`) — never quiescence: no rule reads `turn_end`, so they
 * confirm what a watcher saw and never complete a job alone. The prompt and tool
 * hooks are working. The session is Codex's thread, bound to the attempt by its first event.
 */
export function readCodexEvent(scanned: ScannedHook): HookEvent {
  const s = scanned.scalars;
  if (s.type !== undefined) {
    const { name, session } = identity(scanned, "type", "thread-id");
    const reading: HookReading =
      name === "agent-turn-complete"
        ? { kind: "observe", state: "idle", sourceKind: "turn_end" }
        : { kind: "none", why: `mam does not read Codex's ${name} notification` };
    return { reading, session, sessionField: "thread-id", bindsSession: true, details: { event: name }, stopHookActive: false };
  }
  const { name, session } = identity(scanned, "hook_event_name", "session_id");
  let reading: HookReading;
  switch (name) {
    case "UserPromptSubmit":
    case "PreToolUse":
    case "PostToolUse":
      reading = { kind: "observe", state: "working", sourceKind: ACTIVITY_KIND };
      break;
    case "Stop":
      reading = { kind: "observe", state: "idle", sourceKind: "turn_end" };
      break;
    default:
      reading = { kind: "none", why: `mam does not read Codex's ${name} hook` };
  }
  const details: HookDetails = {
    event: name,
    ...(typeof s.stop_hook_active === "boolean" ? { stop_hook_active: s.stop_hook_active } : {}),
    ...optional("source", typeof s.source === "string" ? s.source.slice(0, 32) : undefined),
  };
  return { reading, session, sessionField: "session_id", bindsSession: true, details, stopHookActive: s.stop_hook_active === true };
}

export const HOOK_READERS: Readonly<Record<HookAgent, (scanned: ScannedHook) => HookEvent>> = {
  "claude-code": readClaudeCodeEvent,
  codex: readCodexEvent,
};

/** What the hook is answered: a nudge (`decision: block`, the fixed reason), or nothing (204). */
export type HookAnswer =
  | { readonly kind: "nudge"; readonly decision: "block"; readonly reason: string }
  | { readonly kind: "recorded"; readonly coalesced: boolean }
  | { readonly kind: "none"; readonly why: string };

/**
 * Record one hook event of the attempt the agent's token is bound to: an observation
 * (`recordObservation`, with the event's allowlisted details, the session it names
 * checked against the dispatch's or bound once, and for a quiescent Stop a nudge
 * decided and counted in the same write), or, for an event with no evidence, only the
 * session checked (a read; nothing written). Refused, writing nothing: another session
 * than the attempt's (`observation.mismatch`, naming the field), and every refusal
 * `recordObservation` makes.
 */
export async function recordHookEvent(
  deps: Using<Pick<JobRecords, "get" | "writeObservations"> & Pick<DispatchRecords, "getDispatch">, "clock" | "flags">,
  bound: { readonly jobId: string; readonly attemptId: number },
  event: HookEvent,
  actor?: Actor,
): Promise<HookAnswer> {
  const { reading } = event;
  const observer = { kind: "agent", attempt: bound.attemptId } as const;
  const request = (state: ObservedState, sourceKind: string) => ({
    state,
    source_kind: sourceKind,
    attempt_id: bound.attemptId,
    agent_session_uuid: event.session,
    observed_at: deps.clock.now().toISOString(),
  });
  const options: ObservationOptions = { sessionField: event.sessionField, bindsSession: event.bindsSession, hook: event.details };
  if (reading.kind === "none") {
    await checkObservedSession(deps, bound.jobId, bound.attemptId, event.session, options);
    return { kind: "none", why: reading.why };
  }
  if (reading.kind === "end") {
    await recordObservation(deps, bound.jobId, request("unknown", "hook.session_start"), observer, actor, {
      ...options,
      endsEvidence: reading.cause,
    });
    return { kind: "recorded", coalesced: false };
  }
  const recorded = await recordObservation(deps, bound.jobId, request(reading.state, reading.sourceKind), observer, actor, {
    ...options,
    ...(reading.quiescentStop === true ? { nudge: { stopHookActive: event.stopHookActive } } : {}),
  });
  if (recorded.nudged) return { kind: "nudge", decision: "block", reason: nudgeReason(bound.attemptId) };
  return { kind: "recorded", coalesced: recorded.coalesced };
}

/** The event's name and session, both required strings: without them an event is no event of a session. */
function identity(scanned: ScannedHook, nameKey: string, sessionKey: string): { name: string; session: string } {
  const name = scanned.scalars[nameKey];
  const session = scanned.scalars[sessionKey];
  const issues = [
    ...(typeof name === "string" && name.length > 0 && name.length <= 64
      ? []
      : [{ path: `body.${nameKey}`, message: "a string of 1-64 characters is required" }]),
    ...(typeof session === "string" && session.length > 0 && session.length <= 128
      ? []
      : [{ path: `body.${sessionKey}`, message: "a string of 1-128 characters is required" }]),
  ];
  if (issues.length > 0) throw new MamError("input.invalid", `not a hook event: it needs ${nameKey} and ${sessionKey}`, { issues });
  return { name: name as string, session: session as string };
}

function optional<K extends string>(key: K, value: string | undefined): { [P in K]?: string } {
  return (value === undefined ? {} : { [key]: value }) as { [P in K]?: string };
}
