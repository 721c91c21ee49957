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
  },
});
