import { createHash } from "node:crypto";
import * as z from "zod";
import { isMamError, MamError } from "./errors.ts";
import type { Clock, ReportStore } from "./ports.ts";
import {
  AttemptId,
  type CompletedEvidence,
  type FinalizedReport,
  IsoTime,
  JobId,
  type SideEffect,
  SideEffectSchema,
  zodIssues,
} from "./schemas.ts";

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
/** An upload's declaration, beside the staged name it binds: written by the service only (`requestReportUpload`). */
export const UPLOAD_DECLARATION_NAME = "report-upload.json";
const UPLOAD_SCHEMA_ID = "mam.upload/v1";

/**
 * What an uploader declared of the report it sends around the service: the staged
 * name must hold exactly these bytes before a stage through the service's own route
 * or a finalize takes them. It binds the staged name until a finalize of those bytes
 * removes it, or a new declaration replaces it.
 */
export const UploadDeclarationSchema = z.strictObject({
  schema: z.literal(UPLOAD_SCHEMA_ID),
  job_id: JobId,
  attempt_id: AttemptId,
  sha256: z.string().regex(/^[0-9a-f]{64}$/, "sha256 is 64 lowercase hex digits"),
  bytes: z.number().int().min(0),
  issued_at: IsoTime,
  /** When the upload address issued with it stops being good (the declaration itself stands until replaced or finalized). */
  expires_at: IsoTime,
});
export type UploadDeclaration = z.infer<typeof UploadDeclarationSchema>;

/** The declaration binding an attempt's staged name, or undefined. One the service did not write (unreadable) is `internal`. */
export async function readUploadDeclaration(reports: ReportStore, location: string): Promise<UploadDeclaration | undefined> {
  const raw = await reports.getBytes(location, UPLOAD_DECLARATION_NAME);
  if (raw === undefined) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
  } catch {
    json = undefined;
  }
  const parsed = UploadDeclarationSchema.safeParse(json);
  if (!parsed.success)
    throw new MamError("internal", `the upload declaration ${reports.describe(location, UPLOAD_DECLARATION_NAME)} is unreadable`);
  return parsed.data;
}

/**
 * Refuse bytes that are not what their upload declared, naming each field that
 * differs (`report.mismatch`, details `declared` and `received`). Checked before
 * anything is pinned or staged: a refusal writes nothing.
 */
export function checkDeclaredUpload(declared: UploadDeclaration, received: { sha256: string; bytes: number }, what: string): void {
  const issues: { path: string; message: string }[] = [];
  if (received.bytes !== declared.bytes) issues.push({ path: "bytes", message: `declared ${declared.bytes}, received ${received.bytes}` });
  if (received.sha256 !== declared.sha256)
    issues.push({ path: "sha256", message: `declared ${declared.sha256}, received ${received.sha256}` });
  if (issues.length === 0) return;
  throw new MamError(
    "report.mismatch",
    `${what} is not the report its upload declared: ${issues.map((i) => `${i.path} ${i.message}`).join("; ")}; nothing was pinned. Upload the declared bytes, or ask for a new upload declaring these`,
    {
      issues,
      details: {
        declared: { sha256: declared.sha256, bytes: declared.bytes },
        received: { sha256: received.sha256, bytes: received.bytes },
      },
    },
  );
}

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

/** Where an attempt's write-once, content-addressed copies of finalized reports live: `<location>/evidence/<sha256>`. */
export function evidenceLocation(location: string): string {
  return `${location.replace(/\/+$/, "")}/evidence`;
}

/** A finalize whose bytes are pinned and whose manifest is built, but not yet visible at the live names. */
export interface PreparedFinalize extends Finalized {
  readonly location: string;
  /** The manifest as it will be written. */
  readonly manifestBytes: Uint8Array;
  /** The name the report was read from: the staged upload, or the live report finalized again. */
  readonly source: typeof STAGED_REPORT_NAME | typeof REPORT_NAME;
  /** The write-once copy of the report's bytes (`evidence/<sha256>`), as the store describes it. */
  readonly evidence: string;
  /** The upload declaration the staged bytes were checked against, removed with them once the finalize is applied. */
  readonly declared?: UploadDeclaration;
}

/**
 * The first half of a finalize: everything that nothing references yet. The report
 * to finalize (the staged upload, else the live report) is hashed and copied to its
 * write-once, content-addressed name, and the manifest is built; no live name
 * changes. A finalize that is then refused leaves at most an unreferenced copy.
 * Bad side effects are refused before anything is written.
 */
