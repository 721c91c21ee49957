import {
  ArtifactKind,
  AttemptId,
  DecisionSchema,
  DispatchRecordSchema,
  EVENT_PAGE_MAX_BYTES,
  EventLogEntrySchema,
  FREE_FORM_MAX_BYTES,
  FREE_FORM_MAX_DEPTH,
  findJsonBoundsIssue,
  IsoTime,
  JobId,
  JobRecordSchema,
  ManifestSchema,
  SideEffectSchema,
  StatusSchema,
} from "@mam/core";
import * as z from "zod";

/**
 * The wire format: the request envelopes and responses the HTTP API adds around
 * core's schemas. Handlers type their responses with these, and the OpenAPI
 * document is generated from them, so the two cannot drift.
 */

// ---- path and query

export const PathParamsSchema = z.strictObject({
  job_id: JobId.optional(),
  attempt: z
    .string()
    .regex(/^[1-9][0-9]{0,6}$/, "an attempt is a positive integer")
    .transform(Number)
    .pipe(AttemptId)
    .optional(),
});

export const ListJobsQuerySchema = z
  .strictObject({
    status: StatusSchema.optional().describe("only jobs with this status"),
    owed: z
      .enum(["quarantined"])
      .optional()
      .describe("`quarantined`: only jobs whose owed notification is quarantined, most recently quarantined first (not with `status`)"),
    limit: z.coerce.number().int().min(1).max(200).default(50).describe("page size, 1..200"),
    cursor: z.string().min(1).max(1024).optional().describe("`next_cursor` from the previous page"),
  })
  .refine((q) => q.owed === undefined || q.status === undefined, {
    path: ["owed"],
    message: "owed and status cannot be combined",
  });

export const VerificationQuerySchema = z.strictObject({
  expected_artifacts: z
    .string()
    .max(4096)
    .transform((s) =>
      s
        .split(",")
        .map((x) => x.trim())
        .filter((x) => x !== ""),
    )
    .pipe(z.array(ArtifactKind).max(32))
    .optional()
    .describe("comma-separated artifact kinds that must be evidenced; the job's own list when absent"),
});

export const ListEventsQuerySchema = z.strictObject({
  limit: z.coerce
    .number()
    .int()
    .min(1)
    .max(1000)
    .default(1000)
    .describe(`at most this many entries, oldest first; a page also stops at ${EVENT_PAGE_MAX_BYTES} bytes of entries`),
  cursor: z.string().min(1).max(1024).optional().describe("`next_cursor` from the previous page"),
});

// ---- request bodies (core's schemas where core has one)

export const FinalizeRequestSchema = z.strictObject({ side_effects: z.array(SideEffectSchema).max(64) });

const SCENARIO_BOUNDS = { maxBytes: FREE_FORM_MAX_BYTES.scenario, maxDepth: FREE_FORM_MAX_DEPTH, storable: false } as const;

/**
 * The scenario is passed raw to the gate, which reads it fail-closed (a scenario it
 * cannot read is a hold, answered 200): only the envelope is strict here, and of the
 * scenario only its size and depth are checked (400, whatever the flags), without
 * recursion, so the gate never holds a value that could overflow a stack.
 */
export const ScenarioInputSchema = z.unknown().superRefine((value, ctx) => {
  if (value === undefined) return;
  const issue = findJsonBoundsIssue(value, SCENARIO_BOUNDS);
  if (issue !== undefined) ctx.addIssue({ code: "custom", message: issue.message, path: [...issue.path] });
});
export const EvaluationRequestSchema = z.strictObject({ scenario: ScenarioInputSchema });

export const RecoverySweepRequestSchema = z.strictObject({});

export const NotificationReleaseRequestSchema = z.strictObject({
  intent_id: z.string().min(1).max(128).optional().describe("release only if this is still the owed intent"),
});

// ---- responses

export const JobPageSchema = z.strictObject({
  items: z.array(JobRecordSchema),
  next_cursor: z.string().optional().describe("absent on the last page"),
});
export type JobPage = z.infer<typeof JobPageSchema>;

export const DispatchResponseSchema = z.strictObject({
  dispatch: DispatchRecordSchema,
  agent_token: z.string().describe("bearer token for this job and attempt only; retired by a newer dispatch"),
  expires_at: IsoTime,
});
export type DispatchResponse = z.infer<typeof DispatchResponseSchema>;

