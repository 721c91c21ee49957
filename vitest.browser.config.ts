/**
 * `npm run test:browser`: the dashboard in a real browser (Debian's Chromium through
 * playwright-core) against an in-process `mam serve`, and the AWS shape's polling
 * page against `npm run offline` (Java 17 for DynamoDB Local): tests/browser/. The
 * dashboard is built first (packages/dashboard/build.mjs), so the page tested is the
 * source's.
 */
import { defineConfig } from "vitest/config";
import base from "./vitest.config.ts";

export default defineConfig({
  ...base,
  test: {
    ...base.test,
    include: ["tests/browser/**/*.test.ts"],
    exclude: ["**/node_modules/**"],
    globalSetup: ["tests/browser/build-dashboard.setup.ts"],
    testTimeout: 120_000,
    // One browser at a time: the page's latencies are what the tests print.
    maxWorkers: 1,
  },
});
