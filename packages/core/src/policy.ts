import * as z from "zod";
import { DEFAULT_SETTLE_WINDOW_MS, evidenceFor } from "./allowlist.ts";
import { QUIESCENCE_RULES, type QuiescenceRule } from "./quiescence-rules.ts";
import type { Decision } from "./schemas.ts";
import { IsoTime } from "./schemas.ts";

/**
 * A scenario: what the watcher collected about one dispatch. Versioned; unknown
 * fields are kept and ignored (collectors add their own).
 */
const Identifiers = {
  job_id: z.string().min(1),
  attempt_id: z.number().int().min(1),
  agent_session_uuid: z.string().min(1),
  pane_process_generation: z.number().int().min(0),
  backend: z.string().min(1),
  pane_id: z.string().min(1),
};
export const IDENTIFIER_FIELDS = Object.keys(Identifiers) as (keyof typeof Identifiers)[];

export const ScenarioSchema = z.looseObject({
  schema: z.literal("mam.scenario/v1"),
  dispatch_context: z.looseObject(Identifiers),
  timeline: z.array(
    z.looseObject({
      at: IsoTime,
      source_kind: z.string().min(1),
      collector_attribution: z.looseObject(z.object(Identifiers).partial().shape).optional(),
      payload: z
        .looseObject({
          agent_status: z.string().optional(),
          job_id: z.string().optional(),
          report_manifest: z.unknown().optional(),
        })
        .optional(),
    }),
  ),
  filesystem: z.looseObject({ manifest_committed: z.boolean() }),
});
export type Scenario = z.infer<typeof ScenarioSchema>;

export const QUIESCENT_STATES = ["done", "idle"] as const;

export interface DecideContext {
  /** The dispatch's execution anchor: evidence from before it is ignored. */
  readonly notBefore?: string | undefined;
  /** The quiescence rules a `mam.scenario/v2` may be approved by (`Flags.quiescenceRules`); none when absent. */
  readonly rules?: readonly string[] | undefined;
}

/** The source kind of the one timeline item of a built scenario that is mam's own clock: when it was built. */
export const CLOCK_SOURCE_KIND = "mam.clock";

/**
 * A scenario mam built from what it recorded of the job's latest dispatch
 * (`buildScenario`, observations.ts): every observation with who recorded it and when
 * mam received it (`received_at`, the first receipt; `last_seen_at`, the last sighting
 * of a coalesced repeat), the report's state, an overflow if the attempt's evidence
 * passed a bound, and one item of its own source kind (`mam.clock`): when it was built.
 */
export const RecordedScenarioSchema = z.looseObject({
  schema: z.literal("mam.scenario/v2"),
  dispatch_context: z.looseObject({ ...Identifiers, pane_id: Identifiers.pane_id.optional() }),
  timeline: z.array(
    z.looseObject({
      source: z.string().min(1),
      source_kind: z.string().min(1),
      state: z.string().min(1),
      received_at: IsoTime,
      last_seen_at: IsoTime,
      sightings: z.number().int().min(1),
      agent_session_uuid: z.string().optional(),
      pane_process_generation: z.number().int().optional(),
      pane_id: z.string().optional(),
    }),
  ),
  filesystem: z.looseObject({ manifest_committed: z.boolean() }),
  evidence_overflow: z.looseObject({ source: z.string(), bound: z.string(), at: IsoTime }).optional(),
  /** The agent's session was cleared or forked (a Claude Code `SessionStart`): the dispatched conversation is over. */
  evidence_ended: z.looseObject({ source: z.string(), cause: z.string(), at: IsoTime }).optional(),
  /** What it was built from: the record's sequences and its observations' `rev`. */
  built_from: z
    .looseObject({ evidence_seq: z.number().int(), transition_seq: z.number().int(), observations_rev: z.number().int() })
    .optional(),
});
export type RecordedScenario = z.infer<typeof RecordedScenarioSchema>;

const hold = (reason: string): Decision => ({ decision: "hold", reason });

