import { z } from "@hono/zod-openapi";
import { attemptReportLocation, completedAlready, evaluateJob, getJob, MamError, publishAgentEvent } from "@mam/core";
import { operator, operatorOrAgent, principalOf } from "../access.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, jsonRequest } from "../openapi.ts";
import {
  AlreadyCompletedSchema,
  EvaluationRequestSchema,
  EventLogSchema,
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
    const r = await evaluateJob(deps, c.req.valid("param").job_id, c.req.valid("json").scenario);
    return c.json(
      { committed: r.committed, reason: r.reason, decision: r.decision, ...(r.record === undefined ? {} : { record: r.record }) },
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
    const actor = actorOf(principal);
    const publishing = withBodyPaths(() =>
      publishAgentEvent(
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
        actor,
        { inline: publishInline },
      ),
    );
    const r = await publishing.catch(async (refusal: unknown) => {
      // The agent's own completion, sent again: told it is done, nothing written (core's rule).
      const shown = fin === undefined ? ({ stored: "report" } as const) : ({ stored: "finalize" } as const);
      const record = body.event === "completed" ? await completedAlready(deps, jobId, refusal, actor, shown) : undefined;
      if (record === undefined) throw refusal;
      return { alreadyCompleted: record } as const;
    });
    if ("alreadyCompleted" in r) return c.json({ already_completed: true as const, record: r.alreadyCompleted }, 200);
    // A publish that fails after the commit is not an error of this request: the
    // transition and its intent are committed, and the intent stays owed until the
    // recovery sweep (or the change relay) delivers it. Answering 5xx would invite
    // the agent to retry a transition that already happened, so the answer is a 200
    // that says so (`published: false` and why). Where another path publishes every
    // commit (the relay, the stream publisher), the request does not know, and says
    // nothing: no `published` at all.
    const flush = r.flush;
    return c.json(
      {
        record: r.record,
        ...(flush === undefined ? {} : { published: flush.outcome !== "failed" }),
        ...(r.finalized === undefined
          ? {}
          : { finalized: { manifest: r.finalized.manifest, manifest_sha256: r.finalized.manifestSha256 } }),
        ...(flush?.outcome === "failed" ? { publish_error: { code: flush.error.code, message: flush.error.message } } : {}),
        ...(r.warnings.length > 0 ? { warnings: [...r.warnings] } : {}),
      },
      200,
    );
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
