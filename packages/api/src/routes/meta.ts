import { z } from "@hono/zod-openapi";
import { secureHeaders } from "hono/secure-headers";
import { anyone } from "../access.ts";
import { DASHBOARD_FILES, DASHBOARD_NOT_BUILT, readDashboardFile } from "../dashboard.ts";
import { DOCS_ASSETS, DOCS_HTML, readDocsAsset } from "../docs.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, REQUEST_ID_HEADER } from "../openapi.ts";
import { RoutingProblem } from "../problem.ts";
import { HealthSchema } from "../wire.ts";
import { withHandler } from "./support.ts";

/**
 * Every HTML answer: not to be sniffed as anything else, framed by nobody, and no
 * Referer leaving the page. Each page's CSP allows scripts from the app alone, none
 * inline (`script-src 'self'`). Swagger UI styles its elements from script, so the
 * docs page allows inline styles; the dashboard does not.
 */
const page = (styleSrc: string[], extra: { fontSrc?: string[] } = {}) =>
  secureHeaders({
    xFrameOptions: "DENY",
    referrerPolicy: "no-referrer",
    contentSecurityPolicy: {
      defaultSrc: ["'none'"],
      scriptSrc: ["'self'"],
      styleSrc,
      connectSrc: ["'self'"],
      imgSrc: ["'self'", "data:"],
      ...extra,
      baseUri: ["'none'"],
      formAction: ["'none'"],
      frameAncestors: ["'none'"],
    },
  });

const HTML_CACHE = { "cache-control": "no-cache" } as const;

const FileParam = z.object({
  file: z.string().openapi({ param: { description: "The asset's file name." }, example: EXAMPLE.file }),
});

const html = (description: string, example: string) => ({
  description,
  headers: REQUEST_ID_HEADER,
  content: { "text/html": { schema: z.string(), example } },
});

/** An asset's answer, one media type per kind of file served. */
const asset = (description: string, types: readonly string[]) => ({
  description,
  headers: REQUEST_ID_HEADER,
  content: Object.fromEntries(
    types.map((t) => [t, { schema: t.startsWith("image/") ? z.string().openapi({ format: "binary" }) : z.string() }]),
  ),
});

const OpenApiDocumentSchema = z
  .looseObject({
    openapi: z.string(),
    info: z.looseObject({ title: z.string(), version: z.string() }),
    paths: z.record(z.string(), z.looseObject({})),
  })
  .openapi("OpenApiDocument", { description: "An OpenAPI 3.1 document." });

export const getOpenApiRoute = withHandler(
  defineRoute(anyone, {
    operationId: "getOpenApi",
    method: "get",
    path: "/openapi.json",
    tags: ["meta"],
    summary: "This OpenAPI document",
    description: "OpenAPI 3.1, generated from the same route declarations and zod schemas the API validates with.",
    responses: {
      200: jsonAnswer("OpenAPI 3.1.", OpenApiDocumentSchema, { openapi: "3.1.0", info: { title: "mam", version: "1" }, paths: {} }),
    },
  }),
  (c) => {
    const { document } = c.var.services;
    return c.json(document() as z.infer<typeof OpenApiDocumentSchema>, 200, { "cache-control": "no-cache" });
  },
);

export const getDocsRoute = withHandler(
  defineRoute(anyone, {
    operationId: "getDocs",
    method: "get",
    path: "/docs",
    tags: ["meta"],
    summary: "API docs (Swagger UI over /openapi.json)",
    description: "Its assets are served by the app itself, from the swagger-ui-dist package (no CDN).",
    middleware: [page(["'self'", "'unsafe-inline'"], { fontSrc: ["'self'", "data:"] })] as const,
    responses: { 200: html("The docs page.", '<!doctype html>\n<html lang="en">\n<head>\n<title>mam API</title>\n…') },
  }),
  (c) => c.html(DOCS_HTML, 200, HTML_CACHE),
);

