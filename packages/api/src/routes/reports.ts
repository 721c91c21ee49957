import { z } from "@hono/zod-openapi";
import {
  answerFinalize,
  answerVerification,
  attemptReportLocation,
  completedAlready,
  REPORT_TEXT_MAX_BYTES,
  readReportText,
  readUploadDeclaration,
  requestReportUpload,
  stageAttemptReport,
} from "@mam/core";
import { operator, operatorOrAgent, principalOf } from "../access.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, jsonRequest, REQUEST_ID_HEADER } from "../openapi.ts";
import {
  AlreadyCompletedSchema,
  AttemptPathSchema,
  FinalizedSchema,
  FinalizeRequestSchema,
  StagedReportSchema,
  VerificationQuerySchema,
  VerificationSchema,
} from "../wire.ts";
import { actorOf, withBodyPaths, withHandler } from "./support.ts";

export const stageReportRoute = withHandler(
  defineRoute(
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
        "is abandoned the moment it passes it. Refused once the job is terminal, except to the agent whose attempt completed it re-sending " +
        "that report: bytes that hash to `completed_evidence.report_sha256` are answered 200 `{already_completed: true, record}`, and kept nowhere. " +
        "One upload of an attempt is in flight at a time: while another PUT streams (or a declaration's lease, taken over by this PUT of its body, " +
        "is held by a PUT already) the answer is 409 `report.uploadInFlight`, naming the one in flight (`in_progress`: its attempt, since, expires_at), " +
        "and nothing is written.",
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
      responses: {
        200: jsonAnswer(
          "The job is already completed on exactly these bytes, by this agent's attempt: nothing was staged.",
          AlreadyCompletedSchema,
          {
            already_completed: true,
            record: EXAMPLE.completedByAgent,
          },
        ),
        201: jsonAnswer("The staged body's digest and size.", StagedReportSchema, EXAMPLE.staged),
      },
    },
    [
      exampleProblem("dispatch.notFound", `job ${EXAMPLE.jobId} has no recorded dispatch for attempt 2`),
      exampleProblem("report.frozen", `job ${EXAMPLE.jobId} is completed: its report tree and dispatches are frozen`),
      507,
      exampleProblem("input.tooLarge", "the report is larger than the limit of 10485760 bytes", {
        issues: [{ path: "body", message: "at most 10485760 bytes" }],
      }),
    ],
  ),
  async (c) => {
    const { deps, settings } = c.var.services;
    const { job_id: jobId, attempt } = c.req.valid("param");
    const upload = c.get("upload");
    if (upload === undefined) throw new Error(`the report route runs without its body limit (${settings.reportBodyLimit} bytes)`);
    if (deps.reports.uploadUrl === undefined) {
      // Here uploads come through this route: a declared one may be larger than a body.
      const declared = await readUploadDeclaration(deps.reports, attemptReportLocation(jobId, attempt));
      if (declared !== undefined) upload.allow(Math.min(declared.bytes, settings.reportUploadLimit));
    }
    const actor = actorOf(principalOf(c));
    const staged = await upload
      .pipeTo((body) => stageAttemptReport(deps, jobId, attempt, body, actor, upload.atMostBytes))
      .catch(async (refusal: unknown) => {
        // Refused before a byte was read. The agent re-sending the report its completion
        // pinned is told it is done: the body is hashed, kept nowhere, compared (core's rule).
        const record = await upload.pipeTo((bytes) => completedAlready(deps, jobId, refusal, actor, { bytes })).catch(() => undefined);
        if (record === undefined) throw refusal;
        return { alreadyCompleted: record } as const;
      });
    if ("alreadyCompleted" in staged) return c.json({ already_completed: true as const, record: staged.alreadyCompleted }, 200);
    return c.json({ sha256: staged.sha256, bytes: staged.bytes }, 201);
  },
);

const Sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, "sha256 is 64 lowercase hex digits");

