import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    // tests/engine/ needs AWS's own engines (Java for DynamoDB Local, cfn-lint): the
    // `test:aws-engine` tier runs it (vitest.engine.config.ts); `npm test` needs neither.
    exclude: ["**/node_modules/**", "tests/engine/**"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    reporters: process.env.MAM_JSON_REPORT ? ["default", ["json", { outputFile: process.env.MAM_JSON_REPORT }]] : ["default"],
  },
});
