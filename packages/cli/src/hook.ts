import { appendFile, chmod, mkdir } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { HOOK_AGENTS, HOOK_ALLOWLISTS, type HookAgent, HookJsonError, parseConfig, type ScannedHook, scanHookJson } from "@mam/core";
import type { CliIo } from "./io.ts";

/**
 * `mam hook claude-code` and `mam hook codex` (issue 21): an agent's hook, run by the
 * agent for each event. It reads the event (stdin; a Codex `notify` program gets it as
 * its last argument), keeps only the allowlisted fields (core's scanner: tool output,
 * prompts and messages never leave the machine), posts them to the service with the
 * agent's token (MAM_API_URL, MAM_TOKEN from `mam dispatch`'s environment) and answers
 * the agent:
 *
 * - stdout carries nothing but a Stop nudge (`{"decision":"block","reason":…}`): Claude
 *   Code reads a command hook's stdout as control input, so nothing else is ever written;
 * - it always exits 0, within `HOOK_DEADLINE_MS`: a hook must never stop the agent nor
 *   hang it (hooks fail open); what could not be delivered is one line in a 0600 log
 *   file (MAM_HOOK_LOG), naming the event and why, never the token or the event's content.
 */
export const HOOK_DEADLINE_MS = 1_700;
/** The post's own limit, inside the deadline. */
const POST_TIMEOUT_MS = 1_500;
/** What is left for reading and posting the event however long start-up took (a loaded machine): the post is still tried. */
const HOOK_FLOOR_MS = 500;

