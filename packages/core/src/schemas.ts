import * as z from "zod";

/** Safe in an MQTT topic, a DynamoDB key, an S3 key and a file name. */
export const JOB_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
export const JobId = z.string().regex(JOB_ID_PATTERN, "a job id is 1-64 letters, digits, '_' or '-', starting with a letter or digit");
export const AttemptId = z.number().int().min(1).max(1_000_000);
export const IsoTime = z.iso.datetime({ offset: true });

export const STATUS = {
  pending: "pending",
  running: "running",
  completed: "completed",
  error: "error",
  cancelled: "cancelled",
} as const;
export type Status = (typeof STATUS)[keyof typeof STATUS];
export const StatusSchema = z.enum(STATUS);
export const TERMINAL: readonly Status[] = ["completed", "error", "cancelled"];
export const isTerminal = (s: Status): boolean => TERMINAL.includes(s);

export const ROLE = { Worker: "Worker", Reviewer: "Reviewer" } as const;
export const RoleSchema = z.enum(["Worker", "Reviewer"]);
export type Role = z.infer<typeof RoleSchema>;

export const ArtifactKind = z.string().regex(/^[a-z][a-z0-9_]{0,63}$/, "an artifact kind is lowercase letters, digits and '_'");

export const NOTIFY_EVENTS = ["completed", "error", "cancelled", "running", "progress"] as const;
export const NotificationIntentSchema = z.strictObject({
  id: z.string().min(1).max(128),
  event: z.string().min(1).max(64),
  seq: z.number().int().min(0),
  reason: z.string().max(1024).optional(),
  created_at: IsoTime,
  // Delivery bookkeeping, written by the recovery sweep and an operator's release
  // (bookkeeping writes: never part of the published payload, never a transition).
  /** Consecutive failures of the intent's own (never an unreachable broker). */
  failures: z.number().int().min(1).optional(),
  /** The sweep does not try it again before this. */
  retry_at: IsoTime.optional(),
  /** Set once `failures` reached the configured limit: still owed, not tried until released. */
  quarantined_at: IsoTime.optional(),
  /** Why the last try failed. */
  last_error: z.strictObject({ code: z.string().max(64), message: z.string().max(1024), at: IsoTime }).optional(),
});
export type NotificationIntent = z.infer<typeof NotificationIntentSchema>;

export const CompletedEvidenceSchema = z.strictObject({
  attempt_id: AttemptId,
  report_sha256: z.string().regex(/^[0-9a-f]{64}$/),
  manifest_sha256: z.string().regex(/^[0-9a-f]{64}$/),
  report_location: z.string(),
  verified_at: IsoTime,
});
export type CompletedEvidence = z.infer<typeof CompletedEvidenceSchema>;

/** Free-form progress an agent may report; bounded so a record stays small. */
export const ProgressSchema = z.record(z.string().max(64), z.json()).refine((v) => JSON.stringify(v).length <= 8192, {
  message: "progress is at most 8 KiB of JSON",
});

export const JobRecordSchema = z.strictObject({
  job_id: JobId,
  prompt: z.string().max(65536),
  agent: z.string().min(1).max(64),
  role: RoleSchema,
  status: StatusSchema,
  iteration: z.number().int().min(0),
  transition_seq: z.number().int().min(0),
  expected_artifacts: z.array(ArtifactKind),
  auto_complete: z.boolean(),
  agent_session: z.string().max(256).optional(),
  progress: ProgressSchema.optional(),
  completed_by: z.literal("auto_complete").optional(),
  completed_evidence: CompletedEvidenceSchema.optional(),
  pending_notification: NotificationIntentSchema.optional(),
  created_at: IsoTime,
  updated_at: IsoTime,
});
export type JobRecord = z.infer<typeof JobRecordSchema>;

export const RegisterJobSchema = z.strictObject({
  job_id: JobId.optional(),
  prompt: z.string().max(65536),
  agent: z.string().min(1).max(64),
  role: RoleSchema.optional(),
  expected_artifacts: z.array(ArtifactKind).max(32).optional(),
  auto_complete: z.boolean().optional(),
});
export type RegisterJob = z.infer<typeof RegisterJobSchema>;

