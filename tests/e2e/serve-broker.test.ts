/**
 * `mam serve`'s MQTT wiring, in process: the embedded broker as configured
 * (reserved client id, `$SYS` closed, packet limit), the service's login on an
 * external broker (MAM_MQTT_URL), never anonymous, and the publisher reconnecting
 * on its own. The abuse itself is tried in detail in tests/contract/broker-abuse.test.ts.
 */
import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import { type RunningService, runCli, startService } from "@mam/cli";
import { parseConfig } from "@mam/core";
import { startEmbeddedBroker } from "@mam/local";
import { connectAsync, type IClientOptions, type MqttClient } from "mqtt";
import { afterEach, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { subscribe } from "../support/subscriber.ts";
import { tempDir } from "../support/temp-dir.ts";

describe("mam serve and its MQTT broker", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c().catch(() => undefined);
  });

  async function dataDir(): Promise<string> {
    const dir = (await tempDir("serve-broker")).dir;
    cleanup.push(() => rm(dir, { recursive: true, force: true }));
    return dir;
  }

  async function serve(env: Record<string, string>): Promise<{ service: RunningService; logs: string[] }> {
    const logs: string[] = [];
    const service = await startService(parseConfig({ MAM_DATA_DIR: await dataDir(), MAM_PORT: "0", MAM_MQTT_PORT: "0", ...env }), (line) =>
      logs.push(line),
    );
    cleanup.push(() => service.stop());
    return { service, logs };
  }

  /** The operator registers a job and cancels it: the service owes, and publishes, a notification. */
  async function cancelAJob(service: RunningService, mqttUrl = service.mqttUrl): Promise<void> {
    const call = async (method: string, path: string, body: unknown) => {
      const res = await fetch(new URL(path, service.url), {
        method,
        headers: { authorization: `Bearer ${service.operatorToken}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      return { status: res.status, body: (await res.json()) as Record<string, unknown> };
    };
    const reg = await call("POST", "/v1/jobs", { prompt: "p", agent: "codex" });
    expect(reg.status).toBe(201);
    const jobId = String(reg.body.job_id);
    const sub = await subscribe(mqttUrl, `mam/jobs/${jobId}/events`);
    try {
      expect((await call("POST", `/v1/jobs/${jobId}/transitions`, { action: "cancel", expected_seq: 0 })).status).toBe(200);
      const message = await sub.next(10_000);
      expect(JSON.parse(message.payload)).toMatchObject({ event: "cancelled", job_id: jobId });
    } finally {
      await sub.close();
    }
  }

  async function client(url: string, options: IClientOptions): Promise<MqttClient> {
    const c = await connectAsync(url, { protocolVersion: 4, reconnectPeriod: 0, connectTimeout: 3000, ...options });
    c.on("error", () => undefined);
    cleanup.push(() => c.endAsync(true));
    return c;
  }

  const closed = (c: MqttClient, what: string, ms = 5000): Promise<void> =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${what}: no close within ${ms} ms`)), ms);
      c.once("close", () => {
        clearTimeout(timer);
        resolve();
      });
    });

  it("with MAM_MQTT_URL and no MAM_MQTT_USERNAME/MAM_MQTT_PASSWORD it does not start, naming both (exit 1)", async () => {
    const io = captureIo({ MAM_MQTT_URL: "mqtt://127.0.0.1:1883", MAM_DATA_DIR: await dataDir(), MAM_PORT: "0" });
    expect(await runCli(["serve"], io)).toBe(1);
    const said = io.err.join("");
    expect(said).toContain("MAM_MQTT_USERNAME");
    expect(said).toContain("MAM_MQTT_PASSWORD");
    expect(said).toMatch(/never anonymously/);
  });

  it("embedded: MAM_MQTT_CLIENT_ID is reserved, $SYS is closed, MAM_MQTT_MAX_PACKET_BYTES bounds packets, and notifications keep flowing", async () => {
    const { service, logs } = await serve({ MAM_MQTT_CLIENT_ID: "svc-e2e", MAM_MQTT_MAX_PACKET_BYTES: "2048" });
    await cancelAJob(service);

    await expect(client(service.mqttUrl, { clientId: "svc-e2e" })).rejects.toMatchObject({ code: 2 });
    await expect(subscribe(service.mqttUrl, "$SYS/#")).rejects.toThrow(/refused the subscription/);
    const big = await client(service.mqttUrl, {});
    big.publish("elsewhere/x", Buffer.alloc(4096, "x"), { qos: 1 }, () => undefined);
    await closed(big, "the broker closing a 4 KiB publish over a 2 KiB limit");

    await cancelAJob(service);
    // The service publishes in the broker's process: it has no connection the abuse could take or drop.
    const mqttLines = logs.map((l) => JSON.parse(l) as { msg: string; detail?: string }).filter((l) => l.msg.startsWith("mqtt"));
    // The one refused CONNECT is logged with its reason (MQTT 3.1.1's CONNACK has only a code).
    expect(mqttLines).toEqual([
      expect.objectContaining({
        msg: "mqtt connect refused",
        client_id: "svc-e2e",
        connack: 2,
        detail: "this client id is reserved for the service",
      }),
    ]);
  });

  it("external: it logs in with MAM_MQTT_USERNAME/MAM_MQTT_PASSWORD as MAM_MQTT_CLIENT_ID, and reconnects on its own when dropped", async () => {
    const login = { username: "mam-ext", password: randomBytes(16).toString("hex") };
    // Only that login may publish under mam/ on this broker: a notification received proves it was used.
    const external = await startEmbeddedBroker({ port: 0, publisherCredentials: login });
    cleanup.push(() => external.close());
    const { service, logs } = await serve({
      MAM_MQTT_URL: external.url,
      MAM_MQTT_USERNAME: login.username,
      MAM_MQTT_PASSWORD: login.password,
      MAM_MQTT_CLIENT_ID: "mam-ext-1",
    });
    expect(service.mqttUrl).toBe(external.url);
    await cancelAJob(service);

    // A client with the same login and client id takes the service's connection over;
    // the service reconnects on its own, with that id, and so closes the intruder's.
    const intruder = await client(external.url, { ...login, clientId: "mam-ext-1" });
    await closed(intruder, "the service taking its client id back", 10_000);
    expect(logs.some((l) => l.includes('"mqtt disconnected"'))).toBe(true);
    await cancelAJob(service);
  });
});
