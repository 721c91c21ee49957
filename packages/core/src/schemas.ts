import * as z from "zod";
import { boundedJsonObject, boundedText, FREE_FORM_MAX_BYTES, FREE_FORM_MAX_DEPTH } from "./bounds.ts";

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
/** What an evidence write (dispatch, report stage, finalize) requires of a job: not terminal. */
export const NON_TERMINAL: readonly Status[] = ["pending", "running"];

export const ROLE = { Worker: "Worker", Reviewer: "Reviewer" } as const;
export const RoleSchema = z.enum(["Worker", "Reviewer"]);
export type Role = z.infer<typeof RoleSchema>;

export const ArtifactKind = z.string().regex(/^[a-z][a-z0-9_]{0,63}$/, "an artifact kind is lowercase letters, digits and '_'");

export const NOTIFY_EVENTS = ["completed", "error", "cancelled", "running", "progress"] as const;
/** Who caused a notified change: for a terminal one, who ended the job. Set by mam, never by a caller. */
export const INTENT_CAUSES = ["agent", "operator", "gate", "sweep"] as const;
export const IntentCauseSchema = z.enum(INTENT_CAUSES);
export type IntentCause = z.infer<typeof IntentCauseSchema>;

export const NotificationIntentSchema = z.strictObject({
  id: z.string().min(1).max(128),
  event: z.string().min(1).max(64),
  seq: z.number().int().min(0),
  reason: z.string().max(1024).optional(),
  by: IntentCauseSchema.optional(),
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

const Sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, "sha256 is 64 lowercase hex digits");

/** How a completion's quiescence was established: a watcher saw it, or it rests on the agent's own sources alone. */
export const QUIESCENCE_BASES = ["watcher-observed", "agent-attested"] as const;
export type QuiescenceBasis = (typeof QUIESCENCE_BASES)[number];

export const CompletedEvidenceSchema = z.strictObject({
  attempt_id: AttemptId,
  report_sha256: Sha256Hex,
  manifest_sha256: Sha256Hex,
  report_location: z.string(),
  /** The write-once, content-addressed copy of the verified bytes: `<attempt tree>/evidence/<report_sha256>`. */
  evidence_location: z.string(),
  verified_at: IsoTime,
  /**
   * What the quiescence rested on: a scenario mam built from what it recorded
   * (`recorded`: rebuilt from the record's `observations` at `observations_rev`, as of
   * `verified_at`), or one a caller posted (`posted`, by the token `posted_by`).
   * Absent on completions from before it was recorded.
   */
  evidence: z.enum(["recorded", "posted"]).optional(),
  posted_by: z.string().max(128).optional(),
  observations_rev: z.number().int().min(0).optional(),
  /** The policy's rule that approved, and the sources it rested on (`watcher:<name>`, `agent:<backend>`). */
  rule: z.string().max(64).optional(),
  sources: z.array(z.string().max(140)).max(16).optional(),
  quiescence: z.enum(QUIESCENCE_BASES).optional(),
});
export type CompletedEvidence = z.infer<typeof CompletedEvidenceSchema>;

/**
 * The report the job's latest finalize committed: what the live manifest must be for
 * the gate to trust it. Written with an `evidence_seq` bump, so a finalize that lands
 * while the gate decides makes the gate's commit fail.
 */
export const FinalizedReportSchema = z.strictObject({
  attempt_id: AttemptId,
  report_sha256: Sha256Hex,
  manifest_sha256: Sha256Hex,
  finalized_at: IsoTime,
});
export type FinalizedReport = z.infer<typeof FinalizedReportSchema>;

/**
 * Free-form progress an agent may report: a JSON object of at most 8 KiB, 16 levels,
 * storable by every store (bounds.ts), its own keys at most 64 characters.
 */
export const ProgressSchema = boundedJsonObject(
  { maxBytes: FREE_FORM_MAX_BYTES.progress, maxDepth: FREE_FORM_MAX_DEPTH, storable: true },
  "free-form progress",
).superRefine((v, ctx) => {
  for (const key of Object.keys(v)) {
    if (key.length > 64) ctx.addIssue({ code: "custom", message: "a progress key is at most 64 characters", path: [key.slice(0, 64)] });
  }
});

/** An agent's event `data`: a JSON object of at most 16 KiB and 16 levels, storable by every store. */
export const EventDataSchema = boundedJsonObject(
  { maxBytes: FREE_FORM_MAX_BYTES.eventData, maxDepth: FREE_FORM_MAX_DEPTH, storable: true },
  "the agent's event data",
);

/**
 * What the job's agents have sent it, counted against the quotas (issue 17): every
 * event, and the bytes of event data, report bodies and upload declarations. Written
 * only by `chargeUsage`, reserved before the bytes are written. Absent: nothing yet.
 * `attempt_bytes` counts the attempt `attempt_id` alone; a charge for another
 * attempt starts it again.
 */
export const AgentUsageSchema = z.strictObject({
  events: z.number().int().min(0),
  bytes: z.number().int().min(0),
  attempt_id: AttemptId,
  attempt_bytes: z.number().int().min(0),
});
export type AgentUsage = z.infer<typeof AgentUsageSchema>;

/**
 * One report upload in flight, or one finalize in progress, on an attempt (issue 17):
 * held on the job record (`upload_in_flight`, `finalize_in_progress`), taken by one
 * conditional write (`holdLease`: absent, expired by the clock, or an older attempt's)
 * and released by one on its `id`. `expires_at` bounds it, so a crashed process cannot
 * wedge the attempt. `declared`: an upload held by its declaration (its bytes not yet
 * sent through the service's route); a PUT of the body takes it over. `actor`: who
 * holds it, as the change feed names an actor (`type`, `token_id`).
 */
export const LeaseSchema = z.strictObject({
  id: z.string().min(1).max(128),
  attempt_id: AttemptId,
  since: IsoTime,
  expires_at: IsoTime,
  declared: z.literal(true).optional(),
  actor: z.strictObject({ type: z.enum(["agent", "operator", "service"]), token_id: z.string().min(1).max(128).optional() }).optional(),
});
export type Lease = z.infer<typeof LeaseSchema>;

/** The job record's field for each kind of lease. */
export const LEASE_FIELDS = { upload: "upload_in_flight", finalize: "finalize_in_progress" } as const;
export type LeaseKind = keyof typeof LEASE_FIELDS;

/**
 * What an observation says the agent's pane or session was doing (herdr's statuses):
 * `idle` and `done` are quiescent; `working` is activity; `blocked` (waiting on a
 * person) and `unknown` are neither.
 */
export const OBSERVED_STATES = ["working", "idle", "done", "blocked", "unknown"] as const;
export const ObservedStateSchema = z.enum(OBSERVED_STATES);
export type ObservedState = z.infer<typeof ObservedStateSchema>;

/**
 * The allowlisted fields of an agent hook's event (Claude Code's, Codex's), all that
 * mam keeps of it: never a tool's input or output, a prompt or a message. Each string
 * bounded; `background_tasks` only their types and statuses; `session_crons` a count.
 */
export const HookDetailsSchema = z.strictObject({
  event: z.string().min(1).max(64),
  stop_hook_active: z.boolean().optional(),
  notification_type: z.string().max(64).optional(),
  error: z.string().max(256).optional(),
  reason: z.string().max(64).optional(),
  source: z.string().max(32).optional(),
  background_tasks: z
    .array(z.strictObject({ type: z.string().max(64).optional(), status: z.string().max(32).optional() }))
    .max(16)
    .optional(),
  /** How many tasks there were, when more than the 16 kept. */
  background_task_count: z.number().int().min(0).optional(),
  session_crons: z.number().int().min(0).optional(),
});
export type HookDetails = z.infer<typeof HookDetailsSchema>;

/** Who recorded an observation, by class: a watcher token (`watcher:<name>`) or an agent's own token (`agent:<backend>`). */
export const SOURCE_CLASSES = ["watcher", "agent"] as const;
export type SourceClass = (typeof SOURCE_CLASSES)[number];
/** `<class>:<who>`, set by mam from the token, never by a caller. */
export const ObservationSource = z.string().regex(/^(watcher|agent):[^\s:]{1,128}$/, "a source is watcher:<name> or agent:<backend>");
/** The kind of signal (`pane_status`, `hook.stop`, `turn_end`, …): lowercase letters, digits, `_`, `.`, `-`. */
export const SourceKind = z
  .string()
  .regex(/^[a-z][a-z0-9_.-]{0,63}$/, "a source kind is 1-64 lowercase letters, digits, '_', '.' or '-', starting with a letter")
  .refine((kind) => !kind.startsWith("mam."), "source kinds starting with mam. are mam's own (its clock in a built scenario)");

/**
 * One observation mam recorded of a dispatch: what was seen (`state`, by a signal of
 * `source_kind`), by whom (`source`, from the token), of which dispatch (its session,
 * process generation and pane where they were given), when the source says it saw it
 * (`observed_at`, a claim) and when mam received it (`received_at`, mam's clock, which
 * orders observations and measures every span). A repeat of the source's last state
 * is coalesced into it: `last_seen_received_at` moves and `sightings` counts.
 */
export const ObservationSchema = z.strictObject({
  /** Its place in the attempt's observations, from 1; never reused. */
  seq: z.number().int().min(1),
  source: ObservationSource,
  source_kind: SourceKind,
  state: ObservedStateSchema,
  agent_session_uuid: z.string().min(1).max(128),
  pane_process_generation: z.number().int().min(0).optional(),
  pane_id: z.string().min(1).max(128).optional(),
  observed_at: IsoTime,
  received_at: IsoTime,
  last_seen_received_at: IsoTime,
  sightings: z.number().int().min(1),
  /** What an agent hook's event said, its allowlisted fields only (agent-hooks.ts); a repeat keeps its first. */
  hook: HookDetailsSchema.optional(),
});
export type Observation = z.infer<typeof ObservationSchema>;

/** How an attempt's session ended its quiescence evidence: a Claude Code `SessionStart` of `clear` or `fork` (another conversation). */
export const EvidenceEndSchema = z.strictObject({
  source: ObservationSource,
  cause: z.enum(["clear", "fork"]),
  at: IsoTime,
});
export type EvidenceEnd = z.infer<typeof EvidenceEndSchema>;

/** The agent's own session id, bound to the attempt by its first hook event when the agent names it (a Codex thread). Set once. */
export const BoundSessionSchema = z.strictObject({
  id: z.string().min(1).max(128),
  /** The field it came in (`thread-id`, `session_id`), named when another session is refused. */
  field: z.string().min(1).max(32),
  at: IsoTime,
});
export type BoundSession = z.infer<typeof BoundSessionSchema>;

/** Why a source's next observation was not stored: its class's count or bytes bound (`OBSERVATION_BOUNDS`). */
export const OverflowSchema = z.strictObject({
  source: ObservationSource,
  bound: z.enum(["count", "bytes"]),
  at: IsoTime,
});
export type Overflow = z.infer<typeof OverflowSchema>;

/**
 * The observations of the job's latest dispatched attempt, kept in the job record (one
 * conditional write each, bounded per source class: bounds.ts `OBSERVATION_BOUNDS`).
 * `rev` grows by one with every write of it (a new observation, a coalesced repeat,
 * an overflow), across attempts too, so a write conditional on the `rev` it read
 * loses to any other. `overflow`: a source's class passed its bound on this attempt;
 * the gate holds until the next dispatch.
 */
export const ObservationSetSchema = z.strictObject({
  attempt_id: AttemptId,
  rev: z.number().int().min(1),
  entries: z.array(ObservationSchema),
  overflow: OverflowSchema.optional(),
  /** A session cleared or forked: the gate holds until the next dispatch. */
  ended: EvidenceEndSchema.optional(),
  bound_session: BoundSessionSchema.optional(),
  /** Stop nudges answered on this attempt (each counted in its Stop observation's write; at most MAM_NUDGE_MAX). */
  nudges: z.number().int().min(1).optional(),
});
export type ObservationSet = z.infer<typeof ObservationSetSchema>;

/** What a watcher or an agent hook posts (`POST /v1/jobs/{id}/observations`): who recorded it is mam's, from the token. */
export const ObservationRequestSchema = z.strictObject({
  state: ObservedStateSchema,
  source_kind: SourceKind,
  attempt_id: AttemptId,
  agent_session_uuid: z.string().min(1).max(128),
  pane_process_generation: z.number().int().min(0).optional(),
  pane_id: z.string().min(1).max(128).optional(),
  observed_at: IsoTime,
});
export type ObservationRequest = z.infer<typeof ObservationRequestSchema>;

export const JobRecordSchema = z.strictObject({
  job_id: JobId,
  prompt: z.string().max(65536),
  agent: z.string().min(1).max(64),
  role: RoleSchema,
  status: StatusSchema,
  iteration: z.number().int().min(0),
  transition_seq: z.number().int().min(0),
  /**
   * Bumped by every write the gate's evidence depends on (dispatch, report stage,
   * finalize), never by a state transition; the gate commits on it and on
   * `transition_seq`. A record from before it existed has none: it reads as 0.
   */
  evidence_seq: z.number().int().min(0).default(0),
  /** The job's latest dispatched attempt (not `attempt_id`: attempt identity lives in the dispatch, B-03). */
  latest_attempt: AttemptId.optional(),
  finalized_report: FinalizedReportSchema.optional(),
  expected_artifacts: z.array(ArtifactKind),
  auto_complete: z.boolean(),
  /** Answer a `Stop` hook with no finalized report by sending the agent back once (issue 21); off when absent. */
  nudge_on_stop: z.boolean().optional(),
  agent_session: z.string().max(256).optional(),
  progress: ProgressSchema.optional(),
  completed_by: z.literal("auto_complete").optional(),
  completed_evidence: CompletedEvidenceSchema.optional(),
  pending_notification: NotificationIntentSchema.optional(),
  agent_usage: AgentUsageSchema.optional(),
  upload_in_flight: LeaseSchema.optional(),
  finalize_in_progress: LeaseSchema.optional(),
  /** What mam recorded of the latest dispatch (`recordObservation`); written only by `writeObservations`. */
  observations: ObservationSetSchema.optional(),
  /**
   * A candidate mark (issue 20): when the scheduled evaluation should next try the
   * gate on this running job (its last quiescent receipt and the settle window), read
   * through a sparse index by due time. Set by evidence writes, cleared by the sweep
   * after a hold (conditionally on the evidence it read), removed by every terminal
   * write and every new dispatch; written only by the persistence base.
   */
  candidate_at: IsoTime.optional(),
  /**
   * The attention marks (issue 20, part 4), written only by the persistence base: the
   * last activity of the job (every transition and evidence write, a `working` sighted
   * again); its current attempt's deadline (start-to-close, from its dispatch); when the
   * sweep marked it stale (no activity for MAM_STALE_AFTER_SECONDS) or overdue (past the
   * deadline), each once; and when the sweep should next look at it (`attention_at`, the
   * attention index's key). Activity clears the stale mark; a new dispatch, the overdue
   * mark; a terminal write removes every mark.
   */
  activity_at: IsoTime.optional(),
  deadline_at: IsoTime.optional(),
  stale_since: IsoTime.optional(),
  overdue_since: IsoTime.optional(),
  attention_at: IsoTime.optional(),
  created_at: IsoTime,
  updated_at: IsoTime,
});
export type JobRecord = z.infer<typeof JobRecordSchema>;

export const RegisterJobSchema = z.strictObject({
  job_id: JobId.optional(),
  prompt: boundedText(FREE_FORM_MAX_BYTES.prompt),
  agent: z.string().min(1).max(64),
  role: RoleSchema.optional(),
  expected_artifacts: z.array(ArtifactKind).max(32).optional(),
  auto_complete: z.boolean().optional(),
  nudge_on_stop: z.boolean().optional(),
});
export type RegisterJob = z.infer<typeof RegisterJobSchema>;

export const ACTIONS = ["claim", "progress", "completed", "error", "cancel"] as const;
export const ActionSchema = z.enum(ACTIONS);
export type Action = z.infer<typeof ActionSchema>;

/** Fields a `progress` transition may write. Who may write which is the engine's table. */
export const ProgressFieldsSchema = z.strictObject({
  progress: ProgressSchema.optional(),
  agent_session: boundedText(256).optional(),
  auto_complete: z.boolean().optional(),
  nudge_on_stop: z.boolean().optional(),
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
  /** The terminal the pane runs (herdr's `terminal_id`): with `pane_id`, how a collector maps a pane to this dispatch. */
  terminal_id: z.string().min(1).max(128).optional(),
  anchor: ExecutionAnchorSchema.partial({ started_at: true }).optional(),
  /** A start-to-close timeout for this attempt, in seconds from the dispatch (default: MAM_DEADLINE_SECONDS, if set). */
  deadline_seconds: z
    .number()
    .int()
    .min(60)
    .max(30 * 86_400)
    .optional(),
});
export type DispatchRequest = z.infer<typeof DispatchRequestSchema>;

export const DispatchRecordSchema = z.strictObject({
  job_id: JobId,
  attempt_id: AttemptId,
  agent_session_uuid: z.string().min(1).max(128),
  pane_process_generation: z.number().int().min(0),
  pane_id: z.string().max(128).optional(),
  terminal_id: z.string().min(1).max(128).optional(),
  anchor: ExecutionAnchorSchema,
  recorded_at: IsoTime,
  /** The attempt's start-to-close deadline, when it has one (`deadline_seconds`, else MAM_DEADLINE_SECONDS). */
  deadline_at: IsoTime.optional(),
});
export type DispatchRecord = z.infer<typeof DispatchRecordSchema>;

export const SideEffectSchema = z.strictObject({
  kind: ArtifactKind,
  reference: boundedText(FREE_FORM_MAX_BYTES.sideEffectReference).refine((s) => s.trim().length > 0, {
    message: "a side effect needs a non-blank reference",
  }),
});
export type SideEffect = z.infer<typeof SideEffectSchema>;

export const EventLogEntrySchema = z.strictObject({
  job_id: JobId,
  at: IsoTime,
  /** Unique within the job, sortable by time. */
  id: z.string(),
  event: z.string().min(1).max(64),
  /**
   * What mam recorded: its own fields, and an agent's `data` (EventDataSchema, at
   * most 16 KiB) one level in. Describes what a read returns; writes are bounded by
   * the request schemas.
   */
  data: boundedJsonObject(
    { maxBytes: 64 * 1024, maxDepth: FREE_FORM_MAX_DEPTH + 2, storable: false },
    "what mam recorded: its own fields, and the agent's event data under `data`",
  ).optional(),
});
export type EventLogEntry = z.infer<typeof EventLogEntrySchema>;

export const PublishEventRequestSchema = z.strictObject({
  event: z.enum(["started", "progress", "completed", "error"]),
  expected_seq: z.number().int().min(0).optional(),
  finalize: z.strictObject({ attempt_id: AttemptId, side_effects: z.array(SideEffectSchema).max(64) }).optional(),
  data: EventDataSchema.optional(),
});
export type PublishEventRequest = z.infer<typeof PublishEventRequestSchema>;

export const DecisionSchema = z.strictObject({
  decision: z.enum(["candidate_approved", "hold"]),
  reason: z.string(),
  /** On a scenario mam built (`mam.scenario/v2`), the rule that approved (quiescence-rules.ts). */
  rule: z.string().optional(),
  /** The sources the approval rested on (`watcher:<name>`, `agent:<backend>`). */
  sources: z.array(z.string()).optional(),
  quiescence: z.enum(QUIESCENCE_BASES).optional(),
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
