import { z } from "@hono/zod-openapi";
import { type Deps, getJob, MamError, recordDispatch, registerJob, transitionJob } from "@mam/core";
import { operator, operatorOrAgent, principalOf } from "../access.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, ETAG_HEADER, exampleProblem, jsonAnswer, jsonRequest, LOCATION_HEADER } from "../openapi.ts";
import {
  AttemptPathSchema,
  DispatchRecord,
  DispatchRequest,
  DispatchResponseSchema,
  JobPageSchema,
  JobPathSchema,
  JobRecord,
  ListJobsQuerySchema,
  RegisterJob,
  TransitionRequest,
} from "../wire.ts";
import { actorOf, recordAnswer, withBodyPaths, withHandler } from "./support.ts";

export const registerJobRoute = withHandler(
  defineRoute(
    operator("write"),
    {
      operationId: "registerJob",
      method: "post",
      path: "/v1/jobs",
      tags: ["jobs"],
      summary: "Register a job",
      description: "Status `pending`, `transition_seq` 0. A `job_id` may be given; otherwise a lowercase UUID is generated.",
      request: {
        body: jsonRequest(RegisterJob, {
          withId: { summary: "A job with its own id, opted in to auto-completion", value: EXAMPLE.registerJob },
          generatedId: { summary: "A job whose id the service generates", value: { prompt: "Update the changelog", agent: "codex" } },
        }),
      },
      responses: {
        201: jsonAnswer("The registered job.", JobRecord, EXAMPLE.pendingJob, { ...ETAG_HEADER, ...LOCATION_HEADER }),
      },
    },
    [exampleProblem("job.exists", `job ${EXAMPLE.jobId} already exists`)],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const job = await registerJob(deps, c.req.valid("json"), actorOf(principalOf(c)));
    return recordAnswer(c, job, 201, { location: `/v1/jobs/${job.job_id}` });
  },
);

export const listJobsRoute = withHandler(
  defineRoute(operator("read"), {
    operationId: "listJobs",
    method: "get",
    path: "/v1/jobs",
    tags: ["jobs"],
    summary: "List jobs, newest first, paged",
    description:
      "Newest update first. With `owed=quarantined`, the jobs whose owed notification is quarantined instead. With `stale=true`, `overdue=true` or `candidate=due`, only the running jobs carrying that mark (issue 20): read as the running jobs filtered, so a page costs the running jobs read, not only those listed.",
    request: { query: ListJobsQuerySchema },
    responses: {
      200: jsonAnswer("One page of jobs.", JobPageSchema, { items: [EXAMPLE.runningJob], next_cursor: EXAMPLE.cursor }),
    },
  }),
  async (c) => {
    const { deps } = c.var.services;
    const q = c.req.valid("query");
    const cursor = q.cursor === undefined ? {} : { cursor: q.cursor };
    const mark =
      q.stale !== undefined ? "stale" : q.overdue !== undefined ? "overdue" : q.candidate !== undefined ? "candidate" : undefined;
    const page =
      q.owed === "quarantined"
        ? await deps.jobs.listQuarantined({ limit: q.limit, ...cursor })
        : mark !== undefined
          ? await deps.jobs.list({ limit: q.limit, mark, dueBy: deps.clock.now().toISOString(), ...cursor })
          : await deps.jobs.list({ limit: q.limit, ...(q.status === undefined ? {} : { status: q.status }), ...cursor });
    return c.json({ items: [...page.items], ...(page.cursor === undefined ? {} : { next_cursor: page.cursor }) }, 200);
  },
);

const StatusCountSchema = z.number().int().openapi({ description: "How many jobs hold this status." });

export const JobCountsSchema = z
  .strictObject({
    counts: z.strictObject({
      pending: StatusCountSchema,
      running: StatusCountSchema,
      completed: StatusCountSchema,
      error: StatusCountSchema,
      cancelled: StatusCountSchema,
    }),
    consistency: z.enum(["exact", "eventual"]).openapi({
      description:
        "`exact`: counted in each write's own transaction (SQLite, `mam serve`). `eventual`: counted after the write, from the table's stream, by the feed writer (AWS): a change shows here once the feed writer has seen it, seconds later as a rule.",
    }),
  })
  .openapi("JobCounts");

