import { MamError, type Publisher } from "@mam/core";
import { connect, ErrorWithReasonCode, type MqttClient } from "mqtt";

export interface MqttPublisherOptions {
  /** `mqtt://host:port` (or `mqtts://`, `ws://`); credentials in it are never echoed in errors. */
  readonly url: string;
  readonly clientId?: string;
  readonly username?: string;
  readonly password?: string;
  /** How long to wait for the broker's CONNACK (default 3000 ms). */
  readonly connectTimeoutMs?: number;
  /** How long to wait for the broker's acknowledgement (the PUBCOMP) once the publish is sent (default 5000 ms). */
  readonly publishTimeoutMs?: number;
  /**
   * The broker's largest packet, when known (the embedded broker's limit): a publish
   * that would not fit is `publish.tooLarge` before anything is sent, rather than a
   * dropped connection the publisher could only call a refusal.
   */
  readonly maxPacketBytes?: number;
  /**
   * After a connection that was up goes away (a broker restart, a dropped socket, a
   * refused publish), the first reconnection is tried after this long, then at
   * doubling intervals up to 30 s, until it succeeds or the publisher is closed
   * (default 1000 ms; 0: only the next publish reconnects).
   */
  readonly reconnectPeriodMs?: number;
  /** Told each time a connection is established (true) or lost (false; not when `close` ends it); for logs and tests. */
  readonly onConnectionChange?: (connected: boolean) => void;
}

/** CONNACK codes meaning "I do not speak that protocol version" (3.1.1 and 5). */
const UNSUPPORTED_VERSION = new Set([1, 0x84]);
const PACKET_TOO_LARGE = 0x95;
const MAX_RECONNECT_DELAY_MS = 30_000;

/**
 * Publishes at QoS 2 and resolves only on the broker's PUBCOMP, which follows its
 * PUBREC: the broker's word that it owns the message. Subscribers still receive at
 * the QoS they subscribed with (QoS 1 for mam's); the publisher's leg is QoS 2
 * because aedes answers a QoS 1 PUBLISH with its PUBACK *before* it queues the
 * message for persistent sessions or hands it to connected subscribers, so a broker
 * killed in between has acknowledged a message it never stored nor sent, and the
 * intent would be settled and lost. aedes writes a QoS 2 PUBREC only after both
 * (tests/contract/broker-ownership.test.ts pins the two orders on aedes itself).
 * Whether an acknowledged message outlives the broker's own crash is then the
 * broker's persistence (aedes-persistence-level writes before the PUBREC;
 * docs/notifications.md, "What an acknowledgement means").
 *
 * It speaks MQTT 5, so a broker can refuse a publish with a reason code; a broker
 * that only speaks 3.1.1 (the embedded aedes broker) answers the CONNECT with
 * "unacceptable protocol version", and the publisher then speaks 3.1.1 to it, where
 * a refused publish is answered by closing the connection.
 *
 * Failure is bounded: mqtt.js never reconnects by itself (`reconnectPeriod: 0`, so
 * no message it queued is re-sent behind the caller's back) and the client is ended
 * on any failure; the next publish connects afresh. Once it has been connected, the
 * publisher also reconnects on its own after any disconnect, so a service is back
 * on the broker before its next notification; the retry timer never keeps a
 * process alive, and `close` stops it (a CLI closes and exits).
 */
export class MqttPublisher implements Publisher {
  readonly #options: MqttPublisherOptions;
  readonly #connectTimeoutMs: number;
  readonly #publishTimeoutMs: number;
  readonly #where: string;
  readonly #reconnectPeriodMs: number;
  #protocolVersion: 4 | 5 = 5;
  /** Set by `close`, cleared by the next publish: no reconnecting on its own meanwhile. */
  #stopped = false;
  /** Reconnecting on its own starts only once a connection was up. */
  #everConnected = false;
  #reconnectDelayMs: number;
  #reconnectTimer: NodeJS.Timeout | undefined;
  #session: Promise<MqttClient> | undefined;
  #client: MqttClient | undefined;
  readonly #connections = new WeakMap<MqttClient, ConnectionState>();

  constructor(options: MqttPublisherOptions) {
    this.#options = options;
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 3000;
    this.#publishTimeoutMs = options.publishTimeoutMs ?? 5000;
    this.#where = `MQTT broker at ${redact(options.url)}`;
    this.#reconnectPeriodMs = options.reconnectPeriodMs ?? 1000;
    this.#reconnectDelayMs = this.#reconnectPeriodMs;
  }