export async function prepareFinalize(reports: ReportStore, clock: Clock, input: FinalizeInput): Promise<PreparedFinalize> {
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
  const staged = await reports.exists(input.location, STAGED_REPORT_NAME);
  const source = staged ? STAGED_REPORT_NAME : REPORT_NAME;
  const declared = await readUploadDeclaration(reports, input.location);
  if (declared !== undefined && !staged) {
    // An uploader who asked for an upload means to finalize that upload, never the report it replaces.
    throw new MamError(
      "report.notFound",
      `the upload declared (sha256 ${declared.sha256}, ${declared.bytes} bytes) has not arrived at ${reports.describe(input.location, STAGED_REPORT_NAME)}; upload it, then finalize`,
    );
  }
  const digest = await reports.hash(input.location, source);
  if (!digest) {
    throw new MamError(
      "report.notFound",
      `no report to finalize: neither ${reports.describe(input.location, STAGED_REPORT_NAME)} nor ${REPORT_NAME} exists`,
    );
  }
  // The uploader's hash and size are claims; these are the bytes that arrived.
  if (declared !== undefined)
    checkDeclaredUpload(declared, digest, `the staged report ${reports.describe(input.location, STAGED_REPORT_NAME)}`);
  // Refused (`report.changed`) when the bytes changed since they were hashed: what is
  // pinned is exactly what the manifest names.
  await reports.copyOnce(
    { location: input.location, name: source },
    { location: evidenceLocation(input.location), name: digest.sha256 },
    digest.sha256,
  );
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
  const manifestBytes = new TextEncoder().encode(`${JSON.stringify(manifest, null, 2)}\n`);
  return {
    location: input.location,
    manifest,
    manifestBytes,
    manifestSha256: sha256Hex(manifestBytes),
    source,
    evidence: reports.describe(evidenceLocation(input.location), digest.sha256),
    ...(declared === undefined ? {} : { declared }),
  };
}

/**
 * The second half: make a prepared finalize visible at the live names, once whatever
 * references it has committed. The live report is written, atomically (B-06), from
 * the pinned copy — the bytes that were hashed and verified — never by renaming the
 * staged name, which an upload may have replaced since. The staged upload is removed
 * only while it still holds those bytes: one staged again meanwhile stays staged for
 * the next finalize.
 */
export async function applyFinalize(reports: ReportStore, prepared: PreparedFinalize): Promise<void> {
  const { location } = prepared;
  const sha256 = prepared.manifest.sha256;
  const pinnedAt = { location: evidenceLocation(location), name: sha256 };
  if (reports.copy !== undefined) {
    // Inside the store: a report uploaded around the service may be larger than one `put` takes.
    await reports.copy(pinnedAt, { location, name: REPORT_NAME }).catch((e: unknown) => {
      throw isMamError(e, "report.notFound") ? new MamError("report.notFound", `the pinned copy ${prepared.evidence} is missing`) : e;
    });
  } else {
    const pinned = await reports.read(pinnedAt.location, pinnedAt.name);
    if (pinned === undefined) throw new MamError("report.notFound", `the pinned copy ${prepared.evidence} is missing`);
    await reports.put(location, REPORT_NAME, pinned);
  }
  if (prepared.source === STAGED_REPORT_NAME && (await reports.hash(location, STAGED_REPORT_NAME))?.sha256 === sha256) {
    await reports.delete(location, STAGED_REPORT_NAME);
    // The declaration goes with the bytes it bound, unless a new one replaced it meanwhile.
    const declared = prepared.declared;
    const standing = declared === undefined ? undefined : await readUploadDeclaration(reports, location);
    if (declared !== undefined && standing?.issued_at === declared.issued_at && standing.sha256 === declared.sha256) {
      await reports.delete(location, UPLOAD_DECLARATION_NAME);
    }
  }
  await reports.put(location, MANIFEST_NAME, prepared.manifestBytes);
}

/**
 * Promote the staged report (if there is one) atomically to its final name, hash the
 * promoted bytes by streaming, and write the manifest, with a write-once copy of the
 * bytes beside them. Bad side effects are refused before anything is written.
 * Finalizing again replaces the manifest (B-33). This is the finalize of a tree no
 * job store watches (the CLI, in the agent's own tree); the service's finalize
 * commits in between (`finalizeAttemptReport`).
 */
