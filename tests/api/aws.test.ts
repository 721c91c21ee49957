import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { apiBoundsSuite } from "./bounds.suite.ts";
import { apiRoutesSuite } from "./routes.suite.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

apiRoutesSuite("the AWS adapters (DynamoDB on dynalite, S3 on s3rver, IoT Core through the stand-in)", (opts) => peers.ports(opts));
apiBoundsSuite("the AWS adapters (DynamoDB on dynalite, S3 on s3rver, IoT Core through the stand-in)", (opts) => peers.ports(opts));
