import { GetObjectTaggingCommand, ListObjectsV2Command } from "@aws-sdk/client-s3";
import { RETIRED_TAG } from "@mam/aws";
import { afterAll, beforeAll } from "vitest";
import { type AwsPeers, type AwsPorts, startAwsPeers } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import { apiAttack17Suite } from "./attack-17.suite.ts";
import type { ApiPorts } from "./harness.ts";

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

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

apiAttack17Suite(`the AWS adapters (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver)`, (opts) => peers.ports(opts), taggedObjects);
