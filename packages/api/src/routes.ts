import { DispatchRequestSchema, JobRecordSchema, PublishEventRequestSchema, RegisterJobSchema, TransitionRequestSchema } from "@mam/core";
import type { z } from "zod";
import { ROUTE_PERMISSIONS, type RouteKey } from "./access.ts";
import {
  DispatchResponseSchema,
  EvaluationRequestSchema,
  EventLogSchema,
  FinalizedSchema,
  FinalizeRequestSchema,
  GateResponseSchema,
  HealthSchema,
  JobPageSchema,
  ListEventsQuerySchema,
  ListJobsQuerySchema,
  NotificationReleaseRequestSchema,
  NotificationReleaseResultSchema,
  PublishEventResponseSchema,
  RecoverySweepRequestSchema,
  RecoverySweepResultSchema,
  StagedReportSchema,
  VerificationQuerySchema,
  VerificationSchema,
} from "./wire.ts";

/**
 * The route table: one entry per route the app serves, read both by the app (which
 * binds a handler to each `operationId`) and by the OpenAPI generator.
 */
export type Method = "get" | "post" | "put";
export type PathParam = "job_id" | "attempt" | "file";

export interface RouteSpec {
  readonly operationId: string;
  readonly method: Method;
  /** OpenAPI path syntax: `/v1/jobs/{job_id}`. */
  readonly path: string;
  readonly summary: string;
  readonly description?: string;
  readonly tag: string;
  readonly params: readonly PathParam[];
  readonly query?: z.ZodObject;
  readonly body?: { readonly kind: "json"; readonly schema: z.ZodType; readonly optional?: boolean } | { readonly kind: "report" };
  readonly success: {
    readonly status: 200 | 201;
    readonly description: string;
    readonly schema?: z.ZodType;
    /** Non-JSON responses (HTML, assets). */
    readonly media?: string;
    readonly etag?: boolean;
  };
  /** Statuses this route's own logic can answer with, beyond those implied by auth, params and body. */
  readonly problems: readonly number[];
}

const job = ["job_id"] as const;
const attempt = ["job_id", "attempt"] as const;