  async publish(topic: string, payload: string): Promise<void> {
    const limit = this.#options.maxPacketBytes;
    if (limit !== undefined) {
      const bytes = publishPacketBytes(topic, payload);
      if (bytes > limit) {
        throw new MamError(
          "publish.tooLarge",
          `${this.#where} takes packets of at most ${limit} bytes; the publish to ${topic} is ${bytes}`,
        );
      }
    }
    this.#stopped = false;
    let client = await this.#connected();
    if (!client.connected) {
      // It went away between two publishes; connect once more.
      this.#drop(client);
      client = await this.#connected();
    }
    await this.#send(client, topic, payload);
  }

  async close(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = undefined;
    const session = this.#session;
    this.#session = undefined;
    this.#client = undefined;
    if (session === undefined) return;
    const client = await session.catch(() => undefined);
    if (client === undefined) return;
    const state = this.#connections.get(client);
    if (state !== undefined) state.abandoned ??= "the publisher was closed";
    await new Promise<void>((resolve) => {
      // A graceful end waits for in-flight acks; a broker that is gone must not
      // hold the caller, so it is forced after a short while.
      const force = setTimeout(() => client.end(true, {}, () => resolve()), 1000);
      client.end(false, {}, () => {
        clearTimeout(force);
        resolve();
      });
    });
  }

  #connected(): Promise<MqttClient> {
    if (this.#session === undefined) {
      const session = this.#connect();
      this.#session = session;
      session.then(
        () => {
          this.#everConnected = true;
          this.#reconnectDelayMs = this.#reconnectPeriodMs;
          this.#tell(true);
        },
        () => {
          if (this.#session === session) this.#session = undefined;
          this.#reconnectSoon();
        },
      );
    }
    return this.#session;
  }

