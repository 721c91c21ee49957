import { z } from "@hono/zod-openapi";
import {
  ArtifactKind,
  ATTENTION_OUTCOMES,
  AttemptId,
  CANDIDATE_OUTCOMES,
  DecisionSchema,
  DispatchRecordSchema,
  DispatchRequestSchema,
  EVENT_PAGE_MAX_BYTES,
  EventLogEntrySchema,
  FREE_FORM_MAX_BYTES,
  FREE_FORM_MAX_DEPTH,
  findJsonBoundsIssue,
  IsoTime,
  JobId,
  JobRecordSchema,
  LeaseSchema,
  ManifestSchema,
  ObservationRequestSchema,
  ObservationSchema,
  PublishEventRequestSchema,
  RegisterJobSchema,
  ScenarioSchema,
  SideEffectSchema,
  StatusSchema,
  TransitionRequestSchema,
} from "@mam/core";
import { EXAMPLE } from "./examples.ts";

/**
 * The wire format: the request envelopes and responses the HTTP API adds around
 * core's schemas, and the names the OpenAPI document gives them. Routes declare
 * their requests and answers with these, so validation, handler types and the
 * document cannot drift.
 */

/**
 * One of core's schemas, ready to be named or described for the document. zod copies
 * prototype methods onto each schema when it is made, and core makes its schemas
 * before `@hono/zod-openapi` adds `.openapi()`: so a core schema is cloned here
 * first (same definition, same checks) and the clone carries the metadata.
 */
function core<S extends z.ZodType>(schema: S): S {
  return schema.clone() as S;
}

// ---- path and query

/** Path parameters, as `createRoute` declares them (`{job_id}`, `{attempt}`). */
export const JobIdParam = core(JobId).openapi({ param: { description: "The job id." }, example: EXAMPLE.jobId });
export const AttemptParam = z
  .string()
  .regex(/^[1-9][0-9]{0,6}$/, "an attempt is a positive integer")
  .transform(Number)
  .pipe(AttemptId)
  .openapi({ param: { description: "The attempt id: a positive integer, as recorded by its dispatch." }, example: "1" });
export const JobPathSchema = z.strictObject({ job_id: JobIdParam });
export const AttemptPathSchema = z.strictObject({ job_id: JobIdParam, attempt: AttemptParam });

/**
 * A query parameter as a form sends it: an empty one (`?status=`) is absent, and
 * of a repeated one the first counts.
 */
function formValue<S extends z.ZodType>(schema: S) {
  return z.preprocess((v) => {
    const first = Array.isArray(v) ? v[0] : v;
    return first === "" ? undefined : first;
  }, schema);
}

export const ListJobsQuerySchema = z
  .strictObject({
    status: formValue(StatusSchema.optional()).openapi({ description: "Only jobs with this status.", example: "running" }),
    owed: formValue(z.enum(["quarantined"]).optional()).openapi({
      description: "`quarantined`: only jobs whose owed notification is quarantined, most recently quarantined first (not with `status`).",
      example: "quarantined",
    }),
    stale: formValue(z.enum(["true"]).optional()).openapi({
      description: "`true`: only running jobs the sweep marked stale (no activity for MAM_STALE_AFTER_SECONDS), newest update first.",
      example: "true",
    }),
    overdue: formValue(z.enum(["true"]).optional()).openapi({
      description: "`true`: only running jobs the sweep marked overdue (past their attempt's deadline), newest update first.",
      example: "true",
    }),
    candidate: formValue(z.enum(["due"]).optional()).openapi({
      description: "`due`: only running jobs marked candidates whose scheduled evaluation is due now, newest update first.",
      example: "due",
    }),
    limit: formValue(z.coerce.number().int().min(1).max(200).default(50)).openapi({ description: "Page size, 1..200.", example: 20 }),
    cursor: formValue(z.string().min(1).max(1024).optional()).openapi({
      description: "`next_cursor` from the previous page.",
      example: EXAMPLE.cursor,
    }),
  })
  .refine((q) => q.owed === undefined || q.status === undefined, {
    path: ["owed"],
    message: "owed and status cannot be combined",
  })
  .refine((q) => [q.owed, q.stale, q.overdue, q.candidate].filter((v) => v !== undefined).length <= 1, {
    path: ["stale"],
    message: "owed, stale, overdue and candidate are each a listing of their own: give at most one",
  })
  .refine(
    (q) =>
      (q.stale === undefined && q.overdue === undefined && q.candidate === undefined) || q.status === undefined || q.status === "running",
    {
      path: ["status"],
      message: "stale, overdue and candidate list running jobs only",
    },
  );

