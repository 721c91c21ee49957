import * as z from "zod";
import { DEFAULT_SETTLE_WINDOW_MS, evidenceFor } from "./allowlist.ts";
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
}

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
  const parsed = ScenarioSchema.safeParse(scenario);
  if (!parsed.success) {
    const i = parsed.error.issues[0];
    const path = i
      ? i.path
          .map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`))
          .join("")
          .replace(/^\./, "")
      : "";
    return hold(`invalid scenario: ${path || "(root)"}: ${i?.message ?? "unreadable"}`);
  }
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
