import type { Deps, Logger, SweepPolicy } from "@mam/core";
import type { RequestIdVariables } from "hono/request-id";
import type { Upload } from "./body.ts";
import type { StreamSlots } from "./routes/stream-slots.ts";
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
  /** Every line the app writes (JSON lines to `AppOptions.log`). */
  readonly logger: Logger;
  readonly sweep?: SweepPolicy;
  /** The sweep's grace period (MAM_SWEEP_GRACE_SECONDS). */
  readonly sweepGraceSeconds: number;
  /** Each sweep's time budget (MAM_SWEEP_BUDGET_SECONDS); none when absent. */
  readonly sweepBudgetSeconds?: number;
  /** Whether a request that commits an intent publishes it itself (false: another path of this process does). */
  readonly publishInline: boolean;
  /** How the change feed's stream runs here (`routes/feed.ts`); defaults when absent. */
  readonly feed?: FeedOptions;
}

/** The change feed's stream in this process. */
export interface FeedOptions {
  /** False where a response cannot stream (AWS Lambda behind HTTP API): the stream answers the rows there now, with `retry:`. */
  readonly streaming?: boolean;
  /** A signal after every commit this process makes (`mam serve`'s change relay): open streams read at once. */
  readonly onCommitted?: (listener: () => void) => () => void;
  /** How often an open stream reads rows no signal announced (another process's commits); 1 s by default. */
  readonly pollMs?: number;
  /** Open streams at once; past it a stream answers what is there and ends. 64 by default. */
  readonly maxStreams?: number;
  /** Open streams per agent token's (job, attempt); past it a 429 `stream.tooMany`. 4 by default. */
  readonly perAgent?: number;
  /** Open streams per operator token (its id, or its name for MAM_OPERATOR_TOKEN); past it a 429. 16 by default. */
  readonly perOperator?: number;
  /** Of `maxStreams`, this many only operator tokens may take; 16 by default. */
  readonly operatorReserve?: number;
  /** A stream whose write does not complete within this many ms is closed and its slot freed; 10 s by default. */
  readonly writeTimeoutMs?: number;
  /** The slots' count, where the composition root wants to read it (`mam serve`'s `openStreams()`); one per app by default. */
  readonly slots?: StreamSlots;
  /** The longest a stream stays open before it ends (the client reconnects); 15 minutes by default. */
  readonly maxStreamMs?: number;
  /** What a client waits before reconnecting (`retry:`), ms; 2 s by default. */
  readonly retryMs?: number;
  /** Aborted when the service stops: every open stream ends at once. */
  readonly shutdown?: AbortSignal;
}
