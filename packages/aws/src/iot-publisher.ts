import { IoTDataPlaneClient, PublishCommand } from "@aws-sdk/client-iot-data-plane";
import { MamError, type Publisher } from "@mam/core";
import { readSdkFailure } from "./sdk-errors.ts";

/** IoT Core's limit on a message payload (128 KB). */
export const IOT_MAX_PAYLOAD_BYTES = 131_072;

export type IotPublisherOptions = (
  | { readonly client: IoTDataPlaneClient }
  | {
      /** The account's IoT data endpoint (`https://<id>-ats.iot.<region>.amazonaws.com`): configuration. */
      readonly endpoint: string;
      readonly region: string;
    }
) & {
  /** Give up (and reject `publish.unreachable`) after this long, retries included. Default 10 s. */
  readonly timeoutMs?: number;
};

/**
 * Publishes to AWS IoT Core over its HTTPS data plane, QoS 1: IoT answers 200 only
 * once the message is accepted, so `publish` resolving means "acknowledged".
 *
 * Failures, decided here once:
 * - payload over 128 KB (UTF-8 bytes): `publish.tooLarge`, before any request (and a
 *   413 from the service, should another limit apply, maps the same way);
 * - no answer (refused connection, DNS, timeout): `publish.unreachable`;
 * - 429 and 5xx (throttled, service unavailable): `publish.unreachable` as well — the
 *   broker could not take it now; the intent stays owed and the sweep retries;
 * - any other 4xx (forbidden topic, bad request, bad credentials): `publish.refused`.
 */
export class IotPublisher implements Publisher {
  readonly #client: IoTDataPlaneClient;
  readonly #ownsClient: boolean;
  readonly #timeoutMs: number;

  constructor(opts: IotPublisherOptions) {
    if ("client" in opts) {
      this.#client = opts.client;
      this.#ownsClient = false;
    } else {
      this.#client = new IoTDataPlaneClient({
        endpoint: opts.endpoint,
        region: opts.region,
        maxAttempts: 3,
      });
      this.#ownsClient = true;
    }
    this.#timeoutMs = opts.timeoutMs ?? 10_000;
  }

  async publish(topic: string, payload: string): Promise<void> {
    const bytes = Buffer.from(payload, "utf8");
    if (bytes.byteLength > IOT_MAX_PAYLOAD_BYTES) {
      throw new MamError(
        "publish.tooLarge",
        `the payload for ${topic} is ${bytes.byteLength} bytes; IoT Core takes at most ${IOT_MAX_PAYLOAD_BYTES}`,
        { details: { topic, bytes: bytes.byteLength, limit: IOT_MAX_PAYLOAD_BYTES } },
      );
    }
    if (topic.length === 0 || topic.includes("#") || topic.includes("+") || topic.includes("\0")) {
      throw new MamError("publish.refused", `not a topic one can publish to: ${JSON.stringify(topic)}`, {
        details: { topic },
      });
    }
    try {
      await this.#client.send(new PublishCommand({ topic, qos: 1, payload: bytes }), {
        abortSignal: AbortSignal.timeout(this.#timeoutMs),
      });
    } catch (err) {
      throw publishFailure(err, topic);
    }
  }

  async close(): Promise<void> {
    if (this.#ownsClient) this.#client.destroy();
  }
}

function publishFailure(err: unknown, topic: string): MamError {
  const f = readSdkFailure(err);
  const details = { topic, sdkError: f.name, ...(f.status !== undefined ? { httpStatus: f.status } : {}) };
  const what = `${f.name}${f.status !== undefined ? ` (HTTP ${f.status})` : f.code !== undefined ? ` ${f.code}` : ""}`;
  if (f.status === 413) {
    return new MamError("publish.tooLarge", `IoT Core refused the payload for ${topic} as too large`, { cause: err, details });
  }
  if (f.status === undefined || f.status === 429 || f.status >= 500) {
    return new MamError("publish.unreachable", `IoT Core could not be reached to publish to ${topic}: ${what}`, {
      cause: err,
      details,
    });
  }
  return new MamError("publish.refused", `IoT Core refused the publish to ${topic}: ${what}`, { cause: err, details });
}
