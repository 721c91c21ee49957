/**
 * The evidence-backed allowlist, as data. A backend may be auto-completed from
 * stillness only if its quiescent state was actually observed: each entry cites the
 * observations that back it (which pane states were seen, when, by which
 * collector) and names a scenario fixture of its own under
 * `fixtures/watcher/quiescence/`. The allowlist is exactly the set of entries here;
 * configuration may narrow it (MAM_AUTO_COMPLETE_BACKENDS) but never widen it.
 * Keys match exactly: `codexish` does not inherit `codex`'s evidence (B-32).
 */
export interface QuiescenceEvidence {
  readonly backend: string;
  /** Where the evidence comes from. */
  readonly source: string;
  /** Pane states observed while the agent sat finished. */
  readonly quiescentStates: readonly ("done" | "idle")[];
  readonly observedAt: string;
  readonly collector: string;
  /** How long the pane must stay quiescent before stillness counts (ms). */
  readonly settleWindowMs: number;
  /** The scenario fixture recording it, relative to fixtures/watcher/quiescence/. */
  readonly fixture: string;
}

export const DEFAULT_SETTLE_WINDOW_MS = 30_000;

export const QUIESCENCE_EVIDENCE: readonly QuiescenceEvidence[] = [
  {
    backend: "claude",
    source: "original system, phase 2b quiescence evidence (seed tests g9/o4; SEED-BEHAVIOURS B-19, B-32)",
    quiescentStates: ["idle", "done"],
    observedAt: "2026-10-02T09:14:00Z",
    collector: "herdr pane-state collector",
    settleWindowMs: DEFAULT_SETTLE_WINDOW_MS,
    fixture: "claude.json",
  },
  {
    backend: "claude-code",
    source: "original system, phase 2b quiescence evidence (seed tests gate_commits/g9; SEED-BEHAVIOURS B-17, B-19)",
    quiescentStates: ["idle", "done"],
    observedAt: "2026-10-02T09:20:00Z",
    collector: "herdr pane-state collector",
    settleWindowMs: DEFAULT_SETTLE_WINDOW_MS,
    fixture: "claude-code.json",
  },
  {
    backend: "codex",
    source: "original system, phase 2b quiescence evidence (seed test o4: prefix names do not inherit it; SEED-BEHAVIOURS B-32)",
    quiescentStates: ["idle"],
    observedAt: "2026-10-03T14:02:00Z",
    collector: "herdr pane-state collector",
    settleWindowMs: DEFAULT_SETTLE_WINDOW_MS,
    fixture: "codex.json",
  },
  {
    backend: "grok",
    source: "original system, phase 2b quiescence evidence (seed test o4: prefix names do not inherit it; SEED-BEHAVIOURS B-32)",
    quiescentStates: ["idle", "done"],
    observedAt: "2026-10-03T15:40:00Z",
    collector: "herdr pane-state collector",
    settleWindowMs: 45_000,
    fixture: "grok.json",
  },
];

export const EVIDENCE_BACKED_BACKENDS: readonly string[] = QUIESCENCE_EVIDENCE.map((e) => e.backend);

export function evidenceFor(backend: string): QuiescenceEvidence | undefined {
  return QUIESCENCE_EVIDENCE.find((e) => e.backend === backend);
}

/**
 * The backends auto-completion may act on: the evidence-backed set, narrowed by the
 * configured list when there is one. Unobserved names in the list are dropped.
 * Order follows the configured list (B-20: `claude,hermes,opencode` gives `(claude)`).
 */
export function allowedBackends(narrowing: readonly string[] | undefined): readonly string[] {
  if (narrowing === undefined) return EVIDENCE_BACKED_BACKENDS;
  return [...new Set(narrowing)].filter((b) => EVIDENCE_BACKED_BACKENDS.includes(b));
}
