import { z } from "@hono/zod-openapi";
import { answerPublishEvent, attemptReportLocation, evaluateJob, getJob, MamError, RECORDED } from "@mam/core";
import { operator, operatorOrAgent, principalOf } from "../access.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, jsonRequest } from "../openapi.ts";
import {
  AlreadyCompletedSchema,
  EvaluationRequestSchema,
  EventLogSchema,
  GateDryRunSchema,
  GateResponseSchema,
  JobPathSchema,
  ListEventsQuerySchema,
  PublishEventRequest,
  PublishEventResponseSchema,
} from "../wire.ts";
import { actorOf, withBodyPaths, withHandler } from "./support.ts";

export const evaluateJobRoute = withHandler(
  defineRoute(
    operator("gate"),
    {
      operationId: "evaluateJob",
      method: "post",
      path: "/v1/jobs/{job_id}/evaluations",
      tags: ["gate"],
      summary: "The gate: evaluate a job against a scenario of collected evidence",
      description:
        "A decision, commit or refusal, is a 200. The scenario is read by the gate fail-closed: one it cannot read is a hold, not a 400 — " +
        "except one over 256 KiB of JSON or nested deeper than 16 levels, refused 400 before the gate runs.",
      request: {
        params: JobPathSchema,
        body: jsonRequest(EvaluationRequestSchema, {
          idlePane: { summary: "A pane seen working, then idle twice across the settle window", value: { scenario: EXAMPLE.scenario } },
        }),
      },
      responses: {
        200: jsonAnswer("The gate's answer: committed, or the first reason it refused.", GateResponseSchema, {
          committed: true,
          reason: "completed on evidence",
          decision: EXAMPLE.approved,
          record: EXAMPLE.completedJob,
        }),
      },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { scenario } = c.req.valid("json");
    const r = await evaluateJob(deps, c.req.valid("param").job_id, scenario === undefined ? RECORDED : scenario, {
      postedBy: scenario === undefined ? undefined : principalOf(c).tokenId,
    });
    return c.json(
      {
        committed: r.committed,
        reason: r.reason,
        decision: r.decision,
        ...(r.record === undefined ? {} : { record: r.record }),
        ...(r.scenario === undefined ? {} : { scenario: r.scenario }),
      },
      200,
    );
  },
);

export const dryRunGateRoute = withHandler(
  defineRoute(
    operator("read"),
    {
      operationId: "dryRunGate",
      method: "get",
      path: "/v1/jobs/{job_id}/gate",
      tags: ["gate"],
      summary: "The gate's dry run: what an evaluation would answer now, and why",
      description:
        "The same evaluation as `POST .../evaluations` without a scenario (built from what mam recorded), writing nothing: `would_commit`, the first reason it holds or the rule that would approve, and the scenario it built.",
      request: { params: JobPathSchema },
      responses: {
        200: jsonAnswer("What the gate would answer now.", GateDryRunSchema, {
          would_commit: false,
          reason: "the policy holds: watcher.pane_status: quiescent for 12s by its last sighting, less than the 30s settle window",
          decision: {
            decision: "hold",
            reason: "watcher.pane_status: quiescent for 12s by its last sighting, less than the 30s settle window",
          },
          evaluated_at: "2026-11-20T10:05:12.000Z",
        }),
      },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const evaluatedAt = deps.clock.now().toISOString();
    const r = await evaluateJob(deps, c.req.valid("param").job_id, RECORDED, { dryRun: true });
    return c.json(
      {
        would_commit: r.wouldCommit === true,
        reason: r.reason,
        decision: r.decision,
        ...(r.scenario === undefined ? {} : { scenario: r.scenario }),
        evaluated_at: evaluatedAt,
      },
      200,
    );
  },
);

export const publishEventRoute = withHandler(
  defineRoute(
    operatorOrAgent("write", "job"),
    {
      operationId: "publishEvent",
      method: "post",
      path: "/v1/jobs/{job_id}/events",
      tags: ["events"],
      summary: "Publish an agent event (finalize first when asked, commit, log, publish, settle)",
      description:
        "The answer comes as soon as the commit stands. An agent re-sending the `completed` its attempt already committed, on the report that completion pinned " +
        "(the attempt's report, or with `finalize` what a finalize would read: the staged upload, else the live report, hashing to `completed_evidence.report_sha256`), " +
        "is answered `{already_completed: true, record}` and nothing is written; any other event on a terminal job is refused as before. Where the service publishes the notification in the request, a failed publish is still a 200 with `published: false`: the commit stands and the notification stays owed for the recovery sweep. Where another path publishes every commit (the change relay of `mam serve`, the stream publisher on AWS), the answer has no `published`.",
      request: {
        params: JobPathSchema,
        body: jsonRequest(PublishEventRequest, {
          completedWithReport: { summary: "Completed, finalizing attempt 1's report in the same write", value: EXAMPLE.publishEvent },
          progress: { summary: "A progress event", value: { event: "progress", data: { step: "running the unit tests" } } },
        }),
      },
      responses: {
        200: jsonAnswer(
          "The committed record and the publish outcome; or, to a re-sent completion, that the job is already completed.",
          z.union([PublishEventResponseSchema, AlreadyCompletedSchema]),
          {
            record: EXAMPLE.completedByAgent,
            published: true,
            finalized: { manifest: EXAMPLE.manifest, manifest_sha256: EXAMPLE.completedJob.finalized_report.manifest_sha256 },
          },
        ),
      },
    },
    [
      exampleProblem("dispatch.notFound", `job ${EXAMPLE.jobId} has no recorded dispatch for attempt 3`, {
        issues: [{ path: "body.finalize.attempt_id", message: "not a recorded dispatch of this job" }],
      }),
      409,
      429,
      507,
    ],
  ),
  async (c) => {
    const { deps, publishInline } = c.var.services;
    const { job_id: jobId } = c.req.valid("param");
    const body = c.req.valid("json");
    const principal = principalOf(c);
    const fin = body.finalize;
    if (fin !== undefined) {
      if (principal.kind === "agent" && fin.attempt_id !== principal.attemptId) {
        throw new MamError("auth.forbidden", `this agent token is bound to attempt ${principal.attemptId}, not ${fin.attempt_id}`);
      }
      // The service finalizes only where it keeps reports: under a recorded dispatch.
      if (!(await deps.jobs.getDispatch(jobId, fin.attempt_id))) {
        await getJob(deps, jobId);
        throw new MamError("dispatch.notFound", `job ${jobId} has no recorded dispatch for attempt ${fin.attempt_id}`, {
          issues: [{ path: "body.finalize.attempt_id", message: "not a recorded dispatch of this job" }],
        });
      }
    }
    const answer = await withBodyPaths(() =>
      answerPublishEvent(
        deps,
        jobId,
        {
          event: body.event,
          expectedSeq: body.expected_seq,
          finalize:
            fin === undefined
              ? undefined
              : { location: attemptReportLocation(jobId, fin.attempt_id), attemptId: fin.attempt_id, sideEffects: fin.side_effects },
          data: body.data,
        },
        actorOf(principal),
        // The agent's own completion, sent again, shows what the service holds for its attempt.
        { inline: publishInline, resent: fin === undefined ? { stored: "report" } : { stored: "finalize" } },
      ),
    );
    return c.json(answer, 200);
  },
);

export const listEventsRoute = withHandler(
  defineRoute(
    operatorOrAgent("read", "job"),
    {
      operationId: "listEvents",
      method: "get",
      path: "/v1/jobs/{job_id}/events",
      tags: ["events"],
      summary: "Read the job's event log, oldest first, paged",
      description:
        "A page holds at most `limit` entries and at most 1 MiB of them (always at least one); `next_cursor`, absent on the last page, fetches the next.",
      request: { params: JobPathSchema, query: ListEventsQuerySchema },
      responses: { 200: jsonAnswer("One page of the event log.", EventLogSchema, { items: [EXAMPLE.eventLogEntry] }) },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { job_id: jobId } = c.req.valid("param");
    const q = c.req.valid("query");
    await getJob(deps, jobId);
    const page = await deps.jobs.listEvents(jobId, { limit: q.limit, ...(q.cursor === undefined ? {} : { cursor: q.cursor }) });
    return c.json({ items: [...page.items], ...(page.cursor === undefined ? {} : { next_cursor: page.cursor }) }, 200);
  },
);
