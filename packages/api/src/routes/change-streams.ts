import { type Config, type Deps, defaultConfig, withDefaults } from "@mam/core";
import { FeedTail } from "./feed-tail.ts";
import { StreamSlots } from "./stream-slots.ts";

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

/** What the configuration does not set: how long a stream stays open, and what its client waits before reconnecting. */
const STREAM_LIFETIME = {
  /** A stream ends after this long, whatever happens; the client reconnects with Last-Event-ID. */
  maxStreamMs: 15 * 60 * 1000,
  /** What a client waits before reconnecting (`retry:`). */
  retryMs: 2000,
};

/** The feed's settings in this process: what the root gave; for the rest the configuration schema's defaults (MAM_FEED_*). */
export type FeedSettings = Omit<FeedOptions, "slots"> & Config["feedStreams"] & typeof STREAM_LIFETIME;

function feedSettingsOf({ slots: _, ...given }: FeedOptions): FeedSettings {
  return withDefaults<FeedSettings>({ ...defaultConfig().feedStreams, ...STREAM_LIFETIME }, given);
}

/**
 * One app's change-feed streams: their settings, their slots, and the one tail they
 * share (`feed-tail.ts`). Made with the app, so the tail hears the commit signal
 * before any stream does (registered first); the tail itself is made with the first
 * stream (serving the document reads no store).
 */
export class ChangeStreams {
  readonly settings: FeedSettings;
  readonly slots: StreamSlots;
  readonly #deps: Pick<Deps, "jobs">;
  #tail: FeedTail | undefined;

  // The store is asked for with the first stream: building the app, and serving the document, touches none.
  constructor(deps: Pick<Deps, "jobs">, feed: FeedOptions = {}) {
    this.#deps = deps;
    this.slots = feed.slots ?? new StreamSlots();
    this.settings = feedSettingsOf(feed);
    this.settings.onCommitted?.(() => this.#tail?.signal());
  }

  tail(): FeedTail {
    this.#tail ??= new FeedTail(this.#deps.jobs, this.settings.pollMs / 2);
    return this.#tail;
  }
}