export const StagedReportSchema = z.strictObject({
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  bytes: z.number().int().min(0),
});
export type StagedReport = z.infer<typeof StagedReportSchema>;

export const FinalizedSchema = z.strictObject({
  manifest: ManifestSchema,
  manifest_sha256: z.string().regex(/^[0-9a-f]{64}$/),
});
export type FinalizedBody = z.infer<typeof FinalizedSchema>;

export const VerificationSchema = z.strictObject({
  ok: z.boolean(),
  reason: z.string(),
  manifest: ManifestSchema.nullable().describe("the manifest found, when one could be read"),
  manifest_sha256: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .optional(),
  pinned: z
    .strictObject({
      ok: z.boolean(),
      reason: z.string(),
      report_sha256: z.string().regex(/^[0-9a-f]{64}$/),
      evidence_location: z.string(),
    })
    .optional()
    .describe("once the job completed on this attempt: the write-once copy its completion pinned, re-hashed"),
});
export type VerificationBody = z.infer<typeof VerificationSchema>;

export const GateResponseSchema = z.strictObject({
  committed: z.boolean(),
  reason: z.string(),
  decision: DecisionSchema.nullable().describe("the policy's decision, when the gate got that far"),
  record: JobRecordSchema.optional().describe("the committed record, when it committed"),
});
export type GateResponse = z.infer<typeof GateResponseSchema>;

export const PublishEventResponseSchema = z.strictObject({
  record: JobRecordSchema,
  published: z.boolean().describe("false: the commit stands and the notification stays owed for the recovery sweep"),
  finalized: FinalizedSchema.optional(),
  publish_error: z.strictObject({ code: z.string(), message: z.string() }).optional(),
  warnings: z.array(z.string()).optional().describe("what went wrong after the commit; the commit stands"),
});
export type PublishEventResponse = z.infer<typeof PublishEventResponseSchema>;

export const EventLogSchema = z.strictObject({
  items: z.array(EventLogEntrySchema),
  next_cursor: z.string().optional().describe("absent on the last page"),
});
export type EventLog = z.infer<typeof EventLogSchema>;

const count = z.number().int().min(0);

export const SweepIntentOutcomeSchema = z.strictObject({
  job_id: z.string(),
  intent_id: z.string(),
  outcome: z
    .enum(["sent", "failed", "quarantined", "deferred", "not_tried"])
    .describe(
      "sent: published and settled; failed: failed for a reason of its own, tried again after `retry_at`; quarantined: failed for the N-th time, not tried again until released; deferred: the broker or the store could not be reached (not counted; the sweep stopped); not_tried: the sweep stopped before it",
    ),
  error: z.strictObject({ code: z.string(), message: z.string() }).optional(),
  failures: z.number().int().min(1).optional().describe("failures of its own so far"),
  retry_at: IsoTime.optional().describe("when the sweep tries it next"),
});

export const RecoverySweepResultSchema = z.strictObject({
  owed: count.describe("owed notifications due now that the sweep read (quarantined ones are not read)"),
  sent: count,
  failed: count.describe("tried, not delivered, still owed (outcomes failed and deferred)"),
  quarantined: count.describe("quarantined by this sweep"),
  not_tried: count,
  results: z.array(SweepIntentOutcomeSchema).describe("one per intent read, in the order tried"),
});
export type RecoverySweepResult = z.infer<typeof RecoverySweepResultSchema>;

export const NotificationReleaseResultSchema = z.strictObject({
  released: z.boolean().describe("true: the owed notification's failures, backoff and quarantine were cleared; the next sweep tries it"),
  reason: z.string(),
  record: JobRecordSchema,
});
export type NotificationReleaseResult = z.infer<typeof NotificationReleaseResultSchema>;

export const HealthSchema = z.strictObject({ ok: z.literal(true) });

export const FieldIssueSchema = z.strictObject({ path: z.string(), message: z.string() });

/** RFC 9457 problem details, with mam's extension members. */
export const ProblemSchema = z.looseObject({
  type: z.string().describe("stable URI per code"),
  title: z.string(),
  status: z.number().int(),
  detail: z.string(),
  code: z.string().describe("dotted error code, e.g. job.transitionConflict"),
  instance: z.string().optional(),
  request_id: z.string(),
  errors: z.array(FieldIssueSchema).optional().describe("each bad field, by dotted path"),
  current: JobRecordSchema.optional().describe("on 409/412: the record as it now stands"),
});
