/** A racer with its own DynamoDB client to the shared endpoint (see racer.ts). */
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { DynamoJobStore } from "@mam/aws";
import { runRacer } from "./racer.ts";

runRacer((target) => {
  if (target.backend !== "dynamodb") throw new Error(`racer-dynamodb got a ${target.backend} target`);
  const client = new DynamoDBClient({
    endpoint: target.endpoint,
    region: "us-east-1",
    credentials: { accessKeyId: "local", secretAccessKey: "local" },
  });
  // As functions/compose.ts composes it: core's guard in front of the adapter.
  return { jobs: new DynamoJobStore({ client, tableName: target.tableName }), close: async () => client.destroy() };
});
