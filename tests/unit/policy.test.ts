/**
 * The policy against every watcher fixture (driven by expectations.json, and no
 * fixture left without an expectation), the quiescence evidence behind the
 * allowlist, and the rules that are not fixtures: notBefore, unknown fields,
 * unreadable input.
 */
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { EVIDENCE_BACKED_BACKENDS, policy, QUIESCENCE_EVIDENCE } from "@mam/core";
import { describe, expect, it } from "vitest";

const WATCHER = fileURLToPath(new URL("../../fixtures/watcher/", import.meta.url));
const QUIESCENCE = `${WATCHER}quiescence/`;

interface Expectation {
  readonly decision: "candidate_approved" | "hold";
  readonly reason_contains: string;
}

const expectations = JSON.parse(readFileSync(`${WATCHER}expectations.json`, "utf8")) as Record<string, Expectation>;
const jsonIn = (dir: string): string[] =>
  readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith(".json"))
    .map((e) => e.name.slice(0, -".json".length))
    .sort();
const scenarioFixtures = jsonIn(WATCHER).filter((n) => n !== "expectations");

// biome-ignore lint/suspicious/noExplicitAny: scenarios are edited freely here, as a collector's JSON would be
type Json = any;
const load = (file: string): Json => JSON.parse(readFileSync(file, "utf8"));
const reference = (): Json => load(`${WATCHER}finalized_candidate.json`);

describe("watcher fixtures", () => {
  it("every scenario fixture has an expectation, and every expectation has its fixture", () => {
    expect(scenarioFixtures.length).toBeGreaterThan(1);
    expect(Object.keys(expectations).sort()).toEqual(scenarioFixtures);
  });

  it("the reference scenario is approved and the others hold", () => {
    expect(expectations.finalized_candidate?.decision).toBe("candidate_approved");
    const holds = Object.entries(expectations).filter(([, e]) => e.decision === "hold");
    expect(holds.length).toBe(scenarioFixtures.length - 1);
  });

  it.each(Object.entries(expectations))("%s: decision and reason as expected", (name, expected) => {
    const decision = policy.decide(load(`${WATCHER}${name}.json`));
    expect(decision.decision).toBe(expected.decision);
    expect(decision.reason).toContain(expected.reason_contains);
  });

  it("each hold variant differs from the reference scenario (it tests something)", () => {
    const ref = JSON.stringify(reference());
    for (const name of scenarioFixtures.filter((n) => n !== "finalized_candidate")) {
      expect(JSON.stringify(load(`${WATCHER}${name}.json`)), name).not.toBe(ref);
    }
  });
});

describe("quiescence evidence (the allowlist, as data)", () => {
  const files = jsonIn(QUIESCENCE);

  it("the allowlist is exactly the backends with an evidence entry, and matches DESIGN.md", () => {
    expect([...EVIDENCE_BACKED_BACKENDS].sort()).toEqual(QUIESCENCE_EVIDENCE.map((e) => e.backend).sort());
    expect([...EVIDENCE_BACKED_BACKENDS].sort()).toEqual(["claude", "claude-code", "codex", "grok"]);
  });

  it("each evidence entry has its fixture file, and no fixture lacks an entry", () => {
    expect(QUIESCENCE_EVIDENCE.map((e) => e.fixture.replace(/\.json$/, "")).sort()).toEqual(files);
    for (const e of QUIESCENCE_EVIDENCE) {
      expect(e.fixture, e.backend).toBe(`${e.backend}.json`);
      expect(e.source.length, `${e.backend} cites its source`).toBeGreaterThan(0);
      expect(e.quiescentStates.length, `${e.backend} names the states observed`).toBeGreaterThan(0);
      expect(Number.isNaN(Date.parse(e.observedAt)), `${e.backend} says when`).toBe(false);
      expect(e.collector.length, `${e.backend} says by which collector`).toBeGreaterThan(0);
    }
  });

  it.each(QUIESCENCE_EVIDENCE.map((e) => [e.backend, e] as const))(
    "%s: its recorded observations are approved, for that backend, in the states it names",
    (backend, entry) => {
      const scenario = load(`${QUIESCENCE}${entry.fixture}`);
      expect(scenario.dispatch_context.backend).toBe(backend);
      const decision = policy.decide(scenario);
      expect(decision.decision, decision.reason).toBe("candidate_approved");
      const seen = new Set(
        scenario.timeline
          .filter((o: Json) => o.source_kind === "herdr" && o.payload?.agent_status !== "working")
          .map((o: Json) => o.payload.agent_status),
      );
      for (const state of seen) expect(entry.quiescentStates).toContain(state);
    },
  );
});

describe("rules the fixtures do not show", () => {
  it("notBefore drops observations from before the execution anchor", () => {
    // Everything from 10:05:25 on is idle: with the anchor there, the pane was never seen working.
    const late = policy.decide(reference(), { notBefore: "2026-11-20T10:05:25Z" });
    expect(late.decision).toBe("hold");
    expect(late.reason).toContain("never observed working");

    // A contradicting observation before the anchor no longer counts.
    const scenario = reference();
    scenario.timeline.unshift({
      at: "2026-11-20T09:00:00Z",
      source_kind: "herdr",
      collector_attribution: { ...scenario.dispatch_context, attempt_id: 7 },
      payload: { agent_status: "idle" },
    });
    expect(policy.decide(scenario).reason).toContain("attempt_id");
    expect(policy.decide(scenario, { notBefore: "2026-11-20T09:59:00Z" }).decision).toBe("candidate_approved");

    // A manifest observed only before the anchor is no manifest.
    const stale = reference();
    stale.filesystem.manifest_committed = false;
    for (const o of stale.timeline) if (o.payload?.report_manifest) o.at = "2026-11-20T09:58:00Z";
    expect(policy.decide(stale).decision).toBe("candidate_approved");
    const held = policy.decide(stale, { notBefore: "2026-11-20T09:59:00Z" });
    expect(held.decision).toBe("hold");
    expect(held.reason).toContain("manifest");
  });

  it("unknown fields are kept and ignored, at every level", () => {
    const plain = policy.decide(reference());
    const scenario = reference();
    scenario.collector_extra = { version: 9 };
    scenario.dispatch_context.tmux_socket = "/tmp/tmux-1000/default";
    scenario.filesystem.inode = 1234;
    for (const o of scenario.timeline) {
      o.sampled_by = "collector-7";
      o.collector_attribution.host = "build-3";
      o.payload.cpu = 0.01;
    }
    expect(policy.decide(scenario)).toEqual(plain);
    expect(plain.decision).toBe("candidate_approved");
  });

  it.each([null, undefined, "a string", 42, true, [], [reference()]])("a non-object scenario (%j) holds: invalid scenario", (input) => {
    const decision = policy.decide(input);
    expect(decision.decision).toBe("hold");
    expect(decision.reason).toContain("invalid scenario");
  });

  it("a timestamp without a zone is unreadable: invalid scenario naming the path", () => {
    const scenario = reference();
    scenario.timeline[1].at = "2026-11-20 10:04:10";
    const decision = policy.decide(scenario);
    expect(decision.decision).toBe("hold");
    expect(decision.reason).toContain("invalid scenario: timeline[1].at");
  });

  it("is pure: deciding twice on the same input gives the same answer and does not change the input", () => {
    const scenario = reference();
    const copy = JSON.stringify(scenario);
    expect(policy.decide(scenario)).toEqual(policy.decide(scenario));
    expect(JSON.stringify(scenario)).toBe(copy);
  });
});
