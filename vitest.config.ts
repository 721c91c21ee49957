import { configDefaults, defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    // tests/engine/ needs AWS's own engines (Java for DynamoDB Local, cfn-lint): the
    // `test:aws-engine` tier runs it (vitest.engine.config.ts); `npm test` needs neither.
    // tests/d1/ runs D1 through Miniflare (workerd): the `test:d1` tier (vitest.d1.config.ts).
    // The long ones (tests/reliability) run in their own tier only: npm run test:reliability sets MAM_RELIABILITY.
    exclude: [
      ...configDefaults.exclude,
      "tests/engine/**",
      "tests/d1/**",
      // tests/browser/ drives Debian's Chromium: the `test:browser` tier (vitest.browser.config.ts).
      "tests/browser/**",
      ...(process.env.MAM_RELIABILITY ? [] : ["tests/reliability/**"]),
    ],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    // Vitest's default is one worker fewer than the cores: one worker on CI's 2 cores,
    // where most of a test's time is spent waiting on the peers it started (brokers,
    // servers, child processes). Measured on a quiet machine: 333 s with one, 262 s with two.
    maxWorkers: 2,
    // The AWS SDK's notice that its releases after January 2027 need Node 22, once per
    // worker on Node 20: its own switch (@aws-sdk/core's
    // emitWarningIfUnsupportedVersion reads it) turns it off in tests only; `mam`,
    // `npm start` and the functions still print it (docs/decisions.md).
    env: { AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: "true" },
    reporters: process.env.MAM_JSON_REPORT ? ["default", ["json", { outputFile: process.env.MAM_JSON_REPORT }]] : ["default"],
  },
});
