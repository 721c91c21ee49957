/** The MQTT part of the configuration: the embedded broker's limits and the service's login on an external broker. */
import { parseConfig } from "@mam/core";
import { describe, expect, it } from "vitest";
import { configError } from "../support/config-error.ts";

const external = { MAM_MQTT_URL: "mqtts://broker.internal:8883", MAM_MQTT_USERNAME: "mam", MAM_MQTT_PASSWORD: "secret" };

describe("MQTT configuration", () => {
  it("defaults: the service's client id mam-service, 64 KiB packets, no external login", () => {
    expect(parseConfig({})).toMatchObject({
      mqttUrl: undefined,
      mqttUsername: undefined,
      mqttPassword: undefined,
      mqttClientId: "mam-service",
      mqttMaxPacketBytes: 64 * 1024,
    });
  });

  it("reads the external broker's login, the client id and the packet limit", () => {
    expect(parseConfig({ ...external, MAM_MQTT_CLIENT_ID: "mam-prod_1", MAM_MQTT_MAX_PACKET_BYTES: "131072" })).toMatchObject({
      mqttUrl: "mqtts://broker.internal:8883",
      mqttUsername: "mam",
      mqttPassword: "secret",
      mqttClientId: "mam-prod_1",
      mqttMaxPacketBytes: 131072,
    });
  });

  it("MAM_MQTT_URL without MAM_MQTT_USERNAME and MAM_MQTT_PASSWORD is config.invalid naming both: never anonymous", () => {
    const e = configError({ MAM_MQTT_URL: "mqtt://broker.internal:1883" });
    expect(e.code).toBe("config.invalid");
    expect(e.issues.map((i) => i.path).sort()).toEqual(["MAM_MQTT_PASSWORD", "MAM_MQTT_USERNAME"]);
    expect(e.message).toContain("MAM_MQTT_URL");
    expect(e.message).toContain("never anonymously");
  });

  it("a username without a password names the password alone", () => {
    const e = configError({ MAM_MQTT_URL: "mqtt://broker.internal:1883", MAM_MQTT_USERNAME: "mam" });
    expect(e.issues.map((i) => i.path)).toEqual(["MAM_MQTT_PASSWORD"]);
  });

  it.each([
    ["MAM_MQTT_URL", "mqtt://mam:secret@broker.internal:1883"],
    ["MAM_MQTT_URL", "http://broker.internal:1883"],
    ["MAM_MQTT_CLIENT_ID", "has space"],
    ["MAM_MQTT_CLIENT_ID", "x".repeat(24)],
    ["MAM_MQTT_MAX_PACKET_BYTES", "512"],
    ["MAM_MQTT_MAX_PACKET_BYTES", String(32 * 1024 * 1024)],
  ])("%s=%s is config.invalid naming the variable", (name, value) => {
    const e = configError({ ...external, [name]: value });
    expect(e.code).toBe("config.invalid");
    expect(e.issues.map((i) => i.path)).toEqual([name]);
  });
});
