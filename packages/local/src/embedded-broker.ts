import { createHash, timingSafeEqual } from "node:crypto";
import net from "node:net";
import { Aedes, type AuthenticateError, type Client } from "aedes";

export interface EmbeddedBrokerOptions {
  /** 0 picks a free port. */
  readonly port: number;
  /** Loopback unless told otherwise. */
  readonly host?: string;
  /**
   * The service's own credentials: the only client allowed to publish under `mam/`.
   * Without them nobody may publish under `mam/` over the wire (fail closed).
   */
  readonly publisherCredentials?: { readonly username: string; readonly password: string };
  /** Refuse a publish to these topics whoever sends it (tests that need a refusing broker). */
  readonly refusePublish?: (topic: string) => boolean;
}

export interface EmbeddedBroker {
  /** `mqtt://host:port`. */
  readonly url: string;
  readonly port: number;
  /** Closes the listener, every client connection and the broker. */
  close(): Promise<void>;
}

/** The namespace only the service may publish in, so a completion cannot be spoofed. */
const SERVICE_PREFIX = "mam/";

/**
 * An MQTT 3.1.1 broker (aedes) in the service's process. Anyone may connect without
 * credentials and subscribe; a client that presents credentials must present the
 * publisher's, or its connection is refused; only that client may publish under
 * `mam/` (its will messages included: aedes authorizes a will like a publish).
 */
export async function startEmbeddedBroker(options: EmbeddedBrokerOptions): Promise<EmbeddedBroker> {
  const host = options.host ?? "127.0.0.1";
  const credentials = options.publisherCredentials;
  const publishers = new WeakSet<Client>();

  const broker = await Aedes.createBroker({
    authenticate(client, username, password, done) {
      const anonymous = (username === undefined || username === "") && password === undefined;
      if (anonymous) return done(null, true);
      if (
        credentials !== undefined &&
        username === credentials.username &&
        password !== undefined &&
        sameSecret(password, credentials.password)
      ) {
        publishers.add(client);
        return done(null, true);
      }
      // 4 = bad user name or password (AuthErrorCode is a const enum aedes does not export at runtime).
      const refusal = Object.assign(new Error("bad user name or password"), { returnCode: 4 }) as AuthenticateError;
      done(refusal, false);
    },
    authorizePublish(client, packet, done) {
      const topic = packet.topic;
      if (topic.startsWith("$SYS")) return done(new Error("$SYS topics are reserved"));
      if (options.refusePublish?.(topic)) return done(new Error(`publishing to ${topic} is refused`));
      const inServiceSpace = topic === "mam" || topic.startsWith(SERVICE_PREFIX);
      if (inServiceSpace && (client === null || !publishers.has(client))) {
        return done(new Error(`only the service may publish under ${SERVICE_PREFIX}`));
      }
      done(null);
    },
  });

  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    broker.handle(socket);
  });
  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(options.port, host, () => {
        server.off("error", reject);
        resolve();
      });
    });
  } catch (e) {
    await new Promise<void>((resolve) => broker.close(() => resolve()));
    throw e;
  }
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("the MQTT listener has no TCP address");
  const port = address.port;

  let closing: Promise<void> | undefined;
  return {
    url: `mqtt://${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    close() {
      closing ??= (async () => {
        const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
        await new Promise<void>((resolve) => broker.close(() => resolve()));
        // Connections that never completed an MQTT CONNECT are not aedes clients.
        for (const socket of sockets) socket.destroy();
        await serverClosed;
      })();
      return closing;
    },
  };
}

/** Constant-time comparison of a presented password with the configured one. */
function sameSecret(presented: Buffer, expected: string): boolean {
  const a = createHash("sha256").update(presented).digest();
  const b = createHash("sha256").update(expected, "utf8").digest();
  return timingSafeEqual(a, b);
}
