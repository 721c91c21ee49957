import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, type AwsPorts, startAwsPeers, taggedObjects } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import { apiPinnedCopiesSuite } from "./pins.suite.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

apiPinnedCopiesSuite(
  `the AWS adapters (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver, IoT Core through the stand-in)`,
  (opts) => peers.ports(opts),
  (ports, evidence) => taggedObjects(peers, ports as unknown as AwsPorts, evidence),
);
