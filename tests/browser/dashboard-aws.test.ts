/**
 * The AWS shape's page: `npm run offline` (the packaged http function behind
 * serverless-offline over DynamoDB Local, its feed written by the feed writer from the
 * table's stream) serves the same dashboard, told by the page's `mam-feed` meta that
 * responses cannot stream there; the page polls `GET /v1/events?after=` every 10 s
 * and says so, and a job's completion reaches it (within the feed's delay and a poll).
 */
import path from "node:path";
import { runCli } from "@mam/cli";
import type { Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, pageErrors, screenshot, signIn, waitForText } from "../support/browser.ts";
import { captureIo } from "../support/cli-io.ts";
import { deadPort } from "../support/dead-port.ts";
import { type Offline, startOffline } from "../support/offline.ts";
import { serviceCaller } from "../support/service-call.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

/** The feed's delay on DynamoDB (30 s) and one poll (10 s), and the stream path's own lag. */
const COMPLETION_CEILING_MS = 90_000;

describe("the dashboard on the AWS shape (npm run offline)", () => {
  let dir: TempDir;
  let offline: Offline | undefined;
  let browser: Browser;

  beforeAll(async () => {
    dir = await tempDir("browser-offline");
    offline = await startOffline(dir.dir, { api: await deadPort(), lambda: await deadPort(), mqtt: await deadPort() });
    browser = await launchChromium();
  }, 300_000);

  afterAll(async () => {
    await browser?.close();
    if (offline !== undefined && offline.child.exitCode === null) {
      offline.child.kill("SIGTERM");
      await offline.exited;
    }
    await dir?.remove();
  });

  it("polls every 10 s and says so; a job completed over the API shows as completed in the open page", async () => {
    if (offline === undefined) throw new Error("npm run offline did not start");
    const api = offline.api;
    const call = serviceCaller(() => api);
    const dataDir = path.join(dir.dir, ".mam");
    const { operator_token: op } = (await import(path.join(dataDir, "credentials.json"), { with: { type: "json" } })).default as {
      operator_token: string;
    };
    const io = captureIo({});
    expect(
      await runCli(["token", "create", "--scope", "read", "--ttl", "8h", "--name", "dashboard", "--data-dir", dataDir, "--json"], io),
    ).toBe(0);
    const reader = JSON.parse(io.out.join("")).token as string;

    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    const errors = pageErrors(page);
    try {
      await signIn(page, api, reader);
      await waitForText(page, "#feed-state", /updates every 10 s, up to 40 s late/);

      const created = await call("POST", "/v1/jobs", op, { job_id: "aws-1", prompt: "On AWS", agent: "codex" });
      expect(created.status, created.text).toBe(201);
      await waitForText(page, '#job-rows tr[data-job="aws-1"]', /pending/, COMPLETION_CEILING_MS);
      const t0 = performance.now();
      const done = await call("POST", "/v1/jobs/aws-1/transitions", op, { action: "completed", expected_seq: 0 });
      expect(done.status, done.text).toBe(200);
      await waitForText(page, '#job-rows tr[data-job="aws-1"]', /completed/, COMPLETION_CEILING_MS);
      console.log(`commit -> page (AWS shape, polled): ${(performance.now() - t0).toFixed(0)} ms`);
      await screenshot(page, "list-aws");
      expect(errors).toEqual([]);
    } finally {
      await context.close();
    }
  });
});