export const getDocsAssetRoute = withHandler(
  defineRoute(
    anyone,
    {
      operationId: "getDocsAsset",
      method: "get",
      path: "/docs/assets/{file}",
      tags: ["meta"],
      summary: "A Swagger UI asset, served from the swagger-ui-dist package",
      description: `One of: ${Object.keys(DOCS_ASSETS)
        .map((f) => `\`${f}\``)
        .join(", ")}, and \`mam-docs.js\`; anything else is a 404.`,
      request: { params: FileParam },
      responses: { 200: asset("The asset.", ["text/css", "text/javascript", "image/png"]) },
    },
    [exampleProblem("route.notFound", 'no docs asset "swagger-ui.css.map" in this deployment')],
  ),
  async (c) => {
    const name = c.req.valid("param").file;
    const found = await readDocsAsset(name);
    if (found === undefined)
      throw new RoutingProblem("route.notFound", `no docs asset ${JSON.stringify(name).slice(0, 80)} in this deployment`);
    return c.body(found.body, 200, {
      "content-type": found.contentType,
      "cache-control": "public, max-age=86400",
      "x-content-type-options": "nosniff",
    });
  },
);

export const getAssetRoute = withHandler(
  defineRoute(
    anyone,
    {
      operationId: "getAsset",
      method: "get",
      path: "/assets/{file}",
      tags: ["meta"],
      summary: "The dashboard's script and stylesheet",
      description: `One of: ${Object.keys(DASHBOARD_FILES)
        .filter((f) => f !== "index.html")
        .map((f) => `\`${f}\``)
        .join(", ")} (built by @mam/dashboard, read on first request); anything else is a 404.`,
      request: { params: FileParam },
      responses: { 200: asset("The asset.", ["text/javascript", "text/css"]) },
    },
    [exampleProblem("route.notFound", 'no asset "app.js.map"')],
  ),
  async (c) => {
    const name = c.req.valid("param").file;
    const found = name === "index.html" ? undefined : await readDashboardFile(name, { streaming: true });
    if (found === undefined) throw new RoutingProblem("route.notFound", `no asset ${JSON.stringify(name).slice(0, 80)}`);
    return c.body(found.body, 200, { "content-type": found.contentType, "cache-control": "no-cache", "x-content-type-options": "nosniff" });
  },
);

export const getHealthRoute = withHandler(
  defineRoute(anyone, {
    operationId: "getHealth",
    method: "get",
    path: "/healthz",
    tags: ["meta"],
    summary: "Liveness",
    description: "Answers while the process serves; it asks no store.",
    responses: { 200: jsonAnswer("Alive.", HealthSchema, { ok: true }) },
  }),
  (c) => c.json({ ok: true as const }, 200),
);

export const getDashboardRoute = withHandler(
  defineRoute(
    anyone,
    {
      operationId: "getDashboard",
      method: "get",
      path: "/",
      tags: ["meta"],
      summary: "The dashboard (its data needs a token)",
      description:
        "The page an operator keeps open: it asks for a token (a read token from `mam token create --scope read --ttl 8h`), keeps it in sessionStorage and reads the JSON API with it, live from the change feed (streamed on `mam serve`, polled every 10 s where responses cannot stream).",
      middleware: [page(["'self'"])] as const,
      responses: { 200: html("The dashboard page.", '<!doctype html>\n<html lang="en">\n<head>\n<title>mam — jobs</title>\n…') },
    },
    [exampleProblem("route.notFound", DASHBOARD_NOT_BUILT)],
  ),
  async (c) => {
    const streaming = c.var.services.changeStreams.settings.streaming !== false;
    const found = await readDashboardFile("index.html", { streaming });
    if (found === undefined) throw new RoutingProblem("route.notFound", DASHBOARD_NOT_BUILT);
    return c.body(found.body, 200, { ...HTML_CACHE, "content-type": found.contentType });
  },
);
