import { createHash, timingSafeEqual } from "node:crypto";
import type { EventEmitter } from "node:events";
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import { Duplex } from "node:stream";
import { MamError, type Publisher } from "@mam/core";
import { Aedes, type AuthenticateError, type Client } from "aedes";
import { Level } from "level";
import { listenOn } from "./listen.ts";
import { publishPacketBytes } from "./mqtt-publisher.ts";
import { SessionOwners } from "./session-owners.ts";

const require = createRequire(import.meta.url);
/** aedes-persistence-level ships no types: it takes an open `level` database and returns an aedes persistence. */
const levelPersistence = require("aedes-persistence-level") as (db: Level<string, Buffer>) => QueueingPersistence;
/** The encoding aedes-persistence-level stores packets in (its own dependency). */
const msgpack = createRequire(require.resolve("aedes-persistence-level"))("msgpack-lite") as { decode(blob: Buffer): unknown };

/** What of an aedes persistence `sessionQueues` wraps (aedes-persistence 11's interface, promise style). */
interface QueueingPersistence {
  outgoingEnqueue(sub: QueuedFor, packet: unknown): Promise<unknown>;
  outgoingEnqueueCombi(subs: QueuedFor[], packet: unknown): Promise<unknown>;
  outgoingClearMessageId(client: { readonly id: string }, packet: unknown): Promise<unknown>;
}
interface QueuedFor {
  readonly clientId: string;
}

/** What a queued message weighs against its session's byte bound: its topic and payload (what the client is sent, less a few header bytes). */
function queuedBytes(packet: unknown): number {
  const p = packet as { topic?: unknown; payload?: unknown } | undefined;
  const topic = typeof p?.topic === "string" ? Buffer.byteLength(p.topic) : 0;
  const payload = p?.payload;
  const body = payload instanceof Uint8Array ? payload.byteLength : typeof payload === "string" ? Buffer.byteLength(payload) : 0;
  return topic + body;
}

/** Where aedes-persistence-level keeps a session's queued messages: `outgoing:<encoded client id>:<broker id>:<counter>`. */
const OUTGOING_PREFIX = "outgoing:";

/**
 * The persistence as the broker uses it, with two rules of ours around its queue:
 *
 * - **A bound per session.** aedes queues every QoS 1 message for every persistent
 *   session with no limit, so a `clean: false` subscriber that never returns would
 *   grow the disk for ever. A session holds at most `maxQueued` messages, and at
 *   most `maxQueuedBytes` bytes of topics and payloads, not yet acknowledged by its
 *   client; beyond either, new messages are not queued for it (as Mosquitto's
 *   `max_queued_messages` and `max_queued_bytes` do) and `onQueueFull` is told, once
 *   per time the session fills. The counts and bytes are read from disk at start and
 *   follow each queue write and each acknowledgement.
 * - **In order.** aedes delivers a QoS 1 message to a connected client only if its
 *   broker counter is higher than the last one that client was sent (its duplicate
 *   check, in lib/client.js), and hands a message to the connected clients once the
 *   persistence has queued it. The memory persistence finishes those writes in the
 *   order they were asked; LevelDB's take as long as each takes, so under concurrent
 *   publishes a message could finish queuing after a later one: aedes then took it
 *   for a duplicate and did not send it to a connected `clean: false` subscriber,
 *   which got it only at its next reconnection (the restart soak saw 4 of 2,000 held
 *   back that way; 10 to 60 of 2,000 with four publishers and no service). Here each
 *   queuing write still starts at once, but completes only after every earlier one.
 */
