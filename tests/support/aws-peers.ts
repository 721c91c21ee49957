/**
 * Real local peers for the AWS adapters: a DynamoDB engine (dynalite by default, AWS's
 * own DynamoDB Local with `MAM_DYNAMODB_PEER=dynamodb-local`), s3rver (S3) and a small
 * stand-in for IoT Core's HTTPS data plane that republishes onto a real MQTT broker.
 * Each listens on a free loopback port and has a `close()`; tests start and stop them
 * themselves. Every test that needs DynamoDB starts it through `startDynamoPeer`, so
 * the switch reaches all of them.
 *
 * What the peers do not do (measured, see the tests that state it):
 * - dynalite: see `DYNAMO_GAPS` (tests/aws/dynamo-peer.test.ts states each gap on
 *   the engine it runs on).
 * - DynamoDB Local: none of dynalite's gaps; what neither shows is in docs/adapters.md.
 * - s3rver: ignores `x-amz-checksum-*` (a wrong ChecksumSHA256 is stored anyway)
 *   and `If-None-Match`.
 * - the IoT stand-in checks no SigV4 signature.
 */
import { rm } from "node:fs/promises";
import type http from "node:http";
import { createRequire } from "node:module";
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { DynamoDBStreamsClient } from "@aws-sdk/client-dynamodb-streams";
import type { S3Client } from "@aws-sdk/client-s3";
import { createS3Client } from "@mam/aws";
import { type DynamoDbLocal, startDynamoDbLocal } from "../../scripts/peers/dynamodb-local.ts";
import { closeServer, listen } from "../../scripts/peers/iot-stand-in.ts";
import { tempDir } from "./temp-dir.ts";
import { TEST_ENV } from "./test-env.ts";

export { type IotStandIn, type IotStandInOptions, startIotStandIn } from "../../scripts/peers/iot-stand-in.ts";

import { loadS3rver } from "../../scripts/peers/s3rver.ts";

const require = createRequire(import.meta.url);

/** dynalite ships no types; this is the part of it we use. */
type DynaliteFactory = (options: { createTableMs: number; deleteTableMs: number; updateTableMs: number }) => http.Server;
const REGION = "us-east-1";

/** The DynamoDB engines a test can run on. */
export type DynamoEngine = "dynalite" | "dynamodb-local";

/** Where an engine differs from DynamoDB, measured (tests/aws/dynamo-peer.test.ts pins each). */
export interface DynamoGaps {
  /** `ReturnValuesOnConditionCheckFailure: ALL_OLD` is ignored: a failed condition comes back with no `Item`. */
  readonly noItemOnConditionFailure: boolean;
  /** A StreamSpecification is accepted and no stream is kept: no `LatestStreamArn`, nothing to read. */
  readonly noStreams: boolean;
  /** `TransactWriteItems` is an unknown operation. */
  readonly noTransactions: boolean;
  /** `UpdateTable` cannot add a global secondary index to a table that exists (it answers an error, the table unchanged). */
  readonly noIndexCreation: boolean;
}

/**
 * Both engines refuse a table name DynamoDB refuses (too short, too long, a character
 * outside `[a-zA-Z0-9_.-]`), each with its own message: not a gap of either.
 */
export const DYNAMO_GAPS: Readonly<Record<DynamoEngine, DynamoGaps>> = {
  dynalite: { noItemOnConditionFailure: true, noStreams: true, noTransactions: true, noIndexCreation: true },
  "dynamodb-local": { noItemOnConditionFailure: false, noStreams: false, noTransactions: false, noIndexCreation: false },
};

export interface DynamoPeer {
  /** Which engine answers: tests state per engine what they observe, from this and `gaps`. */
  readonly engine: DynamoEngine;
  readonly gaps: DynamoGaps;
  readonly endpoint: string;
  /** A client of this handle's own (so a request counter on it counts this user's requests only). */
  readonly client: DynamoDBClient;
  /** DynamoDB Streams' API at the same endpoint; undefined on an engine that keeps no stream. */
  readonly streams: DynamoDBStreamsClient | undefined;
  close(): Promise<void>;
}