export const VerificationQuerySchema = z.strictObject({
  expected_artifacts: formValue(
    z
      .string()
      .max(4096)
      .transform((s) =>
        s
          .split(",")
          .map((x) => x.trim())
          .filter((x) => x !== ""),
      )
      .pipe(z.array(ArtifactKind).max(32))
      .optional(),
  ).openapi({
    description: "Comma-separated artifact kinds that must be evidenced; the job's own list when absent.",
    example: "commit,pull_request",
  }),
});

export const ListEventsQuerySchema = z.strictObject({
  limit: formValue(z.coerce.number().int().min(1).max(1000).default(1000)).openapi({
    description: `At most this many entries, oldest first; a page also stops at ${EVENT_PAGE_MAX_BYTES} bytes of entries.`,
    example: 100,
  }),
  cursor: formValue(z.string().min(1).max(1024).optional()).openapi({
    description: "`next_cursor` from the previous page.",
    example: EXAMPLE.cursor,
  }),
});

// ---- core's schemas, named in the document

export const JobRecord = core(JobRecordSchema).openapi("JobRecord", {
  description: "A job: its status, sequences, evidence and owed notification.",
});
export const Manifest = core(ManifestSchema).openapi("Manifest", { description: "A finalized report's manifest (`mam.manifest/v1`)." });
export const DispatchRecord = core(DispatchRecordSchema).openapi("DispatchRecord");
export const EventLogEntry = core(EventLogEntrySchema).openapi("EventLogEntry");
export const Decision = core(DecisionSchema).openapi("Decision", { description: "The policy's decision on a scenario." });
export const SideEffect = core(SideEffectSchema).openapi("SideEffect", {
  description: "Evidence of an expected artifact: its kind and a reference.",
});
/** The scenario's documented shape; the gate reads what it is sent raw (EvaluationRequest). */
export const Scenario = core(ScenarioSchema).openapi("Scenario", {
  description: "What a watcher collected about one dispatch (`mam.scenario/v1`); unknown fields are kept and ignored.",
});

const SEQ_CONTRACT =
  "The compare-and-swap on `transition_seq`: while CAS is on (`MAM_ENGINE_CAS=1`, the default), a transition needs the seq it expects, " +
  "either here or as an `If-Match` header (the record's `ETag`); with neither it is a 400 naming both. A stale one is a 409 carrying the current record.";

// ---- request bodies (core's schemas where core has one)

export const RegisterJob = core(RegisterJobSchema).openapi("RegisterJob", {
  description: "A job to register. Without `job_id`, a lowercase UUID is generated.",
});
export const TransitionRequest = TransitionRequestSchema.extend({
  expected_seq: core(TransitionRequestSchema.shape.expected_seq).openapi({ description: SEQ_CONTRACT, example: 2 }),
}).openapi("TransitionRequest", { description: `A transition. ${SEQ_CONTRACT}` });
export const DispatchRequest = core(DispatchRequestSchema).openapi("DispatchRequest", {
  description: "A dispatch of the job: the attempt (greater than the latest) and where it runs.",
});
/** What only mam sets of an observation: a body carrying one of these is a 400 naming it. */
const SET_BY_MAM = (what: string) =>
  z
    .unknown()
    .refine(() => false, { error: `${what} is set by mam (who recorded it from the token, when from its own clock); leave it out` })
    .optional()
    .openapi({ description: `Refused: ${what} is set by mam, never by the sender.` });

export const ObservationRequest = ObservationRequestSchema.extend({
  source: SET_BY_MAM("source"),
  recorded_by: SET_BY_MAM("recorded_by"),
  received_at: SET_BY_MAM("received_at"),
}).openapi("ObservationRequest", {
  description:
    "What was seen of the job's latest dispatch: the state, the kind of signal, the dispatch identity (attempt and session always; a watcher also the process generation, and the pane where the dispatch recorded one) and when the sender saw it.",
});
export const Observation = core(ObservationSchema).openapi("Observation", {
  description:
    "An observation as mam recorded it: `source` from the token (`watcher:<name>`, `agent:<backend>`), `received_at` from mam's clock; a coalesced repeat moves `last_seen_received_at` and counts `sightings`.",
});

