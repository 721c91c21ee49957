import { type MamClient, ok } from "@mam/client";
import { isMamError } from "@mam/core";
import type { MamPort, WatchedDispatch } from "./collector.ts";

/** The largest page `GET /v1/jobs` serves. */
const JOB_PAGE = 200;

/**
 * The collector's view of mam over its API: a watcher token with the `read` scope lists
 * the pending and running jobs and reads each one's latest dispatch; with `observe` it
 * posts. A dispatch record is write-once, so each is read once and kept.
 */
export function mamPort(client: MamClient): MamPort {
  const dispatches = new Map<string, WatchedDispatch>();
  return {
    async watchedDispatches() {
      const jobs = new Map<string, { agent: string; attempt: number }>();
      for (const status of ["pending", "running"] as const) {
        let cursor: string | undefined;
        do {
          const page = await ok(
            client.GET("/v1/jobs", { params: { query: { status, limit: JOB_PAGE, ...(cursor === undefined ? {} : { cursor }) } } }),
          );
          for (const job of page.items) {
            if (job.latest_attempt !== undefined) jobs.set(job.job_id, { agent: job.agent, attempt: job.latest_attempt });
          }
          cursor = page.next_cursor;
        } while (cursor !== undefined);
      }
      const found: WatchedDispatch[] = [];
      for (const [jobId, { agent, attempt }] of jobs) {
        const key = `${jobId}#${attempt}`;
        let d = dispatches.get(key);
        if (d === undefined) {
          try {
            const r = await ok(
              client.GET("/v1/jobs/{job_id}/dispatches/{attempt}", { params: { path: { job_id: jobId, attempt: String(attempt) } } }),
            );
            d = {
              job_id: r.job_id,
              agent,
              attempt_id: r.attempt_id,
              agent_session_uuid: r.agent_session_uuid,
              pane_process_generation: r.pane_process_generation,
              ...(r.pane_id === undefined ? {} : { pane_id: r.pane_id }),
              ...(r.terminal_id === undefined ? {} : { terminal_id: r.terminal_id }),
              recorded_at: r.recorded_at,
            };
            dispatches.set(key, d);
          } catch (e) {
            // Gone between the listing and the read (a job removed): left for the next look.
            if (isMamError(e) && (e.code === "dispatch.notFound" || e.code === "job.notFound")) continue;
            throw e;
          }
        }
        found.push(d);
      }
      return found;
    },

    async postObservation(jobId, body) {
      const answer = await ok(client.POST("/v1/jobs/{job_id}/observations", { params: { path: { job_id: jobId } }, body }));
      return { coalesced: answer.coalesced };
    },
  };
}
