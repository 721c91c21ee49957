/**
 * A small stand-in for IoT Core's HTTPS data plane that republishes onto a real MQTT
 * broker: the AWS IoT publisher's peer in the tests, and the IoT Core of
 * `npm run offline`. It listens on a free loopback port and has a `close()`.
 * It checks no SigV4 signature.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { connect, type MqttClient } from "mqtt";

/** Listen on a free loopback port; its number. (Also the local peers' in tests/support/aws-peers.ts.) */
export function listen(server: http.Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

/** Close, dropping kept-alive connections. */
export function closeServer(server: http.Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections?.();
  });
}

export interface IotStandIn {
  readonly endpoint: string;
  /** Publishes the stand-in answered 200 to, in order (topic and payload as received). */
  readonly accepted: readonly { readonly topic: string; readonly payload: Buffer }[];
  close(): Promise<void>;
}

export interface IotStandInOptions {
  /** Credentials the stand-in connects to the broker with (IoT Core's own right to publish). */
  readonly username?: string;
  readonly password?: string;
  /** How long to wait for the broker's CONNACK, then PUBACK (default 3000 ms each). */
  readonly brokerTimeoutMs?: number;
}

const IOT_MAX_PAYLOAD = 131_072;

/**
 * IoT Core's HTTPS publish, as `@aws-sdk/client-iot-data-plane` sends it:
 * `POST /topics/<topic, URL-encoded, '/' as %2F>?qos=1`, body = the payload bytes.
 * The stand-in republishes the body to the MQTT broker at `brokerUrl` with that QoS
 * and answers like IoT Core:
 * - 200 `{}` only after the broker acknowledged (PUBACK at QoS 1);
 * - 413 `RequestEntityTooLargeException` for a body over 128 KB;
 * - 503 `ServiceUnavailableException` when the broker cannot be reached or does not
 *   acknowledge in time;
 * - 403 `ForbiddenException` when the broker refuses the publish (over MQTT 3.1.1 a
 *   broker refuses by closing the connection instead of acknowledging).
 * Each publish uses a connection of its own, so a refusal is never confused with
 * another request's. No SigV4 check.
 */
export async function startIotStandIn(brokerUrl: string, opts: IotStandInOptions = {}): Promise<IotStandIn> {
  const timeoutMs = opts.brokerTimeoutMs ?? 3000;
  const accepted: { topic: string; payload: Buffer }[] = [];
  const sockets = new Set<MqttClient>();

  const answer = (res: http.ServerResponse, status: number, errorType?: string, message?: string): void => {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (errorType !== undefined) headers["x-amzn-errortype"] = errorType;
    res.writeHead(status, headers);
    res.end(JSON.stringify(message === undefined ? {} : { message }));
  };

  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://stand-in");
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      // Count everything, keep nothing past the limit: the answer is 413 anyway.
      if (size <= IOT_MAX_PAYLOAD) chunks.push(chunk);
    });
    req.on("end", () => {
      if (req.method !== "POST" || !url.pathname.startsWith("/topics/")) {
        return answer(res, 404, "ResourceNotFoundException", `no route ${req.method} ${url.pathname}`);
      }
      let topic: string;
      try {
        topic = decodeURIComponent(url.pathname.slice("/topics/".length));
      } catch {
        return answer(res, 400, "InvalidRequestException", "the topic is not URL-encoded");
      }
      const qosParam = url.searchParams.get("qos") ?? "0";
      if (topic === "" || (qosParam !== "0" && qosParam !== "1")) {
        return answer(res, 400, "InvalidRequestException", "a topic and qos 0 or 1 are required");
      }
      if (size > IOT_MAX_PAYLOAD) {
        return answer(res, 413, "RequestEntityTooLargeException", `the payload is ${size} bytes; the limit is ${IOT_MAX_PAYLOAD}`);
      }
      const payload = Buffer.concat(chunks, size);
      republish(brokerUrl, topic, payload, qosParam === "1" ? 1 : 0, opts, timeoutMs, sockets).then(
        (outcome) => {
          if (outcome === "acked") {
            accepted.push({ topic, payload });
            return answer(res, 200);
          }
          if (outcome === "refused") return answer(res, 403, "ForbiddenException", `the broker refused the publish to ${topic}`);
          return answer(res, 503, "ServiceUnavailableException", `the broker is unreachable: ${outcome.unreachable}`);
        },
        (err: unknown) => answer(res, 500, "InternalFailureException", String(err)),
      );
    });
  });
  const port = await listen(server);
  return {
    endpoint: `http://127.0.0.1:${port}`,
    accepted,
    async close() {
      for (const c of sockets) c.end(true);
      await closeServer(server);
    },
  };
}

type Outcome = "acked" | "refused" | { unreachable: string };

function republish(
  brokerUrl: string,
  topic: string,
  payload: Buffer,
  qos: 0 | 1,
  opts: IotStandInOptions,
  timeoutMs: number,
  sockets: Set<MqttClient>,
): Promise<Outcome> {
  const client = connect(brokerUrl, {
    protocolVersion: 4,
    reconnectPeriod: 0,
    connectTimeout: timeoutMs,
    clean: true,
    ...(opts.username === undefined ? {} : { username: opts.username }),
    ...(opts.password === undefined ? {} : { password: opts.password }),
  });
  sockets.add(client);
  client.on("error", () => undefined);
  return new Promise<Outcome>((resolve) => {
    let connected = false;
    let settled = false;
    const settle = (outcome: Outcome): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      client.end(outcome !== "acked", {}, () => sockets.delete(client));
      resolve(outcome);
    };
    const timer = setTimeout(
      () => settle({ unreachable: connected ? `no PUBACK within ${timeoutMs} ms` : `no CONNACK within ${timeoutMs} ms` }),
      timeoutMs * 2,
    );
    client.once("error", (err) => {
      if (connected) return;
      // A CONNACK refusal (bad credentials, not authorized) carries a numeric return
      // code: the broker is there and says no. Anything else: it is not there.
      const returnCode = (err as { code?: unknown }).code;
      settle(typeof returnCode === "number" ? "refused" : { unreachable: err.message });
    });
    client.once("close", () => settle(connected ? "refused" : { unreachable: "the connection closed" }));
    client.once("connect", () => {
      connected = true;
      client.publish(topic, payload, { qos }, (err) => {
        if (err) settle(connected && client.connected ? "refused" : { unreachable: err.message });
        else settle("acked");
      });
    });
  });
}
