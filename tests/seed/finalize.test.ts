/** Seed section 2: finalize — the agent declares, the reader re-derives. */
import { rm } from "node:fs/promises";
import {
  attemptReportLocation,
  type Deps,
  finalizeReport,
  MamError,
  parseSideEffects,
  REPORT_NAME,
  STAGED_REPORT_NAME,
  sha256Hex,
  verifyManifest,
} from "@mam/core";
import { describe, expect, it } from "vitest";
import { rejection } from "../support/rejection.ts";
import { tempDir } from "../support/temp-dir.ts";
import { describeBackends } from "./harness.ts";
import { MANIFEST_FILE, utf8 } from "./scenario.ts";

/** The seed's `job1`, attempt 1, at the location the service would derive for it. */
const JOB = "job1";
const LOCATION = attemptReportLocation(JOB, 1);

/** The seed's `_report`: a report body, final or staged. */
async function report(deps: Deps, body = "done\n", staged = false): Promise<void> {
  await deps.reports.put(LOCATION, staged ? STAGED_REPORT_NAME : REPORT_NAME, utf8(body));
}

async function finalize(deps: Deps, sideEffects: readonly unknown[] = [], jobId = JOB, attemptId = 1) {
  return finalizeReport(deps.reports, deps.clock, { location: LOCATION, jobId, attemptId, sideEffects });
}

/** Rewrite the stored manifest by hand, as the seed does through `manifest_in`. */
async function forgeManifest(deps: Deps, edit: (m: Record<string, unknown>) => void): Promise<void> {
  const raw = await deps.reports.getBytes(LOCATION, MANIFEST_FILE);
  expect(raw, "the manifest to forge exists").toBeDefined();
  const manifest = JSON.parse(new TextDecoder().decode(raw)) as Record<string, unknown>;
  edit(manifest);
  await deps.reports.put(LOCATION, MANIFEST_FILE, utf8(JSON.stringify(manifest)));
}

async function expectSideEffectError(fn: () => unknown): Promise<void> {
  const thrown = await rejection(fn);
  expect(thrown).toBeInstanceOf(MamError);
  expect((thrown as MamError).code).toBe("input.sideEffect");
}

describe("seed 2: finalize (pure)", () => {
  it("B-11 a side-effect argument must be kind=reference: nokey and kind= are bad input", async () => {
    await expectSideEffectError(() => parseSideEffects(["nokey"]));
    await expectSideEffectError(() => parseSideEffects(["kind="]));
    expect(parseSideEffects(["git_push=abc123"])).toEqual([{ kind: "git_push", reference: "abc123" }]);
  });
});

