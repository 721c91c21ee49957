import { randomBytes } from "node:crypto";
import { DeleteTableCommand } from "@aws-sdk/client-dynamodb";
import { IoTDataPlaneClient } from "@aws-sdk/client-iot-data-plane";
import { CreateBucketCommand, GetObjectTaggingCommand, ListObjectsV2Command } from "@aws-sdk/client-s3";
import { createJobTable, DynamoJobStore, IotPublisher, RETIRED_TAG, S3ReportStore } from "@mam/aws";
import type { JobStore } from "@mam/core";
import { type EmbeddedBroker, startEmbeddedBroker } from "@mam/local";
import { type DynamoPeer, type IotStandIn, type S3rverPeer, startDynamoPeer, startIotStandIn, startS3rver } from "./aws-peers.ts";
import { deadPort } from "./dead-port.ts";

/**
 * The cloud backend, on real local peers, for suites written once for every
 * backend: a DynamoDB engine (dynalite, or DynamoDB Local with
 * `MAM_DYNAMODB_PEER=dynamodb-local`: `dynamo.engine` says which), s3rver (S3's API), and IoT Core's publish API
 * through the HTTP stand-in onto an aedes broker that subscribers read.
 * One set of peers per test file; each `ports()` call gets a table and a bucket of
 * its own, so every test starts empty.
 */
export interface AwsPeers {
  readonly dynamo: DynamoPeer;
  readonly s3: S3rverPeer;
  readonly broker: EmbeddedBroker;
  readonly standIn: IotStandIn;
  /**
   * The broker refuses a publish to any topic in any of these sets (the stand-in then
   * answers 403, `publish.refused`): a suite adds its own set and removes it when done.
   */
  readonly refusing: Set<ReadonlySet<string>>;
  ports(opts?: { publisher?: "working" | "unreachable"; refusedTopics?: ReadonlySet<string> }): Promise<AwsPorts>;
  close(): Promise<void>;
}

export interface AwsPorts {
  /** The job store as functions/compose.ts composes it: core's guard in front of the adapter. */
  readonly jobs: JobStore;
  /** The adapter behind no guard, to plant what no caller of the port could write (a legacy or corrupt item). */
  readonly unguardedJobs: DynamoJobStore;
  readonly reports: S3ReportStore;
  readonly publisher: IotPublisher;
  readonly tableName: string;
  readonly bucket: string;
  close(): Promise<void>;
}

let counter = 0;

export async function startAwsPeers(): Promise<AwsPeers> {
  const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  const refusing = new Set<ReadonlySet<string>>();
  const [dynamo, s3, broker] = await Promise.all([
    startDynamoPeer(),
    startS3rver(),
    startEmbeddedBroker({
      port: 0,
      publisherCredentials: credentials,
      refusePublish: (topic) => [...refusing].some((topics) => topics.has(topic)),
    }),
  ]);
  // IoT Core's own right to publish under mam/ is the stand-in's broker credentials.
  const standIn = await startIotStandIn(broker.url, credentials);
  return {
    dynamo,
    s3,
    broker,
    standIn,
    refusing,
    async ports(opts = {}) {
      const refused = opts.refusedTopics;
      if (refused !== undefined) refusing.add(refused);
      const n = `${process.pid}-${++counter}`;
      const tableName = `mam-${n}`;
      const bucket = `mam-${n}`;
      await Promise.all([createJobTable(dynamo.client, tableName), s3.client.send(new CreateBucketCommand({ Bucket: bucket }))]);
      const endpoint = opts.publisher === "unreachable" ? `http://127.0.0.1:${await deadPort()}` : standIn.endpoint;
      const iot = new IoTDataPlaneClient({
        endpoint,
        region: "us-east-1",
        credentials: { accessKeyId: "local", secretAccessKey: "local" },
      });
      const unguardedJobs = new DynamoJobStore({ client: dynamo.client, tableName, transactions: !dynamo.gaps.noTransactions });
      return {
        jobs: unguardedJobs,
        unguardedJobs,
        reports: new S3ReportStore({ client: s3.client, bucket }),
        publisher: new IotPublisher({ client: iot }),
        tableName,
        bucket,
        async close() {
          if (refused !== undefined) refusing.delete(refused);
          iot.destroy();
          await dynamo.client.send(new DeleteTableCommand({ TableName: tableName }));
        },
      };
    },
    async close() {
      await standIn.close();
      await broker.close();
      await Promise.all([dynamo.close(), s3.close()]);
    },
  };
}

/**
 * The objects under an attempt's evidence prefix, each with whether it carries the
 * retire tag. S3 never removes a retired copy itself (the functions may not delete
 * evidence): it tags it, and the bucket's lifecycle rule expires it. s3rver keeps
 * tags but runs no lifecycle rule, so here a retired copy is shown tagged, never gone.
 */
export async function taggedObjects(
  peers: AwsPeers,
  ports: { readonly bucket: string },
  evidence: string,
): Promise<{ name: string; retired: boolean }[]> {
  const listed = await peers.s3.client.send(new ListObjectsV2Command({ Bucket: ports.bucket, Prefix: `${evidence}/` }));
  return Promise.all(
    (listed.Contents ?? []).map(async (o) => {
      const key = o.Key as string;
      const tags = await peers.s3.client.send(new GetObjectTaggingCommand({ Bucket: ports.bucket, Key: key }));
      const retired = (tags.TagSet ?? []).some((t) => t.Key === RETIRED_TAG.Key && t.Value === RETIRED_TAG.Value);
      return { name: key.slice(evidence.length + 1), retired };
    }),
  );
}
