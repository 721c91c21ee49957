import type { Deps, SweepPolicy } from "@mam/core";
import type { RequestIdVariables } from "hono/request-id";
import type { Upload } from "./body.ts";
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
  };
}

/** What the routes are built over: one app's ports, tokens, limits and log. */
export interface Services {
  readonly deps: Deps;
  readonly tokens: TokenService;
  readonly jsonLimit: number;
  readonly reportLimit: number;
  /** Reports larger than a body: the largest an upload may declare, and how long its address is good. */
  readonly reportUpload: { readonly maxBytes: number; readonly expiresInSeconds: number };
  readonly log: (line: string) => void;
  readonly sweep?: SweepPolicy;
  /** The sweep's grace period (MAM_SWEEP_GRACE_SECONDS). */
  readonly sweepGraceSeconds: number;
  /** Whether a request that commits an intent publishes it itself (false: another path of this process does). */
  readonly publishInline: boolean;
}