describeBackends("seed 2: finalize", (backend) => {
  it("B-06 a staged report is promoted atomically and the manifest's sha256 is the promoted bytes' hash", async () => {
    const deps = backend().deps();
    const body = "final body\n";
    await report(deps, body, true);
    expect(await deps.reports.exists(LOCATION, REPORT_NAME)).toBe(false);
    expect(await deps.reports.exists(LOCATION, STAGED_REPORT_NAME)).toBe(true);

    const { manifest } = await finalize(deps);
    expect(await deps.reports.exists(LOCATION, REPORT_NAME)).toBe(true);
    expect(await deps.reports.exists(LOCATION, STAGED_REPORT_NAME)).toBe(false);
    const stored = await deps.reports.hash(LOCATION, REPORT_NAME);
    expect(manifest.sha256).toBe(stored?.sha256);
    expect(manifest.sha256).toBe(sha256Hex(utf8(body)));
    expect(new TextDecoder().decode(await deps.reports.getBytes(LOCATION, REPORT_NAME))).toBe(body);
  });

  it("B-07 verification recomputes the hash: a manifest whose sha256 was edited has changed after finalization", async () => {
    const deps = backend().deps();
    await report(deps);
    await finalize(deps);
    expect((await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB })).ok).toBe(true);

    await forgeManifest(deps, (m) => {
      m.sha256 = "0".repeat(64);
    });
    const verdict = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB });
    expect(verdict.ok).toBe(false);
    expect(verdict.reason).toContain("changed after finalization");
  });

  it("B-08 a report rewritten after finalization fails verification: changed after finalization", async () => {
    const deps = backend().deps();
    await report(deps, "first\n");
    await finalize(deps);
    expect((await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB })).ok).toBe(true);

    await report(deps, "rewritten\n");
    const verdict = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB });
    expect(verdict.ok).toBe(false);
    expect(verdict.reason).toContain("changed after finalization");
  });

  it.each([
    { case: "another job", jobId: "other", attemptId: undefined, fragment: "belongs to job" },
    { case: "another attempt", jobId: JOB, attemptId: 9, fragment: "belongs to attempt" },
  ])("B-09 a manifest for $case is refused: $fragment", async ({ jobId, attemptId, fragment }) => {
    const deps = backend().deps();
    await report(deps);
    await finalize(deps);
    expect((await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB, attemptId: 1 })).ok).toBe(true);

    const verdict = await verifyManifest(deps.reports, { location: LOCATION, jobId, attemptId });
    expect(verdict.ok).toBe(false);
    expect(verdict.reason).toContain(fragment);
  });

  it("B-10 every expected artifact needs side-effect evidence: git_push passes, git_push + api_call fails naming api_call", async () => {
    const deps = backend().deps();
    await report(deps);
    await finalize(deps, parseSideEffects(["git_push=abc123"]));
    const ok = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB, expectedArtifacts: ["git_push"] });
    expect(ok.ok, ok.reason).toBe(true);

    const missing = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB, expectedArtifacts: ["git_push", "api_call"] });
    expect(missing.ok).toBe(false);
    expect(missing.reason).toContain("api_call");
  });

  it("B-12 verifying a location with no manifest is a refusal (no completion manifest), never a crash", async () => {
    const deps = backend().deps();
    const verdict = await verifyManifest(deps.reports, { location: attemptReportLocation("empty", 1), jobId: JOB });
    expect(verdict.ok).toBe(false);
    expect(verdict.reason).toContain("no completion manifest");
  });

  it.each([
    { case: "{kind} alone", entry: { kind: "deploy" } },
    { case: "a blank reference", entry: { kind: "deploy", reference: " " } },
    { case: "{reference} alone", entry: { reference: "abc" } },
    { case: "a non-object entry", entry: "not-an-object" },
  ])("B-15 a side effect with $case is refused when finalizing, and fails verification when hand-written", async ({ entry }) => {
    const deps = backend().deps();
    await report(deps);
    await expectSideEffectError(() => finalize(deps, [entry]));
    // refused before anything was written
    const none = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB });
    expect(none.reason).toContain("no completion manifest");

    // and a hand-written manifest holding it is rejected at verification too
    await finalize(deps, [{ kind: "deploy", reference: "sha" }]);
    expect((await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB, expectedArtifacts: ["deploy"] })).ok).toBe(true);
    await forgeManifest(deps, (m) => {
      m.side_effects = [entry];
    });
    const verdict = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB, expectedArtifacts: ["deploy"] });
    expect(verdict.ok).toBe(false);
  });

  it("B-16 the manifest records an absolute report location, and verification does not depend on the working directory", async () => {
    const b = backend();
    const deps = b.deps();
    const cwd = process.cwd();
    const elsewhere = (await tempDir("seed-cwd")).dir;
    try {
      await report(deps);
      process.chdir(elsewhere);
      const { manifest } = await finalize(deps);
      expect(b.isAbsoluteAddress(manifest.report_location), manifest.report_location).toBe(true);
      expect(manifest.report_location).toBe(deps.reports.describe(LOCATION, REPORT_NAME));

      process.chdir(cwd);
      const verdict = await verifyManifest(deps.reports, { location: LOCATION, jobId: JOB });
      expect(verdict.ok, verdict.reason).toBe(true);
    } finally {
      process.chdir(cwd);
      await rm(elsewhere, { recursive: true, force: true });
    }
  });
});
