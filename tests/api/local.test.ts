import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import { deadPort } from "../support/dead-port.ts";
import { apiBoundsSuite } from "./bounds.suite.ts";
import { apiRoutesSuite, type PortsFactory } from "./routes.suite.ts";

const localPorts: PortsFactory = async ({ publisher, refusedTopics }) => {
  const dir = await mkdtemp(path.join(tmpdir(), "mam-api-"));
  // As `mam serve` composes it: core's guard, the record cache, SQLite.
  const { jobs, close: closeJobs } = openEmbeddedJobStore(path.join(dir, "mam.db"));
  // The service derives every location (reports/<job>/<attempt>) and refuses absolute ones.
  const reports = new FileReportStore(dir, { allowAbsolute: false });
  const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  const broker = await startEmbeddedBroker({
    port: 0,
    publisherCredentials: credentials,
    refusePublish: (topic) => refusedTopics?.has(topic) ?? false,
  });
  const pub =
    publisher === "working"
      ? new MqttPublisher({ url: broker.url, ...credentials })
      : new MqttPublisher({ url: `mqtt://127.0.0.1:${await deadPort()}`, ...credentials, connectTimeoutMs: 500 });
  return {
    jobs,
    reports,
    publisher: pub,
    async close() {
      await pub.close();
      await broker.close();
      await closeJobs();
      await rm(dir, { recursive: true, force: true });
    },
  };
};

apiRoutesSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);
apiBoundsSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);
