import { packageDir, readFileIn } from "./package-files.ts";

/**
 * The docs page: Swagger UI over /openapi.json, its assets served by the app itself
 * from the `swagger-ui-dist` package (a closed network reaches no CDN). The package
 * is looked up lazily, on the first asset request, through node:module and node:fs:
 * a Lambda bundle may leave it out, and then the asset route answers 404 (a
 * problem) instead of the app failing to start.
 */

/** The only files served, with their media types: never a path a caller builds. */
export const DOCS_ASSETS: Readonly<Record<string, string>> = {
  "swagger-ui.css": "text/css; charset=utf-8",
  "index.css": "text/css; charset=utf-8",
  "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
  "swagger-ui-standalone-preset.js": "text/javascript; charset=utf-8",
  "favicon-32x32.png": "image/png",
  "favicon-16x16.png": "image/png",
};

let assetDir: Promise<string | undefined> | undefined;

/**
 * The page's own script, served from here rather than inline: the page's CSP allows
 * scripts from the app alone (`script-src 'self'`), never an inline one.
 */
const DOCS_INIT_NAME = "mam-docs.js";
const DOCS_INIT = new TextEncoder().encode(`window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "StandaloneLayout",
  });
});
`);

/** The bytes of an allowed asset, or undefined (unknown name, or the package is not deployed). */
export async function readDocsAsset(name: string): Promise<{ body: Uint8Array<ArrayBuffer>; contentType: string } | undefined> {
  if (name === DOCS_INIT_NAME) return { body: DOCS_INIT, contentType: "text/javascript; charset=utf-8" };
  const contentType = Object.hasOwn(DOCS_ASSETS, name) ? DOCS_ASSETS[name] : undefined;
  if (contentType === undefined) return undefined;
  assetDir ??= packageDir("swagger-ui-dist");
  const dir = await assetDir;
  if (dir === undefined) return undefined;
  const body = await readFileIn(dir, name);
  return body === undefined ? undefined : { body, contentType };
}

// Relative URLs, so the page works under a path prefix (an API Gateway stage).
export const DOCS_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mam API</title>
<link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png">
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script src="docs/assets/swagger-ui-standalone-preset.js"></script>
<script src="docs/assets/${DOCS_INIT_NAME}"></script>
</body>
</html>
`;
