import { OpenAPIHono } from "@hono/zod-openapi";
import { type Deps, defaultConfig, jsonLogger, type Logger, MamError, withDefaults } from "@mam/core";
import type { Context, Hono } from "hono";
import { HTTPException } from "hono/http-exception";
import { methodNotAllowed } from "hono/method-not-allowed";
import { notJson } from "./body.ts";
import type { AppEnv, FeedOptions, Services } from "./context.ts";
import { problemBody, problemFor, problemResponse } from "./problem.ts";
import { ReadTokenRates } from "./rate-limit.ts";
import { requestLog, saneRequestId } from "./request-log.ts";
import { ChangeStreams } from "./routes/change-streams.ts";
import { ROUTES } from "./routes/index.ts";
import { registerRoutes } from "./routes/support.ts";
import { appServices } from "./services.ts";
import { APP_SETTINGS, type AppSettings, appOptionsOf } from "./settings.ts";
import type { TokenService } from "./tokens.ts";
import { validationHook } from "./validation.ts";
import { Scenario } from "./wire.ts";

export type { AppEnv } from "./context.ts";

export interface AppOptions extends Partial<AppSettings> {
  readonly deps: Deps;
  readonly tokens: TokenService;
  /** Where the app's JSON lines go (one per request, per unexpected error, ...; core's `jsonLogger` writes them); console.log by default. */
  readonly log?: (line: string) => void;
  /**
   * Whether `POST /v1/jobs/{job_id}/events` publishes the intent it committed itself
   * (true when absent). A root whose process has another path publishing every
   * commit — `mam serve`'s change relay, the stream publisher on AWS — says false,
   * and the answer then carries no `published`: the request does not know.
   */
  readonly publishInline?: boolean;
  /** The change feed's stream: streaming or not, its wake-up signal, its bounds, the shutdown signal. */
  readonly feed?: FeedOptions;
}

/**
 * The HTTP API over a ports bundle (DESIGN.md, "HTTP API"), on Hono's own idioms:
 * one `createRoute` declaration per operation (routes/*.ts) is its validation, its
 * handler's types and its part of the document; access and body limits are
 * per-route middleware built from the declaration; every refusal, from a validator
 * or a handler, becomes its problem in `app.onError`. The same app runs under
 * @hono/node-server (`mam serve`) and hono/aws-lambda. A setting left out is the
 * configuration schema's default.
 */
export function createApp(opts: AppOptions): Hono<AppEnv> {
  const app = new OpenAPIHono<AppEnv>({ defaultHook: validationHook });
  const settings = settingsOf(opts);
  const services: Services = {
    deps: opts.deps,
    tokens: opts.tokens,
    settings,
    readRates: new ReadTokenRates(settings.readTokenRatePerMinute),
    logger: jsonLogger(opts.log ?? ((line: string) => console.log(line))),
    publishInline: opts.publishInline ?? true,
    changeStreams: new ChangeStreams(opts.deps, opts.feed),
    document: () => {
      generated ??= app.getOpenAPI31Document(DOCUMENT);
      return generated;
    },
  };

  app.use(saneRequestId(), requestLog(services.logger), appServices(services));
  app.use(
    methodNotAllowed({
      app,
      // HEAD is answered wherever GET is (by Hono); Allow names the methods the API declares.
      onMethodNotAllowed: (c, methods) => {
        const allowed = methods.filter((m) => m !== "HEAD");
        const detail = `${c.req.method} is not served on ${c.req.path}; try ${allowed.join(", ")}`;
        const problem = problemBody("route.methodNotAllowed", detail, { requestId: c.get("requestId"), instance: c.req.path });
        return problemResponse(c, problem, { allow: allowed.join(", ") });
      },
    }),
  );

  app.notFound((c) =>
    problemResponse(
      c,
      problemBody("route.notFound", `no route ${c.req.method} ${c.req.path}`, { requestId: c.get("requestId"), instance: c.req.path }),
    ),
  );
  app.onError((err, c) => answerError(err, c, services.logger));

  registerRoutes(app, services, ROUTES);
  // The scenario's documented shape (EvaluationRequest refers to it; the gate reads what it is sent raw).
  app.openAPIRegistry.register("Scenario", Scenario);
  app.openAPIRegistry.registerComponent("securitySchemes", "bearerAuth", {
    type: "http",
    scheme: "bearer",
    bearerFormat: "JWT",
    description:
      "Operator tokens carry scopes (`read`, `write`, `gate`, `ops`), listed as the roles each operation requires. " +
      "Agent tokens are minted at dispatch, bound to one job and one attempt, and retired by a newer dispatch of the job.",
  });
  return app;
}

