import { CreateTableCommand, type CreateTableCommandInput, DescribeTableCommand, type DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { storeFailure } from "./sdk-errors.ts";
import { JOB_TABLE_DEFINITION } from "./table-definition.ts";
import { migrateJobTable } from "./table-migrations.ts";

export { JOB_TABLE_DEFINITION, JOB_TABLE_INDEX } from "./table-definition.ts";

/**
 * Create the job table (PAY_PER_REQUEST, the keys and indexes of `JOB_TABLE_DEFINITION`, table-definition.ts; a stream of new
 * and old images) and wait until it and its indexes are ACTIVE. An existing table of
 * that name is left as it is (idempotent start-up for local runs and tests); a table
 * made here is stamped at this code's schema version (`table-migrations.ts`).
 *
 * dynalite accepts the StreamSpecification but keeps no stream: locally the change
 * relay stands in for it.
 */
export async function createJobTable(client: DynamoDBClient, tableName: string, opts: { timeoutMs?: number } = {}): Promise<void> {
  const def = JOB_TABLE_DEFINITION;
  const input: CreateTableCommandInput = {
    TableName: tableName,
    BillingMode: def.BillingMode,
    AttributeDefinitions: def.AttributeDefinitions.map((a) => ({ ...a })),
    KeySchema: def.KeySchema.map((k) => ({ ...k })),
    GlobalSecondaryIndexes: def.GlobalSecondaryIndexes.map((g) => ({
      IndexName: g.IndexName,
      KeySchema: g.KeySchema.map((k) => ({ ...k })),
      Projection: { ...g.Projection },
    })),
    StreamSpecification: { StreamEnabled: true, StreamViewType: def.StreamSpecification.StreamViewType },
  };
  let created = false;
  try {
    await client.send(new CreateTableCommand(input));
    created = true;
  } catch (err) {
    if ((err as { name?: string }).name !== "ResourceInUseException") throw storeFailure(err, `create table ${tableName}`);
  }
  const deadline = Date.now() + (opts.timeoutMs ?? 300_000);
  for (;;) {
    try {
      const { Table } = await client.send(new DescribeTableCommand({ TableName: tableName }));
      const indexesActive = (Table?.GlobalSecondaryIndexes ?? []).every((g) => g.IndexStatus === "ACTIVE");
      if (Table?.TableStatus === "ACTIVE" && indexesActive) break;
    } catch (err) {
      if ((err as { name?: string }).name !== "ResourceNotFoundException") throw storeFailure(err, `describe table ${tableName}`);
    }
    if (Date.now() > deadline) throw storeFailure(new Error("table did not become ACTIVE in time"), `create table ${tableName}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  // A table made here is at this code's schema version; one that existed keeps its own.
  if (created) await migrateJobTable({ client, tableName }, { run: "all" });
}
