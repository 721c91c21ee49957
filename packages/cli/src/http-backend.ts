import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { createMamClient, type MamClient, ok } from "@mam/client";
import { MamError, REPORT_NAME, STAGED_REPORT_NAME } from "@mam/core";
import type { AlreadyCompletedAnswer, Backend, ReportInput } from "./backend.ts";

/**
 * API mode: every command is a call (or two) to the service through @mam/client, so
 * a refusal arrives as the MamError the service named and a service that cannot be
 * reached as `service.unreachable` (exit 2).
 */
export function httpBackend(opts: { baseUrl: string; token: string | undefined; fetch?: typeof fetch }): Backend {
  const client = createMamClient({ baseUrl: opts.baseUrl, token: opts.token, ...(opts.fetch === undefined ? {} : { fetch: opts.fetch }) });
  return {
    mode: "api",

    async publishEvent(jobId, input) {
      // A re-sent completion is told at its first step, the upload, that it is done.
      const already = input.finalize === undefined ? undefined : await stageReport(client, jobId, input.finalize);
      if (already !== undefined) return already;
      return ok(
        client.POST("/v1/jobs/{job_id}/events", {
          params: { path: { job_id: jobId } },
          body: {
            event: input.event,
            ...(input.finalize === undefined
              ? {}
              : { finalize: { attempt_id: input.finalize.attemptId, side_effects: [...input.finalize.sideEffects] } }),
          },
        }),
      );
    },

    async dispatch(jobId, request) {
      return ok(client.POST("/v1/jobs/{job_id}/dispatches", { params: { path: { job_id: jobId } }, body: request }));
    },

    async finalize(jobId, input) {
      const already = await stageReport(client, jobId, input);
      if (already !== undefined) return already;
      return ok(
        client.POST("/v1/jobs/{job_id}/attempts/{attempt}/finalize", {
          params: { path: { job_id: jobId, attempt: String(input.attemptId) } },
          body: { side_effects: [...input.sideEffects] },
        }),
      );
    },

    async verify(jobId, input) {
      const expected = input.expectedArtifacts;
      return ok(
        client.GET("/v1/jobs/{job_id}/attempts/{attempt}/verification", {
          params: {
            path: { job_id: jobId, attempt: String(input.attemptId) },
            query: expected === undefined ? {} : { expected_artifacts: expected.join(",") },
          },
        }),
      );
    },

    async listChanges(query) {
      return ok(
        client.GET("/v1/events", {
          params: { query: { limit: query.limit, ...(query.after === undefined ? {} : { after: query.after }) } },
        }),
      );
    },

    async close() {},
  };
}

/**
 * Upload the report for the service to finalize: the staged `.tmp` when there is one,
 * else `report-final.md`. Answers the service's `already_completed` when the job is
 * already completed by this agent's attempt on exactly these bytes (nothing staged).
 */
async function stageReport(client: MamClient, jobId: string, input: ReportInput): Promise<AlreadyCompletedAnswer | undefined> {
  const staged = join(input.reportDir, STAGED_REPORT_NAME);
  const path = existsSync(staged) ? staged : join(input.reportDir, REPORT_NAME);
  let bytes: Uint8Array;
  try {
    bytes = await readFile(path);
  } catch (e) {
    throw new MamError("report.notFound", `no report to upload: ${path} could not be read (${(e as NodeJS.ErrnoException).code ?? e})`, {
      cause: e,
    });
  }
  const answer = await ok(
    client.PUT("/v1/jobs/{job_id}/attempts/{attempt}/report", {
      params: { path: { job_id: jobId, attempt: String(input.attemptId) } },
      // The document types a raw body as a string; the bytes go as they are, never
      // decoded (a report that is not valid UTF-8 must hash the same on both sides).
      body: "",
      bodySerializer: () => bytes,
      headers: { "content-type": "text/markdown" },
    }),
  );
  return "already_completed" in answer ? answer : undefined;
}