const EVENTS_PRINTED = ["SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "StopFailure", "Notification", "SessionEnd"] as const;

const USAGE = `Usage: mam hook claude-code            (a Claude Code command hook: the event on stdin)
       mam hook claude-code --print-config [--http] [--api URL]
       mam hook codex [JSON]                  (Codex notify: the event as the last argument; a Codex hook: on stdin)
       mam hook codex --print-config

Posts the event's allowlisted fields to MAM_API_URL with MAM_TOKEN (both from mam
dispatch's environment). Writes nothing to stdout but a Stop nudge and always exits 0;
what could not be delivered is a line in MAM_HOOK_LOG (default
~/.local/state/mam/hook.log, 0600). --print-config prints the settings block to paste
(Claude Code's settings.json "hooks"; Codex's config.toml notify line), referring to
$MAM_TOKEN, never its value. See docs/agents.md.
`;

/** Run `mam hook …`; returns the exit code, which is 0 but for a usage error of `--print-config`. */
export async function hookCommand(args: readonly string[], io: CliIo): Promise<number> {
  const [agent, ...rest] = args;
  if (agent === undefined || agent === "--help" || agent === "-h" || rest.includes("--help") || rest.includes("-h")) {
    io.stdout(USAGE);
    return 0;
  }
  if (!(HOOK_AGENTS as readonly string[]).includes(agent)) {
    // A mistyped hook must not stop the agent either: a log line, exit 0.
    await logLine(io, `mam hook ${agent}`, `unknown agent ${JSON.stringify(agent.slice(0, 32))} (mam hook claude-code or mam hook codex)`);
    return 0;
  }
  const kind = agent as HookAgent;
  if (rest.includes("--print-config")) return printConfig(kind, rest, io);
  // From the process's start (loading the command takes a good part of a hook's time), not this function's.
  const since = io.startedAt ?? performance.now();
  const deadline = AbortSignal.timeout(Math.max(HOOK_FLOOR_MS, Math.floor(HOOK_DEADLINE_MS - (performance.now() - since))));
  let event = "?";
  try {
    const config = parseConfig(io.env);
    const scanned = await readEvent(kind, rest, io, deadline);
    event = eventName(scanned);
    if (config.apiUrl === undefined || config.token === undefined) {
      await logLine(io, `mam hook ${kind}`, `${event}: not posted: MAM_API_URL and MAM_TOKEN are not both set (mam dispatch writes them)`);
      return 0;
    }
    const res = await fetch(new URL(`/v1/hooks/${kind}`, config.apiUrl), {
      method: "POST",
      headers: { authorization: `Bearer ${config.token}`, "content-type": "application/json" },
      body: JSON.stringify(reduced(scanned)),
      signal: AbortSignal.any([deadline, AbortSignal.timeout(POST_TIMEOUT_MS)]),
    });
    const text = await res.text();
    if (res.status === 200) {
      const nudge = nudgeOf(text);
      if (nudge !== undefined) io.stdout(`${JSON.stringify(nudge)}\n`);
      else await logLine(io, `mam hook ${kind}`, `${event}: the service answered 200 with no nudge in it; nothing passed on`);
      return 0;
    }
    if (res.status !== 204) await logLine(io, `mam hook ${kind}`, `${event}: refused, ${res.status} ${problemOf(text)}`);
  } catch (e) {
    await logLine(io, `mam hook ${kind}`, `${event}: not posted: ${whyNot(e)}`);
  }
  return 0;
}

/** The event: Codex's notify passes it as its last argument; every other hook on stdin. */
async function readEvent(kind: HookAgent, rest: readonly string[], io: CliIo, deadline: AbortSignal): Promise<ScannedHook> {
  const allow = HOOK_ALLOWLISTS[kind];
  const argument = rest[rest.length - 1];
  if (kind === "codex" && argument !== undefined && argument.trimStart().startsWith("{")) {
    return scanHookJson([new TextEncoder().encode(argument)], allow);
  }
  if (io.stdin === undefined) throw new HookJsonError("no event on stdin");
  return scanHookJson(untilDeadline(io.stdin, deadline), allow);
}

/**
 * The chunks of `stdin` until the deadline, which ends the reading even while no chunk
 * comes: an agent that never closes the hook's stdin must not hang it. Stopping
 * returns the iterator, which lets the stream go (so nothing keeps the process alive).
 */
async function* untilDeadline(stdin: AsyncIterable<Uint8Array>, deadline: AbortSignal): AsyncGenerator<Uint8Array> {
  const late = () => new Error(`the event took longer than ${HOOK_DEADLINE_MS} ms to arrive`);
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(late());
    deadline.addEventListener("abort", onAbort, { once: true });
  });
  // Never left unhandled: the race below is what reads it.
  aborted.catch(() => undefined);
  const chunks = stdin[Symbol.asyncIterator]();
  try {
    for (;;) {
      if (deadline.aborted) throw late();
      const next = await Promise.race([chunks.next(), aborted]);
      if (next.done === true) return;
      yield next.value;
    }
  } finally {
    if (onAbort !== undefined) deadline.removeEventListener("abort", onAbort);
    // Not awaited: a stream that never ends may never settle its return either; a
    // stream (process.stdin) is destroyed, or its open pipe would keep the process alive.
    void Promise.resolve(chunks.return?.()).catch(() => undefined);
    (stdin as { destroy?: () => void }).destroy?.();
  }
}

/** The allowlisted fields, in the agent's own shape (so the service reads a posted event and a reduced one alike). */
function reduced(scanned: ScannedHook): Record<string, unknown> {
  return {
    ...scanned.scalars,
    ...Object.fromEntries(Object.entries(scanned.records).map(([k, r]) => [k, r.items.slice(0, r.length)])),
    ...Object.fromEntries(Object.entries(scanned.counts).map(([k, n]) => [k, Array.from({ length: n }, () => ({}))])),
  };
}

function eventName(scanned: ScannedHook): string {
  const name = scanned.scalars.hook_event_name ?? scanned.scalars.type;
  return typeof name === "string" && /^[A-Za-z0-9_.-]{1,64}$/.test(name) ? name : "an event";
}

