import { type Config, MamError } from "@mam/core";

/** A login on an MQTT broker. */
export interface MqttLogin {
  readonly username: string;
  readonly password: string;
}

/**
 * Where a data dir's notifications are published, decided in one place for every
 * process that publishes them (`mam serve`, and the `mam` command on its data dir):
 * - `external`: MAM_MQTT_URL's broker, with the service's login from the environment
 *   (MAM_MQTT_USERNAME and MAM_MQTT_PASSWORD, which parseConfig requires with it);
 * - `embedded`: the broker `mam serve` runs on 127.0.0.1:MAM_MQTT_PORT, with the data
 *   dir's login (credentials.json);
 * - `named`: a broker the command was pointed at (`--mqtt-url`), with the data dir's login.
 */
export type BrokerChoice =
  | { readonly kind: "external"; readonly url: string; readonly login: MqttLogin }
  | { readonly kind: "embedded"; readonly url: string; readonly port: number; readonly login: MqttLogin | undefined }
  | { readonly kind: "named"; readonly url: string; readonly login: MqttLogin | undefined };

export function brokerOf(config: Config, dataDirLogin: MqttLogin | undefined, namedUrl?: string): BrokerChoice {
  if (namedUrl !== undefined) return { kind: "named", url: namedUrl, login: dataDirLogin };
  if (config.mqttUrl !== undefined) {
    // parseConfig refuses MAM_MQTT_URL without both; a Config built by hand must not fall back to the embedded broker either.
    if (config.mqttUsername === undefined || config.mqttPassword === undefined) {
      throw new MamError("config.invalid", "MAM_MQTT_USERNAME and MAM_MQTT_PASSWORD are required with MAM_MQTT_URL");
    }
    return { kind: "external", url: config.mqttUrl, login: { username: config.mqttUsername, password: config.mqttPassword } };
  }
  return { kind: "embedded", url: `mqtt://127.0.0.1:${config.mqttPort}`, port: config.mqttPort, login: dataDirLogin };
}