export const countJobsRoute = withHandler(
  defineRoute(operator("read"), {
    operationId: "countJobs",
    method: "get",
    path: "/v1/job-counts",
    tags: ["jobs"],
    summary: "How many jobs each status holds",
    description:
      "The counts per status the store keeps through its writes (issue 22): one read, whatever the number of jobs. On `mam serve` (SQLite) they are exact, written in each write's own transaction. On AWS they are eventually consistent: the feed writer counts each change from the DynamoDB stream, so a change is counted after the stream's delay (seconds as a rule; longer while the feed writer retries), and never twice. `consistency` says which.",
    responses: {
      200: jsonAnswer("The counts per status.", JobCountsSchema, {
        counts: { pending: 3, running: 12, completed: 140, error: 2, cancelled: 1 },
        consistency: "exact",
      }),
    },
  }),
  async (c) => {
    const { deps } = c.var.services;
    const answer = await deps.jobs.countByStatus();
    return c.json({ counts: { ...answer.counts }, consistency: answer.consistency }, 200);
  },
);

export const getJobRoute = withHandler(
  defineRoute(
    operatorOrAgent("read", "job"),
    {
      operationId: "getJob",
      method: "get",
      path: "/v1/jobs/{job_id}",
      tags: ["jobs"],
      summary: "Read one job",
      description: "`ETag` is the record's `transition_seq`, quoted; send it back as `If-Match` on a transition.",
      request: { params: JobPathSchema },
      responses: { 200: jsonAnswer("The job record.", JobRecord, EXAMPLE.runningJob, ETAG_HEADER) },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    return recordAnswer(c, await getJob(deps, c.req.valid("param").job_id), 200);
  },
);

const IfMatchHeaders = z.object({
  "If-Match": z
    .string()
    .optional()
    .openapi({
      description:
        'The `ETag` of the record the transition is decided on (`"2"`), or `*`. One that does not name the current `transition_seq` is a 412 ' +
        "carrying the current record. Without `expected_seq` in the body, its seq is the compare-and-swap's.",
      example: '"2"',
    }),
});

const SEQ_REQUIRED =
  "expected_seq is required: send it in the body, or the record's ETag as an If-Match header (every transition is compare-and-swap on transition_seq)";

export const transitionJobRoute = withHandler(
  defineRoute(
    operatorOrAgent("write", "job"),
    {
      operationId: "transitionJob",
      method: "post",
      path: "/v1/jobs/{job_id}/transitions",
      tags: ["jobs"],
      summary: "Apply a transition (compare-and-swap on transition_seq)",
      description:
        "While CAS is on (the default), the seq the transition expects is required: `expected_seq` in the body, or an `If-Match` header " +
        "(the record's `ETag`); with neither it is a 400 naming both. A stale `expected_seq` is a 409 carrying the current record in `current`; " +
        "a status that does not allow the action is a 409 too. An `If-Match` that does not name the current `transition_seq` is a 412. " +
        "An agent may `claim`, `progress` (its own free-form fields only), `completed` and `error`.",
      request: {
        params: JobPathSchema,
        headers: IfMatchHeaders,
        body: jsonRequest(TransitionRequest, {
          expectedSeq: { summary: "The seq in the body: claim a pending job", value: EXAMPLE.claim },
          ifMatch: {
            summary: 'The seq as `If-Match: "2"` (the record\'s ETag): report progress',
            value: EXAMPLE.progressWithIfMatch,
          },
        }),
      },
      responses: { 200: jsonAnswer("The committed record.", JobRecord, EXAMPLE.runningJob, ETAG_HEADER) },
    },
    [exampleProblem("input.invalid", SEQ_REQUIRED, { issues: [{ path: "body.expected_seq", message: "required" }] }), 404, 409, 412],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { job_id: jobId } = c.req.valid("param");
    const body = c.req.valid("json");
    const ifMatch = c.req.valid("header")["If-Match"];
    let expectedSeq = body.expected_seq;
    if (ifMatch !== undefined) {
      const current = await getJob(deps, jobId);
      const tags = parseIfMatch(ifMatch);
      if (tags !== "*" && !tags.includes(current.transition_seq)) {
        throw new MamError(
          "job.preconditionFailed",
          `If-Match ${ifMatch} does not match job ${jobId}'s transition_seq ${current.transition_seq}`,
          { details: { current } },
        );
      }
      // A client that states its seq in If-Match need not repeat it in the body:
      // the compare-and-swap then runs on that seq, so a writer landing between
      // this read and the write still loses with a 409.
      if (expectedSeq === undefined && tags !== "*" && tags.length === 1) expectedSeq = tags[0];
    }
    if (expectedSeq === undefined && ifMatch === undefined && deps.flags.engineCas) {
      throw new MamError("input.invalid", SEQ_REQUIRED, { issues: [{ path: "body.expected_seq", message: "required" }] });
    }
    const job = await withBodyPaths(() =>
      transitionJob(
        deps,
        jobId,
        { action: body.action, expectedSeq, fields: body.fields, notify: body.notify, reason: body.reason },
        actorOf(principalOf(c)),
      ),
    );
    return recordAnswer(c, job, 200);
  },
);

export const recordDispatchRoute = withHandler(
  defineRoute(
    operator("write"),
    {
      operationId: "recordDispatch",
      method: "post",
      path: "/v1/jobs/{job_id}/dispatches",
      tags: ["dispatch"],
      summary: "Record a dispatch and mint the agent's token",
      description:
        "The attempt must be greater than the job's latest. The token is bound to this job and attempt; a newer dispatch of the job retires it.",
      request: {
        params: JobPathSchema,
        body: jsonRequest(DispatchRequest, { firstAttempt: { summary: "The first attempt, in pane %12", value: EXAMPLE.dispatchRequest } }),
      },
      responses: { 201: jsonAnswer("The dispatch and the agent's token.", DispatchResponseSchema, EXAMPLE.dispatchResponse) },
    },
    [404, exampleProblem("dispatch.outOfOrder", `attempt 1 is not greater than job ${EXAMPLE.jobId}'s latest dispatched attempt 1`)],
  ),
  async (c) => {
    const { deps, tokens } = c.var.services;
    const { job_id: jobId } = c.req.valid("param");
    const dispatch = await withCurrentRecord(deps, jobId, () => recordDispatch(deps, jobId, c.req.valid("json"), actorOf(principalOf(c))));
    const minted = tokens.mintAgent(jobId, dispatch.attempt_id);
    return c.json({ dispatch, agent_token: minted.token, expires_at: minted.expiresAt }, 201);
  },
);

export const getDispatchRoute = withHandler(
  defineRoute(
    operatorOrAgent("read", "attempt"),
    {
      operationId: "getDispatch",
      method: "get",
      path: "/v1/jobs/{job_id}/dispatches/{attempt}",
      tags: ["dispatch"],
      summary: "Read one recorded dispatch",
      description:
        "The write-once record of one attempt: its session, process generation, pane and terminal, anchor and deadline. A collector maps what it sees to a dispatch by it (`mam watch herdr`).",
      request: { params: AttemptPathSchema },
      responses: { 200: jsonAnswer("The dispatch.", DispatchRecord, EXAMPLE.dispatchResponse.dispatch) },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { job_id: jobId, attempt } = c.req.valid("param");
    const dispatch = await deps.jobs.getDispatch(jobId, attempt);
    if (dispatch === undefined) throw new MamError("dispatch.notFound", `job ${jobId} has no recorded dispatch for attempt ${attempt}`);
    return c.json(dispatch, 200);
  },
);

/** `*`, or the seqs named by strong entity tags (`"3"`; bare digits tolerated). Weak tags never match. */
function parseIfMatch(header: string): "*" | number[] {
  if (header.trim() === "*") return "*";
  return header
    .split(",")
    .map((t) => t.trim())
    .map((t) => /^"(\d{1,15})"$/.exec(t)?.[1] ?? /^(\d{1,15})$/.exec(t)?.[1])
    .filter((t): t is string => t !== undefined)
    .map(Number);
}

/**
 * Every 409 about the job's status carries the record it is about (`current`).
 * Core's recordDispatch refuses a terminal job with a bare `job.transitionRefused`;
 * read the record on that error path only and attach it.
 */
async function withCurrentRecord<T>(deps: Deps, jobId: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof MamError && e.code === "job.transitionRefused" && e.details.current === undefined) {
      const current = await deps.jobs.get(jobId);
      if (current !== undefined) throw new MamError(e.code, e.message, { issues: e.issues, details: { ...e.details, current }, cause: e });
    }
    throw e;
  }
}