export async function finalizeReport(reports: ReportStore, clock: Clock, input: FinalizeInput): Promise<Finalized> {
  const prepared = await prepareFinalize(reports, clock, input);
  await applyFinalize(reports, prepared);
  return { manifest: prepared.manifest, manifestSha256: prepared.manifestSha256 };
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
  const missing = missingArtifacts(m, input.expectedArtifacts);
  if (missing !== undefined) return { ok: false, reason: missing, manifest: m };
  return { ok: true, reason: "the manifest verifies against the stored report", manifest: m, manifestSha256: sha256Hex(raw) };
}

/** Why a manifest does not evidence every kind in `expected`, or undefined when it does. */
export function missingArtifacts(manifest: Manifest, expected: readonly string[] | undefined): string | undefined {
  const evidenced = new Set(manifest.side_effects.map((s) => s.kind));
  const missing = (expected ?? []).filter((k) => !evidenced.has(k));
  return missing.length === 0 ? undefined : `no side-effect evidence for ${missing.join(", ")} (expected by the job)`;
}

/**
 * The evidence a commit may pin: the live manifest verifies (everything
 * `verifyManifest` checks), it is the manifest the job's latest finalize committed
 * (`finalized_report`), and the write-once copy of the report re-hashes to what the
 * manifest names. Every failure is a refusal naming what is wrong.
 */
export async function verifyFinalizedEvidence(
  reports: ReportStore,
  input: VerifyInput & { readonly attemptId: number; readonly finalized: FinalizedReport | undefined; readonly find?: RegExp },
): Promise<
  | { ok: true; reason: string; manifest: Manifest; evidence: Omit<CompletedEvidence, "verified_at">; found: boolean }
  | { ok: false; reason: string }
> {
  const verification = await verifyManifest(reports, input);
  if (!verification.ok) return verification;
  const finalized = input.finalized;
  if (finalized === undefined || finalized.attempt_id !== input.attemptId) {
    return {
      ok: false,
      reason: `no finalize of attempt ${input.attemptId} was committed by mam for job ${input.jobId}; finalize the report through mam first`,
    };
  }
  if (finalized.manifest_sha256 !== verification.manifestSha256) {
    return {
      ok: false,
      reason: `the completion manifest is not the one job ${input.jobId}'s latest finalize committed (a finalize is in flight, or the manifest was written another way); finalize again`,
    };
  }
  const pinned = await verifyPinnedReport(reports, input.location, verification.manifest.sha256, input.find ? { find: input.find } : {});
  if (!pinned.ok) return pinned;
  return {
    ok: true,
    found: pinned.found,
    reason: verification.reason,
    manifest: verification.manifest,
    evidence: {
      attempt_id: input.attemptId,
      report_sha256: verification.manifest.sha256,
      manifest_sha256: verification.manifestSha256,
      report_location: verification.manifest.report_location,
      evidence_location: pinned.evidence,
    },
  };
}

/**
 * Re-derive the hash of the write-once copy of a report (`evidence/<sha256>`) by
 * streaming it; with `find`, also say whether the text matches it, in the same read
 * (a match may straddle chunks).
 */
export async function verifyPinnedReport(
  reports: ReportStore,
  location: string,
  sha256: string,
  opts: { readonly find?: RegExp } = {},
): Promise<{ ok: true; reason: string; evidence: string; found: boolean } | { ok: false; reason: string }> {
  const evidence = reports.describe(evidenceLocation(location), sha256);
  const stream = await reports.read(evidenceLocation(location), sha256);
  if (!stream) return { ok: false, reason: `the pinned copy of the report (${evidence}) is missing` };
  const hash = createHash("sha256");
  const decoder = new TextDecoder();
  const find = opts.find;
  let found = false;
  let carry = "";
  for await (const chunk of stream) {
    hash.update(chunk);
    if (find !== undefined && !found) {
      const text = carry + decoder.decode(chunk, { stream: true });
      found = find.test(text);
      carry = text.slice(-256);
    }
  }
  if (find !== undefined && !found) found = find.test(carry + decoder.decode());
  const digest = hash.digest("hex");
  if (digest !== sha256) return { ok: false, reason: `the pinned copy of the report (${evidence}) hashes to ${digest}, not ${sha256}` };
  return { ok: true, reason: "the pinned copy of the report re-hashes to what the completion names", evidence, found };
}

export function sha256Hex(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}