async function sessionQueues<P extends QueueingPersistence>(
  persistence: P,
  db: Level<string, Buffer>,
  maxQueued: number,
  maxQueuedBytes: number,
  onQueueFull: ((clientId: string) => void) | undefined,
): Promise<P> {
  const queued = new Map<string, number>();
  const bytes = new Map<string, number>();
  for await (const [key, value] of db.iterator({ gte: OUTGOING_PREFIX, lt: "outgoing;", valueEncoding: "buffer" })) {
    const clientId = decodeURIComponent(key.slice(OUTGOING_PREFIX.length).split(":", 1)[0] ?? "");
    queued.set(clientId, (queued.get(clientId) ?? 0) + 1);
    bytes.set(clientId, (bytes.get(clientId) ?? 0) + queuedBytes(msgpack.decode(value as Buffer)));
  }
  const full = new Set<string>();
  /**
   * Counts the message once for each session with room for it; the others are left
   * out. A client whose filters overlap (`mam/events` and `mam/#`) is matched once per
   * filter, but its queue holds the message once (one key per client and message)
   * and its PUBACK clears it once: it is counted once.
   */
  const admit = (subs: QueuedFor[], packet: unknown): QueuedFor[] => {
    const seen = new Set<string>();
    const size = queuedBytes(packet);
    return subs.filter((sub) => {
      if (seen.has(sub.clientId)) return false;
      seen.add(sub.clientId);
      const n = queued.get(sub.clientId) ?? 0;
      const b = bytes.get(sub.clientId) ?? 0;
      if (n >= maxQueued || b + size > maxQueuedBytes) {
        if (!full.has(sub.clientId)) {
          full.add(sub.clientId);
          onQueueFull?.(sub.clientId);
        }
        return false;
      }
      queued.set(sub.clientId, n + 1);
      bytes.set(sub.clientId, b + size);
      return true;
    });
  };

  const enqueueOne = persistence.outgoingEnqueue.bind(persistence);
  const enqueue = persistence.outgoingEnqueueCombi.bind(persistence);
  const clear = persistence.outgoingClearMessageId.bind(persistence);
  let previous: Promise<unknown> = Promise.resolve();
  persistence.outgoingEnqueueCombi = (subs, packet) => {
    const write = enqueue(admit(subs ?? [], packet), packet);
    const after = previous.then(
      () => write,
      () => write,
    );
    previous = after.catch(() => undefined);
    return after;
  };
  persistence.outgoingEnqueue = (sub, packet) => (admit([sub], packet).length === 0 ? Promise.resolve() : enqueueOne(sub, packet));
  persistence.outgoingClearMessageId = async (client, packet) => {
    const cleared = await clear(client, packet);
    if (cleared !== undefined) {
      const n = (queued.get(client.id) ?? 1) - 1;
      const b = (bytes.get(client.id) ?? 0) - queuedBytes(cleared);
      if (n > 0) {
        queued.set(client.id, n);
        bytes.set(client.id, Math.max(b, 0));
      } else {
        queued.delete(client.id);
        bytes.delete(client.id);
      }
      full.delete(client.id);
    }
    return cleared;
  };
  return persistence;
}

/** The broker's sessions folder, like everything under the data dir, is for this user alone. */
const SESSIONS_DIR_MODE = 0o700;

