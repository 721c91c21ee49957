/**
 * A reference point for bench/bundles.ts, not its baseline: the least a function of
 * this shape can do with the AWS SDK. hono/aws-lambda answering `GET /v1/jobs/:id`
 * with one consistent GetItem through @aws-sdk/lib-dynamodb (as the DynamoJobStore
 * reads a record), the client built on the first request as functions/compose.ts
 * builds its own. Bundled with the same esbuild options as the functions, so its
 * cold start shows what the SDK alone costs next to the hello world.
 */
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { DynamoDBDocumentClient, GetCommand } from "@aws-sdk/lib-dynamodb";
import { Hono } from "hono";
import { handle } from "hono/aws-lambda";

let documents: DynamoDBDocumentClient | undefined;

const app = new Hono().get("/v1/jobs/:id", async (c) => {
  const endpoint = process.env.MAM_DYNAMODB_ENDPOINT;
  documents ??= DynamoDBDocumentClient.from(
    new DynamoDBClient({ region: process.env.AWS_REGION ?? "us-east-1", ...(endpoint ? { endpoint } : {}) }),
  );
  const out = await documents.send(
    new GetCommand({ TableName: process.env.MAM_TABLE_NAME, Key: { pk: `JOB#${c.req.param("id")}`, sk: "JOB" }, ConsistentRead: true }),
  );
  if (out.Item === undefined) return c.json({ status: 404 }, 404);
  const { pk: _pk, sk: _sk, ...record } = out.Item;
  return c.json(record);
});

export const handler = handle(app);
