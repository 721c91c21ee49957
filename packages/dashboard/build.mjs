#!/usr/bin/env node
/**
 * Builds the dashboard into dist/: index.html and app.css as they are, src/main.tsx
 * bundled by esbuild (Preact, the feed parser and openapi-fetch inside; minified, one
 * file, no source map served) into app.js. `npm ci` runs it (the root's `prepare`),
 * and so do `npm start`, `npm run package` and the browser tier, so a fresh clone
 * serves the page with the README's two commands. It takes well under a second.
 *
 * `node packages/dashboard/build.mjs` prints what it wrote; `buildDashboard()` is
 * the same for scripts.
 */
import { copyFileSync, mkdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));

/** The files the API serves, and nothing else: @mam/api's DASHBOARD_FILES names the same three. */
export const DASHBOARD_FILES = ["index.html", "app.js", "app.css"];

/** Builds dist/ (or `outdir`); answers the files' sizes in bytes and the time it took. */
export async function buildDashboard(outdir = join(here, "dist")) {
  const started = performance.now();
  mkdirSync(outdir, { recursive: true });
  await build({
    entryPoints: [join(here, "src", "main.tsx")],
    outfile: join(outdir, "app.js"),
    bundle: true,
    minify: true,
    format: "esm",
    target: ["chrome120", "firefox120", "safari17"],
    jsx: "automatic",
    jsxImportSource: "preact",
    legalComments: "none",
    logLevel: "warning",
  });
  copyFileSync(join(here, "src", "app.css"), join(outdir, "app.css"));
  copyFileSync(join(here, "index.html"), join(outdir, "index.html"));
  const sizes = Object.fromEntries(DASHBOARD_FILES.map((f) => [f, statSync(join(outdir, f)).size]));
  return { outdir, sizes, ms: Math.round(performance.now() - started) };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { outdir, sizes, ms } = await buildDashboard();
  const total = Object.values(sizes).reduce((a, b) => a + b, 0);
  console.error(
    `dashboard built in ${ms} ms: ${outdir} (${Object.entries(sizes)
      .map(([f, n]) => `${f} ${(n / 1024).toFixed(1)} KiB`)
      .join(", ")}; ${(total / 1024).toFixed(1)} KiB in all)`,
  );
}
