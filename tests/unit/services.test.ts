/**
 * publishAgentEvent, the publish-event path: a refusal answers exit 1 / HTTP 409,
 * and exit 1 promises nothing finalized, nothing committed, nothing published.
 */
import {
  type Deps,
  isMamError,
  type JobStore,
  MemoryJobStore,
  MemoryReportStore,
  OPERATOR,
  type Publisher,
  parseFlags,
  publishAgentEvent,
  REPORT_NAME,
  randomIds,
  registerJob,
  STAGED_REPORT_NAME,
  verifyManifest,
} from "@mam/core";
import { beforeEach, describe, expect, it } from "vitest";
import { tickingClock } from "../support/clock.ts";
import { rejection } from "../support/rejection.ts";

const LOCATION = "reports/agent-tree/1";
let jobs: JobStore;
let deps: Deps;
const published: string[] = [];

beforeEach(async () => {
  jobs = new MemoryJobStore();
  const publisher: Publisher = {
    async publish(topic) {
      published.push(topic);
    },
  };
  deps = {
    jobs,
    reports: new MemoryReportStore(),
    publisher,
    clock: tickingClock("2026-11-20T12:00:00.000Z"),
    ids: randomIds,
    flags: parseFlags({}),
  };
  published.length = 0;
  await deps.reports.put(LOCATION, STAGED_REPORT_NAME, new TextEncoder().encode("report\n"));
});

describe("publishAgentEvent with --finalize", () => {
  it("an event the job's status does not allow is refused before anything is finalized", async () => {
    const job = await registerJob(deps, { prompt: "p", agent: "claude-code" }); // pending: `progress` needs running
    const thrown = await rejection(
      publishAgentEvent(deps, job.job_id, { event: "progress", finalize: { location: LOCATION, attemptId: 1, sideEffects: [] } }, OPERATOR),
    );
    expect(isMamError(thrown, "job.transitionRefused"), String(thrown)).toBe(true);
    expect(await jobs.get(job.job_id)).toEqual(job);
    expect(published).toEqual([]);
    // nothing finalized: the report is still staged and there is no manifest
    expect(await deps.reports.exists(LOCATION, STAGED_REPORT_NAME)).toBe(true);
    expect(await deps.reports.exists(LOCATION, REPORT_NAME)).toBe(false);
    expect((await verifyManifest(deps.reports, { location: LOCATION, jobId: job.job_id })).reason).toContain("no completion manifest");
  });

  it("an allowed event finalizes, commits, logs and publishes (control)", async () => {
    const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
    const result = await publishAgentEvent(
      deps,
      job.job_id,
      { event: "completed", finalize: { location: LOCATION, attemptId: 1, sideEffects: [{ kind: "git_push", reference: "abc" }] } },
      OPERATOR,
    );
    expect(result.record.status).toBe("completed");
    expect(result.flush?.outcome).toBe("sent");
    expect(published).toEqual([`mam/jobs/${job.job_id}/events`, "mam/events"]);
    expect((await verifyManifest(deps.reports, { location: LOCATION, jobId: job.job_id, expectedArtifacts: ["git_push"] })).ok).toBe(true);
    expect((await jobs.listEvents(job.job_id, { limit: 10 })).items.map((e) => e.event)).toEqual(["publish_event", "published"]);
  });

  it("with another publish path (inline: false) it commits and logs, publishes nothing, and leaves the intent owed for that path", async () => {
    const job = await registerJob(deps, { prompt: "p", agent: "claude-code" });
    const result = await publishAgentEvent(deps, job.job_id, { event: "started" }, OPERATOR, { inline: false });
    expect(result.record.status).toBe("running");
    expect(result.flush).toBeUndefined();
    expect(published).toEqual([]);
    expect((await jobs.get(job.job_id))?.pending_notification?.id).toBe(result.record.pending_notification?.id);
    expect((await jobs.listEvents(job.job_id, { limit: 10 })).items.map((e) => e.event)).toEqual(["publish_event"]);
  });
});
