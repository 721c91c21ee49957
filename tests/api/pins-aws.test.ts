import { GetObjectTaggingCommand, ListObjectsV2Command } from "@aws-sdk/client-s3";
import { RETIRED_TAG } from "@mam/aws";
import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, type AwsPorts, startAwsPeers } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import type { ApiPorts } from "./harness.ts";
import { apiPinnedCopiesSuite } from "./pins.suite.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

/**
 * The objects under the attempt's evidence prefix, each with whether it carries the
 * retire tag. S3 never removes a retired copy itself (the functions may not delete
 * evidence): it tags it, and the bucket's lifecycle rule expires it. s3rver keeps
 * tags but runs no lifecycle rule, so here a retired copy is shown tagged, never gone.
 */
async function taggedObjects(ports: ApiPorts, evidence: string) {
  const { bucket } = ports as unknown as AwsPorts;
  const listed = await peers.s3.client.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: `${evidence}/` }));
  return Promise.all(
    (listed.Contents ?? []).map(async (o) => {
      const key = o.Key as string;
      const tags = await peers.s3.client.send(new GetObjectTaggingCommand({ Bucket: bucket, Key: key }));
      const retired = (tags.TagSet ?? []).some((t) => t.Key === RETIRED_TAG.Key && t.Value === RETIRED_TAG.Value);
      return { name: key.slice(evidence.length + 1), retired };
    }),
  );
}

apiPinnedCopiesSuite(
  `the AWS adapters (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver, IoT Core through the stand-in)`,
  (opts) => peers.ports(opts),
  taggedObjects,
);