export interface EmbeddedBrokerOptions {
  /** 0 picks a free port. */
  readonly port: number;
  /** The variable that sets `port` (`MAM_MQTT_PORT`), named when the port is taken. */
  readonly portSetting?: string;
  /** Loopback unless told otherwise. */
  readonly host?: string;
  /**
   * The service's own credentials: the only client allowed to publish under `mam/`.
   * Without them nobody may publish under `mam/` over the wire (fail closed).
   */
  readonly publisherCredentials?: { readonly username: string; readonly password: string };
  /**
   * The service publisher's client id, reserved for a connection presenting
   * `publisherCredentials`: anyone else using it is refused at CONNECT, so the
   * service's connection is never taken over (MQTT lets a new connection with a
   * client id close the one that held it).
   */
  readonly serviceClientId?: string;
  /**
   * Largest MQTT packet accepted from a client, fixed header included (default
   * 64 KiB). A larger one closes its connection as soon as its header announces
   * the size, before its body is read: nothing of it is buffered.
   */
  readonly maxPacketBytes?: number;
  /** Refuse a publish to these topics whoever sends it (tests that need a refusing broker). */
  readonly refusePublish?: (topic: string) => boolean;
  /**
   * A directory (created 0700 if absent) where the broker keeps its sessions on disk
   * (aedes-persistence-level, a LevelDB database): the subscriptions of clients that
   * connected with `clean: false` and the QoS 1 messages queued for them while they
   * were away, so both outlive a restart of the process. Without it, sessions live in
   * memory and die with the process. Only one process may hold the directory at a
   * time (LevelDB's lock; the OS releases it when the holder dies, even by SIGKILL).
   */
  readonly sessionsDir?: string;
  /**
   * With `sessionsDir`: the most messages a persistent session holds that its client
   * has not acknowledged (default 10,000); beyond it, new messages are not queued
   * for that session until it drains. A subscriber that was away that long catches
   * up from the change feed.
   */
  readonly maxQueuedPerSession?: number;
  /**
   * With `sessionsDir`: the most bytes of topics and payloads a persistent session
   * holds unacknowledged (default 4 MiB); beyond it, as beyond `maxQueuedPerSession`.
   */
  readonly maxQueuedBytesPerSession?: number;
  /** Told when a persistent session reaches `maxQueuedPerSession` or `maxQueuedBytesPerSession` (once until it drains). */
  readonly onSessionQueueFull?: (clientId: string) => void;
  /**
   * Who a subscriber logging in is: its MQTT password is an operator token, and this
   * verifies it as the API does, answering the token's name, or why it may not log
   * in (an agent token, no read scope, no name, a token that does not verify).
   * Without it nobody but the service may log in, so nobody may keep a persistent
   * session (`clean: false`).
   */
  readonly verifySubscriber?: (token: string) => { readonly name: string } | { readonly refused: string };
  /**
   * Whether a client may connect without a login (for `clean: true` subscriptions
   * only). Default: when `host` is a loopback address, on; beyond loopback, off.
   */
  readonly anonymousSubscribers?: boolean;
  /** The most persistent sessions one token name may own (default 16). */
  readonly maxSessionsPerName?: number;
  /** The most persistent sessions the broker keeps in all (default 1,000). */
  readonly maxSessions?: number;
  /**
   * Where the owner of each persistent session is kept (a JSON file, 0600); default
   * `<sessionsDir>-owners.json`, beside the sessions. Without `sessionsDir`, in memory.
   */
  readonly sessionOwnersFile?: string;
  /** QoS 2 publishes one client may have awaiting their PUBREL (aedes's `maxInflightInbound`; default 32). */
  readonly maxInflightInbound?: number;
  /** Told of each CONNECT refused, with its reason (MQTT 3.1.1's CONNACK carries only a code). */
  readonly onConnectRefused?: (clientId: string, code: number, reason: string) => void;
  /**
   * How long a subscriber's socket may stay full before aedes drops the connection
   * (its `drainTimeout`; default 2000 ms, aedes's own is 60 s). A delivery waits for
   * a full socket to drain, and aedes runs at most 100 deliveries at once for the
   * whole broker, so one client that subscribes and never reads holds every other
   * delivery — the service's publishes included — until it is dropped. Keep it under
   * the service's publish timeout, so such a client delays a notification but never
   * fails it. A `clean: false` subscriber that is dropped gets what it missed when it
   * reconnects; a clean one catches up from the feed.
   */
  readonly drainTimeoutMs?: number;
  /**
   * The most bytes written to a client that it has not read yet (its socket's
   * buffer) before the broker drops it (default 256 KiB; at least `maxPacketBytes`;
   * a logged-in subscriber's bound has room for its whole queue besides). Writes
   * never wait for a client to read: this bound, not a wait, is what a client that
   * stops reading meets, so no delivery of the service's waits on it.
   */
  readonly maxOutgoingBytes?: number;
  /**
   * Told of an error aedes raises on the broker itself (a persistence failure, a will
   * from an earlier run it cannot publish), which would otherwise end the process.
   */
  readonly onError?: (error: Error) => void;
}

/** How long a subscriber's socket may stay full before the broker drops it (`drainTimeoutMs`). */
export const DEFAULT_DRAIN_TIMEOUT_MS = 2000;

/**
 * Why a publish is refused here, or undefined: the one set of rules for a client's
 * publish (authorizePublish), a will (checked with its CONNECT, since the broker
 * publishes it later, unasked) and the service's own publish in process.
 */
