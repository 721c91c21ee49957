import { DEFAULT_SETTLE_WINDOW_MS, EVIDENCE_BACKED_BACKENDS, evidenceFor } from "./allowlist.ts";
import type { ObservationSet, SourceClass } from "./schemas.ts";

/**
 * What may establish that an agent sat quiescent, per (backend, source kind): the
 * policy's rules for a scenario mam built from what it recorded (`mam.scenario/v2`).
 * Each rule names its evidence:
 * - `observed`: backed by recorded observations of real sessions (the allowlist's
 *   entries, each citing its fixture): on by default;
 * - `documented`: backed only by the agent's public documentation (what its hook or
 *   notify promises), never by a recorded session: off unless
 *   `MAM_AUTO_COMPLETE_SOURCES` names it.
 * A rule exists only for backends of the evidence-backed allowlist (B-19, B-20): no
 * configuration adds a backend, and `MAM_AUTO_COMPLETE_SOURCES` only opts a rule in
 * by name. How a rule's span is measured:
 * - `polling` (a watcher that reports what it sees, again and again): from the first
 *   quiescent receipt to the source's last sighting. mam's clock never closes it: a
 *   watcher that dies after posting idle proves nothing about the time after.
 * - `event` (a hook that fires once, when the agent stops): mam's clock may close it,
 *   but only if that quiescent observation is the last thing recorded of the attempt,
 *   by any source, for the whole settle window.
 *
 *   polling:  working .. idle(first receipt) ------ idle(last sighting)   span = last - first
 *   event:    working .. stop ----------------------------- now (mam)     span = now - stop, nothing after stop
 */
export interface QuiescenceRule {
  readonly name: string;
  readonly sourceClass: SourceClass;
  readonly sourceKind: string;
  readonly backends: readonly string[];
  readonly evidence: "observed" | "documented";
  readonly span: "polling" | "event";
  /** What backs it, in words a reader can check. */
  readonly basis: string;
}

export const QUIESCENCE_RULES: readonly QuiescenceRule[] = [
  {
    name: "watcher.pane_status",
    sourceClass: "watcher",
    sourceKind: "pane_status",
    backends: EVIDENCE_BACKED_BACKENDS,
    evidence: "observed",
    span: "polling",
    basis:
      "the seed's rule: a watcher's pane status, quiescent after its last working across the backend's settle window; each backend's quiescent states recorded in the allowlist (fixtures/watcher/quiescence/)",
  },
  {
    name: "agent.claude-code.stop",
    sourceClass: "agent",
    sourceKind: "hook.stop",
    backends: ["claude", "claude-code"].filter((b) => EVIDENCE_BACKED_BACKENDS.includes(b)),
    evidence: "documented",
    span: "event",
    basis:
      "Claude Code's hooks documentation: Stop fires when the main agent finishes responding; no recorded session backs it as quiescence",
  },
];

export const QUIESCENCE_RULE_NAMES: readonly string[] = QUIESCENCE_RULES.map((r) => r.name);

/**
 * The rules the gate may apply: every observed rule, and the documented ones
 * `MAM_AUTO_COMPLETE_SOURCES` names; with the variable set, only the rules it names.
 * Unknown names are refused at start-up (config.ts).
 */
export function enabledRules(named: readonly string[] | undefined): readonly string[] {
  if (named === undefined) return QUIESCENCE_RULES.filter((r) => r.evidence === "observed").map((r) => r.name);
  return QUIESCENCE_RULES.filter((r) => named.includes(r.name)).map((r) => r.name);
}

/** The quiescent states of `backend`, as its allowlist entry recorded them. */
export function quiescentStatesOf(backend: string): readonly string[] {
  return evidenceFor(backend)?.quiescentStates ?? [];
}

/**
 * When the scheduled evaluation should next try the gate on `set` (what mam recorded
 * of `backend`'s latest attempt) under the enabled `rules`: the first receipt of a
 * quiescent observation after the last sighting of `working`, by a source an enabled
 * rule reads, plus the backend's settle window — the earliest time any rule could
 * approve. None (null): nothing could approve until another observation arrives (no
 * working seen, a source still unsettled after it, no quiescent observation a rule
 * reads, or the evidence overflowed). A due time is only when to ask: the gate
 * decides, and a job the sweep finds held is cleared until its evidence moves. With
 * `source`, the receipts of that source alone: when its own span could cover the
 * window (a polling rule measures each source on its own).
 */
export function candidateDueOf(set: ObservationSet | undefined, backend: string, rules: readonly string[], source?: string): string | null {
  if (set === undefined || set.overflow !== undefined || set.ended !== undefined) return null;
  const readers = QUIESCENCE_RULES.filter((r) => r.backends.includes(backend) && rules.includes(r.name));
  if (readers.length === 0) return null;
  const quiescent = quiescentStatesOf(backend);
  const working = set.entries.filter((e) => e.state === "working");
  if (working.length === 0) return null;
  const lastWorking = Math.max(...working.map((e) => Date.parse(e.last_seen_received_at)));
  const unsettled = set.entries.some((e) => Date.parse(e.last_seen_received_at) > lastWorking && !quiescent.includes(e.state));
  if (unsettled) return null;
  const firsts = set.entries
    .filter(
      (e) =>
        (source === undefined || e.source === source) &&
        Date.parse(e.received_at) > lastWorking &&
        quiescent.includes(e.state) &&
        readers.some((r) => r.sourceKind === e.source_kind && e.source.startsWith(`${r.sourceClass}:`)),
    )
    .map((e) => Date.parse(e.received_at));
  if (firsts.length === 0) return null;
  const windowMs = evidenceFor(backend)?.settleWindowMs ?? DEFAULT_SETTLE_WINDOW_MS;
  return new Date(Math.min(...firsts) + windowMs).toISOString();
}
