/**
 * Real local peers for the AWS adapters: dynalite (DynamoDB), s3rver (S3) and a
 * small stand-in for IoT Core's HTTPS data plane that republishes onto a real MQTT
 * broker. Each listens on a free loopback port and has a `close()`; tests start and
 * stop them themselves.
 *
 * What the peers do not do (measured, see the tests that state it):
 * - dynalite: no TransactWriteItems, no Streams (it accepts a StreamSpecification
 *   and keeps no stream), no `Item` on a failed condition
 *   (`ReturnValuesOnConditionCheckFailure` is ignored).
 * - s3rver: ignores `x-amz-checksum-*` (a wrong ChecksumSHA256 is stored anyway)
 *   and `If-None-Match`.
 * - the IoT stand-in checks no SigV4 signature.
 */
import { rm } from "node:fs/promises";
import type http from "node:http";
import { createRequire } from "node:module";
import type { AddressInfo } from "node:net";
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import type { S3Client } from "@aws-sdk/client-s3";
import { createS3Client } from "@mam/aws";
import { tempDir } from "./temp-dir.ts";

export { type IotStandIn, type IotStandInOptions, startIotStandIn } from "../../scripts/peers/iot-stand-in.ts";

const require = createRequire(import.meta.url);

/** Neither dynalite nor s3rver ships types; this is the part of them we use. */
type DynaliteFactory = (options: { createTableMs: number; deleteTableMs: number; updateTableMs: number }) => http.Server;
interface S3rverInstance {
  run(): Promise<AddressInfo>;
  close(): Promise<void>;
}
type S3rverClass = new (options: {
  port: number;
  address: string;
  silent: boolean;
  directory: string;
  configureBuckets: { name: string; configs: string[] }[];
}) => S3rverInstance;

const REGION = "us-east-1";

function listen(server: http.Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

function closeServer(server: http.Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections?.();
  });
}

export interface DynalitePeer {
  readonly endpoint: string;
  readonly client: DynamoDBClient;
  close(): Promise<void>;
}

/** dynalite in this process, in memory, tables ACTIVE at once. */
export async function startDynalite(): Promise<DynalitePeer> {
  const dynalite = require("dynalite") as DynaliteFactory;
  const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  const port = await listen(server);
  const endpoint = `http://127.0.0.1:${port}`;
  const client = new DynamoDBClient({
    endpoint,
    region: REGION,
    credentials: { accessKeyId: "local", secretAccessKey: "local" },
  });
  return {
    endpoint,
    client,
    async close() {
      client.destroy();
      await closeServer(server);
    },
  };
}

export interface S3rverPeer {
  readonly endpoint: string;
  readonly client: S3Client;
  readonly bucket: string;
  close(): Promise<void>;
}

/** s3rver over a fresh temporary directory, silent, with one bucket created. */
export async function startS3rver(bucket = "mam-reports"): Promise<S3rverPeer> {
  const S3rver = require("s3rver") as S3rverClass;
  const directory = (await tempDir("s3rver")).dir;
  const server = new S3rver({
    port: 0,
    address: "127.0.0.1",
    silent: true,
    directory,
    configureBuckets: [{ name: bucket, configs: [] }],
  });
  const { port } = await server.run();
  const endpoint = `http://127.0.0.1:${port}`;
  // s3rver's default credentials; path-style addressing (no bucket subdomains here).
  const client = createS3Client({
    endpoint,
    region: REGION,
    forcePathStyle: true,
    credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" },
  });
  return {
    endpoint,
    client,
    bucket,
    async close() {
      client.destroy();
      await server.close();
      await rm(directory, { recursive: true, force: true });
    },
  };
}