  /**
   * One reconnection attempt after the current delay, unless one is pending, a
   * connection is up or being made (a publish reconnected first), or the publisher
   * was closed. A failed attempt schedules the next at twice the delay.
   */
  #reconnectSoon(): void {
    if (this.#reconnectPeriodMs === 0 || !this.#everConnected || this.#stopped || this.#reconnectTimer !== undefined) return;
    const delay = this.#reconnectDelayMs;
    this.#reconnectDelayMs = Math.min(delay * 2, MAX_RECONNECT_DELAY_MS);
    this.#reconnectTimer = setTimeout(() => {
      this.#reconnectTimer = undefined;
      if (this.#stopped || this.#session !== undefined) return;
      // A failure is handled where every session's is: it schedules the next try.
      this.#connected().catch(() => undefined);
    }, delay);
    this.#reconnectTimer.unref();
  }

  #tell(connected: boolean): void {
    try {
      this.#options.onConnectionChange?.(connected);
    } catch {
      // A listener's failure is not the publisher's.
    }
  }

  async #connect(): Promise<MqttClient> {
    const deadline = Date.now() + this.#connectTimeoutMs;
    try {
      return await this.#attempt(this.#protocolVersion, this.#connectTimeoutMs);
    } catch (e) {
      const remaining = deadline - Date.now();
      if (this.#protocolVersion === 5 && e instanceof ErrorWithReasonCode && UNSUPPORTED_VERSION.has(e.code) && remaining > 0) {
        this.#protocolVersion = 4;
        try {
          return await this.#attempt(4, remaining);
        } catch (e4) {
          throw this.#unreachable(e4);
        }
      }
      throw this.#unreachable(e);
    }
  }

  #attempt(protocolVersion: 4 | 5, timeoutMs: number): Promise<MqttClient> {
    const o = this.#options;
    const client = connect(o.url, {
      protocolVersion,
      reconnectPeriod: 0,
      connectTimeout: timeoutMs,
      clean: true,
      ...(o.clientId === undefined ? {} : { clientId: o.clientId }),
      ...(o.username === undefined ? {} : { username: o.username }),
      ...(o.password === undefined ? {} : { password: o.password }),
    });
    // An error event with no listener would crash the process; every failure that
    // matters reaches the caller through the handlers below instead.
    client.on("error", () => undefined);
    return new Promise<MqttClient>((resolve, reject) => {
      const settle = (err?: unknown): void => {
        clearTimeout(timer);
        client.off("connect", onConnect);
        client.off("error", onError);
        client.off("close", onClose);
        if (err === undefined) {
          this.#watch(client);
          resolve(client);
        } else {
          client.end(true);
          reject(err);
        }
      };
      const onConnect = (): void => settle();
      const onError = (err: Error): void => settle(err);
      const onClose = (): void => settle(new Error("the connection closed before the broker accepted it"));
      const timer = setTimeout(() => settle(new Error(`no CONNACK within ${timeoutMs} ms`)), timeoutMs);
      client.on("connect", onConnect);
      client.on("error", onError);
      client.on("close", onClose);
    });
  }

  /**
   * Once connected, one close listener per client: a close fails every publish
   * still waiting on that connection, and the client is forgotten so the next
   * publish connects afresh.
   */
  #watch(client: MqttClient): void {
    this.#client = client;
    const state: ConnectionState = { inFlight: new Set() };
    this.#connections.set(client, state);
    client.once("close", () => {
      // Fail the waiting publishes first: ending the client flushes their mqtt.js
      // callbacks with a bare "Connection closed", which says less.
      for (const fail of [...state.inFlight]) fail(state.abandoned);
      this.#drop(client);
      if (this.#stopped) return;
      this.#tell(false);
      this.#reconnectSoon();
    });
  }

  #send(client: MqttClient, topic: string, payload: string): Promise<void> {
    const state = this.#connections.get(client);
    return new Promise<void>((resolve, reject) => {
      const settle = (err?: MamError): void => {
        if (!state?.inFlight.delete(onClosed)) return;
        clearTimeout(timer);
        if (err === undefined) {
          resolve();
          return;
        }
        reject(err);
        // Ending the client on any failure leaves nothing that could keep a CLI
        // alive; publishes in flight beside this one fail as unreachable.
        state.abandoned ??= `the connection was dropped after a failed publish (${err.code})`;
        this.#drop(client);
      };
      // Over MQTT 3.1.1 a broker has no way to say "no" to a publish but to drop the
      // connection, which is what aedes does when authorizePublish refuses. If we
      // dropped it ourselves, that is not the broker refusing.
      const onClosed = (abandoned: string | undefined): void =>
        settle(
          abandoned === undefined
            ? new MamError("publish.refused", `${this.#where} closed the connection instead of acknowledging the publish to ${topic}`)
            : new MamError("publish.unreachable", `${this.#where} is unreachable: ${abandoned}`),
        );
      const timer = setTimeout(
        () =>
          settle(
            new MamError(
              "publish.unreachable",
              `${this.#where} is unreachable: no acknowledgement (PUBCOMP) within ${this.#publishTimeoutMs} ms`,
            ),
          ),
        this.#publishTimeoutMs,
      );
      if (state === undefined) {
        clearTimeout(timer);
        return reject(new MamError("publish.unreachable", `${this.#where} is unreachable: the connection is gone`));
      }
      state.inFlight.add(onClosed);
      client.publish(topic, payload, { qos: 2 }, (err) => {
        if (err === undefined || err === null) return settle();
        if (err instanceof ErrorWithReasonCode && err.code === PACKET_TOO_LARGE) {
          return settle(new MamError("publish.tooLarge", `${this.#where} refused the publish to ${topic}: ${err.message}`, { cause: err }));
        }
        if (err instanceof ErrorWithReasonCode) {
          return settle(new MamError("publish.refused", `${this.#where} refused the publish to ${topic}: ${err.message}`, { cause: err }));
        }
        // mqtt.js flushing its queue as the connection ends ("Connection closed").
        settle(new MamError("publish.unreachable", `${this.#where} is unreachable: ${err.message}`, { cause: err }));
      });
    });
  }

  #unreachable(e: unknown): MamError {
    const reason = e instanceof Error ? e.message : String(e);
    return new MamError("publish.unreachable", `${this.#where} is unreachable: ${reason}`, { cause: e });
  }

  /** Forget a client and end it, so no socket or timer of it outlives a failure. */
  #drop(client: MqttClient): void {
    if (this.#client === client) {
      this.#client = undefined;
      this.#session = undefined;
    }
    if (!client.disconnecting) client.end(true);
  }
}

interface ConnectionState {
  /** One entry per publish awaiting its acknowledgement: how to fail it if the connection closes. */
  readonly inFlight: Set<(abandoned: string | undefined) => void>;
  /** Set when we dropped the connection ourselves, and why. */
  abandoned?: string;
}

/**
 * The size of a QoS 2 PUBLISH (the same as a QoS 1) of `payload` to `topic`, fixed header included; one
 * byte of MQTT 5 properties is counted whichever version is spoken.
 */
export function publishPacketBytes(topic: string, payload: string): number {
  const remaining = 2 + Buffer.byteLength(topic) + 2 + 1 + Buffer.byteLength(payload);
  const lengthBytes = remaining < 128 ? 1 : remaining < 16_384 ? 2 : remaining < 2_097_152 ? 3 : 4;
  return 1 + lengthBytes + remaining;
}

function redact(url: string): string {
  try {
    const u = new URL(url);
    u.username = "";
    u.password = "";
    return u.toString().replace(/\/$/, "");
  } catch {
    return "(an unparsable URL)";
  }
}
