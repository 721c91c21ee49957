import { z } from "@hono/zod-openapi";
import { finalizeAttemptReport, stageAttemptReport, verifyAttemptReport } from "@mam/core";
import { operator, operatorOrAgent } from "../access.ts";
import type { Services } from "../context.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, jsonRequest } from "../openapi.ts";
import {
  AttemptPathSchema,
  FinalizedSchema,
  FinalizeRequestSchema,
  StagedReportSchema,
  VerificationQuerySchema,
  VerificationSchema,
} from "../wire.ts";
import { actorOf, type RouteOpener } from "./support.ts";

export const stageReport = defineRoute(
  operatorOrAgent("write", "attempt"),
  {
    operationId: "stageReport",
    method: "put",
    path: "/v1/jobs/{job_id}/attempts/{attempt}/report",
    tags: ["reports"],
    summary: "Stage an attempt's report body",
    description:
      "The raw body (any content type; `text/markdown` typical), hashed and streamed to the report store as `report-final.md.tmp`, " +
      "for the job's latest attempt only. A declared `Content-Length` over the limit is a 413 before a byte is read; a chunked body " +
      "is abandoned the moment it passes it. Refused once the job is terminal.",
    request: {
      params: AttemptPathSchema,
      body: {
        required: true,
        description: "The report, at most the configured report limit (`MAM_REPORT_BODY_LIMIT`, 10 MiB by default), any content type.",
        content: {
          "text/markdown": { schema: z.string(), example: EXAMPLE.report },
          "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) },
        },
      },
    },
    responses: { 201: jsonAnswer("The staged body's digest and size.", StagedReportSchema, EXAMPLE.staged) },
  },
  [
    exampleProblem("dispatch.notFound", `job ${EXAMPLE.jobId} has no recorded dispatch for attempt 2`),
    exampleProblem("report.frozen", `job ${EXAMPLE.jobId} is completed: its report tree and dispatches are frozen`),
    exampleProblem("input.tooLarge", "the report is larger than the limit of 10485760 bytes", {
      issues: [{ path: "body", message: "at most 10485760 bytes" }],
    }),
  ],
);

export const finalizeReport = defineRoute(
  operatorOrAgent("write", "attempt"),
  {
    operationId: "finalizeReport",
    method: "post",
    path: "/v1/jobs/{job_id}/attempts/{attempt}/finalize",
    tags: ["reports"],
    summary: "Finalize an attempt's report: promote, hash, write the manifest",
    description: "Pins the staged bytes (write-once, content-addressed), commits the job's `finalized_report` and writes the manifest.",
    request: {
      params: AttemptPathSchema,
      body: jsonRequest(FinalizeRequestSchema, { commit: { summary: "A report evidencing one commit", value: EXAMPLE.finalizeRequest } }),
    },
    responses: {
      200: jsonAnswer("The manifest written.", FinalizedSchema, {
        manifest: EXAMPLE.manifest,
        manifest_sha256: EXAMPLE.completedJob.finalized_report.manifest_sha256,
      }),
    },
  },
  [
    exampleProblem("report.notFound", `no staged report for attempt 1 of job ${EXAMPLE.jobId}`),
    exampleProblem("report.frozen", `job ${EXAMPLE.jobId} is completed: its report tree and dispatches are frozen`),
  ],
);

export const verifyReport = defineRoute(
  operator("read"),
  {
    operationId: "verifyReport",
    method: "get",
    path: "/v1/jobs/{job_id}/attempts/{attempt}/verification",
    tags: ["reports"],
    summary: "Verify an attempt's manifest against the stored report",
    description: "A failed verification is an answer (`ok: false` with the reason), not an error.",
    request: { params: AttemptPathSchema, query: VerificationQuerySchema },
    responses: {
      200: jsonAnswer("The verification.", VerificationSchema, {
        ok: true,
        reason: "verified",
        manifest: EXAMPLE.manifest,
        manifest_sha256: EXAMPLE.completedJob.finalized_report.manifest_sha256,
        pinned: {
          ok: true,
          reason: "verified",
          report_sha256: EXAMPLE.staged.sha256,
          evidence_location: EXAMPLE.completedJob.completed_evidence.evidence_location,
        },
      }),
    },
  },
  [404],
);

export function reportRoutes(app: RouteOpener, { deps, reportLimit }: Services): void {
  app(stageReport, async (c) => {
    const { job_id: jobId, attempt } = c.req.valid("param");
    const upload = c.get("upload");
    if (upload === undefined) throw new Error(`the report route runs without its body limit (${reportLimit} bytes)`);
    const staged = await upload.pipeTo((body) => stageAttemptReport(deps, jobId, attempt, body, actorOf(c.get("principal"))));
    return c.json({ sha256: staged.sha256, bytes: staged.bytes }, 201);
  });

  app(finalizeReport, async (c) => {
    const { job_id: jobId, attempt } = c.req.valid("param");
    const f = await finalizeAttemptReport(deps, jobId, attempt, c.req.valid("json").side_effects, actorOf(c.get("principal")));
    return c.json({ manifest: f.manifest, manifest_sha256: f.manifestSha256 }, 200);
  });

  app(verifyReport, async (c) => {
    const { job_id: jobId, attempt } = c.req.valid("param");
    const v = await verifyAttemptReport(deps, jobId, attempt, c.req.valid("query").expected_artifacts);
    return c.json(
      {
        ok: v.ok,
        reason: v.reason,
        manifest: v.manifest ?? null,
        ...(v.ok ? { manifest_sha256: v.manifestSha256 } : {}),
        ...(v.pinned === undefined ? {} : { pinned: v.pinned }),
      },
      200,
    );
  });
}
