import { randomBytes } from "node:crypto";
import { connect, type MqttClient } from "mqtt";

/**
 * The clients of issue 17's stalled-subscriber storm, real mqtt.js clients, shared by
 * the storm test (tests/contract/broker-storm) and bench/subscribers: the caller ends
 * each client it is handed.
 */

/** An anonymous client that subscribes to everything, then stops reading its socket; dropped, it comes back and stalls again. */
export function stalledSubscriber(url: string, i: number): MqttClient {
  const c = connect(url, { protocolVersion: 4, reconnectPeriod: 20, clientId: `stalled-${i}`, keepalive: 0 });
  c.on("error", () => undefined);
  c.on("connect", () => {
    c.subscribe(["#", "mam/#"], { qos: 1 }, () => undefined);
    // Reading stops once the SUBSCRIBE is out: the broker keeps writing to a socket nobody reads.
    setImmediate(() => c.stream.pause());
  });
  return c;
}

/** Resolves once the client has connected and stopped reading. */
export function stalled(c: MqttClient): Promise<void> {
  return new Promise((resolve) => (c.connected && c.stream.isPaused() ? resolve() : c.once("connect", () => setImmediate(resolve))));
}

/** An anonymous client that publishes 60 KB junk outside mam/ for as long as `storm.on`. */
export function junkPublisher(url: string, i: number, storm: { readonly on: boolean }): MqttClient {
  const c = connect(url, { protocolVersion: 4, reconnectPeriod: 20, clientId: `junk-${i}` });
  c.on("error", () => undefined);
  const payload = randomBytes(60_000);
  const pump = () => {
    if (!storm.on || !c.connected) return;
    c.publish(`junk/${i}`, payload, { qos: 0 }, () => setImmediate(pump));
  };
  c.on("connect", pump);
  return c;
}
