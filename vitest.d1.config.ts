/**
 * `npm run test:d1`: the SQL driver seam on Cloudflare's D1, through Miniflare (the
 * pinned `miniflare` devDependency, workerd inside it) driven from Node: tests/d1/.
 * `npm test` runs the same contract suite on better-sqlite3 and leaves tests/d1/ to
 * this tier (workerd is a second engine process per test file).
 */
import { defineConfig } from "vitest/config";
import base from "./vitest.config.ts";

// Spread, not mergeConfig: mergeConfig concatenates arrays, and `include`/`exclude`
// here replace the default run's (which excludes tests/d1/).
export default defineConfig({
  ...base,
  test: {
    ...base.test,
    include: ["tests/d1/**/*.test.ts"],
    exclude: ["**/node_modules/**"],
    // The race is what this tier is for, and a trial is a fraction of a second here:
    // 100 of them (3,200 racing batches) unless MAM_RACE_TRIALS says otherwise.
    env: { ...base.test?.env, MAM_RACE_TRIALS: process.env.MAM_RACE_TRIALS ?? "100" },
  },
});
