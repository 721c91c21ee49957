/**
 * The browser tier's kit: Debian's Chromium (`/usr/bin/chromium`, or MAM_CHROMIUM)
 * driven by playwright-core, started headless with the flags a closed network needs
 * (no background networking, no component updates: without them Chromium's own
 * connections are refused many at a time). Each test gets a fresh context (its own
 * sessionStorage). Waits are for the DOM, never for time: `waitFor` polls the page
 * until a condition holds, within a generous ceiling, and says how long it took.
 */
import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import path from "node:path";
import { type Browser, chromium, type Page } from "playwright-core";

export const CHROMIUM = process.env.MAM_CHROMIUM ?? "/usr/bin/chromium";
/** Where the tier leaves its screenshots (a CI artifact; the README's images are copies). */
export const ARTIFACTS = path.resolve(import.meta.dirname, "..", "..", "test-results", "browser");
/** The most a DOM change may take to appear; measured latencies are printed. */
export const DOM_CEILING_MS = 20_000;

export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM}: install Debian's chromium package (apt-get install chromium), or set MAM_CHROMIUM`);
  await mkdir(ARTIFACTS, { recursive: true });
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

/** Everything the page printed to its console or threw, for a test to assert on. */
export function pageErrors(page: Page): string[] {
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("dialog", (d) => {
    errors.push(`dialog: ${d.type()} ${d.message()}`);
    void d.dismiss();
  });
  return errors;
}

/** Opens the page and signs in with `token` through its form, as a person would. */
export async function signIn(page: Page, baseUrl: string, token: string): Promise<void> {
  await page.goto(`${baseUrl}/`);
  await page.getByLabel("Token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#feed-state").waitFor({ timeout: DOM_CEILING_MS });
}

/** What `waitForText` reads of the page's document. */
interface PageDocument {
  querySelectorAll(selector: string): ArrayLike<{ readonly textContent: string | null }>;
}

/** Waits until the locator's text matches; answers the milliseconds it took. */
export async function waitForText(page: Page, selector: string, pattern: RegExp, ceilingMs = DOM_CEILING_MS): Promise<number> {
  const started = performance.now();
  // A function with its arguments, not a string: the page's CSP forbids eval, and a
  // string predicate is evaluated with it. (This file is type-checked without the DOM's types.)
  const wanted = page.waitForFunction(
    ({ selector, source, flags }) => {
      const doc = (globalThis as unknown as { document: PageDocument }).document;
      const text = Array.from(doc.querySelectorAll(selector))
        .map((e) => e.textContent ?? "")
        .join("\n");
      return new RegExp(source, flags).test(text);
    },
    { selector, source: pattern.source, flags: pattern.flags },
    { timeout: ceilingMs, polling: 50 },
  );
  try {
    await wanted;
  } catch (e) {
    const texts = await page
      .locator(selector)
      .allTextContents()
      .catch(() => []);
    throw new Error(`${selector} never matched ${pattern} within ${ceilingMs} ms; it reads: ${JSON.stringify(texts).slice(0, 2000)}`, {
      cause: e,
    });
  }
  return performance.now() - started;
}

/** The feed indicator's state (`data-state`): connecting, down, live, caught-up. */
export async function waitForFeedState(page: Page, state: string, ceilingMs = DOM_CEILING_MS): Promise<number> {
  const started = performance.now();
  await page.locator(`#feed-state[data-state="${state}"]`).waitFor({ timeout: ceilingMs });
  return performance.now() - started;
}

export async function screenshot(page: Page, name: string): Promise<string> {
  const file = path.join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

/** A refusal the browser answers itself (`refuse`), as the service would word it. */
export interface Refusal {
  readonly status: number;
  readonly title: string;
  readonly code?: string;
  readonly detail?: string;
  readonly retryAfter?: string;
}

/** The read token's rate passed, as the service answers it (retry after 1 s). */
export const RATE_LIMITED: Refusal = {
  status: 429,
  code: "rate.limited",
  title: "Too Many Requests",
  detail: "the read token's rate was passed",
  retryAfter: "1",
};

/**
 * Requests matching `url` are answered with `refusal` (problem+json) the first `times`
 * times (every time when `times` is absent), then go to the service; answers how many
 * were refused so far.
 */
export async function refuse(page: Page, url: RegExp, refusal: Refusal, times?: number): Promise<() => number> {
  let refused = 0;
  await page.route(url, async (route) => {
    if (times !== undefined && refused >= times) return route.continue();
    refused += 1;
    const { status, retryAfter, ...problem } = refusal;
    await route.fulfill({
      status,
      headers: { "content-type": "application/problem+json", ...(retryAfter === undefined ? {} : { "retry-after": retryAfter }) },
      body: JSON.stringify(problem),
    });
  });
  return () => refused;
}