export const ReportUploadRequestSchema = z
  .strictObject({
    sha256: Sha256Hex.openapi({ description: "SHA-256 of the report, 64 lowercase hex digits." }),
    bytes: z
      .number()
      .int()
      .min(0)
      .max(5 * 1024 * 1024 * 1024)
      .openapi({ description: "The report's size: at most the configured upload limit (`MAM_REPORT_UPLOAD_LIMIT`, 256 MiB by default)." }),
  })
  .openapi("ReportUploadRequest", { description: "What the report to upload is: the bytes that arrive must be exactly these." });

export const ReportUploadSchema = z
  .strictObject({
    url: z.string().url().openapi({ description: "Where to send the report: one request, with `method` and exactly `headers`." }),
    method: z.literal("PUT"),
    headers: z.record(z.string(), z.string()).openapi({ description: "Headers to send as given (they are signed, on S3)." }),
    expires_at: z.iso.datetime({ offset: true }).openapi({ description: "When `url` stops being good." }),
    bearer: z.boolean().openapi({
      description:
        "Whether to send your bearer token too: true where the URL is this service's own report route (`mam serve`), false for a presigned store URL (never send it there).",
    }),
    staged: z.string().openapi({ description: "The staged name the bytes go to (never evidence: finalize verifies and pins them)." }),
  })
  .openapi("ReportUpload", { description: "Where and how to send a report too large for a request body." });

const UPLOAD_SHA = "2a1e1b1c7b1e4f4e8a0f1c9d6f1e0b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2";

export const requestUploadRoute = withHandler(
  defineRoute(
    operatorOrAgent("write", "attempt"),
    {
      operationId: "requestReportUpload",
      method: "post",
      path: "/v1/jobs/{job_id}/attempts/{attempt}/report/upload",
      tags: ["reports"],
      summary: "Ask for an upload of an attempt's report larger than a request body",
      description:
        "Declares the report (`sha256`, `bytes`) and answers where to send it. On AWS, a presigned S3 PUT to the staged name, " +
        "good for `MAM_REPORT_UPLOAD_TTL_SECONDS` (15 minutes by default), with its length and checksum signed; under `mam serve`, " +
        "this service's own `PUT .../report`, which then takes up to the declared size. Either way the declaration binds the staged " +
        "name: a stage or a finalize of other bytes is refused (409 `report.mismatch`, naming what differs), and a finalize hashes " +
        "what arrived before anything is pinned. For the job's latest attempt only, and refused once the job is terminal. " +
        "One upload of an attempt is in flight at a time, from its declaration until a PUT stages the declared bytes, a finalize takes them, " +
        "or `expires_at` passes: a second declaration meanwhile is 409 `report.uploadInFlight`, naming the one in flight, and writes nothing.",
      request: {
        params: AttemptPathSchema,
        body: jsonRequest(ReportUploadRequestSchema, {
          report: { summary: "A 40 MiB report", value: { sha256: UPLOAD_SHA, bytes: 41_943_040 } },
        }),
      },
      responses: {
        200: jsonAnswer("Where and how to send the report.", ReportUploadSchema, {
          url: `https://mam-reports.s3.eu-west-1.amazonaws.com/reports/${EXAMPLE.jobId}/1/report-final.md.tmp?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=900&X-Amz-SignedHeaders=content-length%3Bhost%3Bx-amz-checksum-sha256%3Bx-amz-meta-sha256&X-Amz-Signature=...`,
          method: "PUT",
          headers: {
            "content-length": "41943040",
            "x-amz-checksum-sha256": Buffer.from(UPLOAD_SHA, "hex").toString("base64"),
            "x-amz-meta-sha256": UPLOAD_SHA,
          },
          expires_at: "2026-07-01T12:15:00.000Z",
          bearer: false,
          staged: `s3://mam-reports/reports/${EXAMPLE.jobId}/1/report-final.md.tmp`,
        }),
      },
    },
    [
      exampleProblem("dispatch.notFound", `job ${EXAMPLE.jobId} has no recorded dispatch for attempt 2`),
      exampleProblem("report.frozen", `job ${EXAMPLE.jobId} is completed: its report tree and dispatches are frozen`),
      507,
    ],
  ),
  async (c) => {
    const { deps, settings } = c.var.services;
    const { job_id: jobId, attempt } = c.req.valid("param");
    const declared = c.req.valid("json");
    const actor = actorOf(principalOf(c));
    const issued = await withBodyPaths(() =>
      requestReportUpload(
        deps,
        jobId,
        attempt,
        declared,
        { maxBytes: settings.reportUploadLimit, expiresInSeconds: settings.reportUploadTtlSeconds },
        actor,
      ),
    );
    if (issued.target !== undefined) {
      const { url, method, headers, expiresAt } = issued.target;
      return c.json(
        { url, method, headers: { ...headers }, expires_at: expiresAt.toISOString(), bearer: false, staged: issued.staged },
        200,
      );
    }
    // No store address: the bytes come through this service's own report route, with the caller's token.
    return c.json(
      {
        url: new URL(`/v1/jobs/${jobId}/attempts/${attempt}/report`, c.req.url).href,
        method: "PUT" as const,
        headers: { "content-type": "application/octet-stream", "content-length": String(declared.bytes) },
        expires_at: issued.declaration.expires_at,
        bearer: true,
        staged: issued.staged,
      },
      200,
    );
  },
);