/**
 * Pure: no clock, every time it compares comes from the scenario. Holds unless
 * every identifier agrees with the dispatch context, a committed manifest was
 * observed, and the pane was seen quiescent after its last `working` in at least
 * two consecutive observations spanning the backend's settle window:
 *
 *   working ... working | idle ------------- idle      -> approve if span >= window
 *                       ^ first quiescent    ^ last
 */
export function decide(scenario: unknown, ctx: DecideContext = {}): Decision {
  if ((scenario as { schema?: unknown } | null)?.schema === "mam.scenario/v2") return decideRecorded(scenario, ctx);
  const parsed = ScenarioSchema.safeParse(scenario);
  if (!parsed.success) return invalid(parsed.error);
  const s = parsed.data;
  const ctxIds = s.dispatch_context;
  const notBefore = ctx.notBefore === undefined ? Number.NEGATIVE_INFINITY : Date.parse(ctx.notBefore);

  const timeline = s.timeline
    .map((item, index) => ({ item, index, t: Date.parse(item.at) }))
    .filter((o) => o.t >= notBefore)
    .sort((a, b) => a.t - b.t || a.index - b.index);

  for (const { item, index } of timeline) {
    const attribution = item.collector_attribution ?? {};
    for (const field of IDENTIFIER_FIELDS) {
      const v = attribution[field];
      if (v !== undefined && v !== ctxIds[field]) {
        return hold(
          `timeline[${index}].collector_attribution.${field} is ${JSON.stringify(v)}, but dispatch_context.${field} is ${JSON.stringify(ctxIds[field])}`,
        );
      }
    }
    const payloadJob = item.payload?.job_id;
    if (item.source_kind !== "herdr" && payloadJob !== undefined && payloadJob !== ctxIds.job_id) {
      return hold(
        `timeline[${index}].payload.job_id is ${JSON.stringify(payloadJob)}, but dispatch_context.job_id is ${JSON.stringify(ctxIds.job_id)}`,
      );
    }
  }

  const manifestSeen = s.filesystem.manifest_committed || timeline.some((o) => o.item.payload?.report_manifest != null);
  if (!manifestSeen) return hold("no committed report manifest was observed");

  const evidence = evidenceFor(ctxIds.backend);
  const quiescent: readonly string[] = evidence?.quiescentStates ?? QUIESCENT_STATES;
  const windowMs = evidence?.settleWindowMs ?? DEFAULT_SETTLE_WINDOW_MS;
  const pane = timeline.filter((o) => o.item.source_kind === "herdr" && typeof o.item.payload?.agent_status === "string");
  if (pane.length === 0) return hold("the pane was never observed (no herdr observation after the dispatch)");
  const lastWorking = pane.findLastIndex((o) => o.item.payload?.agent_status === "working");
  if (lastWorking < 0) return hold("the pane was never observed working after the dispatch");
  const after = pane.slice(lastWorking + 1);
  if (after.length === 0) return hold(`the pane is still working: last seen working at ${pane[lastWorking]?.item.at}`);
  const run: typeof after = [];
  for (const o of after) {
    if (!quiescent.includes(o.item.payload?.agent_status ?? "")) {
      return hold(`the pane is not quiescent: it was last seen ${o.item.payload?.agent_status} at ${o.item.at}`);
    }
    run.push(o);
  }
  const first = run[0];
  const last = run[run.length - 1];
  if (!first || !last || run.length < 2) {
    return hold(`the pane was not seen quiescent (${quiescent.join("/")}) in two consecutive observations after its last working`);
  }
  const span = last.t - first.t;
  if (span < windowMs) {
    return hold(`the pane has been quiescent for ${span / 1000}s, less than the ${windowMs / 1000}s settle window of ${ctxIds.backend}`);
  }
  return {
    decision: "candidate_approved",
    reason: `manifest committed; pane quiescent for ${span / 1000}s over ${run.length} observations after its last working`,
  };
}

