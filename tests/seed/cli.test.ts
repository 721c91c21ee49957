/**
 * Seed section 2, the agent-facing publish command (`mam publish-event`). The
 * `--data-dir` mode is the embedded store by definition (DIR/mam.db, DIR/reports),
 * so these run on the embedded backend only; an API-mode twin belongs in tests/e2e.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { runCli } from "@mam/cli";
import { type JobRecord, randomIds, registerJob, STAGED_REPORT_NAME, verifyManifest } from "@mam/core";
import { type EmbeddedBroker, FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { captureIo, publishCompletedArgs } from "../support/cli-io.ts";
import { tickingClock } from "../support/clock.ts";
import { deadPort } from "../support/dead-port.ts";
import { barrier, subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";
import { CLOCK_START } from "./harness.ts";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));

interface Sandbox {
  readonly root: string;
  readonly dataDir: string;
  /** `<root>/claude-reports/report-final.md`, the PATH given to --finalize-report. */
  readonly reportPath: string;
}

let sandbox: Sandbox;

beforeEach(async () => {
  const root = (await tempDir("seed-cli")).dir;
  const dataDir = path.join(root, "data");
  await mkdir(path.join(root, "claude-reports"), { recursive: true });
  await mkdir(dataDir, { recursive: true });
  sandbox = { root, dataDir, reportPath: path.join(root, "claude-reports", "report-final.md") };
});

afterEach(async () => {
  await rm(sandbox.root, { recursive: true, force: true });
});

/** Register a job in DIR/mam.db the way the service would, then let go of the database. */
async function registerIn(dataDir: string): Promise<string> {
  const { jobs, close } = openEmbeddedJobStore(path.join(dataDir, "mam.db"));
  try {
    return (await registerJob({ jobs, clock: tickingClock(CLOCK_START), ids: randomIds }, { prompt: "p", agent: "claude-code" })).job_id;
  } finally {
    await close();
  }
}

async function inspect(dataDir: string, jobId: string) {
  const { jobs, close } = openEmbeddedJobStore(path.join(dataDir, "mam.db"));
  try {
    return { record: (await jobs.get(jobId)) as JobRecord, events: (await jobs.listEvents(jobId, { limit: 100 })).items };
  } finally {
    await close();
  }
}

const publishArgs = (jobId: string, mqttUrl: string, sideEffect: string): string[] => [
  ...publishCompletedArgs(jobId, sandbox.reportPath, sideEffect),
  "--data-dir",
  sandbox.dataDir,
  "--mqtt-url",
  mqttUrl,
];

/** What every B-13 run must leave behind, however the CLI was started. */
async function expectFinalizedButUnpublished(jobId: string): Promise<void> {
  expect(existsSync(sandbox.reportPath), "the staged report was promoted").toBe(true);
  expect(existsSync(path.join(path.dirname(sandbox.reportPath), STAGED_REPORT_NAME))).toBe(false);
  const verdict = await verifyManifest(new FileReportStore(path.join(sandbox.dataDir, "reports")), {
    location: path.dirname(sandbox.reportPath),
    jobId,
  });
  expect(verdict.ok, verdict.reason).toBe(true);
  expect(verdict.manifest?.side_effects[0]?.kind).toBe("git_push");

  const { record, events } = await inspect(sandbox.dataDir, jobId);
  expect(record.status, "what was committed stays").toBe("completed");
  expect(record.pending_notification?.event, "the intent stays owed for the sweep").toBe("completed");
  const attempts = events.filter((e) => e.event === "published");
  expect(attempts.length, "the publish attempt is in the job's event log").toBeGreaterThan(0);
  expect(attempts.at(-1)?.data?.outcome).toBe("failed");
}

describe("seed 2: the publish command [embedded --data-dir]", () => {
  it("B-13 publish-event finalizes before it publishes: broker unreachable exits 2, yet the report was promoted and verifies", async () => {
    const jobId = await registerIn(sandbox.dataDir);
    await writeFile(`${sandbox.reportPath}.tmp`, "the report\n");
    const port = await deadPort();

    const streams = captureIo();
    const code = await runCli(publishArgs(jobId, `mqtt://127.0.0.1:${port}`, "git_push=deadbeef"), streams);
    expect(code, streams.err.join("")).toBe(2);
    await expectFinalizedButUnpublished(jobId);
  });

  it("B-13 (subprocess) `mam publish-event` as an agent runs it: exit status 2, finalization kept", async () => {
    const jobId = await registerIn(sandbox.dataDir);
    await writeFile(`${sandbox.reportPath}.tmp`, "the report\n");
    const port = await deadPort();

    const child = spawn(
      process.execPath,
      ["--import", "tsx", "packages/cli/src/main.ts", ...publishArgs(jobId, `mqtt://127.0.0.1:${port}`, "git_push=deadbeef")],
      { cwd: REPO_ROOT, env: { PATH: process.env.PATH ?? "" }, stdio: ["ignore", "pipe", "pipe"] },
    );
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    const status = await new Promise<number | null>((resolve, reject) => {
      child.once("error", reject);
      child.once("close", (c) => resolve(c));
    });
    expect(status, stderr).toBe(2);
    await expectFinalizedButUnpublished(jobId);
  }, 60_000);

  describe("with a live broker", () => {
    const mqtt = { username: "mam-service", password: "seed-secret" };
    let broker: EmbeddedBroker;
    beforeEach(async () => {
      broker = await startEmbeddedBroker({ port: 0, publisherCredentials: mqtt });
      // the CLI publishes with the service's credentials from the data dir
      await writeFile(
        path.join(sandbox.dataDir, "credentials.json"),
        JSON.stringify({ operator_token: "unused", signing_key: "unused-unused-unused-unused-unused", mqtt }),
      );
    });
    afterEach(async () => {
      await broker.close();
    });

    it("B-14 publish-event exits 1 on a malformed side effect and finalizes, commits and publishes nothing", async () => {
      const jobId = await registerIn(sandbox.dataDir);
      await writeFile(sandbox.reportPath, "done\n");
      const before = await inspect(sandbox.dataDir, jobId);
      const sub = await subscribe(broker.url, "mam/#");
      try {
        const streams = captureIo();
        const code = await runCli(publishArgs(jobId, broker.url, "malformed"), streams);
        expect(code, streams.err.join("")).toBe(1);

        const verdict = await verifyManifest(new FileReportStore(path.join(sandbox.dataDir, "reports")), {
          location: path.dirname(sandbox.reportPath),
          jobId,
        });
        expect(verdict.reason).toContain("no completion manifest");
        expect(await inspect(sandbox.dataDir, jobId)).toEqual(before);
        // a publish of the run above, had there been one, arrives before this marker
        const marker = new MqttPublisher({ url: broker.url, ...mqtt });
        const silenceEnds = await barrier(sub, marker, `mam/jobs/${jobId}/events`).finally(() => marker.close());
        expect(sub.received.slice(0, silenceEnds)).toEqual([]);

        // the same call, well-formed, does publish over this wiring: the silence above was the CLI's
        const good = captureIo();
        expect(await runCli(publishArgs(jobId, broker.url, "git_push=deadbeef"), good), good.err.join("")).toBe(0);
        const message = await sub.waitFor((m) => sub.received.indexOf(m) > silenceEnds);
        expect(JSON.parse(message.payload)).toMatchObject({ event: "completed", job_id: jobId });
      } finally {
        await sub.close();
      }
    });
  });
});