function publishRefusal(
  publish: { readonly topic: string; readonly retain?: boolean },
  byService: boolean,
  refusePublish: ((topic: string) => boolean) | undefined,
): string | undefined {
  const topic = publish.topic;
  if (topic.startsWith(SYS_PREFIX)) return "$SYS topics are reserved";
  if (publish.retain) return "retained messages are refused";
  if (refusePublish?.(topic)) return `publishing to ${topic} is refused`;
  if (!byService && (topic === "mam" || topic.startsWith(SERVICE_PREFIX))) return `only the service may publish under ${SERVICE_PREFIX}`;
  return undefined;
}

/** The default bound on a persistent session's queue: about 1.5 MiB on disk of mam's ~230-byte notifications (measured). */
export const DEFAULT_MAX_QUEUED_PER_SESSION = 10_000;
/** The default byte bound on a persistent session's queue: 10,000 of mam's notifications fit; 10,000 64 KiB junk messages do not. */
export const DEFAULT_MAX_QUEUED_BYTES_PER_SESSION = 4 * 1024 * 1024;
export const DEFAULT_MAX_SESSIONS_PER_NAME = 16;
export const DEFAULT_MAX_SESSIONS = 1000;
export const DEFAULT_MAX_INFLIGHT_INBOUND = 32;
/** A reading subscriber holds a few of mam's notifications unread at most; 256 KiB is a thousand of them. */
export const DEFAULT_MAX_OUTGOING_BYTES = 256 * 1024;

