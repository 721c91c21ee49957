import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { createTokenService, verifySubscriberLogin } from "@mam/api";
import { type Publisher, systemClock } from "@mam/core";
import { connect } from "mqtt";

export interface ReceivedMessage {
  readonly topic: string;
  readonly payload: string;
}

/** What a subscriber on a broker receives, in arrival order. */
export interface Subscription {
  /** Every message received so far, in arrival order. */
  readonly received: readonly ReceivedMessage[];
  /** The next message not yet taken by `next`; rejects if none arrives within `timeoutMs` (default 5000). */
  next(timeoutMs?: number): Promise<ReceivedMessage>;
  /** The first received message (past or future) that matches; rejects after `timeoutMs` (default 5000). */
  waitFor(match: (m: ReceivedMessage) => boolean, timeoutMs?: number): Promise<ReceivedMessage>;
  /** Whether the broker said, at the last CONNACK, that it still held this client's session. */
  readonly sessionPresent: () => boolean;
  /** How many times the client connected (1 after the first CONNACK; reconnections add one each). */
  readonly connections: () => number;
  close(): Promise<void>;
}

export interface SubscribeOptions {
  /** A fixed client id (a persistent session is the client id's). */
  readonly clientId?: string;
  /** `false`: a persistent session, whose subscriptions and QoS 1 queue the broker keeps while the client is away. Default true. */
  readonly clean?: boolean;
  /** Reconnect on its own this often after the connection drops (default: never). */
  readonly reconnectPeriodMs?: number;
  /**
   * Subscribe after connecting (default true). `false` for a client returning to a
   * persistent session: what the broker queued for it arrives on the session's own
   * subscription, with nothing asked again.
   */
  readonly subscribe?: boolean;
  /**
   * Log in: the embedded broker keeps a persistent session only for a subscriber who
   * logs in, with an operator token (read scope, a name) as the MQTT password; the
   * session belongs to the token's name.
   */
  readonly token?: string;
}

/**
 * The one test subscriber, a plain MQTT client as a dashboard would be: it connects
 * without credentials (or logs in with `token`), subscribes (filters allowed) at QoS 1, resolves once the
 * broker granted it, and throws if the broker refused it.
 */
export async function subscribe(url: string, topicFilter: string, opts: SubscribeOptions = {}): Promise<Subscription> {
  const received: ReceivedMessage[] = [];
  let taken = 0;
  const listeners = new Set<() => void>();
  let sessionPresent = false;
  let connections = 0;
  // MQTT 3.1.1: the embedded (aedes) broker speaks nothing newer.
  const client = connect(url, {
    protocolVersion: 4,
    reconnectPeriod: opts.reconnectPeriodMs ?? 0,
    connectTimeout: 5000,
    clean: opts.clean ?? true,
    // A returning persistent session keeps its subscription on the broker: asking again is not what is tested.
    resubscribe: false,
    ...(opts.clientId === undefined ? {} : { clientId: opts.clientId }),
    ...(opts.token === undefined ? {} : { username: "subscriber", password: opts.token }),
  });
  client.on("error", () => undefined);
  // Listening before the first CONNACK: a returning session's queue may arrive right behind it.
  client.on("connect", (connack) => {
    sessionPresent = connack.sessionPresent;
    connections++;
  });
  client.on("message", (topic, payload) => {
    received.push({ topic, payload: payload.toString("utf8") });
    for (const l of [...listeners]) l();
  });
  await new Promise<void>((resolve, reject) => {
    const fail = (e: Error) => {
      settle();
      client.end(true);
      reject(e);
    };
    const closed = () => fail(new Error(`could not connect to ${url}`));
    const connected = () => {
      settle();
      resolve();
    };
    const settle = () => {
      client.off("connect", connected);
      client.off("error", fail);
      client.off("close", closed);
    };
    client.once("connect", connected);
    client.once("error", fail);
    if ((opts.reconnectPeriodMs ?? 0) === 0) client.once("close", closed);
  });
  // mqtt.js rejects a SUBACK of 0x80 itself ("Subscribe error: Unspecified error").
  const refused =
    opts.subscribe === false
      ? undefined
      : await client.subscribeAsync(topicFilter, { qos: 1 }).then(
          (grants) => (grants.some((g) => g.qos === 128) ? "granted 0x80" : undefined),
          (e: unknown) => (e instanceof Error ? e.message : String(e)),
        );
  if (refused !== undefined) {
    await client.endAsync(true);
    throw new Error(`the broker refused the subscription to ${topicFilter}: ${refused}`);
  }

  /** Resolves with `pick()`'s first defined answer, checked now and on every arrival. */
  function until<T>(pick: () => T | undefined, timeoutMs: number, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const check = (): void => {
        const hit = pick();
        if (hit === undefined) return;
        clearTimeout(timer);
        listeners.delete(check);
        resolve(hit);
      };
      const timer = setTimeout(() => {
        listeners.delete(check);
        reject(new Error(`no ${what} on ${topicFilter} within ${timeoutMs} ms (received ${received.length})`));
      }, timeoutMs);
      listeners.add(check);
      check();
    });
  }

  return {
    received,
    next(timeoutMs = 5000) {
      return until(() => (taken < received.length ? received[taken++] : undefined), timeoutMs, "message");
    },
    waitFor(match, timeoutMs = 5000) {
      return until(() => received.find(match), timeoutMs, "matching message");
    },
    sessionPresent: () => sessionPresent,
    connections: () => connections,
    close: () => client.endAsync(true),
  };
}

/**
 * The absence check: publish a marker on `topic` through `publisher` and wait until the subscriber has
 * it. Messages on one topic from one publisher arrive in order, so once the marker is
 * in, anything published before it is in too: "nothing more arrived" is then a fact,
 * not a guess about a timeout. (A publish that completed before the marker was sent,
 * from any client, was in the broker first and reaches the subscriber first.)
 * Resolves with the marker's index in `sub.received`.
 */
export async function barrier(sub: Subscription, publisher: Publisher, topic: string): Promise<number> {
  const marker = `barrier-${Math.random().toString(36).slice(2)}`;
  await publisher.publish(topic, marker);
  await sub.waitFor((m) => m.payload === marker);
  return sub.received.findIndex((m) => m.payload === marker);
}

/**
 * Logging in as a subscriber, for tests: a token service of the tests' own, the
 * broker option that verifies its tokens as `mam serve` does, and read tokens with
 * a name (each test picks names of its own, so sessions never meet across tests).
 */
const testTokens = createTokenService({ signingKey: randomBytes(32).toString("hex"), clock: systemClock });
export const subscriberLogins = {
  verifySubscriber: (token: string) => verifySubscriberLogin(testTokens, token),
} as const;
export function subscriberToken(name = `subscriber-${randomBytes(4).toString("hex")}`): string {
  return testTokens.mintOperator(["read"], { name });
}

/** A read token with `name` signed with a data dir's key, as `mam token create --scope read --name NAME` prints it. */
export async function dataDirSubscriberToken(dataDir: string, name = `subscriber-${randomBytes(4).toString("hex")}`): Promise<string> {
  const { signing_key } = JSON.parse(await readFile(join(dataDir, "credentials.json"), "utf8")) as { signing_key: string };
  return createTokenService({ signingKey: signing_key, clock: systemClock }).mintOperator(["read"], { name });
}
