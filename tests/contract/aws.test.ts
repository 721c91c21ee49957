import { randomBytes } from "node:crypto";
import { DeleteTableCommand } from "@aws-sdk/client-dynamodb";
import { IoTDataPlaneClient } from "@aws-sdk/client-iot-data-plane";
import { CreateBucketCommand, GetObjectTaggingCommand } from "@aws-sdk/client-s3";
import { createJobTable, DynamoJobStore, IotPublisher, RETIRED_TAG, S3ReportStore } from "@mam/aws";
import { startEmbeddedBroker } from "@mam/local";
import { afterAll, beforeAll } from "vitest";
import { DYNAMODB_PEER, type DynamoPeer, type S3rverPeer, startDynamoPeer, startIotStandIn, startS3rver } from "../support/aws-peers.ts";
import { deadPort } from "../support/dead-port.ts";
import { subscribe } from "../support/subscriber.ts";
import { jobStoreContract } from "./job-store.suite.ts";
import { publisherContract } from "./publisher.suite.ts";
import { reportStoreContract } from "./report-store.suite.ts";

// One DynamoDB peer (dynalite, or DynamoDB Local: MAM_DYNAMODB_PEER) and one s3rver
// for the file; every store the suites make gets a table (or bucket) of its own, so
// each test starts empty.
let dynamo: DynamoPeer;
let s3: S3rverPeer;
let seq = 0;

beforeAll(async () => {
  [dynamo, s3] = await Promise.all([startDynamoPeer(), startS3rver()]);
});
afterAll(async () => {
  await Promise.all([dynamo?.close(), s3?.close()]);
});

// ---------------------------------------------------------------- JobStore

jobStoreContract(`DynamoDB (${DYNAMODB_PEER})`, async () => {
  const tableName = `mam-contract-${++seq}`;
  await createJobTable(dynamo.client, tableName);
  return {
    store: new DynamoJobStore({ client: dynamo.client, tableName, transactions: !dynamo.gaps.noTransactions }),
    async close() {
      await dynamo.client.send(new DeleteTableCommand({ TableName: tableName }));
    },
  };
});

// ---------------------------------------------------------------- ReportStore

reportStoreContract(
  "S3 (s3rver)",
  async () => {
    const bucket = `mam-contract-${++seq}`;
    await s3.client.send(new CreateBucketCommand({ Bucket: bucket }));
    return { store: new S3ReportStore({ client: s3.client, bucket }), close: async () => undefined };
  },
  {
    uploadUrl: true,
    copy: true,
    // s3rver keeps object tags (GetObjectTagging answers what PutObjectTagging set) but
    // applies no lifecycle rule: the mark is shown here, the expiry only by the template.
    retire: {
      removes: false,
      async retired(location, name) {
        const bucket = `mam-contract-${seq}`;
        const out = await s3.client.send(new GetObjectTaggingCommand({ Bucket: bucket, Key: `${location}/${name}` }));
        return (out.TagSet ?? []).some((t) => t.Key === RETIRED_TAG.Key && t.Value === RETIRED_TAG.Value);
      },
    },
  },
);

// ---------------------------------------------------------------- Publisher

publisherContract("IoT Core data plane (HTTPS stand-in onto aedes)", async () => {
  const credentials = { username: "mam-service", password: randomBytes(16).toString("hex") };
  const broker = await startEmbeddedBroker({ port: 0, publisherCredentials: credentials });
  // IoT Core's own right to publish under mam/ is the stand-in's broker credentials.
  const standIn = await startIotStandIn(broker.url, credentials);
  const clients: IoTDataPlaneClient[] = [];
  const publisherAt = (endpoint: string): IotPublisher => {
    const client = new IoTDataPlaneClient({
      endpoint,
      region: "us-east-1",
      credentials: { accessKeyId: "local", secretAccessKey: "local" },
    });
    clients.push(client);
    return new IotPublisher({ client });
  };
  const extraStandIns: { close(): Promise<void> }[] = [];
  return {
    publisher: publisherAt(standIn.endpoint),
    subscribe: (topic) => subscribe(broker.url, topic),
    unreachable: async () => publisherAt(`http://127.0.0.1:${await deadPort()}`),
    // A data plane without the right to publish under mam/: the broker refuses, IoT answers 403.
    refusing: async () => {
      const unauthorised = await startIotStandIn(broker.url);
      extraStandIns.push(unauthorised);
      return publisherAt(unauthorised.endpoint);
    },
    async close() {
      for (const c of clients) c.destroy();
      for (const s of extraStandIns) await s.close();
      await standIn.close();
      await broker.close();
    },
  };
});