/** Whether `host` is a loopback address (where only this machine's users can reach the broker). */
export function isLoopbackHost(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

export interface EmbeddedBroker {
  /** `mqtt://host:port`. */
  readonly url: string;
  readonly port: number;
  /**
   * The service's own publisher, in the broker's process (aedes's `publish(packet,
   * callback)`; no socket, no login): `publish` resolves only once aedes has queued
   * the message for every persistent session (on disk, with `sessionsDir`) and
   * written it to every connected subscriber, which is where aedes's wire
   * acknowledgement of a QoS 1 publish is not (it answers before it queues:
   * tests/contract/broker-ownership.test.ts). Messages go out at QoS 1. The same
   * rules as for a wire publish hold: no retained message, nothing to `$SYS`, the
   * packet bound (`publish.tooLarge`) and `refusePublish` (`publish.refused`); a
   * closed broker or one that has not finished within `timeoutMs` (default 5000) is
   * `publish.unreachable`, and the intent stays owed.
   */
  publisher(options?: { readonly timeoutMs?: number }): Publisher;
  /** Closes the listener, every client connection, the broker and its sessions database. */
  close(): Promise<void>;
}

/**
 * mam's notifications are a few hundred bytes of identifiers and status; 64 KiB
 * leaves room for any client of the broker that chats beside them, while bounding
 * what one anonymous packet can make the service hold.
 */
export const DEFAULT_MAX_PACKET_BYTES = 64 * 1024;

/** The namespace only the service may publish in, so a completion cannot be spoofed. */
const SERVICE_PREFIX = "mam/";
const SYS_PREFIX = "$SYS";

/** MQTT 3.1.1 CONNACK return codes (AuthErrorCode is a const enum aedes does not export at runtime). */
export const CONNACK = { IDENTIFIER_REJECTED: 2, SERVER_UNAVAILABLE: 3, BAD_USERNAME_OR_PASSWORD: 4, NOT_AUTHORIZED: 5 } as const;
const { IDENTIFIER_REJECTED, SERVER_UNAVAILABLE, BAD_USERNAME_OR_PASSWORD, NOT_AUTHORIZED } = CONNACK;

/**
 * An MQTT 3.1.1 broker (aedes) in the service's process. Anyone may connect without
 * credentials and subscribe, except to `$SYS` (which names every connected client);
 * a client that presents credentials must present the publisher's, or its
 * connection is refused; only that client may publish under `mam/` (its will
 * messages included: aedes authorizes a will like a publish) or connect with the
 * service's client id. Nobody may retain a message, the service included: mam's
 * notifications are events, not state, and a retained message would live in the
 * service's memory and be replayed to every new subscriber. Every packet is
 * bounded in size before it is buffered.
 *
 * Over MQTT 3.1.1 a broker refuses a publish by closing the connection; a refused
 * subscription is granted 0x80.
 *
 * With `sessionsDir`, the returned promise resolves only once the sessions kept
 * there are loaded (aedes awaits its persistence's `setup` before it accepts a
 * client, and the listener opens after that): a caller that publishes after it
 * resolves reaches every persistent session, the ones of clients still away included.
 */
export async function startEmbeddedBroker(options: EmbeddedBrokerOptions): Promise<EmbeddedBroker> {
  const host = options.host ?? "127.0.0.1";
  const credentials = options.publisherCredentials;
  const maxPacketBytes = options.maxPacketBytes ?? DEFAULT_MAX_PACKET_BYTES;
  const maxOutgoingBytes = Math.max(options.maxOutgoingBytes ?? DEFAULT_MAX_OUTGOING_BYTES, maxPacketBytes);
  const maxQueuedBytes = options.maxQueuedBytesPerSession ?? DEFAULT_MAX_QUEUED_BYTES_PER_SESSION;
  const publishers = new WeakSet<Client>();
  const wills = new WeakMap<Client, { readonly topic: string; readonly retain?: boolean }>();

  const anonymousAllowed = options.anonymousSubscribers ?? isLoopbackHost(host);
  const maxSessionsPerName = options.maxSessionsPerName ?? DEFAULT_MAX_SESSIONS_PER_NAME;
  const maxSessions = options.maxSessions ?? DEFAULT_MAX_SESSIONS;
  const owners = SessionOwners.load(
    options.sessionsDir === undefined ? undefined : (options.sessionOwnersFile ?? `${options.sessionsDir}-owners.json`),
  );
  const refuseConnect = (
    client: Client,
    done: (error: AuthenticateError | null, success: boolean | null) => void,
    code: number,
    message: string,
  ) => {
    options.onConnectRefused?.(client.id, code, message);
    done(Object.assign(new Error(message), { returnCode: code }) as AuthenticateError, false);
  };

  let sessions: Level<string, Buffer> | undefined;
  if (options.sessionsDir !== undefined) {
    mkdirSync(options.sessionsDir, { recursive: true, mode: SESSIONS_DIR_MODE });
    const at = options.sessionsDir;
    sessions = new Level<string, Buffer>(at);
    // LevelDB's own reason (a full disk, another process holding the LOCK) is in the
    // error's cause; its message alone says only "Database failed to open".
    await sessions.open().catch((e: unknown) => {
      const cause = e instanceof Error && e.cause instanceof Error ? e.cause.message : e instanceof Error ? e.message : String(e);
      throw new MamError("store.unavailable", `the broker's session store ${at} could not be opened: ${cause}`);
    });
  }
  let sessionsClosed = false;
  const closeSessions = async () => {
    sessionsClosed = true;
    await sessions?.close();
  };
  /**
   * aedes deletes a connecting client's will with `delWill(client).finally(…)` and no
   * catch (aedes/lib/handlers/connect.js, `storeWill`), so a connection still in its
   * CONNECT when the broker closes asks a session store already closed, and its
   * rejection is unhandled (seen once in CI, in tests/contract/broker-storm's
   * teardown). Once the store is closed such a delete has nothing to do: it resolves.
   */
  const tolerateClosedStore = <Q extends object>(persistence: Q): Q => {
    const target = persistence as unknown as { delWill(client: unknown, cb?: unknown): Promise<unknown> | undefined };
    const delWill = target.delWill.bind(target);
    target.delWill = (client: unknown, cb?: unknown) => {
      if (cb !== undefined) return delWill(client, cb);
      return (delWill(client) as Promise<unknown>).catch((e: unknown) => {
        if (sessionsClosed) return undefined;
        throw e;
      });
    };
    return persistence;
  };

  let broker: Aedes;
  try {
    broker = await Aedes.createBroker({
      ...(sessions === undefined
        ? {}
        : {
            persistence: tolerateClosedStore(
              await sessionQueues(
                levelPersistence(sessions),
                sessions,
                options.maxQueuedPerSession ?? DEFAULT_MAX_QUEUED_PER_SESSION,
                maxQueuedBytes,
                options.onSessionQueueFull,
              ),
            ),
          }),
      drainTimeout: options.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS,
      maxInflightInbound: options.maxInflightInbound ?? DEFAULT_MAX_INFLIGHT_INBOUND,
      // A will is published by the broker when its client goes away, from disk after a
      // crash too (aedes's will sweep, which authorizes it then and, refused, raised an
      // error that ended the process at every restart): one that could never be
      // published is refused with the CONNECT that carries it: anyone's but the
      // service's, which sets none. It is noted here, where the CONNECT is seen, and
      // refused by authenticate, which knows who connects, with "not authorized", so
      // the client is told (CONNACK 5) rather than cut off.
      preConnect(client, packet, done) {
        if (packet.will) wills.set(client, packet.will);
        done(null, true);
      },
      authenticate(client, username, password, done) {
        const anonymous = (username === undefined || username === "") && password === undefined;
        const isPublisher =
          !anonymous &&
          credentials !== undefined &&
          username === credentials.username &&
          password !== undefined &&
          sameSecret(password, credentials.password);
        const will = wills.get(client);
        if (will !== undefined) {
          const refusal = isPublisher ? publishRefusal(will, true, options.refusePublish) : "only the service may publish";
          if (refusal !== undefined) return refuseConnect(client, done, NOT_AUTHORIZED, `the will is refused: ${refusal}`);
        }
        if (!isPublisher && credentials !== undefined && username === credentials.username) {
          return refuseConnect(client, done, BAD_USERNAME_OR_PASSWORD, "bad user name or password");
        }
        // aedes closes a connected client when another connects with its id (after this
        // hook accepts it), so every check on the id must be here, before that can happen.
        if (options.serviceClientId !== undefined && client.id === options.serviceClientId && !isPublisher) {
          return refuseConnect(client, done, IDENTIFIER_REJECTED, "this client id is reserved for the service");
        }
        if (isPublisher) {
          publishers.add(client);
          return done(null, true);
        }
        let name: string | undefined;
        if (!anonymous) {
          const verified =
            options.verifySubscriber === undefined || password === undefined
              ? { refused: password === undefined ? "a login needs a token as the password" : "this broker takes no subscriber logins" }
              : options.verifySubscriber(password.toString("utf8"));
          if ("refused" in verified) return refuseConnect(client, done, BAD_USERNAME_OR_PASSWORD, verified.refused);
          name = verified.name;
        }
        const owner = owners.owner(client.id);
        if (owner !== undefined && owner !== name) {
          return refuseConnect(client, done, IDENTIFIER_REJECTED, "this client id's persistent session belongs to another subscriber");
        }
        if (name === undefined) {
          if (!client.clean) {
            return refuseConnect(
              client,
              done,
              NOT_AUTHORIZED,
              "a persistent session (clean: false) needs a login: an operator token with the read scope and a name as the password",
            );
          }
          if (!anonymousAllowed) {
            return refuseConnect(client, done, NOT_AUTHORIZED, "this broker listens beyond loopback: subscribers log in");
          }
          return done(null, true);
        }
        const loggedIn = name;
        // Its session's queue comes at once when it returns: room for all of it.
        if (client.conn instanceof PacketSizeGuard) client.conn.allowOutgoing(maxQueuedBytes + maxOutgoingBytes);
        const settle = (p: Promise<void>) =>
          p.then(
            () => done(null, true),
            (e: unknown) =>
              refuseConnect(
                client,
                done,
                SERVER_UNAVAILABLE,
                `the session's owner could not be recorded: ${e instanceof Error ? e.message : e}`,
              ),
          );
        // Its owner starting the session afresh: aedes wipes it, and it is nobody's.
        if (client.clean) return owner === undefined ? done(null, true) : void settle(owners.release(client.id));
        if (owner === loggedIn) return done(null, true);
        if (owners.countOf(loggedIn) >= maxSessionsPerName) {
          return refuseConnect(
            client,
            done,
            NOT_AUTHORIZED,
            `${loggedIn} already owns ${maxSessionsPerName} persistent sessions, the most one name may (start one afresh with clean: true to free it)`,
          );
        }
        if (owners.size >= maxSessions) {
          return refuseConnect(client, done, SERVER_UNAVAILABLE, `the broker keeps ${maxSessions} persistent sessions, the most it may`);
        }
        void settle(owners.claim(client.id, loggedIn));
      },
      authorizePublish(client, packet, done) {
        // Subscribers, logged in or not, only listen: a publish is the service's.
        const byService = client !== null && publishers.has(client);
        const refusal = byService ? publishRefusal(packet, true, options.refusePublish) : "only the service may publish";
        done(refusal === undefined ? null : new Error(refusal));
      },
      authorizeSubscribe(client, subscription, done) {
        // `#` and `+/...` never match `$SYS` topics (aedes follows MQTT-4.7.2-1), so
        // refusing the filters that name it closes it.
        if (subscription.topic.startsWith(SYS_PREFIX) && !publishers.has(client)) return done(null, null);
        done(null, subscription);
      },
    });
  } catch (e) {
    await closeSessions();
    throw e;
  }

  // Without a listener an "error" event ends the process; the broker's own errors are reported instead.
  // (aedes emits it but does not declare it in its types.)
  (broker as EventEmitter).on("error", (error: Error) => options.onError?.(error));

  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    broker.handle(new PacketSizeGuard(socket, maxPacketBytes, maxOutgoingBytes));
  });
  let port: number;
  try {
    port = (await listenOn(server, { port: options.port, host, setting: options.portSetting })).port;
  } catch (e) {
    await new Promise<void>((resolve) => broker.close(() => resolve()));
    await closeSessions();
    throw e;
  }

  let closing: Promise<void> | undefined;
  return {
    url: `mqtt://${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    publisher: ({ timeoutMs = 5000 } = {}) =>
      inProcessPublisher(broker, { maxPacketBytes, refusePublish: options.refusePublish, timeoutMs, closed: () => closing !== undefined }),
    close() {
      closing ??= (async () => {
        const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
        await new Promise<void>((resolve) => broker.close(() => resolve()));
        // Connections that never completed an MQTT CONNECT are not aedes clients.
        for (const socket of sockets) socket.destroy();
        await serverClosed;
        // aedes does not close its persistence; what was queued is on disk already.
        await closeSessions();
      })();
      return closing;
    },
  };
}

const IN_PROCESS = "the embedded MQTT broker";

function inProcessPublisher(
  broker: Aedes,
  o: {
    readonly maxPacketBytes: number;
    readonly refusePublish: ((topic: string) => boolean) | undefined;
    readonly timeoutMs: number;
    readonly closed: () => boolean;
  },
): Publisher {
  return {
    async publish(topic, payload) {
      if (o.closed()) throw new MamError("publish.unreachable", `${IN_PROCESS} is unreachable: it is closed`);
      const bytes = publishPacketBytes(topic, payload);
      if (bytes > o.maxPacketBytes) {
        throw new MamError(
          "publish.tooLarge",
          `${IN_PROCESS} takes packets of at most ${o.maxPacketBytes} bytes; the publish to ${topic} is ${bytes}`,
        );
      }
      const refusal = publishRefusal({ topic }, true, o.refusePublish);
      if (refusal !== undefined) throw new MamError("publish.refused", `${IN_PROCESS} refused the publish to ${topic}: ${refusal}`);
      await new Promise<void>((resolve, reject) => {
        // A subscriber whose socket is full holds deliveries until the broker's drain
        // timeout drops it, and aedes raises a failed subscription lookup as an
        // "error" without calling back: the wait is bounded here, like a PUBACK's.
        const timer = setTimeout(
          () =>
            reject(
              new MamError(
                "publish.unreachable",
                `${IN_PROCESS} is unreachable: it did not finish queuing and delivering the publish to ${topic} within ${o.timeoutMs} ms`,
              ),
            ),
          o.timeoutMs,
        );
        broker.publish({ cmd: "publish", topic, payload: Buffer.from(payload, "utf8"), qos: 1, retain: false, dup: false }, (err) => {
          clearTimeout(timer);
          if (err) reject(new MamError("publish.unreachable", `${IN_PROCESS} is unreachable: ${err.message}`, { cause: err }));
          else resolve();
        });
      });
    },
  };
}

/**
 * The client's socket as aedes reads it, with every incoming packet's size read
 * from its fixed header as the bytes pass. aedes 1.x has no packet size option and
 * its parser (mqtt-packet) buffers a whole packet before it looks at it, so a
 * 100 MiB publish was held in memory in full; here the connection is destroyed as
 * soon as a header announces more than the limit, before the body is read.
 *
 * ```
 * | type | remaining length (1-4 bytes) | body (remaining length bytes) | type | ...
 *          ^ the size is known here: over the limit, the socket is destroyed
 * ```
 *
 * Bytes pass through unchanged and unbuffered; the scan keeps a few integers.
 */
class PacketSizeGuard extends Duplex {
  readonly #socket: net.Socket;
  readonly #maxPacketBytes: number;
  #maxOutgoingBytes: number;
  #phase: "type" | "length" | "body" = "type";
  #remaining = 0;
  #multiplier = 1;
  #lengthBytes = 0;

  constructor(socket: net.Socket, maxPacketBytes: number, maxOutgoingBytes: number) {
    super({ allowHalfOpen: false, writableHighWaterMark: maxOutgoingBytes });
    this.#socket = socket;
    this.#maxPacketBytes = maxPacketBytes;
    this.#maxOutgoingBytes = maxOutgoingBytes;
    socket.on("data", (chunk: Buffer) => {
      if (!this.#withinLimit(chunk)) {
        // MQTT 3.1.1 has no way to say "too large" but to close the connection.
        this.destroy();
        return;
      }
      if (!this.push(chunk)) socket.pause();
    });
    socket.once("end", () => this.push(null));
    socket.on("error", (err) => this.destroy(err));
    socket.once("close", () => this.destroy());
  }

  override _read(): void {
    this.#socket.resume();
  }

  /** Raises this connection's outgoing bound (a logged-in subscriber's session replays its queue at once). */
  allowOutgoing(bytes: number): void {
    this.#maxOutgoingBytes = Math.max(this.#maxOutgoingBytes, bytes);
  }

  override _write(chunk: Buffer, encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.#socket.write(chunk, encoding);
    this.#bounded(callback);
  }

  override _writev(chunks: { chunk: Buffer; encoding: BufferEncoding }[], callback: (error?: Error | null) => void): void {
    this.#socket.cork();
    for (const { chunk, encoding } of chunks) this.#socket.write(chunk, encoding);
    this.#socket.uncork();
    this.#bounded(callback);
  }

  /**
   * Every write is done at once for aedes, whatever the client reads: what it has not
   * read waits in its socket's buffer, and once that holds more than the bound the
   * client is dropped. So no delivery ever waits for a client's socket to drain, and
   * a client that stops reading holds no delivery of anyone else's, nor a slot of
   * aedes's hundred deliveries at once.
   */
  #bounded(callback: (error?: Error | null) => void): void {
    if (this.#socket.writableLength > this.#maxOutgoingBytes) {
      this.#socket.destroy();
      this.destroy();
    }
    callback();
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.#socket.end(() => callback());
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    this.#socket.destroy();
    callback(error);
  }

  /** Advances the scan over `chunk`; false as soon as a packet is over the limit. */
  #withinLimit(chunk: Buffer): boolean {
    let i = 0;
    while (i < chunk.length) {
      if (this.#phase === "body") {
        const take = Math.min(this.#remaining, chunk.length - i);
        this.#remaining -= take;
        i += take;
        if (this.#remaining === 0) this.#phase = "type";
        continue;
      }
      if (this.#phase === "type") {
        i++;
        this.#phase = "length";
        this.#remaining = 0;
        this.#multiplier = 1;
        this.#lengthBytes = 0;
        continue;
      }
      const byte = chunk[i++] as number;
      this.#remaining += (byte & 0x7f) * this.#multiplier;
      this.#multiplier *= 128;
      this.#lengthBytes++;
      if (byte & 0x80) {
        // A fifth length byte is malformed MQTT; refuse it here too.
        if (this.#lengthBytes === 4) return false;
        continue;
      }
      if (1 + this.#lengthBytes + this.#remaining > this.#maxPacketBytes) return false;
      this.#phase = this.#remaining === 0 ? "type" : "body";
    }
    return true;
  }
}

/** Constant-time comparison of a presented password with the configured one. */
function sameSecret(presented: Buffer, expected: string): boolean {
  const a = createHash("sha256").update(presented).digest();
  const b = createHash("sha256").update(expected, "utf8").digest();
  return timingSafeEqual(a, b);
}
