import { randomBytes } from "node:crypto";
import { mkdir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import type { JobStore } from "@mam/core";
import { FileReportStore, MqttPublisher, openEmbeddedJobStore, startEmbeddedBroker } from "@mam/local";
import { deadPort } from "./dead-port.ts";
import { tempDir } from "./temp-dir.ts";

/**
 * The embedded backend for the API suites: SQLite in a temp dir, the file report
 * store under a directory of its own (so a walk of it sees report bytes only, never
 * the database's -wal and -shm), and an aedes broker on a free loopback port.
 */
export interface LocalPorts {
  readonly jobs: JobStore;
  readonly reports: FileReportStore;
  readonly publisher: MqttPublisher;
  /** The database file, for a second, read-only connection. */
  readonly dbFile: string;
  /** The report store's root. */
  readonly reportRoot: string;
  close(): Promise<void>;
}

export async function localPorts(opts: { publisher: "working" | "unreachable"; refusedTopics?: ReadonlySet<string> }): Promise<LocalPorts> {
  const dir = (await tempDir("api")).dir;
  const dbFile = path.join(dir, "mam.db");
  const reportRoot = path.join(dir, "store");
  await mkdir(reportRoot, { recursive: true });
  // As `mam serve` composes it: core's guard, the record cache, SQLite.
  const { jobs, close: closeJobs } = openEmbeddedJobStore(dbFile);
  // The service derives every location (reports/<job>/<attempt>) and refuses absolute ones.
  const reports = new FileReportStore(reportRoot, { allowAbsolute: false });
  const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  const refusedTopics = opts.refusedTopics;
  const broker = await startEmbeddedBroker({
    port: 0,
    publisherCredentials: credentials,
    refusePublish: (topic) => refusedTopics?.has(topic) ?? false,
  });
  const pub =
    opts.publisher === "working"
      ? new MqttPublisher({ url: broker.url, ...credentials })
      : new MqttPublisher({ url: `mqtt://127.0.0.1:${await deadPort()}`, ...credentials, connectTimeoutMs: 500 });
  return {
    jobs,
    reports,
    publisher: pub,
    dbFile,
    reportRoot,
    async close() {
      await pub.close();
      await broker.close();
      await closeJobs();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** The files under an attempt's evidence directory (`reports/<job>/<attempt>/evidence`): the file store removes what it retires, so none is ever marked retired. */
export async function pinnedFiles(ports: { readonly reportRoot: string }, evidence: string): Promise<{ name: string; retired: boolean }[]> {
  const dir = path.join(ports.reportRoot, ...evidence.split("/"));
  const names = await readdir(dir).catch((e: NodeJS.ErrnoException) => {
    if (e.code === "ENOENT") return [];
    throw e;
  });
  return names.map((name) => ({ name, retired: false }));
}