export const ROUTES = [
  {
    operationId: "registerJob",
    method: "post",
    path: "/v1/jobs",
    tag: "jobs",
    summary: "Register a job",
    description: "Status `pending`, `transition_seq` 0. A `job_id` may be given; otherwise a lowercase UUID is generated.",
    params: [],
    body: { kind: "json", schema: RegisterJobSchema },
    success: { status: 201, description: "The registered job", schema: JobRecordSchema, etag: true },
    problems: [409],
  },
  {
    operationId: "listJobs",
    method: "get",
    path: "/v1/jobs",
    tag: "jobs",
    summary: "List jobs, newest first, paged",
    params: [],
    query: ListJobsQuerySchema,
    success: { status: 200, description: "One page of jobs", schema: JobPageSchema },
    problems: [],
  },
  {
    operationId: "getJob",
    method: "get",
    path: "/v1/jobs/{job_id}",
    tag: "jobs",
    summary: "Read one job",
    description: "`ETag` is the record's `transition_seq`, quoted; send it back as `If-Match` on a transition.",
    params: job,
    success: { status: 200, description: "The job record", schema: JobRecordSchema, etag: true },
    problems: [404],
  },
  {
    operationId: "transitionJob",
    method: "post",
    path: "/v1/jobs/{job_id}/transitions",
    tag: "jobs",
    summary: "Apply a transition (compare-and-swap on transition_seq)",
    description:
      "A stale `expected_seq` is a 409 carrying the current record in `current`; a status that does not allow the action is a 409 too. " +
      "An `If-Match` header that does not name the current `transition_seq` is a 412; when the body has no `expected_seq`, the `If-Match` seq is used as it. " +
      "An agent may `claim`, `progress` (its own free-form fields only), `completed` and `error`.",
    params: job,
    body: { kind: "json", schema: TransitionRequestSchema },
    success: { status: 200, description: "The committed record", schema: JobRecordSchema, etag: true },
    problems: [404, 409, 412],
  },
  {
    operationId: "recordDispatch",
    method: "post",
    path: "/v1/jobs/{job_id}/dispatches",
    tag: "dispatch",
    summary: "Record a dispatch and mint the agent's token",
    description: "Write-once per attempt. The token is bound to this job and attempt; a newer dispatch of the job retires it.",
    params: job,
    body: { kind: "json", schema: DispatchRequestSchema },
    success: { status: 201, description: "The dispatch and the agent's token", schema: DispatchResponseSchema },
    problems: [404, 409],
  },
  {
    operationId: "stageReport",
    method: "put",
    path: "/v1/jobs/{job_id}/attempts/{attempt}/report",
    tag: "reports",
    summary: "Stage an attempt's report body",
    description:
      "The raw body (any content type; `text/markdown` typical), streamed to the report store as `report-final.md.tmp`. Refused once the job is terminal.",
    params: attempt,
    body: { kind: "report" },
    success: { status: 201, description: "The staged body's digest", schema: StagedReportSchema },
    problems: [404, 409],
  },
  {
    operationId: "finalizeReport",
    method: "post",
    path: "/v1/jobs/{job_id}/attempts/{attempt}/finalize",
    tag: "reports",
    summary: "Finalize an attempt's report: promote, hash, write the manifest",
    params: attempt,
    body: { kind: "json", schema: FinalizeRequestSchema },
    success: { status: 200, description: "The manifest written", schema: FinalizedSchema },
    problems: [404, 409],
  },
  {
    operationId: "verifyReport",
    method: "get",
    path: "/v1/jobs/{job_id}/attempts/{attempt}/verification",
    tag: "reports",
    summary: "Verify an attempt's manifest against the stored report",
    description: "A failed verification is an answer (`ok: false` with the reason), not an error.",
    params: attempt,
    query: VerificationQuerySchema,
    success: { status: 200, description: "The verification", schema: VerificationSchema },
    problems: [404],
  },
  {
    operationId: "evaluateJob",
    method: "post",
    path: "/v1/jobs/{job_id}/evaluations",
    tag: "gate",
    summary: "The gate: evaluate a job against a scenario of collected evidence",
    description:
      "A decision, commit or refusal, is a 200. The scenario is read by the gate fail-closed: one it cannot read is a hold, not a 400 — " +
      "except one over 256 KiB of JSON or nested deeper than 16 levels, refused 400 before the gate runs.",
    params: job,
    body: { kind: "json", schema: EvaluationRequestSchema },
    success: { status: 200, description: "The gate's answer", schema: GateResponseSchema },
    problems: [404],
  },
  {
    operationId: "publishEvent",
    method: "post",
    path: "/v1/jobs/{job_id}/events",
    tag: "events",
    summary: "Publish an agent event (finalize first when asked, commit, log, publish, settle)",
    description:
      "A failed publish after the commit is still a 200 with `published: false`: the commit stands and the notification stays owed for the recovery sweep.",
    params: job,
    body: { kind: "json", schema: PublishEventRequestSchema },
    success: { status: 200, description: "The committed record and the publish outcome", schema: PublishEventResponseSchema },
    problems: [404, 409],
  },
  {
    operationId: "listEvents",
    method: "get",
    path: "/v1/jobs/{job_id}/events",
    tag: "events",
    summary: "Read the job's event log, oldest first, paged",
    description:
      "A page holds at most `limit` entries and at most 1 MiB of them (always at least one); `next_cursor`, absent on the last page, fetches the next.",
    params: job,
    query: ListEventsQuerySchema,
    success: { status: 200, description: "One page of the event log", schema: EventLogSchema },
    problems: [404],
  },
  {
    operationId: "runRecoverySweep",
    method: "post",
    path: "/v1/recovery-sweeps",
    tag: "operations",
    summary: "Re-send every owed notification that is due",
    description:
      "The body may be absent or `{}`. Each owed intent is tried on its own: one that fails for a reason of its own is retried with backoff and quarantined after the configured number of failures; an unreachable broker counts against nobody and stops the sweep (the rest are `not_tried`).",
    params: [],
    body: { kind: "json", schema: RecoverySweepRequestSchema, optional: true },
    success: { status: 200, description: "The sweep's counts and each intent's outcome", schema: RecoverySweepResultSchema },
    problems: [503],
  },
  {
    operationId: "releaseNotification",
    method: "post",
    path: "/v1/jobs/{job_id}/notification-release",
    tag: "operations",
    summary: "Release the job's owed notification from quarantine and backoff",
    description:
      "Clears the owed intent's failure count, `retry_at` and `quarantined_at`, so the next sweep tries it. The body may be absent or `{}`; with `intent_id`, only that intent is released. Nothing to release is a 200 with `released: false`.",
    params: job,
    body: { kind: "json", schema: NotificationReleaseRequestSchema, optional: true },
    success: { status: 200, description: "Whether it was released, and the record", schema: NotificationReleaseResultSchema },
    problems: [404],
  },
  {
    operationId: "getOpenApi",
    method: "get",
    path: "/openapi.json",
    tag: "meta",
    summary: "This OpenAPI document",
    params: [],
    success: { status: 200, description: "OpenAPI 3.1", media: "application/json" },
    problems: [],
  },
  {
    operationId: "getDocs",
    method: "get",
    path: "/docs",
    tag: "meta",
    summary: "API docs (Swagger UI over /openapi.json)",
    params: [],
    success: { status: 200, description: "HTML", media: "text/html" },
    problems: [],
  },
  {
    operationId: "getDocsAsset",
    method: "get",
    path: "/docs/assets/{file}",
    tag: "meta",
    summary: "A Swagger UI asset, served from the swagger-ui-dist package",
    params: ["file"],
    success: { status: 200, description: "The asset", media: "application/octet-stream" },
    problems: [404],
  },
  {
    operationId: "getAsset",
    method: "get",
    path: "/assets/{file}",
    tag: "meta",
    summary: "The dashboard's script and stylesheet",
    params: ["file"],
    success: { status: 200, description: "The asset", media: "application/octet-stream" },
    problems: [404],
  },
  {
    operationId: "getHealth",
    method: "get",
    path: "/healthz",
    tag: "meta",
    summary: "Liveness",
    params: [],
    success: { status: 200, description: "Alive", schema: HealthSchema },
    problems: [],
  },
  {
    operationId: "getDashboard",
    method: "get",
    path: "/",
    tag: "meta",
    summary: "The dashboard shell (its data needs a token)",
    params: [],
    success: { status: 200, description: "HTML", media: "text/html" },
    problems: [],
  },
] as const satisfies readonly RouteSpec[];

export type OperationId = (typeof ROUTES)[number]["operationId"];

export function routeKey(spec: Pick<RouteSpec, "method" | "path">): RouteKey {
  const key = `${spec.method.toUpperCase()} ${spec.path}`;
  if (!(key in ROUTE_PERMISSIONS)) throw new Error(`route ${key} has no entry in ROUTE_PERMISSIONS`);
  return key as RouteKey;
}
