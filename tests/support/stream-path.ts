/**
 * The AWS stream path as the engine tier wires it: a job table on DynamoDB Local (its
 * stream) -> our stream poller, imitating Lambda's event source mapping exactly as
 * serverless.yml configures the stream publisher's -> the real stream publisher handler
 * (functions/compose.ts) -> IoT Core's HTTPS publish (the stand-in). Shared by
 * tests/engine/stream.test.ts and tests/engine/publish-count.test.ts.
 */
import type { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import type { DynamoDBStreamsClient } from "@aws-sdk/client-dynamodb-streams";
import { createStreamPublisherHandler, type Overrides } from "../../functions/compose.ts";
import { streamMappingOf } from "../../scripts/offline/serverless-yml.ts";
import {
  type Invocation,
  type OnFailureMessage,
  type StreamHandler,
  type StreamPoller,
  startStreamPoller,
} from "../../scripts/peers/stream-poller.ts";

/** The event source mapping exactly as serverless.yml configures the stream publisher's. */
export const STREAM_MAPPING = streamMappingOf("streamPublisher");

export interface StreamPathOptions {
  readonly dynamodb: DynamoDBClient;
  readonly streams: DynamoDBStreamsClient;
  readonly tableName: string;
  /** The environment the stream publisher's composition reads (its table, IoT endpoint, DynamoDB endpoint). */
  readonly env: Record<string, string>;
  /** What the composition takes besides the environment (credentials, a clock, a log sink). */
  readonly overrides?: Overrides;
  /** The region the Lambda records name. */
  readonly region?: string;
  /** Stands between the poller and the real handler (a test's stand-in for a function that crashes). */
  readonly around?: (handler: StreamHandler) => StreamHandler;
}

export interface StreamPath {
  readonly invocations: Invocation[];
  readonly failures: OnFailureMessage[];
  /** Resolves with the first message the poller sends to the on-failure destination. */
  readonly firstFailure: Promise<OnFailureMessage>;
  /** Resolves with the first call of the handler (past or future) that matches. */
  invocation(match: (i: Invocation) => boolean): Promise<Invocation>;
  /** Starts the poller (TRIM_HORIZON: it reads what was committed before it started too). */
  start(onInvocation?: (i: Invocation) => void | Promise<void>): Promise<StreamPoller>;
  /** Stops the poller, if started (a call in flight finishes first). */
  close(): Promise<void>;
}

/** The poller and the real stream publisher over one table; nothing polls until `start`. */
export function streamPath(opts: StreamPathOptions): StreamPath {
  const log: string[] = [];
  const real = createStreamPublisherHandler(opts.env, { log: (line) => log.push(line), ...opts.overrides });
  const handler = (opts.around ?? ((h) => h))((event) => real(event));
  const invocations: Invocation[] = [];
  const waiters = new Set<() => void>();
  const failures: OnFailureMessage[] = [];
  let poller: StreamPoller | undefined;
  let failed: (m: OnFailureMessage) => void = () => undefined;
  const firstFailure = new Promise<OnFailureMessage>((resolve) => {
    failed = resolve;
  });
  return {
    invocations,
    failures,
    firstFailure,
    invocation(match) {
      return new Promise((resolve) => {
        const check = (): void => {
          const hit = invocations.find(match);
          if (hit === undefined) return;
          waiters.delete(check);
          resolve(hit);
        };
        waiters.add(check);
        check();
      });
    },
    async start(onInvocation) {
      poller = await startStreamPoller({
        streams: opts.streams,
        dynamodb: opts.dynamodb,
        tableName: opts.tableName,
        handler: (event) => handler(event),
        mapping: STREAM_MAPPING,
        ...(opts.region === undefined ? {} : { region: opts.region }),
        onInvocation: async (i) => {
          invocations.push(i);
          for (const w of [...waiters]) w();
          await onInvocation?.(i);
        },
        onFailure: (m) => {
          failures.push(m);
          failed(m);
        },
      });
      return poller;
    },
    async close() {
      await poller?.close();
    },
  };
}
