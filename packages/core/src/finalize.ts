import { createHash } from "node:crypto";
import * as z from "zod";
import { MamError } from "./errors.ts";
import type { Clock, ReportStore } from "./ports.ts";
import { AttemptId, IsoTime, JobId, type SideEffect, SideEffectSchema, zodIssues } from "./schemas.ts";

/**
 * The completion manifest has one author (B-02): its name and format are defined
 * here, only `finalizeReport` writes it and only `verifyManifest` reads it.
 * Adapters store the bytes they are handed under the name they are handed.
 *
 * The agent declares (finalize); the reader re-derives (verify): the hash is
 * recomputed from the stored report every time, so a manifest cannot certify
 * itself, and a report rewritten after finalization is void at once.
 */
const MANIFEST_NAME = "report-manifest.json";
export const REPORT_NAME = "report-final.md";
export const STAGED_REPORT_NAME = `${REPORT_NAME}.tmp`;
const MANIFEST_SCHEMA_ID = "mam.manifest/v1";

export const ManifestSchema = z.strictObject({
  schema: z.literal(MANIFEST_SCHEMA_ID),
  job_id: JobId,
  attempt_id: AttemptId,
  /** The absolute address of the report when it was finalized: a claim to check, never an address to follow. */
  report_location: z.string().min(1),
  sha256: z.string().regex(/^[0-9a-f]{64}$/, "sha256 is 64 lowercase hex digits"),
  bytes: z.number().int().min(0),
  side_effects: z.array(SideEffectSchema),
  finalized_at: IsoTime,
});
export type Manifest = z.infer<typeof ManifestSchema>;

/** Where the service keeps an attempt's report tree: derived, never supplied by a caller. */
export function attemptReportLocation(jobId: string, attemptId: number): string {
  return `reports/${jobId}/${attemptId}`;
}

/** Parse `kind=reference` arguments (the CLI's `--side-effect`). Throws `input.sideEffect`. */
export function parseSideEffects(args: readonly string[]): SideEffect[] {
  return args.map((arg) => {
    const eq = arg.indexOf("=");
    if (eq < 0) throw new MamError("input.sideEffect", `side effect ${JSON.stringify(arg)} is not kind=reference (no '=')`);
    return validateSideEffect({ kind: arg.slice(0, eq), reference: arg.slice(eq + 1) }, `side effect ${JSON.stringify(arg)}`, "");
  });
}

function validateSideEffect(entry: unknown, label: string, path: string): SideEffect {
  const r = SideEffectSchema.safeParse(entry);
  if (!r.success) {
    const issues = zodIssues(r.error, path);
    throw new MamError("input.sideEffect", `${label} is not evidence: ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`, {
      issues,
    });
  }
  return r.data;
}

/** Every entry must be `{kind, reference}` with a non-blank reference (B-15). */
export function validateSideEffects(entries: readonly unknown[]): SideEffect[] {
  return entries.map((e, i) => validateSideEffect(e, `side_effects[${i}]`, `side_effects.${i}`));
}

export interface FinalizeInput {
  readonly location: string;
  readonly jobId: string;
  readonly attemptId: number;
  readonly sideEffects: readonly unknown[];
}

export interface Finalized {
  readonly manifest: Manifest;
  readonly manifestSha256: string;
}

/**
 * Promote the staged report (if there is one) atomically to its final name, hash the
 * promoted bytes by streaming, and write the manifest. Bad side effects are refused
 * before anything is written. Finalizing again replaces the manifest (B-33).
 */
