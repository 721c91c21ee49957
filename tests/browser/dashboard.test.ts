/**
 * The dashboard in Debian's Chromium against an in-process `mam serve` on the test
 * clock (tests/support/browser.ts): live updates, one job's story, why a job is not
 * completing, the operator's actions by scope, hostile text shown as text, an
 * accessibility check, screenshots. Every wait is for the DOM; latencies printed.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { runCli, startService } from "@mam/cli";
import { parseConfig } from "@mam/core";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, pageErrors, RATE_LIMITED, refuse, screenshot, signIn, waitForFeedState, waitForText } from "../support/browser.ts";
import { captureIo } from "../support/cli-io.ts";
import { TestClock } from "../support/clock.ts";
import { deadPort } from "../support/dead-port.ts";
import { type ServiceAnswer, serviceCaller } from "../support/service-call.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

type Running = Awaited<ReturnType<typeof startService>>;

const require = createRequire(import.meta.url);
const AXE_SOURCE = readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");

const SESSION = "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa";
/** A pane id as a watcher may name it (at most 128 characters). */
const PANE = `<img src=x onerror="window.__owned=1">`;
const HOSTILE = `<script>window.__owned=1</script><img src=x onerror="window.__owned=1"><a href="javascript:window.__owned=1">x</a>`;

