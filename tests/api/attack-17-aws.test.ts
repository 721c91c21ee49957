import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, type AwsPorts, startAwsPeers, taggedObjects } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import { apiAttack17Suite } from "./attack-17.suite.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

apiAttack17Suite(
  `the AWS adapters (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver)`,
  (opts) => peers.ports(opts),
  (ports, evidence) => taggedObjects(peers, ports as unknown as AwsPorts, evidence),
);