export const PublishEventRequest = PublishEventRequestSchema.extend({
  expected_seq: core(PublishEventRequestSchema.shape.expected_seq).openapi({
    description: "The `transition_seq` the event's transition expects; without it, the current one.",
    example: 2,
  }),
}).openapi("PublishEventRequest", { description: "An agent's event: finalize first when asked, commit, log, publish, settle." });

export const FinalizeRequestSchema = z
  .strictObject({ side_effects: z.array(SideEffect).max(64) })
  .openapi("FinalizeRequest", { description: "The side effects the report's manifest records." });

const SCENARIO_BOUNDS = { maxBytes: FREE_FORM_MAX_BYTES.scenario, maxDepth: FREE_FORM_MAX_DEPTH, storable: false } as const;

/**
 * The scenario is passed raw to the gate, which reads it fail-closed (a scenario it
 * cannot read is a hold, answered 200): only the envelope is strict here, and of the
 * scenario only its size and depth are checked (400, whatever the flags), without
 * recursion, so the gate never holds a value that could overflow a stack.
 */
export const ScenarioInputSchema = z.unknown().superRefine((value, ctx) => {
  if (value === undefined) return ctx.addIssue({ code: "custom", message: "required" });
  const issue = findJsonBoundsIssue(value, SCENARIO_BOUNDS);
  if (issue !== undefined) ctx.addIssue({ code: "custom", message: issue.message, path: [...issue.path] });
});
export const EvaluationRequestSchema = z
  .strictObject({
    scenario: ScenarioInputSchema.optional().openapi({
      allOf: [{ $ref: "#/components/schemas/Scenario" }],
      description:
        "Read raw by the gate: a scenario it cannot read is a hold (200), not a 400. Absent: the gate builds a `mam.scenario/v2` from what mam recorded of the latest dispatch (its observations, the finalized report) and evaluates that.",
    }),
  })
  .openapi("EvaluationRequest");

export const RecoverySweepRequestSchema = z
  .strictObject({
    grace_seconds: z
      .number()
      .int()
      .min(0)
      .max(3600)
      .optional()
      .describe(
        "Take only intents due at least this many seconds ago. Absent: the service's grace period (MAM_SWEEP_GRACE_SECONDS), which leaves a fresh intent to the path that publishes each commit; 0 sends everything due now, at the risk of a duplicate (subscribers drop duplicates by `data.notification_intent.id`).",
      ),
  })
  .openapi("RecoverySweepRequest");

export const NotificationReleaseRequestSchema = z
  .strictObject({
    intent_id: z.string().min(1).max(128).optional().describe("Release only if this is still the owed intent."),
  })
  .openapi("NotificationReleaseRequest");

// ---- responses

export const JobPageSchema = z
  .strictObject({
    items: z.array(JobRecord),
    next_cursor: z.string().optional().describe("absent on the last page"),
  })
  .openapi("JobPage");
export type JobPage = z.infer<typeof JobPageSchema>;

export const DispatchResponseSchema = z
  .strictObject({
    dispatch: DispatchRecord,
    agent_token: z.string().describe("bearer token for this job and attempt only; retired by a newer dispatch"),
    expires_at: IsoTime,
  })
  .openapi("DispatchResponse");
export type DispatchResponse = z.infer<typeof DispatchResponseSchema>;

export const ObservationAnswerSchema = z
  .strictObject({
    observation: Observation,
    coalesced: z
      .boolean()
      .describe("a repeat of the source's last state for the dispatch, folded into it (200); a new observation is a 201"),
    evidence_seq: z.number().int().min(0).describe("the job's evidence_seq after the write (a repeat does not bump it)"),
  })
  .openapi("ObservationAnswer");

export const StagedReportSchema = z
  .strictObject({
    sha256: z.string().regex(/^[0-9a-f]{64}$/),
    bytes: z.number().int().min(0),
  })
  .openapi("StagedReport");
export type StagedReport = z.infer<typeof StagedReportSchema>;

export const FinalizedSchema = z
  .strictObject({
    manifest: Manifest,
    manifest_sha256: z.string().regex(/^[0-9a-f]{64}$/),
  })
  .openapi("Finalized");
export type FinalizedBody = z.infer<typeof FinalizedSchema>;

