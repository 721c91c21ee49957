import { DescribeTableCommand, type DynamoDBClient } from "@aws-sdk/client-dynamodb";
import {
  type _Record,
  DescribeStreamCommand,
  type DynamoDBStreamsClient,
  GetRecordsCommand,
  GetShardIteratorCommand,
} from "@aws-sdk/client-dynamodb-streams";
import type { DynamoDBRecord } from "aws-lambda";

/**
 * Lambda's stream poller, stood in for: reads a table's real stream (DynamoDB Local's)
 * from its start, shard by shard, in each shard's order, remembering where each shard
 * was left, and hands each record, in Lambda's shape, to `write` (the feed writer's
 * `writeStreamChanges`).
 */
export class StreamPump {
  readonly #iterators = new Map<string, string | undefined>();
  constructor(
    readonly peer: { readonly client: DynamoDBClient; readonly streams: DynamoDBStreamsClient },
    readonly tableName: string,
    readonly write: (record: DynamoDBRecord) => Promise<number>,
  ) {}

  /** Hand every record not yet pumped to the feed write, in each shard's order; how many rows were written. */
  async pump(): Promise<number> {
    const { client, streams } = this.peer;
    const { Table } = await client.send(new DescribeTableCommand({ TableName: this.tableName }));
    const { StreamDescription } = await streams.send(new DescribeStreamCommand({ StreamArn: Table!.LatestStreamArn! }));
    let written = 0;
    for (const shard of StreamDescription?.Shards ?? []) {
      let iterator = this.#iterators.get(shard.ShardId!);
      if (!this.#iterators.has(shard.ShardId!)) {
        iterator = (
          await streams.send(
            new GetShardIteratorCommand({ StreamArn: Table!.LatestStreamArn!, ShardId: shard.ShardId!, ShardIteratorType: "TRIM_HORIZON" }),
          )
        ).ShardIterator;
      }
      while (iterator !== undefined) {
        const out = await streams.send(new GetRecordsCommand({ ShardIterator: iterator }));
        for (const r of out.Records ?? []) written += await this.write(lambdaShape(r));
        iterator = out.NextShardIterator;
        if ((out.Records ?? []).length === 0) break;
      }
      this.#iterators.set(shard.ShardId!, iterator);
    }
    return written;
  }
}

/** A Streams API record as Lambda hands it over: the creation time in epoch seconds. */
export function lambdaShape(r: _Record): DynamoDBRecord {
  const created = r.dynamodb?.ApproximateCreationDateTime;
  return {
    ...r,
    dynamodb: { ...r.dynamodb, ...(created === undefined ? {} : { ApproximateCreationDateTime: created.getTime() / 1000 }) },
  } as unknown as DynamoDBRecord;
}
