import { packageDir, readFileIn } from "./package-files.ts";

/**
 * The dashboard's files: built by @mam/dashboard (esbuild, `packages/dashboard/dist/`)
 * and served by the app to anyone — the page holds no data of its own; it asks for a
 * token and reads the JSON API with it. The files are found lazily, on the first
 * request, through node:module and node:fs (as the docs page finds swagger-ui-dist):
 * never imported, so no bundle carries them (on AWS they sit next to the http
 * function's bundle, copied by `npm run package`), and a service whose dashboard was
 * not built still starts; then the page answers 404 saying how to build it.
 */

/** The only files served, with their media types: never a path a caller builds. */
export const DASHBOARD_FILES: Readonly<Record<string, string>> = {
  "index.html": "text/html; charset=utf-8",
  "app.js": "text/javascript; charset=utf-8",
  "app.css": "text/css; charset=utf-8",
};

/** Where the page learns whether the feed streams here (`mam serve`) or must be polled (Lambda). */
const FEED_MODE_META = '<meta name="mam-feed" content="stream">';

let distDir: Promise<string | undefined> | undefined;
const read = new Map<string, Promise<Uint8Array<ArrayBuffer> | undefined>>();

async function readFileOnce(name: string): Promise<Uint8Array<ArrayBuffer> | undefined> {
  distDir ??= packageDir("@mam/dashboard").then((dir) => (dir === undefined ? undefined : `${dir}/dist`));
  const dir = await distDir;
  return dir === undefined ? undefined : readFileIn(dir, name);
}

/**
 * An allowed file's bytes and media type, or undefined (an unknown name, or the
 * dashboard not built). Read on first request and kept; a file missing is looked for
 * again on the next request (a build may have run since).
 */
export async function readDashboardFile(
  name: string,
  options: { readonly streaming: boolean },
): Promise<{ body: Uint8Array<ArrayBuffer>; contentType: string } | undefined> {
  const contentType = Object.hasOwn(DASHBOARD_FILES, name) ? DASHBOARD_FILES[name] : undefined;
  if (contentType === undefined) return undefined;
  // The page as served where responses cannot stream is kept as such: rewritten once, not per request.
  const poll = name === "index.html" && !options.streaming;
  const key = poll ? "index.html (poll)" : name;
  let kept = read.get(key);
  if (kept === undefined) {
    kept = poll
      ? readFileOnce(name).then((bytes) =>
          bytes === undefined
            ? undefined
            : new TextEncoder().encode(new TextDecoder().decode(bytes).replace(FEED_MODE_META, '<meta name="mam-feed" content="poll">')),
        )
      : readFileOnce(name);
    read.set(key, kept);
  }
  const body = await kept;
  if (body === undefined) {
    read.delete(key);
    return undefined;
  }
  return { body, contentType };
}

/** What `GET /` answers when the dashboard was not built. */
export const DASHBOARD_NOT_BUILT =
  "the dashboard is not built here: run `npm run build:dashboard` (npm ci runs it), or `npm run package` for the AWS bundle";