export const VerificationSchema = z
  .strictObject({
    ok: z.boolean(),
    reason: z.string(),
    // A union, not `.nullable()`: zod-to-openapi renders a nullable named schema as
    // a nullable component (or an allOf that cannot be null), and a `.describe()` on
    // a named schema renames the component; so fields holding one carry neither.
    manifest: z.union([Manifest, z.null()]),
    manifest_sha256: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional()
      .describe("the live manifest's SHA-256, whenever it verifies on its own (also when it is not the one the completion names)"),
    matches_completion: z
      .boolean()
      .optional()
      .describe(
        "once the job completed on this attempt: whether the live report and manifest verify on their own (whatever `expected_artifacts` asks) and are the ones the completion names (`completed_evidence.manifest_sha256`, `report_sha256`); when false, `ok` is false",
      ),
    pinned: z
      .strictObject({
        ok: z.boolean(),
        reason: z.string(),
        report_sha256: z.string().regex(/^[0-9a-f]{64}$/),
        evidence_location: z.string(),
      })
      .optional()
      .describe("once the job completed on this attempt: the write-once copy its completion pinned, re-hashed"),
  })
  .openapi("Verification");
export type VerificationBody = z.infer<typeof VerificationSchema>;

export const GateResponseSchema = z
  .strictObject({
    committed: z.boolean(),
    reason: z.string(),
    decision: z.union([Decision, z.null()]),
    record: JobRecord.optional(),
    scenario: z
      .record(z.string(), z.unknown())
      .optional()
      .describe("the `mam.scenario/v2` the gate built from what mam recorded, when it built one"),
  })
  .openapi("GateResponse");

export const GateDryRunSchema = z
  .strictObject({
    would_commit: z.boolean().describe("whether an evaluation now would complete the job; a dry run writes nothing"),
    reason: z.string(),
    decision: z.union([Decision, z.null()]),
    scenario: z.record(z.string(), z.unknown()).optional().describe("the `mam.scenario/v2` the gate built, when it got that far"),
    evaluated_at: IsoTime,
  })
  .openapi("GateDryRun");
export type GateResponse = z.infer<typeof GateResponseSchema>;

export const PublishEventResponseSchema = z
  .strictObject({
    record: JobRecord,
    published: z
      .boolean()
      .optional()
      .describe(
        "Present only where the request published the notification itself. false: the commit stands and the notification stays owed for the recovery sweep. Absent: another path of the service publishes every commit (the change relay of `mam serve`, the stream publisher on AWS), so the request does not know; the notification is owed until that path or the sweep delivers it.",
      ),
    finalized: FinalizedSchema.optional(),
    publish_error: z.strictObject({ code: z.string(), message: z.string() }).optional(),
    warnings: z.array(z.string()).optional().describe("what went wrong after the commit; the commit stands"),
  })
  .openapi("PublishEventResponse");
export type PublishEventResponse = z.infer<typeof PublishEventResponseSchema>;

/**
 * The answer to an agent re-sending the completion it already committed (core's
 * `completedAlready`): nothing was written; the record is the one it completed.
 */
export const AlreadyCompletedSchema = z
  .strictObject({
    already_completed: z.literal(true),
    record: JobRecord,
  })
  .openapi("AlreadyCompleted", {
    description:
      "The job is already completed by this agent's attempt, on the report it shows (its bytes hash to the pinned `report_sha256`): nothing was written. Any other request on a terminal job is refused as before.",
  });
export type AlreadyCompleted = z.infer<typeof AlreadyCompletedSchema>;

export const EventLogSchema = z
  .strictObject({
    items: z.array(EventLogEntry),
    next_cursor: z.string().optional().describe("absent on the last page"),
  })
  .openapi("EventLog");
export type EventLog = z.infer<typeof EventLogSchema>;

const count = z.number().int().min(0);

export const SweepIntentOutcomeSchema = z
  .strictObject({
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
  })
  .openapi("SweepIntentOutcome");

