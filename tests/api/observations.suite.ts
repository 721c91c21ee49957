import { createHmac, randomUUID } from "node:crypto";
import { OBSERVATION_BOUNDS } from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import { type Harness, type HarnessOptions, makeHarness, type PortsFactory, type Res, SIGNING_KEY } from "./harness.ts";

const PROBLEM = /^application\/problem\+json/;
const ANCHOR = "2026-11-20T10:00:00.000Z";

/** An operator token as mam minted them before the `observe` scope existed: no `sv` claim. */
function legacyOperatorToken(scopes: readonly string[], jti: string): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ iss: "mam", kind: "operator", jti, iat: 1_700_000_000, scopes })}`;
  return `${body}.${createHmac("sha256", SIGNING_KEY).update(body).digest("base64url")}`;
}

/**
 * Observations mam records itself (issue 20), through `POST /v1/jobs/{id}/observations`
 * on every adapter family: who recorded one is set from the token, when from mam's
 * clock; a repeat is coalesced; each source class is bounded; every refusal writes
 * nothing (the job record and its event log unchanged), but for the overflow mark past
 * a bound, written once.
 */
export function apiObservationSuite(name: string, factory: PortsFactory): void {
  describe(`observations, over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}) => makeHarness(factory, opts, cleanup);

    interface Dispatched {
      readonly jobId: string;
      readonly session: string;
      readonly agent: string;
      readonly watcher: string;
    }

    async function dispatched(h: Harness, opts: { agent?: string; pane?: boolean } = {}): Promise<Dispatched> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const reg = await h.call("POST", "/v1/jobs", {
        token: h.operator,
        json: { job_id: jobId, prompt: "p", agent: opts.agent ?? "claude-code" },
      });
      expect(reg.status, reg.text).toBe(201);
      const session = randomUUID();
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: {
          attempt_id: 1,
          agent_session_uuid: session,
          pane_process_generation: 3,
          ...(opts.pane === false ? {} : { pane_id: "%12" }),
          anchor: { started_at: ANCHOR },
        },
      });
      expect(res.status, res.text).toBe(201);
      return { jobId, session, agent: res.body.agent_token, watcher: h.tokens.mintOperator(["observe"], { name: "herdr-1" }) };
    }

    const seen = (d: Dispatched, state: string, extra: Record<string, unknown> = {}) => ({
      state,
      source_kind: "pane_status",
      attempt_id: 1,
      agent_session_uuid: d.session,
      pane_process_generation: 3,
      pane_id: "%12",
      observed_at: "2026-11-20T10:09:59.000Z",
      ...extra,
    });

    const observe = (h: Harness, d: Dispatched, token: string, body: unknown, jobId = d.jobId) =>
      h.call("POST", `/v1/jobs/${jobId}/observations`, { token, json: body });

    /** The job as the store holds it and its event log: what a refusal leaves as it was. */
    async function fingerprint(h: Harness, jobId: string): Promise<unknown> {
      const record = (await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body;
      const events = await h.call("GET", `/v1/jobs/${jobId}/events?limit=200`, { token: h.operator });
      return { record, events: events.body };
    }

    function expectProblem(res: Res, status: number, code: string, path?: string): void {
      expect(res.status, res.text).toBe(status);
      expect(res.headers.get("content-type")).toMatch(PROBLEM);
      expect(res.body.code).toBe(code);
      if (path !== undefined) expect(res.body.errors.map((i: { path: string }) => i.path)).toContain(path);
    }

    it("a watcher token records watcher:<its name> at mam's clock, an agent token agent:<the job's backend>; a repeat of a source's last state is coalesced (200: last_seen_received_at moves, nothing bumped)", async () => {
      const h = await harness();
      const d = await dispatched(h);
      const start = (await h.call("GET", `/v1/jobs/${d.jobId}`, { token: h.operator })).body.evidence_seq;
      const working = await observe(h, d, d.watcher, seen(d, "working"));
      expect(working.status, working.text).toBe(201);
      expect(working.body).toMatchObject({
        coalesced: false,
        evidence_seq: start + 1,
        observation: { seq: 1, source: "watcher:herdr-1", state: "working", received_at: h.clock.now().toISOString(), sightings: 1 },
      });
      h.clock.advance(1000);
      const idle = await observe(h, d, d.watcher, seen(d, "idle"));
      expect(idle.status, idle.text).toBe(201);
      expect(idle.body.observation).toMatchObject({ seq: 2, state: "idle" });
      h.clock.advance(40_000);
      const again = await observe(h, d, d.watcher, seen(d, "idle", { observed_at: "2026-11-20T10:10:40.000Z" }));
      expect(again.status, again.text).toBe(200);
      expect(again.body).toMatchObject({
        coalesced: true,
        evidence_seq: start + 2,
        observation: {
          seq: 2,
          received_at: idle.body.observation.received_at,
          last_seen_received_at: h.clock.now().toISOString(),
          sightings: 2,
        },
      });
      // The agent's own hook: its source is the job's backend, from the record, never the body.
      const hook = await observe(h, d, d.agent, { ...seen(d, "done"), source_kind: "hook.stop" });
      expect(hook.status, hook.text).toBe(201);
      expect(hook.body.observation).toMatchObject({ seq: 3, source: "agent:claude-code", source_kind: "hook.stop" });
      const record = (await h.call("GET", `/v1/jobs/${d.jobId}`, { token: h.operator })).body;
      expect(record.observations.entries.map((e: { source: string; state: string }) => `${e.source}/${e.state}`)).toEqual([
        "watcher:herdr-1/working",
        "watcher:herdr-1/idle",
        "agent:claude-code/done",
      ]);
      expect(record.transition_seq).toBe(0);
    });

    it("the observe scope: a token without it is 403; the bootstrap token of an older data dir gains it; an unnamed watcher token records its id", async () => {
      const h = await harness();
      const d = await dispatched(h);
      const reader = h.tokens.mintOperator(["read", "write", "gate"]);
      expectProblem(await observe(h, d, reader, seen(d, "idle")), 403, "auth.forbidden");
      // A token minted since observe exists names exactly its scopes: the four others do not grant it.
      expectProblem(await observe(h, d, h.tokens.mintOperator(["read", "write", "gate", "ops"]), seen(d, "idle")), 403, "auth.forbidden");
      // The bootstrap token of an older data dir: every scope there was then, no `sv` claim. It gains observe.
      const older = legacyOperatorToken(["read", "write", "gate", "ops"], "bootstrap-1");
      const res = await observe(h, d, older, seen(d, "idle"));
      expect(res.status, res.text).toBe(201);
      expect(res.body.observation.source).toBe("watcher:bootstrap-1");
      // An older token with fewer scopes gains nothing.
      expectProblem(await observe(h, d, legacyOperatorToken(["read", "gate"], "old-reader"), seen(d, "idle")), 403, "auth.forbidden");
    });

    it("refusals write nothing: another attempt, session, generation or pane; a retired token; another job's token; backdated or from the future; oversized; a body claiming who recorded it or when it was received; a terminal job", async () => {
      const h = await harness();
      const d = await dispatched(h);
      const other = await dispatched(h);
      expect((await observe(h, d, d.watcher, seen(d, "working"))).status).toBe(201);
      const before = await fingerprint(h, d.jobId);
      const cases: [string, () => Promise<Res>, number, string, string?][] = [
        [
          "another session",
          () => observe(h, d, d.watcher, seen(d, "idle", { agent_session_uuid: randomUUID() })),
          409,
          "observation.mismatch",
          "body.agent_session_uuid",
        ],
        [
          "another generation",
          () => observe(h, d, d.watcher, seen(d, "idle", { pane_process_generation: 4 })),
          409,
          "observation.mismatch",
          "body.pane_process_generation",
        ],
        ["another pane", () => observe(h, d, d.watcher, seen(d, "idle", { pane_id: "%13" })), 409, "observation.mismatch", "body.pane_id"],
        [
          "a watcher naming no generation",
          () => observe(h, d, d.watcher, seen(d, "idle", { pane_process_generation: undefined })),
          409,
          "observation.mismatch",
          "body.pane_process_generation",
        ],
        ["an attempt not dispatched", () => observe(h, d, d.watcher, seen(d, "idle", { attempt_id: 2 })), 404, "dispatch.notFound"],
        ["an agent naming another attempt", () => observe(h, d, d.agent, seen(d, "idle", { attempt_id: 2 })), 403, "auth.forbidden"],
        ["another job's agent token", () => observe(h, d, other.agent, seen(d, "idle")), 403, "auth.forbidden"],
        [
          "from the future",
          () => observe(h, d, d.watcher, seen(d, "idle", { observed_at: "2026-11-20T10:10:06.000Z" })),
          400,
          "input.invalid",
          "body.observed_at",
        ],
        [
          "backdated before the dispatch",
          () => observe(h, d, d.watcher, seen(d, "idle", { observed_at: "2026-11-20T09:59:59.000Z" })),
          400,
          "input.invalid",
          "body.observed_at",
        ],
        [
          "the 2031 clock",
          () => observe(h, d, d.watcher, seen(d, "idle", { observed_at: "2031-01-01T00:00:00.000Z" })),
          400,
          "input.invalid",
          "body.observed_at",
        ],
        [
          "oversized",
          () => observe(h, d, d.watcher, seen(d, "idle", { agent_session_uuid: "s".repeat(129) })),
          400,
          "input.invalid",
          "body.agent_session_uuid",
        ],
        ["an unknown state", () => observe(h, d, d.watcher, seen(d, "asleep")), 400, "input.invalid", "body.state"],
        [
          "mam's own source kind",
          () => observe(h, d, d.watcher, seen(d, "idle", { source_kind: "mam.clock" })),
          400,
          "input.invalid",
          "body.source_kind",
        ],
        [
          "a body claiming its source",
          () => observe(h, d, d.watcher, seen(d, "idle", { source: "watcher:someone-else" })),
          400,
          "input.invalid",
          "body.source",
        ],
        [
          "a body claiming who recorded it",
          () => observe(h, d, d.agent, seen(d, "idle", { recorded_by: "watcher:herdr-1" })),
          400,
          "input.invalid",
          "body.recorded_by",
        ],
        [
          "a body claiming when it was received",
          () => observe(h, d, d.watcher, seen(d, "idle", { received_at: "2026-11-20T10:10:00.000Z" })),
          400,
          "input.invalid",
          "body.received_at",
        ],
      ];
      for (const [what, send, status, code, path] of cases) {
        const res = await send();
        expectProblem(res, status, code, path);
        expect(res.body.detail, what).not.toMatch(/at \S+\.ts|node_modules/);
        expect(await fingerprint(h, d.jobId), `${what} wrote nothing`).toEqual(before);
      }
      // The skew is named, with the variable to change.
      const future = await observe(h, d, d.watcher, seen(d, "idle", { observed_at: "2026-11-20T10:10:06.000Z" }));
      expect(future.body.detail).toContain("MAM_OBSERVATION_SKEW_SECONDS");
      // A dispatch of attempt 2 retires attempt 1: its observations are refused, its agent token too.
      const second = await h.call("POST", `/v1/jobs/${d.jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 2, agent_session_uuid: d.session, pane_process_generation: 3, pane_id: "%12", anchor: { started_at: ANCHOR } },
      });
      expect(second.status, second.text).toBe(201);
      const retired = await fingerprint(h, d.jobId);
      expectProblem(await observe(h, d, d.watcher, seen(d, "idle")), 409, "observation.mismatch", "body.attempt_id");
      expectProblem(await observe(h, d, d.agent, seen(d, "idle")), 403, "auth.forbidden");
      expect(await fingerprint(h, d.jobId)).toEqual(retired);
      // A terminal job takes none.
      const cancel = await h.call("POST", `/v1/jobs/${d.jobId}/transitions`, {
        token: h.operator,
        json: { action: "cancel", expected_seq: retired && (retired as { record: { transition_seq: number } }).record.transition_seq },
      });
      expect(cancel.status, cancel.text).toBe(200);
      const ended = await fingerprint(h, d.jobId);
      expectProblem(await observe(h, d, d.watcher, seen(d, "idle", { attempt_id: 2 })), 409, "job.transitionRefused");
      expect(await fingerprint(h, d.jobId)).toEqual(ended);
    });

    it("a watcher's observation of a dispatch that recorded no pane names none; one naming a pane is refused", async () => {
      const h = await harness();
      const d = await dispatched(h, { pane: false });
      const before = await fingerprint(h, d.jobId);
      expectProblem(await observe(h, d, d.watcher, seen(d, "idle")), 409, "observation.mismatch", "body.pane_id");
      expect(await fingerprint(h, d.jobId)).toEqual(before);
      expect((await observe(h, d, d.watcher, seen(d, "idle", { pane_id: undefined }))).status).toBe(201);
    });

    it("bounded per source class: an agent past its bound is 429 quota.observations, stores nothing of it, marks the attempt overflowed once; a watcher's observations are still recorded", async () => {
      const h = await harness();
      const d = await dispatched(h);
      const bound = OBSERVATION_BOUNDS.agent.count;
      for (let i = 0; i < bound; i++) {
        const res = await observe(h, d, d.agent, { ...seen(d, i % 2 === 0 ? "working" : "idle"), source_kind: "hook.event" });
        expect(res.status, res.text).toBe(201);
      }
      const full = (await fingerprint(h, d.jobId)) as {
        record: Record<string, unknown> & { observations: Record<string, unknown> };
        events: unknown;
      };
      const over = await observe(h, d, d.agent, { ...seen(d, bound % 2 === 0 ? "working" : "idle"), source_kind: "hook.event" });
      expectProblem(over, 429, "quota.observations");
      expect(over.body.detail).toContain(`${bound} observations`);
      const marked = (await fingerprint(h, d.jobId)) as typeof full;
      // The one write: the overflow mark and the evidence bump, nothing of the state itself.
      expect(marked.record.observations.overflow).toEqual({ source: "agent:claude-code", bound: "count", at: h.clock.now().toISOString() });
      expect(marked.record.observations.entries).toEqual(full.record.observations.entries);
      expect(marked.record.evidence_seq).toBe((full.record.evidence_seq as number) + 1);
      expect(marked.events).toEqual(full.events);
      // Past the bound again: nothing more is written.
      expectProblem(await observe(h, d, d.agent, { ...seen(d, "blocked"), source_kind: "hook.event" }), 429, "quota.observations");
      expect(await fingerprint(h, d.jobId)).toEqual(marked);
      // A repeat of the agent's last state is still coalesced (it adds nothing).
      const repeat = await observe(h, d, d.agent, { ...seen(d, bound % 2 === 0 ? "idle" : "working"), source_kind: "hook.event" });
      expect(repeat.status, repeat.text).toBe(200);
      // The watcher's class is its own.
      const watcher = await observe(h, d, d.watcher, seen(d, "idle"));
      expect(watcher.status, watcher.text).toBe(201);
      expect(watcher.body.observation.source).toBe("watcher:herdr-1");
    });

    const hook = (h: Harness, token: string, agent: string, event: Record<string, unknown>) =>
      h.call("POST", `/v1/hooks/${agent}`, { token, body: JSON.stringify(event) });

    it("issue 21: hook events are stored as observations on every store: a Stop's allowlisted details, a Codex thread bound once, a cleared session's end, a nudge counted", async () => {
      const h = await harness({ env: { MAM_AUTO_COMPLETE: "1" } });
      const d = await dispatched(h);
      const op = h.operator;
      const claim = await h.call("POST", `/v1/jobs/${d.jobId}/transitions`, { token: op, json: { action: "claim", expected_seq: 0 } });
      expect(claim.status, claim.text).toBe(200);
      const progress = await h.call("POST", `/v1/jobs/${d.jobId}/transitions`, {
        token: op,
        json: { action: "progress", expected_seq: claim.body.transition_seq, fields: { auto_complete: true, nudge_on_stop: true } },
      });
      expect(progress.status, progress.text).toBe(200);
      expect(
        (
          await hook(h, d.agent, "claude-code", {
            hook_event_name: "PostToolUse",
            session_id: d.session,
            tool_response: "x".repeat(100_000),
          })
        ).status,
      ).toBe(204);
      const stop = await hook(h, d.agent, "claude-code", {
        hook_event_name: "Stop",
        session_id: d.session,
        stop_hook_active: false,
        last_assistant_message: "SECRET",
        background_tasks: [],
        session_crons: [],
      });
      expect(stop.status, stop.text).toBe(200);
      expect(stop.body.decision).toBe("block");
      expect(
        (await hook(h, d.agent, "claude-code", { hook_event_name: "SessionStart", session_id: "another", source: "clear" })).status,
      ).toBe(204);
      const record = (await h.call("GET", `/v1/jobs/${d.jobId}`, { token: op })).body;
      expect(record.observations).toMatchObject({ nudges: 1, ended: { cause: "clear", source: "agent:claude-code" } });
      expect(record.observations.entries.map((e: { source_kind: string }) => e.source_kind)).toEqual([
        "hook.activity",
        "hook.stop",
        "hook.session_start",
      ]);
      expect(record.observations.entries[1].hook).toEqual({
        event: "Stop",
        stop_hook_active: false,
        background_tasks: [],
        session_crons: 0,
      });
      expect(JSON.stringify(record)).not.toContain("SECRET");

      const c = await dispatched(h, { agent: "codex" });
      const turn = { type: "agent-turn-complete", "thread-id": "thread-1", "turn-id": "t1", "input-messages": ["SECRET"] };
      expect((await hook(h, c.agent, "codex", turn)).status).toBe(204);
      const before = await fingerprint(h, c.jobId);
      expectProblem(await hook(h, c.agent, "codex", { ...turn, "thread-id": "thread-2" }), 409, "observation.mismatch");
      expect(await fingerprint(h, c.jobId)).toEqual(before);
      const bound = (await h.call("GET", `/v1/jobs/${c.jobId}`, { token: op })).body.observations;
      expect(bound.bound_session).toMatchObject({ id: "thread-1", field: "thread-id" });
      expect(bound.entries).toEqual([expect.objectContaining({ source_kind: "turn_end", state: "idle", agent_session_uuid: c.session })]);
    });
  });
}
