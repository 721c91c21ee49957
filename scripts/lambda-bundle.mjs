/**
 * How the Lambda functions are bundled: the one place esbuild's options live, used by
 * `npm run package` (scripts/package.mjs) and by bench/bundles.ts, so what is
 * measured is what is deployed.
 *
 * ESM (`.mjs`), node22, minified, linked source maps (the functions run with
 * NODE_OPTIONS=--enable-source-maps). Nothing is external: the AWS SDK v3 clients
 * are bundled (tree-shaken) at the versions the lockfile pins. Code splitting is on
 * so that a dynamic import (the S3 store, loaded on the first report operation)
 * becomes a chunk of its own that a cold start does not load.
 */

import { dirname, join } from "node:path";

/** Function name (as in serverless.yml, kebab-cased for the folder) -> entry point. */
export const LAMBDA_ENTRIES = {
  http: "functions/http.ts",
  "stream-publisher": "functions/stream-publisher.ts",
  "feed-writer": "functions/feed-writer.ts",
  "recovery-sweep": "functions/recovery-sweep.ts",
};

/** ESM bundles of CommonJS dependencies still call `require` for Node built-ins: give them one. */
export const ESM_REQUIRE_BANNER = [
  'import { createRequire as __mamCreateRequire } from "node:module";',
  "const require = __mamCreateRequire(import.meta.url);",
].join("\n");

/**
 * zod's classic API re-exports every locale it ships (`z.locales`, ~250 KiB minified
 * of error-message translations in some 50 languages) from one index module, so no
 * tree shaking can drop them. The service speaks English (zod's default, `en`, which
 * zod registers itself): the Lambda bundles get an index with `en` alone. Nothing of
 * zod is replaced; `z.locales.en` still exists, the other languages do not. (The
 * same idea as the bundlers' well-known "ignore moment's locales".)
 */
export const zodEnglishOnly = {
  name: "zod-english-only",
  setup(b) {
    b.onResolve({ filter: /^\.\.\/locales\/index\.js$/ }, (args) =>
      /[\\/]node_modules[\\/]zod[\\/]v4[\\/](classic|core)$/.test(args.resolveDir)
        ? { path: join(args.resolveDir, "..", "locales", "index.js"), namespace: "zod-english-only" }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: "zod-english-only" }, (args) => ({
      contents: 'export { default as en } from "./en.js";',
      resolveDir: dirname(args.path),
      loader: "js",
    }));
  },
};

/** esbuild options for one function's bundle, written to `outdir`. */
export function lambdaBuildOptions(root, name, entry, outdir) {
  return {
    absWorkingDir: root,
    entryPoints: { [name]: entry },
    outdir,
    outExtension: { ".js": ".mjs" },
    bundle: true,
    splitting: true,
    chunkNames: "chunks/[name]-[hash]",
    platform: "node",
    target: "node22",
    format: "esm",
    mainFields: ["module", "main"],
    minify: true,
    sourcemap: "linked",
    sourcesContent: false,
    legalComments: "none",
    banner: { js: ESM_REQUIRE_BANNER },
    metafile: true,
    logLevel: "warning",
    plugins: [zodEnglishOnly],
  };
}