export const SweepEvaluationSchema = z
  .strictObject({
    due: count.describe("candidates due that the pass read (at most MAM_SWEEP_EVALUATIONS)"),
    completed: count,
    held: count.describe("the gate held: the mark is cleared until the job's evidence moves"),
    kept: count.describe("still candidates: a finalize in progress, or another write won the race"),
    failed: count,
    not_tried: count.describe("left for the next pass (the bytes budget, MAM_SWEEP_EVALUATION_MIB, or an unreachable store)"),
    bytes_hashed: count.describe("bytes of reports the gate hashed in this pass"),
    disabled: z.literal(true).optional().describe("auto-completion is off (MAM_AUTO_COMPLETE=0): nothing was read, evaluated or cleared"),
    results: z
      .array(
        z.strictObject({
          job_id: z.string(),
          outcome: z.enum(CANDIDATE_OUTCOMES),
          reason: z.string().optional(),
        }),
      )
      .describe("one per candidate read, oldest due first"),
  })
  .describe("The pass's second part, after the notifications: the due candidates the gate evaluated on recorded evidence.")
  .openapi("SweepEvaluation");

export const SweepAttentionSchema = z
  .strictObject({
    due: count.describe("running jobs due for a look that the pass read (at most 500)"),
    stale: count.describe("marked stale: no activity for MAM_STALE_AFTER_SECONDS (a feed row job.stale, a stale notification)"),
    overdue: count.describe("marked overdue: past their attempt's deadline (a feed row job.overdue, an overdue notification)"),
    rekeyed: count.describe("looked at and the next look moved: nothing due yet, or a mark waiting while another notification is owed"),
    lost_race: count.describe("an activity landed while the sweep looked: left for the next look"),
    failed: count,
    results: z
      .array(z.strictObject({ job_id: z.string(), outcome: z.enum(ATTENTION_OUTCOMES) }))
      .describe("one per job read, oldest due first"),
  })
  .describe("The pass's third part: stale and overdue jobs.")
  .openapi("SweepAttention");

export const RecoverySweepResultSchema = z
  .strictObject({
    owed: count.describe("owed notifications due now that the sweep read (quarantined ones are not read)"),
    sent: count,
    failed: count.describe("tried, not delivered, still owed (outcomes failed and deferred)"),
    quarantined: count.describe("quarantined by this sweep"),
    not_tried: count,
    results: z.array(SweepIntentOutcomeSchema).describe("one per intent read, in the order tried"),
    candidates: SweepEvaluationSchema,
    attention: SweepAttentionSchema,
  })
  .openapi("RecoverySweepResult");
export type RecoverySweepResult = z.infer<typeof RecoverySweepResultSchema>;

export const NotificationReleaseResultSchema = z
  .strictObject({
    released: z.boolean().describe("true: the owed notification's failures, backoff and quarantine were cleared; the next sweep tries it"),
    reason: z.string(),
    record: JobRecord,
  })
  .openapi("NotificationReleaseResult");
export type NotificationReleaseResult = z.infer<typeof NotificationReleaseResultSchema>;

export const NotificationSendResultSchema = z
  .strictObject({
    outcome: z
      .enum(["sent", "failed", "nothing_owed"])
      .describe(
        "`sent`: the broker acknowledged both topics; `failed`: it did not (the intent stays owed); `nothing_owed`: the job owes none",
      ),
    intent_id: z.string().optional().describe("The intent tried."),
    settled: z
      .boolean()
      .optional()
      .describe("Sent, and cleared from the job here (false: a peer had already settled it, or a newer intent is owed)."),
    error: z.strictObject({ code: z.string(), message: z.string() }).optional().describe("Why the broker did not take it."),
  })
  .openapi("NotificationSendResult");

export const HealthSchema = z.strictObject({ ok: z.literal(true) }).openapi("Health");

export const FieldIssueSchema = z
  .strictObject({
    path: z.string().describe("The bad field, by dotted path from the request: `body.fields.progress`, `query.limit`."),
    message: z.string(),
  })
  .openapi("FieldIssue");

/** RFC 9457 problem details, with mam's extension members. */
export const ProblemSchema = z
  .looseObject({
    type: z.string().describe("stable URI per code"),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    code: z.string().describe("dotted error code, e.g. job.transitionConflict"),
    instance: z.string().optional(),
    request_id: z.string(),
    errors: z.array(FieldIssueSchema).optional().describe("each bad field, by dotted path"),
    current: JobRecord.optional(),
    in_progress: core(LeaseSchema)
      .extend({ kind: z.enum(["upload", "finalize"]) })
      .optional()
      .openapi({
        description:
          "on `report.uploadInFlight` and `report.finalizeInProgress`: the one upload in flight or finalize in progress that holds the attempt (its kind, attempt, who holds it, since when, and when it expires at the latest)",
      }),
  })
  .openapi("Problem", { description: "RFC 9457 problem details, with mam's extension members." });