export async function finalizeReport(reports: ReportStore, clock: Clock, input: FinalizeInput): Promise<Finalized> {
  const sideEffects = validateSideEffects(input.sideEffects);
  const job = JobId.safeParse(input.jobId);
  if (!job.success)
    throw new MamError("input.jobId", `not a valid job id: ${JSON.stringify(input.jobId)}`, { issues: zodIssues(job.error, "job_id") });
  const attempt = AttemptId.safeParse(input.attemptId);
  if (!attempt.success) {
    throw new MamError("input.invalid", `not a valid attempt: ${JSON.stringify(input.attemptId)} (a positive integer)`, {
      issues: zodIssues(attempt.error, "attempt_id"),
    });
  }
  if (await reports.exists(input.location, STAGED_REPORT_NAME)) {
    await reports.promote(input.location, STAGED_REPORT_NAME, REPORT_NAME);
  }
  const digest = await reports.hash(input.location, REPORT_NAME);
  if (!digest) {
    throw new MamError(
      "report.notFound",
      `no report to finalize: neither ${reports.describe(input.location, STAGED_REPORT_NAME)} nor ${REPORT_NAME} exists`,
    );
  }
  const manifest: Manifest = {
    schema: MANIFEST_SCHEMA_ID,
    job_id: input.jobId,
    attempt_id: input.attemptId,
    report_location: reports.describe(input.location, REPORT_NAME),
    sha256: digest.sha256,
    bytes: digest.bytes,
    side_effects: sideEffects,
    finalized_at: clock.now().toISOString(),
  };
  const bytes = new TextEncoder().encode(`${JSON.stringify(manifest, null, 2)}\n`);
  await reports.put(input.location, MANIFEST_NAME, bytes);
  return { manifest, manifestSha256: sha256Hex(bytes) };
}

export interface VerifyInput {
  readonly location: string;
  readonly jobId: string;
  /** When given, the manifest must be for this attempt. */
  readonly attemptId?: number | undefined;
  readonly expectedArtifacts?: readonly string[] | undefined;
}

export type Verification =
  | { readonly ok: true; readonly reason: string; readonly manifest: Manifest; readonly manifestSha256: string }
  | { readonly ok: false; readonly reason: string; readonly manifest?: Manifest };

/**
 * Re-derive everything the manifest claims from the stored bytes. Every failure is
 * a refusal naming what is wrong, never an exception for bad data.
 */
export async function verifyManifest(reports: ReportStore, input: VerifyInput): Promise<Verification> {
  if (input.location.trim() === "") return { ok: false, reason: "no completion manifest: the report location is empty" };
  const raw = await reports.getBytes(input.location, MANIFEST_NAME);
  if (!raw) return { ok: false, reason: `no completion manifest at ${reports.describe(input.location, MANIFEST_NAME)}` };
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
  } catch (e) {
    return { ok: false, reason: `the completion manifest is not valid JSON: ${(e as Error).message}` };
  }
  const parsed = ManifestSchema.safeParse(json);
  if (!parsed.success) {
    const issues = zodIssues(parsed.error);
    return { ok: false, reason: `the completion manifest is malformed: ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}` };
  }
  const m = parsed.data;
  if (m.job_id !== input.jobId) return { ok: false, reason: `the manifest belongs to job ${m.job_id}, not ${input.jobId}`, manifest: m };
  if (input.attemptId !== undefined && m.attempt_id !== input.attemptId) {
    return { ok: false, reason: `the manifest belongs to attempt ${m.attempt_id}, not ${input.attemptId}`, manifest: m };
  }
  const here = reports.describe(input.location, REPORT_NAME);
  if (m.report_location !== here) {
    return { ok: false, reason: `the manifest claims its report is at ${m.report_location}, but it was found at ${here}`, manifest: m };
  }
  const digest = await reports.hash(input.location, REPORT_NAME);
  if (!digest) return { ok: false, reason: `the finalized report ${here} is missing`, manifest: m };
  if (digest.sha256 !== m.sha256 || digest.bytes !== m.bytes) {
    return {
      ok: false,
      reason: `the report changed after finalization: the manifest says sha256 ${m.sha256} (${m.bytes} bytes), the stored report is ${digest.sha256} (${digest.bytes} bytes)`,
      manifest: m,
    };
  }
  const evidenced = new Set(m.side_effects.map((s) => s.kind));
  const missing = (input.expectedArtifacts ?? []).filter((k) => !evidenced.has(k));
  if (missing.length > 0) {
    return { ok: false, reason: `no side-effect evidence for ${missing.join(", ")} (expected by the job)`, manifest: m };
  }
  return { ok: true, reason: "the manifest verifies against the stored report", manifest: m, manifestSha256: sha256Hex(raw) };
}

export function sha256Hex(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}
