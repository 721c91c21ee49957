import type { Deps, Logger } from "@mam/core";
import type { RequestIdVariables } from "hono/request-id";
import type { Upload } from "./body.ts";
import type { ReadTokenRates } from "./rate-limit.ts";
import type { ChangeStreams, FeedOptions } from "./routes/change-streams.ts";
import type { AppSettings } from "./settings.ts";
import type { Principal, TokenService } from "./tokens.ts";

/** What a request carries through the middleware to its handler. */
export interface AppEnv {
  Variables: RequestIdVariables & {
    /** Set by `bearerAuth` on a protected route. */
    principal?: Principal;
    /** Set by `reportBody` on the report upload. */
    upload?: Upload;
    /** The client went away before its answer (logged as 499, not as a failure). */
    clientAborted?: boolean;
    /** Set by `appServices` on every request: what the handlers are built over. */
    services: Services;
  };
}

/** What the routes are built over: one app's ports, tokens, limits and log; a handler reads them as `c.var.services`. */
export interface Services {
  readonly deps: Deps;
  readonly tokens: TokenService;
  /** The configuration the app reads (body limits, uploads, the sweep's policy, grace and budget). */
  readonly settings: AppSettings;
  /** Every line the app writes (JSON lines to `AppOptions.log`). */
  readonly logger: Logger;
  /** Whether a request that commits an intent publishes it itself (false: another path of this process does). */
  readonly publishInline: boolean;
  /** The change feed's streams in this app (`routes/feed.ts`): their settings, slots and shared tail. */
  readonly changeStreams: ChangeStreams;
  /** The request rate each read token has left, in this process (`rate-limit.ts`). */
  readonly readRates: ReadTokenRates;
  /** The OpenAPI document this app serves (`GET /openapi.json`), generated on its first request. */
  readonly document: () => unknown;
}

export type { FeedOptions };