describe("the dashboard in a real browser", () => {
  let tmp: TempDir;
  let dataDir: string;
  let port: number;
  let service: Running;
  let browser: Browser;
  let op: string;
  let reader: string;
  let watcher: string;
  const clock = new TestClock(new Date().toISOString(), { tickMs: 1 });
  const base = () => `http://127.0.0.1:${port}`;
  const call = serviceCaller(base);

  const start = async () =>
    startService(
      parseConfig({
        MAM_DATA_DIR: dataDir,
        MAM_PORT: String(port),
        MAM_MQTT_PORT: "0",
        MAM_AUTO_COMPLETE: "1",
        MAM_SWEEP_INTERVAL_SECONDS: "1",
      }),
      () => undefined,
      { clock },
    );

  const token = async (...args: string[]): Promise<string> => {
    const io = captureIo({});
    expect(await runCli(["token", "create", ...args, "--data-dir", dataDir, "--json"], io)).toBe(0);
    return JSON.parse(io.out.join("")).token as string;
  };

  /**
   * A read token of its own for a test: the rate (600 a minute per token) refills on the
   * service's clock, which here moves only when read or advanced, so the suite's pages
   * would otherwise share one budget of about 600 requests.
   */
  const ownReader = () => token("--scope", "read", "--ttl", "8h", "--name", "dashboard");

  const expectStatus = (answer: ServiceAnswer, status: number) => expect(answer.status, answer.text).toBe(status);

  /** Registers, dispatches and claims a job; answers the agent's token. */
  const running = async (jobId: string, extra: Record<string, unknown> = {}, dispatch: Record<string, unknown> = {}): Promise<string> => {
    expectStatus(
      await call("POST", "/v1/jobs", op, { job_id: jobId, prompt: `Fix ${jobId}`, agent: "claude-code", auto_complete: true, ...extra }),
      201,
    );
    const dispatched = await call("POST", `/v1/jobs/${jobId}/dispatches`, op, {
      attempt_id: 1,
      agent_session_uuid: SESSION,
      pane_process_generation: 3,
      anchor: { started_at: clock.now().toISOString() },
      ...dispatch,
    });
    expectStatus(dispatched, 201);
    const agent = dispatched.body.agent_token as string;
    expectStatus(await call("POST", `/v1/jobs/${jobId}/transitions`, agent, { action: "claim", expected_seq: 0 }), 200);
    return agent;
  };

  const observe = (jobId: string, state: string, extra: Record<string, unknown> = {}) =>
    call("POST", `/v1/jobs/${jobId}/observations`, watcher, {
      state,
      source_kind: "pane_status",
      attempt_id: 1,
      agent_session_uuid: SESSION,
      pane_process_generation: 3,
      observed_at: clock.now().toISOString(),
      ...extra,
    });

  const newPage = async (): Promise<{ context: BrowserContext; page: Page; errors: string[] }> => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    return { context, page, errors: pageErrors(page) };
  };

  /** A fresh page (its own context) for `body`: no error thrown in the page and no dialog opened by it, then closed. */
  const withPage = async (body: (page: Page) => Promise<void>): Promise<void> => {
    const { context, page, errors } = await newPage();
    try {
      await body(page);
      expect(errors).toEqual([]);
    } finally {
      await context.close();
    }
  };

  beforeAll(async () => {
    tmp = await tempDir("browser");
    dataDir = path.join(tmp.dir, "data");
    port = await deadPort();
    service = await start();
    op = service.operatorToken;
    reader = await token("--scope", "read", "--ttl", "8h", "--name", "dashboard");
    watcher = await token("--scope", "observe", "--name", "herdr-1");
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
    await service?.stop();
    await tmp?.remove();
  });

  it("signs in with a read token; a job registered and moved over the API appears and changes status without a reload; the indicator shows a restart and 'caught up' after it", async () => {
    await withPage(async (page) => {
      await signIn(page, base(), reader);
      await waitForFeedState(page, "caught-up");
      await waitForText(page, "header .who", /dashboard · read/);

      let t0 = performance.now();
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: "live-1", prompt: "Live", agent: "claude-code" }), 201);
      await waitForText(page, '#job-rows tr[data-job="live-1"]', /pending/);
      const appeared = performance.now() - t0;

      t0 = performance.now();
      expectStatus(await call("POST", "/v1/jobs/live-1/transitions", op, { action: "cancel", expected_seq: 0 }), 200);
      await waitForText(page, '#job-rows tr[data-job="live-1"]', /cancelled/);
      const changed = performance.now() - t0;
      console.log(`commit -> page (mam serve, streamed): registered ${appeared.toFixed(0)} ms, status changed ${changed.toFixed(0)} ms`);

      // The service stops: the page says so; it comes back on the same port: "caught up" again, and what committed meanwhile shows.
      const navigations: string[] = [];
      page.on("framenavigated", (f) => navigations.push(f.url()));
      await service.stop();
      await waitForFeedState(page, "down");
      service = await start();
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: "live-2", prompt: "After the restart", agent: "codex" }), 201);
      const back = await waitForFeedState(page, "caught-up", 30_000);
      await waitForText(page, '#job-rows tr[data-job="live-2"]', /pending/);
      console.log(`restart: caught up ${back.toFixed(0)} ms after the service came back`);
      expect(navigations).toEqual([]);
    });
  });

  it("one job's story: its dispatch, observations, report, completion and notification; a held job shows the dry run's reason at the top; a stale job is listed first", async () => {
    const agent = await running("story-1");
    expectStatus(await call("PUT", "/v1/jobs/story-1/attempts/1/report", agent, "# Report\n\nFixed it.\n", "text/markdown"), 201);
    expectStatus(await call("POST", "/v1/jobs/story-1/attempts/1/finalize", agent, { side_effects: [] }), 200);
    const heldAgent = await running("held-1");
    expectStatus(await call("PUT", "/v1/jobs/held-1/attempts/1/report", heldAgent, "# Report\n", "text/markdown"), 201);
    expectStatus(await call("POST", "/v1/jobs/held-1/attempts/1/finalize", heldAgent, { side_effects: [] }), 200);

    await withPage(async (page) => {
      await signIn(page, base(), reader);
      // The held job: why, at the top, labelled "now".
      await page.goto(`${base()}/#/jobs/held-1`);
      await waitForText(page, "#why-reason", /now\s*Not completing: the policy holds: nothing was observed of attempt 1/);
      const whyTop = await page.evaluate(
        `(document.getElementById("why-title").compareDocumentPosition(document.getElementById("record-title")) & Node.DOCUMENT_POSITION_FOLLOWING) !== 0`,
      );
      expect(whyTop).toBe(true);

      // The story: observed, settled, completed by the gate; the page follows it live.
      await page.goto(`${base()}/#/jobs/story-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      expectStatus(await observe("story-1", "working"), 201);
      expectStatus(await observe("story-1", "idle"), 201);
      clock.advance(31_000);
      expect((await observe("story-1", "idle")).status).toBeLessThan(300);
      const t0 = performance.now();
      const evaluated = await call("POST", "/v1/jobs/story-1/evaluations", op, {});
      expectStatus(evaluated, 200);
      expect(evaluated.body.committed, evaluated.text).toBe(true);
      await waitForText(page, "#job-title", /completed/);
      await waitForText(page, ".timeline", /intent\.published/);
      console.log(`completion -> job page: ${(performance.now() - t0).toFixed(0)} ms`);
      const timeline = (await page.locator(".timeline").textContent()) ?? "";
      for (const kind of [
        "job.registered",
        "dispatch.recorded",
        "job.transitioned",
        "observation.recorded",
        "report.staged",
        "report.finalized",
        "intent.published",
      ])
        expect(timeline).toContain(kind);
      await waitForText(page, "#why-title + *", /Completed by the gate, on evidence/);
      await waitForText(page, ".attempt", /Verifies/);
      await page.getByRole("button", { name: "Read the report" }).click();
      await waitForText(page, ".report-text pre", /Fixed it\./);
      await screenshot(page, "job");

      // Stale: no activity past MAM_STALE_AFTER_SECONDS; the sweep marks it; the list shows it under "Needs a person", first.
      await running("stale-1");
      clock.advance(1_801_000);
      await page.goto(`${base()}/#/`);
      await waitForText(page, ".attention li", /stale-1.*stale since/s, 30_000);
      const firstSection = await page.locator("main section h2").allInnerTexts();
      expect(firstSection.indexOf("Needs a person")).toBeLessThan(firstSection.indexOf("Jobs"));
      await screenshot(page, "list");
    });
  });

  it("a read-only token sees no action; an operator's cancel, re-evaluation and send-now from the page commit and show their answers", async () => {
    await running("act-1");
    await running("act-2");
    const ro = await newPage();
    try {
      await signIn(ro.page, base(), reader);
      await ro.page.goto(`${base()}/#/jobs/act-1`);
      await waitForText(ro.page, "#why-reason", /Not completing/);
      expect(await ro.page.locator("#actions-title").count()).toBe(0);
      expect(await ro.page.getByRole("button", { name: /Cancel|Re-evaluate|Send|Release/ }).count()).toBe(0);
    } finally {
      await ro.context.close();
    }

    await withPage(async (page) => {
      await signIn(page, base(), op);
      await page.goto(`${base()}/#/jobs/act-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      // Re-evaluate: the gate holds, and says why; nothing is written.
      await page.getByRole("button", { name: "Re-evaluate" }).click();
      await page.getByRole("button", { name: "Yes, re-evaluate" }).click();
      await waitForText(page, "#action-answer", /^Held: no completion manifest at /);
      expect((await call("GET", "/v1/jobs/act-1", op)).body.status).toBe("running");

      // Cancel: committed; the page shows the answer and the job's new status.
      await page.getByRole("button", { name: "Cancel job" }).click();
      await page.getByRole("button", { name: "Yes, cancel job" }).click();
      await waitForText(page, "#action-answer", /^Cancelled: the job is now cancelled/);
      await waitForText(page, "#job-title", /cancelled/);
      expect((await call("GET", "/v1/jobs/act-1", op)).body.status).toBe("cancelled");

      await screenshot(page, "actions");
    });

    // Send now, on a service whose broker is down: the cancel's intent stays owed, the
    // page offers to send it, and shows the service's answer (the send failed; still owed).
    const other = await tempDir("browser-owed");
    const otherPort = await deadPort();
    const down = await startService(
      parseConfig({
        MAM_DATA_DIR: path.join(other.dir, "data"),
        MAM_PORT: String(otherPort),
        MAM_MQTT_URL: `mqtt://127.0.0.1:${await deadPort()}`,
        MAM_MQTT_USERNAME: "mam",
        MAM_MQTT_PASSWORD: "not-used",
      }),
      () => undefined,
      { clock },
    );
    const second = await newPage();
    try {
      const otherCall = serviceCaller(() => `http://127.0.0.1:${otherPort}`);
      expectStatus(await otherCall("POST", "/v1/jobs", down.operatorToken, { job_id: "owed-1", prompt: "Owed", agent: "codex" }), 201);
      await signIn(second.page, `http://127.0.0.1:${otherPort}`, down.operatorToken);
      await second.page.goto(`http://127.0.0.1:${otherPort}/#/jobs/owed-1`);
      await second.page.getByRole("button", { name: "Cancel job" }).click();
      await second.page.getByRole("button", { name: "Yes, cancel job" }).click();
      await waitForText(second.page, "#action-answer", /^Cancelled/);
      await waitForText(second.page, "#owed", /Owed: "cancelled" intent/);
      await second.page.getByRole("button", { name: "Send notification now" }).click();
      await second.page.getByRole("button", { name: "Yes, send notification now" }).click();
      await waitForText(second.page, "#action-answer", /^The send failed: .+; the intent stays owed\./);
      expect((await otherCall("GET", "/v1/jobs/owed-1", down.operatorToken)).body.pending_notification?.event).toBe("cancelled");
      expect(second.errors).toEqual([]);
    } finally {
      await second.context.close();
      await down.stop();
      await other.remove();
    }
  });

  it("paging shows no job twice; a job that moves is shown first by the live update; a page that follows a busy job asks the gate far less often than the job moves", async () => {
    for (let i = 1; i <= 55; i += 1) {
      const id = `page-${String(i).padStart(2, "0")}`;
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: id, prompt: id, agent: "codex" }), 201);
    }
    await withPage(async (page) => {
      await signIn(page, base(), reader);
      await waitForText(page, "#job-rows", /page-55/);
      // page-03 is not on the first page; it moves (cancelled now): the live update shows it first.
      expect(await page.locator('#job-rows tr[data-job="page-03"]').count()).toBe(0);
      expectStatus(await call("POST", "/v1/jobs/page-03/transitions", op, { action: "cancel", expected_seq: 0 }), 200);
      await waitForText(page, "#job-rows tr:first-child", /page-03.*cancelled/s);
      await page.getByRole("button", { name: "Load older jobs" }).click();
      await waitForText(page, "#job-rows", /page-01/);
      const ids = await page.locator("#job-rows tr").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-job")));
      expect(ids.filter((id) => id === "page-03")).toHaveLength(1);
      expect(new Set(ids).size).toBe(ids.length);

      // A busy job on screen: ten observations, each seen by the page (its record's
      // evidence_seq shown) before the next; then the dry run answering for the last.
      const busyAgent = await running("busy-1");
      expectStatus(await call("PUT", "/v1/jobs/busy-1/attempts/1/report", busyAgent, "# Busy\n", "text/markdown"), 201);
      expectStatus(await call("POST", "/v1/jobs/busy-1/attempts/1/finalize", busyAgent, { side_effects: [] }), 200);
      await page.goto(`${base()}/#/jobs/busy-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      const asked = async () => Number(await page.evaluate("window.mamDashboard.dryRuns.asked"));
      const before = await asked();
      const started = performance.now();
      let seq = 0;
      for (let i = 0; i < 10; i += 1) {
        const seen = await observe("busy-1", i % 2 === 0 ? "working" : "idle");
        expect(seen.status, seen.text).toBeLessThan(300);
        seq = seen.body.evidence_seq as number;
        await waitForText(page, ".record", new RegExp(`Evidence seq\\s*${seq}(?!\\d)`));
      }
      await waitForText(page, "#why-title ~ details pre.json", new RegExp(`"evidence_seq": ${seq},`));
      const seconds = (performance.now() - started) / 1000;
      const more = (await asked()) - before;
      console.log(`dry runs while the job moved 10 times in ${seconds.toFixed(1)} s, each seen by the page: ${more}`);
      expect(more).toBeGreaterThanOrEqual(1);
      expect(more).toBeLessThanOrEqual(Math.ceil(seconds / 2) + 1);
      expect(more).toBeLessThan(10);
    });
  });

  it("a prompt, report, observation or event holding <script>, an onerror attribute or a javascript: URL is shown as text and runs nothing", async () => {
    const agent = await running("xss-1", { prompt: HOSTILE }, { pane_id: PANE });
    expectStatus(await observe("xss-1", "working", { pane_id: PANE }), 201);
    expectStatus(
      await call("POST", "/v1/jobs/xss-1/transitions", agent, {
        action: "progress",
        expected_seq: 1,
        fields: { progress: { note: HOSTILE } },
      }),
      200,
    );
    expectStatus(await call("PUT", "/v1/jobs/xss-1/attempts/1/report", agent, `# ${HOSTILE}\n`, "text/markdown"), 201);
    expectStatus(await call("POST", "/v1/jobs/xss-1/events", agent, { event: "progress", data: { note: HOSTILE } }), 200);
    await withPage(async (page) => {
      await signIn(page, base(), reader);
      await page.goto(`${base()}/#/jobs/xss-1`);
      await waitForText(page, "pre.prompt", /<script>window\.__owned=1<\/script>/);
      await waitForText(page, ".record", /onerror/);
      await page.getByRole("button", { name: "Read the report" }).click();
      await waitForText(page, ".report-text pre", /javascript:window\.__owned=1/);
      await waitForText(page, ".events", /onerror=/);
      await waitForText(page, ".attempt", /pane <img src=x onerror=/);
      const owned = await page.evaluate(`({
        flag: window.__owned,
        scripts: document.querySelectorAll("main script").length,
        images: document.querySelectorAll("main img").length,
        links: Array.from(document.querySelectorAll("main a")).filter((a) => (a.getAttribute("href") ?? "").startsWith("javascript:")).length,
      })`);
      expect(owned).toEqual({ flag: undefined, scripts: 0, images: 0, links: 0 });
    });
  });

  it("an accessibility check (axe-core, WCAG 2.1 A/AA) of the list and a job page reports no serious or critical violation", async () => {
    await running("a11y-1");
    const { context, page } = await newPage();
    try {
      await signIn(page, base(), op);
      const check = async (where: string) => {
        // Evaluated over the DevTools protocol, so the page's CSP (no inline script) stays as it is.
        await page.evaluate(AXE_SOURCE);
        const result = (await page.evaluate(
          "axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } })",
        )) as { violations: { id: string; impact: string; nodes: unknown[] }[] };
        const serious = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
        console.log(
          `axe ${where}: ${result.violations.length} violations (${result.violations.map((v) => `${v.id}:${v.impact}`).join(", ") || "none"})`,
        );
        expect(serious.map((v) => v.id)).toEqual([]);
      };
      await waitForText(page, "#job-rows", /a11y-1/);
      await check("list");
      await page.goto(`${base()}/#/jobs/a11y-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      await check("job page");
      // Narrow window: the page still reads, without a horizontal scroll.
      await page.setViewportSize({ width: 360, height: 800 });
      await page.goto(`${base()}/#/`);
      await waitForText(page, "#job-rows", /a11y-1/);
      expect(await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")).toBe(true);
      await check("list, narrow");
    } finally {
      await context.close();
    }
  });
  it("a hash whose percent-encoding is malformed or hostile shows as text: the page does not crash", async () => {
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up");
      await page.goto(`${base()}/#/jobs/%E0%A4%A`);
      await waitForText(page, "main h2", /%E0%A4%A/);
      await waitForText(page, "main [role=alert]", /./);
      await page.goto(`${base()}/#/jobs/%3Cimg%20src%3Dx%20onerror%3D%22window.__owned%3D1%22%3E`);
      await waitForText(page, "main h2", /<img src=x onerror=/);
      expect(await page.evaluate("window.__owned")).toBeUndefined();
      expect(await page.locator("header .who").count()).toBe(1);
    });
  });

  it("the skip link moves focus to the content and leaves the route (filters, job) as it was", async () => {
    await running("skip-1");
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await page.goto(`${base()}/#/?status=running`);
      await waitForText(page, "#job-rows", /skip-1/);
      await page.locator(".skip").focus();
      expect(await page.evaluate("document.activeElement.textContent")).toBe("Skip to the content");
      await page.keyboard.press("Enter");
      await waitForText(page, "#job-rows", /skip-1/);
      expect(await page.evaluate("location.hash")).toBe("#/?status=running");
      expect(await page.evaluate("document.activeElement.id")).toBe("main");
      await page.goto(`${base()}/#/jobs/skip-1`);
      await waitForText(page, "#job-title", /skip-1/);
      await page.locator(".skip").focus();
      await page.keyboard.press("Enter");
      expect(await page.evaluate("location.hash")).toBe("#/jobs/skip-1");
      expect(await page.locator("#job-title").count()).toBe(1);
    });
  });

  it("going from one job's page straight to another's shows the second job's dispatch and report, never the first's", async () => {
    const a = await running("nav-a", {}, { pane_id: "pane-of-a" });
    expectStatus(await call("PUT", "/v1/jobs/nav-a/attempts/1/report", a, "# Report of A\n", "text/markdown"), 201);
    const b = await running("nav-b", {}, { pane_id: "pane-of-b" });
    expectStatus(await call("PUT", "/v1/jobs/nav-b/attempts/1/report", b, "# Report of B\n", "text/markdown"), 201);
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await page.goto(`${base()}/#/jobs/nav-a`);
      await waitForText(page, ".attempt", /pane pane-of-a/);
      await page.getByRole("button", { name: "Read the report" }).click();
      await waitForText(page, ".report-text pre", /Report of A/);
      await page.goto(`${base()}/#/jobs/nav-b`);
      await waitForText(page, "#job-title", /nav-b/);
      await waitForText(page, ".attempt", /pane pane-of-b/);
      expect(await page.locator(".attempt").textContent()).not.toMatch(/Report of A|pane-of-a/);
    });
  });

  it("a re-read of the job that fails once (429) leaves the job's page up, and it follows the next move", async () => {
    await running("flaky-1");
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await page.goto(`${base()}/#/jobs/flaky-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      const refused = await refuse(page, /\/v1\/jobs\/flaky-1$/, RATE_LIMITED, 1);
      expectStatus(await observe("flaky-1", "working"), 201);
      await expect.poll(refused, { timeout: 20_000 }).toBe(1);
      const seen = await observe("flaky-1", "idle");
      expect(seen.status, seen.text).toBeLessThan(300);
      await waitForText(page, ".record", new RegExp(`Evidence seq\\s*${seen.body.evidence_seq as number}(?!\\d)`));
      expect(await page.locator("#job-title").count()).toBe(1);
    });
  });

  it("a sign-in the service could not check (503) offers to try again or sign out, not a dead end", async () => {
    await withPage(async (page) => {
      await refuse(page, /\/v1\/token$/, { status: 503, title: "Service Unavailable" }, 1);
      await page.goto(`${base()}/`);
      await page.getByLabel("Token").fill(reader);
      await page.getByRole("button", { name: "Sign in" }).click();
      await waitForText(page, "main", /could not say who this token is/);
      await page.getByRole("button", { name: "Try again" }).click();
      await waitForFeedState(page, "caught-up");
      await page.getByRole("button", { name: "Sign out" }).click();
      await page.getByLabel("Token").waitFor();
      expect(await page.evaluate("sessionStorage.length")).toBe(0);
    });
  });

  it("a token refused mid-session (401: expired, or the service's key rotated) returns the page to sign-in at the first refused read, not a 'Live' page whose reads all fail", async () => {
    // The stream opened before the refusal goes on (it is not ended when a token expires): the
    // read the next row causes is the first to be refused, here answered 401 by the browser.
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up");
      await refuse(page, /\/v1\/jobs\/after-expiry$/, {
        status: 401,
        code: "auth.invalid",
        title: "Unauthorized",
        detail: "the token expired at 2026-01-01T00:00:00.000Z",
      });
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: "after-expiry", prompt: "x", agent: "codex" }), 201);
      await page.getByLabel("Token").waitFor({ timeout: 20_000 });
      await waitForText(page, "main [role=alert]", /expired or was refused/);
      expect(await page.evaluate("sessionStorage.length")).toBe(0);
    });
  });

  it("a job page following a busy job reads its event log again only when a notification is published or fails (what writes it), not once per observation", async () => {
    await running("chatty-1");
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      const logReads: string[] = [];
      page.on("request", (r) => {
        if (new URL(r.url()).pathname === "/v1/jobs/chatty-1/events") logReads.push(r.url());
      });
      await page.goto(`${base()}/#/jobs/chatty-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      for (let i = 0; i < 8; i += 1) {
        const seen = await observe("chatty-1", i % 2 === 0 ? "working" : "idle");
        expect(seen.status, seen.text).toBeLessThan(300);
        await waitForText(page, ".record", new RegExp(`Evidence seq\\s*${seen.body.evidence_seq as number}(?!\\d)`));
      }
      console.log(`event log reads while the job was observed 8 times: ${logReads.length}`);
      expect(logReads.length).toBeLessThanOrEqual(2);
      // A publish is what the log records: the page shows it.
      expectStatus(await call("POST", "/v1/jobs/chatty-1/transitions", op, { action: "cancel", expected_seq: 1 }), 200);
      await waitForText(page, ".timeline", /intent\.published/);
      await waitForText(page, ".events", /published/);
    });
  });

  it("a row the feed brings while the job's history is still being read goes after that history in the timeline (oldest first)", async () => {
    await running("late-1");
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up");
      let release: () => void = () => undefined;
      const held = new Promise<void>((r) => {
        release = r;
      });
      let asked = false;
      await page.route(
        (url) => url.pathname === "/v1/events" && url.searchParams.get("job_id") === "late-1",
        async (route) => {
          asked = true;
          await held;
          await route.continue();
        },
      );
      await page.goto(`${base()}/#/jobs/late-1`);
      await expect.poll(() => asked, { timeout: 20_000 }).toBe(true);
      const seen = await observe("late-1", "working");
      expect(seen.status, seen.text).toBeLessThan(300);
      await waitForText(page, ".timeline", /observation\.recorded/);
      release();
      await waitForText(page, ".timeline", /job\.registered/);
      const kinds = await page.locator(".timeline li").evaluateAll((li) => li.map((l) => l.getAttribute("data-kind")));
      expect(kinds[0]).toBe("job.registered");
      expect(kinds.at(-1)).toBe("observation.recorded");
    });
  });

  it("a job registered while the list's first page is being read is shown when the page arrives, not dropped by it", async () => {
    expectStatus(await call("POST", "/v1/jobs", op, { job_id: "race-0", prompt: "x", agent: "codex" }), 201);
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up");
      let release: () => void = () => undefined;
      const held = new Promise<void>((r) => {
        release = r;
      });
      let asked = false;
      // The listing for the filter about to be chosen: read now (before the registration), answered later.
      await page.route(
        (url) => url.pathname === "/v1/jobs" && url.searchParams.get("status") === "pending",
        async (route) => {
          const answer = await route.fetch();
          asked = true;
          await held;
          await route.fulfill({ response: answer });
        },
      );
      const reread = page.waitForResponse((r) => new URL(r.url()).pathname === "/v1/jobs/race-1");
      await page.goto(`${base()}/#/?status=pending`);
      await expect.poll(() => asked, { timeout: 20_000 }).toBe(true);
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: "race-1", prompt: "x", agent: "codex" }), 201);
      await reread;
      await waitForText(page, "#job-rows", /race-1/);
      release();
      await page.waitForFunction(() => {
        const doc = (globalThis as unknown as { document: { querySelector(s: string): { getAttribute(n: string): string | null } | null } })
          .document;
        return doc.querySelector('table[aria-labelledby="jobs-title"]')?.getAttribute("aria-busy") === "false";
      });
      await waitForText(page, "#job-rows", /race-0/);
      await waitForText(page, "#job-rows", /race-1/);
    });
  });

  it("a job whose read is refused once (429 with Retry-After) still shows in the list: the read is tried again after the wait, not dropped", async () => {
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up");
      const refused = await refuse(page, /\/v1\/jobs\/limited-1$/, RATE_LIMITED, 1);
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: "limited-1", prompt: "x", agent: "codex" }), 201);
      await expect.poll(refused, { timeout: 20_000 }).toBe(1);
      await waitForText(page, '#job-rows tr[data-job="limited-1"]', /pending/);
    });
  });

  it("a job page whose re-read is refused once (429) reads the job again after the wait, with no further row to prompt it", async () => {
    await running("flaky-2");
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await page.goto(`${base()}/#/jobs/flaky-2`);
      await waitForText(page, "#why-reason", /Not completing/);
      const refused = await refuse(page, /\/v1\/jobs\/flaky-2$/, RATE_LIMITED, 1);
      const seen = await observe("flaky-2", "working");
      expect(seen.status, seen.text).toBeLessThan(300);
      await waitForText(page, ".record", new RegExp(`Evidence seq\\s*${seen.body.evidence_seq as number}(?!\\d)`));
      expect(refused()).toBe(1);
    });
  });

  it("by keyboard alone, an action's dialog opens, closes on Escape or No with focus back on its button, and after Yes focus lands on the answer, not the page's top", async () => {
    await running("keys-1");
    await withPage(async (page) => {
      await signIn(page, base(), op);
      await page.goto(`${base()}/#/jobs/keys-1`);
      await waitForText(page, "#why-reason", /Not completing/);
      const focused = () => page.evaluate("document.activeElement?.textContent ?? ''");
      await page.getByRole("button", { name: "Cancel job" }).focus();
      await page.keyboard.press("Enter");
      await page.getByRole("dialog", { name: "Cancel job" }).waitFor();
      await page.keyboard.press("Escape");
      expect(await focused()).toBe("Cancel job");
      await page.keyboard.press("Enter");
      await page.getByRole("button", { name: "No" }).focus();
      await page.keyboard.press("Enter");
      expect(await focused()).toBe("Cancel job");
      await page.keyboard.press("Enter");
      await page.getByRole("button", { name: "Yes, cancel job" }).focus();
      await page.keyboard.press("Enter");
      await waitForText(page, "#action-answer", /^Cancelled: the job is now cancelled/);
      await waitForText(page, "#job-title", /cancelled/);
      expect(await page.evaluate("document.activeElement?.id")).toBe("action-answer");
    });
  });

  it("a refused read of the counts (429) keeps the counts shown, not 'This service does not count jobs by status'", async () => {
    await withPage(async (page) => {
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up");
      await page.locator('[data-count="pending"]').waitFor();
      await waitForText(page, '[data-count="pending"]', /\d/);
      const refused = await refuse(page, /\/v1\/job-counts$/, RATE_LIMITED);
      expectStatus(await call("POST", "/v1/jobs", op, { job_id: "counted-1", prompt: "x", agent: "codex" }), 201);
      await expect.poll(refused, { timeout: 20_000 }).toBeGreaterThan(0);
      await waitForText(page, "main .said", /Counts: the read token's rate was passed/);
      expect(await page.locator('[data-count="pending"]').count()).toBe(1);
      expect(await page.getByText("This service does not count jobs by status.").count()).toBe(0);
    });
  });

  it("the feed's waits between reconnections leave no listener behind on its abort signal (one per wait, for the page's life)", async () => {
    await withPage(async (page) => {
      // Counts the abort listeners the page's own code adds and removes (CDP's init script: the CSP does not apply).
      await page.addInitScript(() => {
        const w = globalThis as unknown as { __abortListeners: number };
        w.__abortListeners = 0;
        const proto = AbortSignal.prototype;
        const add = proto.addEventListener;
        const remove = proto.removeEventListener;
        proto.addEventListener = function (this: AbortSignal, type: string, ...rest: unknown[]) {
          if (type === "abort") w.__abortListeners += 1;
          return (add as (...a: unknown[]) => void).call(this, type, ...rest);
        } as typeof proto.addEventListener;
        proto.removeEventListener = function (this: AbortSignal, type: string, ...rest: unknown[]) {
          if (type === "abort") w.__abortListeners -= 1;
          return (remove as (...a: unknown[]) => void).call(this, type, ...rest);
        } as typeof proto.removeEventListener;
      });
      const refused = await refuse(page, /\/v1\/events\/stream/, { status: 503, title: "Service Unavailable" }, 3);
      await signIn(page, base(), await ownReader());
      await waitForFeedState(page, "caught-up", 30_000);
      expect(refused()).toBe(3);
      expect(await page.evaluate("window.__abortListeners")).toBe(0);
    });
  });

  it("a listed job whose evaluation falls due while the page is open (no write, so no feed row) joins 'Needs a person'", async () => {
    await running("due-1");
    await withPage(async (page) => {
      // The listing, and every read of due-1, say its evaluation falls due 2 s after the
      // page opens (browser time): nothing is written then. (A live re-read must say the
      // same: the sweep's hold may clear the real mark, and that write is a feed row.)
      const dueAt = new Date(Date.now() + 2000).toISOString();
      await page.route(
        (url) =>
          (url.pathname === "/v1/jobs" && [...url.searchParams.keys()].every((k) => k === "limit")) || url.pathname === "/v1/jobs/due-1",
        async (route) => {
          const answer = await route.fetch();
          const body = (await answer.json()) as {
            items?: { job_id: string; candidate_at?: string }[];
            job_id?: string;
            candidate_at?: string;
          };
          for (const j of body.items ?? [body]) if (j.job_id === "due-1") j.candidate_at = dueAt;
          await route.fulfill({ response: answer, json: body });
        },
      );
      await signIn(page, base(), await ownReader());
      await waitForText(page, '#job-rows tr[data-job="due-1"]', /running/);
      // The list redraws its times every 15 s: the mark shows within one redraw.
      await waitForText(page, '#job-rows tr[data-job="due-1"]', /evaluation due/, 30_000);
      await waitForText(page, "#attention-title ~ *", /due-1/);
    });
  });
});
