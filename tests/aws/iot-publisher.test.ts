import http from "node:http";
import type { AddressInfo } from "node:net";
import { IoTDataPlaneClient } from "@aws-sdk/client-iot-data-plane";
import { IOT_MAX_PAYLOAD_BYTES, IotPublisher } from "@mam/aws";
import { MamError } from "@mam/core";
import { type EmbeddedBroker, startEmbeddedBroker } from "@mam/local";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type IotStandIn, startIotStandIn } from "../support/aws-peers.ts";
import { countRequests } from "../support/count-requests.ts";
import { rejection } from "../support/rejection.ts";
import { subscribe } from "../support/subscriber.ts";

const SERVICE = { username: "mam-service", password: "s3cret-for-tests" };

let broker: EmbeddedBroker;
let standIn: IotStandIn;
const cleanup: (() => Promise<void> | void)[] = [];

beforeAll(async () => {
  // The broker plays IoT Core's, which takes a 128 KB payload (the embedded default stops at 64 KiB).
  broker = await startEmbeddedBroker({ port: 0, publisherCredentials: SERVICE, maxPacketBytes: IOT_MAX_PAYLOAD_BYTES + 1024 });
  standIn = await startIotStandIn(broker.url, SERVICE);
});
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});
afterAll(async () => {
  await standIn.close();
  await broker.close();
});

function iotClient(endpoint: string, maxAttempts = 3): IoTDataPlaneClient {
  const client = new IoTDataPlaneClient({
    endpoint,
    region: "us-east-1",
    credentials: { accessKeyId: "local", secretAccessKey: "local" },
    maxAttempts,
  });
  cleanup.push(() => client.destroy());
  return client;
}