export const ACTIONS = ["claim", "progress", "completed", "error", "cancel"] as const;
export const ActionSchema = z.enum(ACTIONS);
export type Action = z.infer<typeof ActionSchema>;

/** Fields a `progress` transition may write. Who may write which is the engine's table. */
export const ProgressFieldsSchema = z.strictObject({
  progress: ProgressSchema.optional(),
  agent_session: z.string().max(256).optional(),
  auto_complete: z.boolean().optional(),
  role: RoleSchema.optional(),
  expected_artifacts: z.array(ArtifactKind).max(32).optional(),
});
export type ProgressFields = z.infer<typeof ProgressFieldsSchema>;

export const TransitionRequestSchema = z.strictObject({
  action: ActionSchema,
  expected_seq: z.number().int().min(0).optional(),
  fields: ProgressFieldsSchema.optional(),
  notify: z.boolean().optional(),
  reason: z.string().max(1024).optional(),
});
export type TransitionRequest = z.infer<typeof TransitionRequestSchema>;

export const ExecutionAnchorSchema = z.strictObject({
  started_at: IsoTime,
  workspace_revision: z.string().max(128).optional(),
});
export type ExecutionAnchor = z.infer<typeof ExecutionAnchorSchema>;

export const DispatchRequestSchema = z.strictObject({
  attempt_id: AttemptId,
  agent_session_uuid: z.string().min(1).max(128),
  pane_process_generation: z.number().int().min(0),
  pane_id: z.string().max(128).optional(),
  anchor: ExecutionAnchorSchema.partial({ started_at: true }).optional(),
});
export type DispatchRequest = z.infer<typeof DispatchRequestSchema>;

export const DispatchRecordSchema = z.strictObject({
  job_id: JobId,
  attempt_id: AttemptId,
  agent_session_uuid: z.string().min(1).max(128),
  pane_process_generation: z.number().int().min(0),
  pane_id: z.string().max(128).optional(),
  anchor: ExecutionAnchorSchema,
  recorded_at: IsoTime,
});
export type DispatchRecord = z.infer<typeof DispatchRecordSchema>;

export const SideEffectSchema = z.strictObject({
  kind: ArtifactKind,
  reference: z
    .string()
    .max(1024)
    .refine((s) => s.trim().length > 0, { message: "a side effect needs a non-blank reference" }),
});
export type SideEffect = z.infer<typeof SideEffectSchema>;

export const EventLogEntrySchema = z.strictObject({
  job_id: JobId,
  at: IsoTime,
  /** Unique within the job, sortable by time. */
  id: z.string(),
  event: z.string().min(1).max(64),
  data: z.record(z.string(), z.json()).optional(),
});
export type EventLogEntry = z.infer<typeof EventLogEntrySchema>;

export const PublishEventRequestSchema = z.strictObject({
  event: z.enum(["started", "progress", "completed", "error"]),
  expected_seq: z.number().int().min(0).optional(),
  finalize: z.strictObject({ attempt_id: AttemptId, side_effects: z.array(SideEffectSchema).max(64) }).optional(),
  data: z.record(z.string(), z.json()).optional(),
});
export type PublishEventRequest = z.infer<typeof PublishEventRequestSchema>;

export const DecisionSchema = z.strictObject({
  decision: z.enum(["candidate_approved", "hold"]),
  reason: z.string(),
});
export type Decision = z.infer<typeof DecisionSchema>;

/** Render a zod error as field issues with dotted paths, prefixed by where the value came from. */
export function zodIssues(err: z.ZodError, prefix = ""): { path: string; message: string }[] {
  const join = (parts: readonly PropertyKey[]) => [prefix, ...parts.map(String)].filter((p) => p !== "").join(".") || "(root)";
  // An unknown key is reported by zod at its parent; name each key itself.
  return err.issues.flatMap((i) =>
    i.code === "unrecognized_keys"
      ? i.keys.map((k) => ({ path: join([...i.path, k]), message: "unknown field" }))
      : [{ path: join(i.path), message: i.message }],
  );
}
