import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import { apiObservationSuite } from "./observations.suite.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

apiObservationSuite(`the AWS adapters (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver, IoT Core through the stand-in)`, (opts) =>
  peers.ports(opts),
);
