import { configDefaults, defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    // The long ones (tests/reliability) run in their own tier only: npm run test:reliability sets MAM_RELIABILITY.
    exclude: [...configDefaults.exclude, ...(process.env.MAM_RELIABILITY ? [] : ["tests/reliability/**"])],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    reporters: process.env.MAM_JSON_REPORT ? ["default", ["json", { outputFile: process.env.MAM_JSON_REPORT }]] : ["default"],
  },
});
