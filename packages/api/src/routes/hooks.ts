import { z } from "@hono/zod-openapi";
import { HOOK_AGENTS, HOOK_ALLOWLISTS, HOOK_READERS, HookJsonError, MamError, recordHookEvent, scanHookJson } from "@mam/core";
import { agentOnly, principalOf } from "../access.ts";
import { defineRoute, exampleProblem, jsonAnswer, REQUEST_ID_HEADER } from "../openapi.ts";
import { actorOf, withHandler } from "./support.ts";

const HookPathSchema = z.strictObject({
  agent: z.enum(HOOK_AGENTS).openapi({ description: "Whose hook sent the event: `claude-code` or `codex`.", example: "claude-code" }),
});

export const NudgeSchema = z
  .strictObject({
    decision: z.literal("block"),
    reason: z
      .string()
      .openapi({ description: "A fixed template naming the attempt and the `mam finalize` command; never a field of the job." }),
  })
  .openapi("StopNudge");

/** The body as documented: the agent's own hook JSON (read as it streams; only the allowlisted fields are kept). */
const HOOK_EVENT_DOCUMENT = {
  type: "object" as const,
  description:
    "The hook's JSON as Claude Code (an `http` hook, or `mam hook claude-code`) or Codex (`mam hook codex`) sends it. Read as it streams: only `hook_event_name`, `session_id`, `stop_hook_active`, `notification_type`, `error`, `reason`, `source`, the types and statuses of `background_tasks` and the count of `session_crons` (Codex: `type`, `thread-id`) are kept; tool input and output, prompts and messages are dropped unread, so a large event meets no JSON body limit.",
  required: ["hook_event_name", "session_id"] as string[],
  properties: {
    hook_event_name: { type: "string" as const, description: "The event (`Stop`, `PostToolUse`, …); Codex's notify sends `type` instead." },
    session_id: {
      type: "string" as const,
      description: "The agent's session: the dispatch's (`claude --session-id \"$MAM_SESSION\"`); Codex's thread.",
    },
  },
  additionalProperties: true,
};

const HOOK_EVENT_EXAMPLE = {
  session_id: "0f8e2c1a-7b7d-4e0b-9a57-2b1f0c3d9e11",
  transcript_path: "/home/dev/.claude/projects/repo/0f8e2c1a-7b7d-4e0b-9a57-2b1f0c3d9e11.jsonl",
  cwd: "/home/dev/repo",
  hook_event_name: "Stop",
  stop_hook_active: false,
  last_assistant_message: "Done: the tests pass.",
  background_tasks: [],
  session_crons: [],
};

export const postHookEventRoute = withHandler(
  defineRoute(
    agentOnly,
    {
      operationId: "postHookEvent",
      method: "post",
      path: "/v1/hooks/{agent}",
      tags: ["gate"],
      summary: "Record an agent hook's event as an observation of the token's attempt",
      description:
        "The agent's token names the job and attempt, so the URL is the same for every job. The event is read by the mapping in docs/agents.md " +
        "(Stop with empty `background_tasks` and `session_crons`: idle, read by the documented rule `agent.claude-code.stop`; prompt and tool " +
        "events: working; StopFailure, a permission prompt: blocked; SessionStart `clear` or `fork`: the attempt's quiescence evidence ends). " +
        "The session it names must be the dispatch's (`mam dispatch` generates it) — for Codex, the one its first event bound — or it is a 409 " +
        "`observation.mismatch` naming the field. Answered 204 with no body (Claude Code reads any 2xx JSON body as control input), except a " +
        "Stop nudge: a job with `nudge_on_stop` whose agent stopped with no finalized report gets `{decision: block, reason}` once (MAM_NUDGE_MAX). " +
        "A refusal writes nothing; hooks fail open, so a refused event lets the agent carry on.",
      request: {
        params: HookPathSchema,
        body: { required: true, content: { "application/json": { schema: HOOK_EVENT_DOCUMENT, example: HOOK_EVENT_EXAMPLE } } },
      },
      responses: {
        204: { description: "Recorded (or no evidence in it); no body.", headers: REQUEST_ID_HEADER },
        200: jsonAnswer("A Stop nudge: the agent is sent back to finalize its report.", NudgeSchema, {
          decision: "block",
          reason:
            'mam: attempt 1 has no finalized report. Write your report to report-final.md, then run mam finalize --job "$MAM_JOB" --attempt "$MAM_ATTEMPT" --report report-final.md and stop again.',
        }),
      },
      "x-mam-body": "scanned",
    },
    [
      404,
      exampleProblem("observation.mismatch", "session_id does not match attempt 1's recorded dispatch (another session's observation)", {
        issues: [{ path: "body.session_id", message: "does not match the recorded dispatch" }],
      }),
    ],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const principal = principalOf(c);
    if (principal.kind !== "agent") throw new MamError("auth.forbidden", "only an agent's token posts hook events");
    const { agent } = c.req.valid("param");
    const upload = c.var.upload;
    if (upload === undefined) throw new MamError("internal", "the hook route ran without its body middleware");
    let scanned: Awaited<ReturnType<typeof scanHookJson>>;
    try {
      scanned = await upload.pipeTo((body) => scanHookJson(body instanceof Uint8Array ? [body] : body, HOOK_ALLOWLISTS[agent]));
    } catch (e) {
      if (!(e instanceof HookJsonError)) throw e;
      throw new MamError("input.invalid", `the hook event is not one JSON object: ${e.message}`, {
        issues: [{ path: "body", message: e.message }],
      });
    }
    const event = HOOK_READERS[agent](scanned);
    const answer = await recordHookEvent(deps, { jobId: principal.jobId, attemptId: principal.attemptId }, event, actorOf(principal));
    if (answer.kind === "nudge") return c.json({ decision: answer.decision, reason: answer.reason }, 200);
    return c.body(null, 204);
  },
);
