import { flushNotification, logEvent, releaseNotification, sweepPass } from "@mam/core";
import { operator, principalOf } from "../access.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, jsonAnswer, jsonRequest } from "../openapi.ts";
import {
  JobPathSchema,
  NotificationReleaseRequestSchema,
  NotificationReleaseResultSchema,
  NotificationSendResultSchema,
  RecoverySweepRequestSchema,
  RecoverySweepResultSchema,
} from "../wire.ts";
import { actorOf, withHandler } from "./support.ts";

const OPTIONAL_BODY = "Optional: no body at all, or JSON.";

export const runRecoverySweepRoute = withHandler(
  defineRoute(operator("ops"), {
    operationId: "runRecoverySweep",
    method: "post",
    path: "/v1/recovery-sweeps",
    tags: ["operations"],
    summary: "Re-send every owed notification that is due, then evaluate the due candidates",
    description:
      "The body may be absent or `{}`. The sweep takes only intents due at least the service's grace period ago (MAM_SWEEP_GRACE_SECONDS), so it does not race the path that publishes each commit; `grace_seconds` asks for another (0: everything due now). Each owed intent is tried on its own: one that fails for a reason of its own is retried with backoff and quarantined after the configured number of failures; an unreachable or congested broker counts against nobody and the sweep goes on with the others; an unreachable store stops it, and so does the sweep's time budget (MAM_SWEEP_BUDGET_SECONDS): the rest are `not_tried`, owed for the next sweep. Then, never before, the pass evaluates the jobs marked candidates that are due (at most MAM_SWEEP_EVALUATIONS, until MAM_SWEEP_EVALUATION_MIB of reports hashed), oldest due first, on the scenario mam builds from what it recorded: `candidates`. Last, the running jobs due for a look: each marked stale (no activity for MAM_STALE_AFTER_SECONDS) or overdue (past its attempt's deadline) once, with a feed row and a notification: `attention`.",
    request: {
      body: jsonRequest(
        RecoverySweepRequestSchema,
        {
          empty: { summary: "No options: the service's grace period", value: {} },
          now: { summary: "Everything due now, fresh intents included", value: { grace_seconds: 0 } },
        },
        { required: false, description: OPTIONAL_BODY },
      ),
    },
    responses: {
      200: jsonAnswer("The sweep's counts and each intent's outcome.", RecoverySweepResultSchema, {
        owed: 2,
        sent: 1,
        failed: 1,
        quarantined: 0,
        not_tried: 0,
        results: [
          { job_id: EXAMPLE.jobId, intent_id: EXAMPLE.completedJob.pending_notification.id, outcome: "sent" },
          {
            job_id: "job-7c1e",
            intent_id: "5a9d3e7b-2c4f-4a1d-9e8b-0f6c2d4a8e1b",
            outcome: "failed",
            error: { code: "publish.refused", message: "the broker refused the publish to mam/jobs/job-7c1e/events" },
            failures: 1,
            retry_at: "2026-11-20T10:08:30.000Z",
          },
        ],
        candidates: {
          due: 1,
          completed: 1,
          held: 0,
          kept: 0,
          failed: 0,
          not_tried: 0,
          bytes_hashed: 2048,
          results: [
            {
              job_id: "job-3f2a",
              outcome: "completed",
              reason:
                "completed on evidence: manifest committed; quiescent for 31s (2 sightings by watcher:herdr-1) after the last working, by rule watcher.pane_status",
            },
          ],
        },
        attention: {
          due: 2,
          stale: 1,
          overdue: 0,
          rekeyed: 1,
          lost_race: 0,
          failed: 0,
          results: [
            { job_id: "job-5b7c", outcome: "stale" },
            { job_id: "job-9d1e", outcome: "rekeyed" },
          ],
        },
      }),
    },
  }),
  async (c) => {
    const { deps, logger, settings } = c.var.services;
    const requestId = c.get("requestId");
    const body = c.req.valid("json");
    const {
      notifications: r,
      candidates,
      attention,
    } = await sweepPass(deps, {
      policy: settings.sweep,
      graceMs: (body.grace_seconds ?? settings.sweepGraceSeconds) * 1000,
      budgetMs: settings.sweepBudgetSeconds * 1000,
      evaluation: settings.sweepEvaluation,
      log: (entry) => logEvent(logger, { request_id: requestId, ...entry }),
    });
    return c.json(
      {
        owed: r.owed,
        sent: r.sent,
        failed: r.failed,
        quarantined: r.quarantined,
        not_tried: r.not_tried,
        results: [...r.results],
        candidates: { ...candidates, results: [...candidates.results] },
        attention: { ...attention, results: [...attention.results] },
      },
      200,
    );
  },
);

export const releaseNotificationRoute = withHandler(
  defineRoute(
    operator("ops"),
    {
      operationId: "releaseNotification",
      method: "post",
      path: "/v1/jobs/{job_id}/notification-release",
      tags: ["operations"],
      summary: "Release the job's owed notification from quarantine and backoff",
      description:
        "Clears the owed intent's failure count, `retry_at` and `quarantined_at`, so the next sweep tries it. The body may be absent or `{}`; with `intent_id`, only that intent is released. Nothing to release is a 200 with `released: false`.",
      request: {
        params: JobPathSchema,
        body: jsonRequest(
          NotificationReleaseRequestSchema,
          {
            thisIntent: {
              summary: "Only if this is still the owed intent",
              value: { intent_id: EXAMPLE.completedJob.pending_notification.id },
            },
          },
          { required: false, description: OPTIONAL_BODY },
        ),
      },
      responses: {
        200: jsonAnswer("Whether it was released, and the record.", NotificationReleaseResultSchema, {
          released: true,
          reason: "released: the next sweep tries it",
          record: EXAMPLE.completedJob,
        }),
      },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { intent_id } = c.req.valid("json");
    const actor = actorOf(principalOf(c));
    const r = await releaseNotification(
      deps,
      c.req.valid("param").job_id,
      intent_id === undefined ? { actor } : { intentId: intent_id, actor },
    );
    return c.json({ released: r.released, reason: r.reason, record: r.record }, 200);
  },
);

export const sendNotificationRoute = withHandler(
  defineRoute(
    operator("ops"),
    {
      operationId: "sendNotification",
      method: "post",
      path: "/v1/jobs/{job_id}/notification-sends",
      tags: ["operations"],
      summary: "Send the job's owed notification now",
      description:
        "Publishes the job's one owed intent (if any) to its topic and the fan-in, now, whatever its backoff or quarantine, and settles it once the broker acknowledged: what the sweep would do for it, on an operator's word. A failed send is an answer (`outcome: failed`, the intent stays owed); it does not count against the intent's quarantine (only the sweep's tries do). Nothing owed is `outcome: nothing_owed`.",
      request: { params: JobPathSchema },
      responses: {
        200: jsonAnswer("What the send did.", NotificationSendResultSchema, {
          outcome: "sent",
          intent_id: EXAMPLE.completedJob.pending_notification.id,
          settled: true,
        }),
      },
    },
    [404],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const r = await flushNotification(deps, c.req.valid("param").job_id);
    if (r.outcome === "nothing_owed") return c.json({ outcome: r.outcome }, 200);
    if (r.outcome === "sent") return c.json({ outcome: r.outcome, intent_id: r.intent.id, settled: r.settled }, 200);
    return c.json({ outcome: r.outcome, intent_id: r.intent.id, error: { code: r.error.code, message: r.error.message } }, 200);
  },
);