/** Only a well-formed nudge is passed to the agent: nothing else the service says becomes control input. */
function nudgeOf(text: string): { decision: "block"; reason: string } | undefined {
  try {
    const body = JSON.parse(text) as { decision?: unknown; reason?: unknown };
    if (body.decision === "block" && typeof body.reason === "string" && body.reason.length <= 1000)
      return { decision: "block", reason: body.reason };
  } catch {
    // not JSON: no nudge
  }
  return undefined;
}

function problemOf(text: string): string {
  try {
    const p = JSON.parse(text) as { title?: unknown; detail?: unknown };
    return [p.title, p.detail]
      .filter((x): x is string => typeof x === "string")
      .join(": ")
      .slice(0, 300);
  } catch {
    return "(no problem document)";
  }
}

function whyNot(e: unknown): string {
  if (e instanceof HookJsonError) return `the event is not one JSON object (${e.message})`;
  if (e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError")) return `no answer within ${HOOK_DEADLINE_MS} ms`;
  // fetch's failure names its cause: a socket error's code, or the codes of each address tried.
  const cause = (e as { cause?: { code?: unknown; errors?: { code?: unknown }[] } } | undefined)?.cause;
  const code = cause?.code ?? cause?.errors?.find((x) => typeof x.code === "string")?.code;
  if (e instanceof TypeError && cause !== undefined) {
    return `the service could not be reached (${typeof code === "string" ? code : String((cause as { message?: unknown }).message ?? "fetch failed").slice(0, 100)})`;
  }
  if (e instanceof Error && e.constructor.name === "MamError") return e.message.slice(0, 300);
  return e instanceof Error ? e.message.slice(0, 300) : "an unknown failure";
}

/** One line in the hook's log (0600; its directory 0700), never the token nor the event's content. Failing to log fails nothing. */
async function logLine(io: CliIo, who: string, what: string): Promise<void> {
  // Read from the environment itself, not the parsed configuration: the log must take
  // the line that says the configuration did not parse.
  const path = io.env.MAM_HOOK_LOG ?? join(io.env.HOME ?? homedir(), ".local", "state", "mam", "hook.log");
  try {
    await mkdir(dirname(path), { recursive: true, mode: 0o700 });
    await appendFile(path, `${new Date().toISOString()} ${who}: ${what}\n`, { mode: 0o600 });
    await chmod(path, 0o600);
  } catch {
    // A hook never fails the agent, not even for its log.
  }
}

function printConfig(kind: HookAgent, rest: readonly string[], io: CliIo): number {
  const apiFlag = rest.indexOf("--api");
  const api = (apiFlag >= 0 ? rest[apiFlag + 1] : undefined) ?? io.env.MAM_API_URL ?? "http://127.0.0.1:8787";
  if (kind === "codex") {
    io.stdout(
      `# ~/.codex/config.toml: Codex runs this with the turn's JSON as the last argument (never awaited)\nnotify = ["mam", "hook", "codex"]\n`,
    );
    return 0;
  }
  const http = rest.includes("--http");
  if (http && !URL.canParse(api)) {
    io.stderr(`mam hook claude-code: --api must be a URL, not ${JSON.stringify(api)}\n`);
    return 1;
  }
  const handler = (async: boolean) =>
    http
      ? {
          type: "http",
          url: new URL("/v1/hooks/claude-code", api).toString(),
          headers: { Authorization: "Bearer $MAM_TOKEN" },
          allowedEnvVars: ["MAM_TOKEN"],
          timeout: 5,
          ...(async ? { async: true } : {}),
        }
      : { type: "command", command: "mam hook claude-code", timeout: 5, ...(async ? { async: true } : {}) };
  // Stop is awaited: its answer may be a nudge. Every other event is async: never delays the agent.
  const hooks = Object.fromEntries(
    EVENTS_PRINTED.map((e) => [e, [{ ...(e === "PostToolUse" ? { matcher: "*" } : {}), hooks: [handler(e !== "Stop")] }]]),
  );
  io.stdout(`${JSON.stringify({ hooks }, null, 2)}\n`);
  return 0;
}