export const finalizeReportRoute = withHandler(
  defineRoute(
    operatorOrAgent("write", "attempt"),
    {
      operationId: "finalizeReport",
      method: "post",
      path: "/v1/jobs/{job_id}/attempts/{attempt}/finalize",
      tags: ["reports"],
      summary: "Finalize an attempt's report: promote, hash, write the manifest",
      description:
        "Pins the staged bytes (write-once, content-addressed), commits the job's `finalized_report` and writes the manifest. " +
        "After an upload (`POST .../report/upload`), the staged bytes are hashed first and must be what the upload declared: " +
        "otherwise 409 `report.mismatch` naming what differs, and nothing is pinned. Once the job is terminal it is refused (409 `report.frozen`), " +
        "except to the agent whose attempt completed it, when what a finalize would read (the staged upload, else the live report) hashes to " +
        "`completed_evidence.report_sha256`: then 200 `{already_completed: true, record}`, and nothing is written. " +
        "One finalize of an attempt is in progress at a time, whoever asks (`MAM_FINALIZE_LEASE_SECONDS` at most): a second one meanwhile is " +
        "409 `report.finalizeInProgress`, naming the one in progress (`in_progress`), and writes nothing.",
      request: {
        params: AttemptPathSchema,
        // Optional, as @hono/zod-openapi means it: a request with no body (and no
        // Content-Type) is validated as `{}`, which is `side_effects: []`.
        body: jsonRequest(
          FinalizeRequestSchema,
          {
            commit: { summary: "A report evidencing one commit", value: EXAMPLE.finalizeRequest },
            none: { summary: "No side effects (the same as sending no body)", value: { side_effects: [] } },
          },
          {
            required: false,
            description:
              'JSON, as for every route; optional: a request with no body and no Content-Type (or `Content-Length: 0`) is `{"side_effects": []}`. ' +
              "A body that says it is JSON must be JSON: an empty one, or one that does not parse, is a 400.",
          },
        ),
      },
      responses: {
        200: jsonAnswer(
          "The manifest written; or, to a re-sent finalize of a completed attempt, that the job is already completed.",
          z.union([FinalizedSchema, AlreadyCompletedSchema]),
          {
            manifest: EXAMPLE.manifest,
            manifest_sha256: EXAMPLE.completedJob.finalized_report.manifest_sha256,
          },
        ),
      },
    },
    [
      507,
      exampleProblem("report.notFound", `no staged report for attempt 1 of job ${EXAMPLE.jobId}`),
      exampleProblem(
        "report.mismatch",
        `the staged report s3://mam-reports/reports/${EXAMPLE.jobId}/1/report-final.md.tmp is not the report its upload declared: bytes declared 41943040, received 41943039; nothing was pinned`,
        { issues: [{ path: "bytes", message: "declared 41943040, received 41943039" }] },
      ),
    ],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { job_id: jobId, attempt } = c.req.valid("param");
    const actor = actorOf(principalOf(c));
    // No body: zod-openapi hands the handler `{}` unvalidated; it means no side effects.
    const sideEffects = (c.req.valid("json") as { side_effects?: readonly unknown[] }).side_effects ?? [];
    return c.json(await answerFinalize(deps, jobId, attempt, sideEffects, actor), 200);
  },
);