/** The settings given, the schema's defaults for the rest. */
function settingsOf(opts: AppOptions): AppSettings {
  return withDefaults(appOptionsOf(defaultConfig()), Object.fromEntries(APP_SETTINGS.map((k) => [k, opts[k]])));
}

/**
 * Every error a request ends in, as its answer: a refusal (MamError, a routing
 * problem) as its problem; a body Hono's JSON validator could not parse as a 400
 * naming `body`; a client that went away as a bare 499 for the log (nobody reads
 * it); anything else as a 500 with a generic detail, logged with its stack.
 */
async function answerError(err: unknown, c: Context<AppEnv>, logger: Logger): Promise<Response> {
  const requestId = c.get("requestId");
  if (clientAborted(c.req.raw, err)) {
    c.set("clientAborted", true);
    return c.body(null, CLIENT_CLOSED_REQUEST as 200);
  }
  let error = err;
  if (err instanceof HTTPException) {
    // Hono's validators: JSON that did not parse, or a media type the route does not take.
    if (err.status === 415) error = unsupportedMediaType(c.req.header("content-type"));
    else if (err.status === 400) error = await notJson(c.req.text());
  }
  const { problem, unexpected } = problemFor(error, { requestId, instance: c.req.path });
  if (unexpected) {
    logger.error("unexpected error", {
      request_id: requestId,
      method: c.req.method,
      path: c.req.path,
      error: err instanceof Error ? { name: err.name, message: err.message, stack: err.stack } : String(err),
    });
  }
  return problemResponse(c, problem);
}

function unsupportedMediaType(contentType: string | undefined): MamError {
  return new MamError(
    "input.unsupportedMediaType",
    `this route takes application/json, not ${contentType === undefined ? "a body without a Content-Type" : JSON.stringify(contentType)}`,
    { issues: [{ path: "header.content-type", message: "must be application/json" }] },
  );
}

/** What nginx logs for a client that closed its connection before the answer: not a status anybody receives. */
const CLIENT_CLOSED_REQUEST = 499;

/**
 * The client went away mid-request: the runtime aborted the request's signal
 * (@hono/node-server does when the connection closes before the answer), or reading
 * its body failed with the HTTP server's own "aborted" reset. A MamError is a
 * refusal or a store's failure (a store's socket reset is wrapped in one), never this.
 */
function clientAborted(req: Request, err: unknown): boolean {
  if (req.signal.aborted) return true;
  if (err instanceof MamError) return false;
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if ((e as { code?: unknown }).code === "ECONNRESET" && e.message === "aborted") return true;
  }
  return false;
}

/**
 * The document, generated on its first request: from the route declarations alone
 * (module constants; nothing in it depends on an app's options), so every app in
 * the process serves the same one.
 */
let generated: unknown;

const DOCUMENT = {
  openapi: "3.1.0",
  info: {
    title: "mam",
    version: "1",
    summary: "Decides, fail-closed and on evidence it checks itself, whether a job delegated to an AI coding agent is finished.",
    description:
      "The job registry, report store and completion gate for delegated AI coding agents. " +
      "Every error is `application/problem+json` (RFC 9457) with a stable `type` per `code`, and every answer carries `X-Request-Id`.",
    contact: { name: "mam maintainers", url: "https://mam.dev" },
    license: { name: "UNLICENSED", identifier: "UNLICENSED" },
  },
  servers: [{ url: "/", description: "This service (relative: under an API Gateway stage too)." }],
  security: [{ bearerAuth: [] }],
  tags: [
    { name: "jobs", description: "Register, list, read and transition jobs." },
    { name: "dispatch", description: "Record a dispatch of a job and mint its agent token." },
    { name: "reports", description: "Stage, finalize and verify an attempt's report." },
    { name: "gate", description: "Complete a job on evidence." },
    { name: "events", description: "An agent's events, and the job's event log." },
    { name: "operations", description: "Notification delivery: the recovery sweep and quarantine release." },
    { name: "meta", description: "This document, its docs page, the dashboard and liveness." },
  ],
};