describe("IotPublisher through the IoT stand-in onto a real broker", () => {
  it("a subscriber receives exactly the payload; the request is POST /topics/<encoded topic>?qos=1", async () => {
    const client = iotClient(standIn.endpoint);
    const counter = countRequests(client);
    const paths: string[] = [];
    client.middlewareStack.add(
      (next) => async (args) => {
        const req = args.request as { method: string; path: string; query?: Record<string, string> };
        paths.push(`${req.method} ${req.path}?${new URLSearchParams(req.query ?? {}).toString()}`);
        return next(args);
      },
      { step: "deserialize", name: "capturePath" },
    );
    const publisher = new IotPublisher({ client });
    const topic = "mam/jobs/job-1/events";
    const sub = await subscribe(broker.url, topic);
    cleanup.push(() => sub.close());
    const payload = JSON.stringify({ event: "completed", job_id: "job-1", seq: 3, data: { note: "ünïcode ✓" } });

    await publisher.publish(topic, payload);

    expect(await sub.next()).toEqual({ topic, payload });
    expect(counter.byCommand).toEqual({ PublishCommand: 1 });
    expect(paths).toEqual(["POST /topics/mam%2Fjobs%2Fjob-1%2Fevents?qos=1"]);
  });

  it("a payload of exactly 128 KB goes through", async () => {
    const publisher = new IotPublisher({ client: iotClient(standIn.endpoint) });
    const topic = "mam/jobs/job-max/events";
    const sub = await subscribe(broker.url, topic);
    cleanup.push(() => sub.close());
    const payload = "x".repeat(IOT_MAX_PAYLOAD_BYTES);
    await publisher.publish(topic, payload);
    expect((await sub.next()).payload.length).toBe(IOT_MAX_PAYLOAD_BYTES);
  });

  it("a payload over 128 KB (UTF-8 bytes, not characters) is publish.tooLarge with no request made", async () => {
    const client = iotClient(standIn.endpoint);
    const counter = countRequests(client);
    const publisher = new IotPublisher({ client });
    for (const payload of ["x".repeat(IOT_MAX_PAYLOAD_BYTES + 1), "é".repeat(IOT_MAX_PAYLOAD_BYTES / 2 + 1)]) {
      const err = await rejection(publisher.publish("mam/jobs/big/events", payload));
      expect(err).toBeInstanceOf(MamError);
      expect((err as MamError).code).toBe("publish.tooLarge");
      expect((err as MamError).retryable).toBe(false);
    }
    expect(counter.total).toBe(0);
  });

  it("the stand-in itself answers 413 to a body over 128 KB, as IoT Core does", async () => {
    const res = await fetch(`${standIn.endpoint}/topics/${encodeURIComponent("mam/jobs/x/events")}?qos=1`, {
      method: "POST",
      body: Buffer.alloc(IOT_MAX_PAYLOAD_BYTES + 1, 1),
    });
    expect(res.status).toBe(413);
    expect(res.headers.get("x-amzn-errortype")).toBe("RequestEntityTooLargeException");
  });

  it("a publish the broker refuses (no right to publish under mam/) is publish.refused, and nothing is delivered", async () => {
    const noRights = await startIotStandIn(broker.url);
    cleanup.push(() => noRights.close());
    const topic = "mam/jobs/spoof/events";
    const sub = await subscribe(broker.url, topic);
    cleanup.push(() => sub.close());
    const err = await rejection(new IotPublisher({ client: iotClient(noRights.endpoint) }).publish(topic, "spoofed"));
    expect((err as MamError).code).toBe("publish.refused");
    await new IotPublisher({ client: iotClient(standIn.endpoint) }).publish(topic, "real");
    expect(await sub.next()).toEqual({ topic, payload: "real" });
  });

  it("a broker that is down makes the stand-in answer 503: publish.unreachable", async () => {
    const down = await startEmbeddedBroker({ port: 0 });
    const url = down.url;
    await down.close();
    const orphan = await startIotStandIn(url);
    cleanup.push(() => orphan.close());
    const err = await rejection(new IotPublisher({ client: iotClient(orphan.endpoint) }).publish("mam/jobs/x/events", "{}"));
    expect((err as MamError).code).toBe("publish.unreachable");
    expect((err as MamError).details.httpStatus).toBe(503);
  });

  it("an endpoint nobody listens on is publish.unreachable", async () => {
    const server = http.createServer();
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as AddressInfo).port;
    await new Promise<void>((r) => server.close(() => r()));
    const err = await rejection(new IotPublisher({ client: iotClient(`http://127.0.0.1:${port}`) }).publish("mam/jobs/x/events", "{}"));
    expect((err as MamError).code).toBe("publish.unreachable");
  });

  it("an endpoint that never answers is publish.unreachable within the bounded time", async () => {
    const sockets = new Set<import("node:net").Socket>();
    const silent = http.createServer(() => undefined);
    silent.on("connection", (s) => sockets.add(s));
    await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
    cleanup.push(
      () =>
        new Promise<void>((r) => {
          for (const s of sockets) s.destroy();
          silent.close(() => r());
        }),
    );
    const endpoint = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    const publisher = new IotPublisher({ client: iotClient(endpoint), timeoutMs: 300 });
    const started = Date.now();
    const err = await rejection(publisher.publish("mam/jobs/x/events", "{}"));
    expect((err as MamError).code).toBe("publish.unreachable");
    expect(Date.now() - started).toBeLessThan(3000);
  });

  it("a wildcard topic is refused before any request", async () => {
    const client = iotClient(standIn.endpoint);
    const counter = countRequests(client);
    const err = await rejection(new IotPublisher({ client }).publish("mam/jobs/+/events", "{}"));
    expect((err as MamError).code).toBe("publish.refused");
    expect(counter.total).toBe(0);
  });

  it("can be built from an endpoint and region (the Lambda's configuration)", async () => {
    const topic = "mam/jobs/configured/events";
    const sub = await subscribe(broker.url, topic);
    cleanup.push(() => sub.close());
    const prev = { id: process.env.AWS_ACCESS_KEY_ID, secret: process.env.AWS_SECRET_ACCESS_KEY };
    // The default credential chain reads the environment, as it would in a Lambda.
    process.env.AWS_ACCESS_KEY_ID = "local";
    process.env.AWS_SECRET_ACCESS_KEY = "local";
    try {
      const publisher = new IotPublisher({ endpoint: standIn.endpoint, region: "us-east-1" });
      await publisher.publish(topic, "hello");
      await publisher.close();
    } finally {
      if (prev.id === undefined) delete process.env.AWS_ACCESS_KEY_ID;
      else process.env.AWS_ACCESS_KEY_ID = prev.id;
      if (prev.secret === undefined) delete process.env.AWS_SECRET_ACCESS_KEY;
      else process.env.AWS_SECRET_ACCESS_KEY = prev.secret;
    }
    expect(await sub.next()).toEqual({ topic, payload: "hello" });
  });
});