/** The engine `MAM_DYNAMODB_PEER` names (dynalite unless set), read once by test-env.ts. */
export const DYNAMODB_PEER: DynamoEngine = TEST_ENV.MAM_DYNAMODB_PEER;

const localCredentials = { accessKeyId: "local", secretAccessKey: "local" };

/** dynalite in this process, in memory, tables ACTIVE at once. */
export async function startDynalite(): Promise<DynamoPeer> {
  const dynalite = require("dynalite") as DynaliteFactory;
  const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  const port = await listen(server);
  const endpoint = `http://127.0.0.1:${port}`;
  const client = new DynamoDBClient({ endpoint, region: REGION, credentials: localCredentials });
  return {
    engine: "dynalite",
    gaps: DYNAMO_GAPS.dynalite,
    endpoint,
    client,
    streams: undefined,
    async close() {
      client.destroy();
      await closeServer(server);
    },
  };
}

/**
 * The file's DynamoDB Local: started by the first handle that asks, shared by every
 * handle open at once (each with clients of its own), stopped when the last closes.
 * A test file runs in a process of its own, so this is one JVM per file.
 */
let sharedLocal: { readonly started: Promise<DynamoDbLocal>; users: number } | undefined;

/** How long each DynamoDB Local start took here, in ms (a test file may print it). */
export const dynamoDbLocalStartsMs: number[] = [];

async function startTimedDynamoDbLocal(): Promise<DynamoDbLocal> {
  const t0 = performance.now();
  const local = await startDynamoDbLocal();
  const ms = Math.round(performance.now() - t0);
  dynamoDbLocalStartsMs.push(ms);
  // One line per file in the tier's output: the start time the tier pays per file.
  console.log(`[dynamodb-local] started on ${local.endpoint} in ${ms} ms`);
  return local;
}

async function dynamoDbLocalHandle(): Promise<DynamoPeer> {
  if (sharedLocal === undefined) {
    const started = startTimedDynamoDbLocal();
    sharedLocal = { started, users: 0 };
    // A start that failed is not kept: the next handle tries again.
    started.catch(() => {
      if (sharedLocal?.started === started) sharedLocal = undefined;
    });
  }
  const shared = sharedLocal;
  shared.users++;
  let local: DynamoDbLocal;
  try {
    local = await shared.started;
  } catch (e) {
    shared.users--;
    throw e;
  }
  const endpoint = local.endpoint;
  const release = async (): Promise<void> => {
    if (--shared.users > 0) return;
    if (sharedLocal === shared) sharedLocal = undefined;
    await local.close();
  };
  const client = new DynamoDBClient({ endpoint, region: REGION, credentials: localCredentials });
  const streams = new DynamoDBStreamsClient({ endpoint, region: REGION, credentials: localCredentials });
  let closed = false;
  return {
    engine: "dynamodb-local",
    gaps: DYNAMO_GAPS["dynamodb-local"],
    endpoint,
    client,
    streams,
    async close() {
      if (closed) return;
      closed = true;
      client.destroy();
      streams.destroy();
      await release();
    },
  };
}

/**
 * A DynamoDB peer on the engine `MAM_DYNAMODB_PEER` names: every test that needs
 * DynamoDB starts it here. On dynalite each call is a server of its own (in-process,
 * instant); on DynamoDB Local the handles open at once in one file share one JVM
 * (2.6 to 14 s to start here, by the machine's load), each with clients of its own.
 * Callers keep their table names apart: a shared instance holds every handle's tables.
 */
export function startDynamoPeer(): Promise<DynamoPeer> {
  return DYNAMODB_PEER === "dynalite" ? startDynalite() : dynamoDbLocalHandle();
}

export interface S3rverPeer {
  readonly endpoint: string;
  readonly client: S3Client;
  readonly bucket: string;
  close(): Promise<void>;
}

/** s3rver over a fresh temporary directory, silent, with one bucket created. */
export async function startS3rver(bucket = "mam-reports"): Promise<S3rverPeer> {
  const S3rver = loadS3rver();
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