function invalid(error: z.ZodError): Decision {
  const i = error.issues[0];
  const path = i
    ? i.path
        .map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`))
        .join("")
        .replace(/^\./, "")
    : "";
  return hold(`invalid scenario: ${path || "(root)"}: ${i?.message ?? "unreadable"}`);
}

type Item = RecordedScenario["timeline"][number];

/** mam's own clock item: its source kind, recorded by mam itself (no caller's observation is of a `mam.` kind). */
const isClock = (item: Item): boolean => item.source_kind === CLOCK_SOURCE_KIND && item.source === "mam";

/**
 * A `mam.scenario/v2` (what mam recorded), pure as `decide` is: every identifier of
 * every observation agrees with the dispatch context; the attempt's evidence did not
 * overflow; the report's manifest is committed; some source saw the agent working;
 * and one of the rules `ctx.rules` enables, for the context's backend, finds it
 * quiescent after the last sighting of `working` (by any source) across the settle
 * window. Every other observation after the quiescent one must be quiescent too.
 */
function decideRecorded(scenario: unknown, ctx: DecideContext): Decision {
  const parsed = RecordedScenarioSchema.safeParse(scenario);
  if (!parsed.success) return invalid(parsed.error);
  const s = parsed.data;
  const ids = s.dispatch_context;
  if (s.evidence_ended !== undefined) {
    const e = s.evidence_ended;
    return hold(
      `the agent's session was ${e.cause === "clear" ? "cleared" : "forked"} (${e.source}, SessionStart source ${e.cause}, at ${e.at}): what it did after is another conversation than the one dispatched, so this attempt's quiescence evidence ended; record a new dispatch to go on`,
    );
  }
  for (const [index, item] of s.timeline.entries()) {
    for (const field of ["agent_session_uuid", "pane_process_generation", "pane_id"] as const) {
      const v = item[field];
      if (v !== undefined && v !== ids[field]) {
        return hold(`timeline[${index}].${field} is ${JSON.stringify(v)}, but dispatch_context.${field} is ${JSON.stringify(ids[field])}`);
      }
    }
  }
  if (s.evidence_overflow !== undefined) {
    const o = s.evidence_overflow;
    return hold(
      `the attempt's evidence overflowed: ${o.source} passed its class's ${o.bound} bound at ${o.at}, so what was seen after is not recorded; the gate holds until the next dispatch`,
    );
  }
  if (!s.filesystem.manifest_committed) return hold("no committed report manifest was observed");
  const rules = QUIESCENCE_RULES.filter((r) => r.backends.includes(ids.backend));
  if (rules.length === 0) return hold(`backend ${JSON.stringify(ids.backend)} has no quiescence rule (no quiescent-state evidence)`);
  const enabled = rules.filter((r) => ctx.rules?.includes(r.name) === true);
  if (enabled.length === 0) {
    const off = rules.map((r) => `${r.name} (${r.evidence === "documented" ? "documented, not observed" : "observed"})`).join(", ");
    return hold(`no quiescence rule for ${ids.backend} is enabled: ${off}; MAM_AUTO_COMPLETE_SOURCES names the rules the gate may apply`);
  }
  const notBefore = ctx.notBefore === undefined ? Number.NEGATIVE_INFINITY : Date.parse(ctx.notBefore);
  const seen = s.timeline
    .map((item, index) => ({ item, index, first: Date.parse(item.received_at), last: Date.parse(item.last_seen_at) }))
    .filter((o) => !isClock(o.item) && o.first >= notBefore)
    .sort((a, b) => a.first - b.first || a.index - b.index);
  const clock = s.timeline.find(isClock);
  if (seen.length === 0) return hold(`nothing was observed of attempt ${ids.attempt_id} after its dispatch`);
  const working = seen.filter((o) => o.item.state === "working");
  if (working.length === 0) return hold("the agent was never observed working after the dispatch");
  const lastWorking = Math.max(...working.map((o) => o.last));
  const quiescent: readonly string[] = evidenceFor(ids.backend)?.quiescentStates ?? QUIESCENT_STATES;
  const windowMs = evidenceFor(ids.backend)?.settleWindowMs ?? DEFAULT_SETTLE_WINDOW_MS;
  const after = seen.filter((o) => o.first > lastWorking);
  // Every sighting after the last working counts, a coalesced repeat's too: a source whose
  // first `blocked` came before that working but which kept reporting it after is not settled.
  const unsettled = seen.find((o) => o.last > lastWorking && !quiescent.includes(o.item.state));
  if (unsettled !== undefined) {
    return hold(
      `${unsettled.item.source} saw ${unsettled.item.state} (${unsettled.item.source_kind}) at ${unsettled.item.last_seen_at}, after the last working`,
    );
  }
  const reasons: string[] = [];
  for (const rule of enabled) {
    const answer = applyRule(rule, after, seen, clock, windowMs, quiescent);
    if (answer.decision === "candidate_approved") return answer;
    reasons.push(`${rule.name}: ${answer.reason}`);
  }
  const off = rules.filter((r) => !enabled.includes(r));
  if (off.length > 0) {
    const names = off.map((r) => `${r.name}${r.evidence === "documented" ? " (documented, not observed)" : ""}`).join(", ");
    reasons.push(`not applied: ${names}; MAM_AUTO_COMPLETE_SOURCES names the rules the gate may apply`);
  }
  return hold(reasons.join("; "));
}

/** One rule on the observations after the last working (`after`, all quiescent), `seen` being all of them. */
function applyRule(
  rule: QuiescenceRule,
  after: readonly { item: Item; first: number; last: number }[],
  seen: readonly { item: Item; first: number; last: number }[],
  clock: Item | undefined,
  windowMs: number,
  quiescent: readonly string[],
): Decision {
  const mine = after.filter((o) => o.item.source_kind === rule.sourceKind && o.item.source.startsWith(`${rule.sourceClass}:`));
  if (mine.length === 0) return hold(`no ${rule.sourceClass} ${rule.sourceKind} observation saw it quiescent after the last working`);
  const approve = (span: number, sources: readonly string[], how: string): Decision => ({
    decision: "candidate_approved",
    reason: `manifest committed; quiescent for ${span / 1000}s (${how}) after the last working, by rule ${rule.name}`,
    rule: rule.name,
    sources: [...sources],
    quiescence: sources.every((src) => src.startsWith("agent:")) ? "agent-attested" : "watcher-observed",
  });
  if (rule.span === "polling") {
    // Each source on its own: its first quiescent receipt to its last sighting; mam's clock never closes it.
    let best = 0;
    for (const source of new Set(mine.map((o) => o.item.source))) {
      const own = mine.filter((o) => o.item.source === source);
      const sightings = own.reduce((n, o) => n + o.item.sightings, 0);
      const span = Math.max(...own.map((o) => o.last)) - Math.min(...own.map((o) => o.first));
      if (sightings >= 2 && span >= windowMs) return approve(span, [source], `${sightings} sightings by ${source}`);
      best = Math.max(best, span);
    }
    return hold(
      `quiescent for ${best / 1000}s by its last sighting, less than the ${windowMs / 1000}s settle window (mam's clock does not extend a watcher's span)`,
    );
  }
  // An event, closed by mam's clock: after it, only quiescent confirmations (an idle
  // prompt, the session's end, a watcher's idle), by any source; anything else after it
  // was refused above as unsettled, and a `working` would have moved the last working past it.
  const latest = mine[mine.length - 1] as { item: Item; first: number; last: number };
  const later = seen.find((o) => o !== latest && o.last > latest.first && !quiescent.includes(o.item.state));
  if (later !== undefined) {
    return hold(`${later.item.source} recorded ${later.item.state} at ${later.item.last_seen_at}, after ${rule.sourceKind}`);
  }
  if (clock === undefined)
    return hold(`mam's clock (${CLOCK_SOURCE_KIND}) is not in the scenario, so the span after ${rule.sourceKind} cannot be closed`);
  const span = Date.parse(clock.received_at) - latest.first;
  if (span < windowMs)
    return hold(`${span / 1000}s since ${rule.sourceKind} with nothing after it, less than the ${windowMs / 1000}s settle window`);
  return approve(span, [latest.item.source], `nothing recorded after ${rule.sourceKind}, closed by mam's clock`);
}
