import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import { apiBoundsSuite } from "./bounds.suite.ts";
import { apiFinalizeBodySuite } from "./finalize-body.suite.ts";
import { apiResentCompletionSuite } from "./resent.suite.ts";
import { apiRoutesSuite } from "./routes.suite.ts";
import { apiVerificationSuite } from "./verification.suite.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

const TITLE = `the AWS adapters (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver, IoT Core through the stand-in)`;
apiRoutesSuite(TITLE, (opts) => peers.ports(opts));
apiBoundsSuite(TITLE, (opts) => peers.ports(opts));
apiResentCompletionSuite(TITLE, (opts) => peers.ports(opts));
apiFinalizeBodySuite(TITLE, (opts) => peers.ports(opts));
apiVerificationSuite(TITLE, (opts) => peers.ports(opts));