export const verifyReportRoute = withHandler(
  defineRoute(
    operator("read"),
    {
      operationId: "verifyReport",
      method: "get",
      path: "/v1/jobs/{job_id}/attempts/{attempt}/verification",
      tags: ["reports"],
      summary: "Verify an attempt's manifest against the stored report",
      description:
        "A failed verification is an answer (`ok: false` with the reason), not an error. Once the job completed on this attempt, " +
        "the answer also says whether the live report and manifest are the ones the completion names (`matches_completion`; `ok` is false " +
        "when they are not, however well they agree with each other) and re-hashes the write-once copy the completion pinned (`pinned`).",
      request: { params: AttemptPathSchema, query: VerificationQuerySchema },
      responses: {
        200: jsonAnswer("The verification.", VerificationSchema, {
          ok: true,
          reason: "verified",
          manifest: EXAMPLE.manifest,
          manifest_sha256: EXAMPLE.completedJob.finalized_report.manifest_sha256,
          matches_completion: true,
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
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { job_id: jobId, attempt } = c.req.valid("param");
    return c.json(await answerVerification(deps, jobId, attempt, c.req.valid("query").expected_artifacts), 200);
  },
);

/** The report's text, as bytes (a report is any UTF-8; its first 1 MiB is cut at a character boundary). */
const REPORT_TEXT_CONTENT: Record<string, { schema: z.ZodString; example: string }> = {
  "text/plain": { schema: z.string(), example: "# Report\n\nThe flaky test is fixed: the retry now waits for the broker's PUBACK.\n" },
};

export const readReportRoute = withHandler(
  defineRoute(
    operatorOrAgent("read", "attempt"),
    {
      operationId: "readReport",
      method: "get",
      path: "/v1/jobs/{job_id}/attempts/{attempt}/report",
      tags: ["reports"],
      summary: "Read an attempt's report as text",
      description:
        "The finalized report (else the staged one, said by `X-Mam-Report: staged`), as `text/plain; charset=utf-8` with `X-Content-Type-Options: nosniff` " +
        "and `Content-Security-Policy: sandbox`: never rendered as a page. At most its first 1 MiB, then a notice; where the store can hand out an " +
        "address for the whole (S3: a presigned GET, an attachment, good for 5 minutes) the notice names it and `Link: <…>; rel=alternate` carries it. " +
        "Its hash and verification state are `GET …/verification`'s.",
      request: { params: AttemptPathSchema },
      responses: {
        200: {
          description: "The report's text (its first 1 MiB).",
          headers: {
            ...REQUEST_ID_HEADER,
            "X-Mam-Report": { description: "`finalized` or `staged`.", schema: { type: "string", enum: ["finalized", "staged"] } },
          },
          content: REPORT_TEXT_CONTENT,
        },
      },
    },
    [exampleProblem("report.notFound", "attempt 1 of job fix-flaky has no report stored yet")],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const { job_id: jobId, attempt } = c.req.valid("param");
    const report = await readReportText(deps, jobId, attempt);
    const notice = !report.truncated
      ? ""
      : report.download === undefined
        ? `\n\n[mam: this report is longer than ${REPORT_TEXT_MAX_BYTES} bytes; only its first ${REPORT_TEXT_MAX_BYTES} bytes are served here.]\n`
        : `\n\n[mam: this report is longer than ${REPORT_TEXT_MAX_BYTES} bytes; these are its first ${REPORT_TEXT_MAX_BYTES}. The whole report, until ${report.download.expiresAt}: ${report.download.url} ]\n`;
    const body = notice === "" ? report.bytes : Buffer.concat([report.bytes, Buffer.from(notice, "utf8")]);
    return c.body(new Uint8Array(body), 200, {
      "content-type": "text/plain; charset=utf-8",
      "x-content-type-options": "nosniff",
      "content-security-policy": "sandbox",
      "cache-control": "no-store",
      "x-mam-report": report.state,
      ...(report.download === undefined ? {} : { link: `<${report.download.url}>; rel="alternate"` }),
    });
  },
);
