/**
 * The DynamoDB peer the AWS tests run on, and its gaps as data (`DYNAMO_GAPS` in
 * tests/support/aws-peers.ts): each gap is stated here by what the engine this run
 * uses really does, so a gap that is wrong fails on that engine. `npm test` runs it
 * on dynalite; `npm run test:aws-engine` on AWS's DynamoDB Local.
 */
import {
  ConditionalCheckFailedException,
  CreateTableCommand,
  DescribeTableCommand,
  GetItemCommand,
  ListTablesCommand,
  PutItemCommand,
  TransactWriteItemsCommand,
  UpdateItemCommand,
  UpdateTableCommand,
} from "@aws-sdk/client-dynamodb";
import { DescribeStreamCommand, GetRecordsCommand, GetShardIteratorCommand } from "@aws-sdk/client-dynamodb-streams";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DYNAMO_GAPS, DYNAMODB_PEER, type DynamoPeer, dynamoDbLocalStartsMs, startDynamoPeer } from "../support/aws-peers.ts";
import { rejection } from "../support/rejection.ts";
import { parseTestEnv } from "../support/test-env.ts";

let peer: DynamoPeer;
let seq = 0;

beforeAll(async () => {
  peer = await startDynamoPeer();
});
afterAll(async () => {
  await peer?.close();
});

/** A table keyed by `pk` (string), with a stream of both images asked for. */
async function table(): Promise<string> {
  const name = `peer-gaps-${++seq}`;
  await peer.client.send(
    new CreateTableCommand({
      TableName: name,
      BillingMode: "PAY_PER_REQUEST",
      AttributeDefinitions: [{ AttributeName: "pk", AttributeType: "S" }],
      KeySchema: [{ AttributeName: "pk", KeyType: "HASH" }],
      StreamSpecification: { StreamEnabled: true, StreamViewType: "NEW_AND_OLD_IMAGES" },
    }),
  );
  return name;
}

describe(`the DynamoDB peer (${DYNAMODB_PEER})`, () => {
  it("is the engine MAM_DYNAMODB_PEER names, with that engine's gaps", () => {
    expect(peer.engine).toBe(DYNAMODB_PEER);
    expect(peer.gaps).toEqual(DYNAMO_GAPS[peer.engine]);
    expect(peer.streams === undefined).toBe(peer.gaps.noStreams);
  });

  it("DynamoDB Local: handles open at once share the file's one instance, each with its own client; dynalite: a server per handle", async () => {
    const name = await table();
    const second = await startDynamoPeer();
    try {
      expect(second.client).not.toBe(peer.client);
      if (peer.engine === "dynamodb-local") {
        expect(second.endpoint).toBe(peer.endpoint);
        expect(dynamoDbLocalStartsMs).toHaveLength(1);
        // The second handle sees the first's table: one database.
        expect((await second.client.send(new ListTablesCommand({}))).TableNames).toContain(name);
      } else {
        expect(second.endpoint).not.toBe(peer.endpoint);
        expect(dynamoDbLocalStartsMs).toEqual([]);
      }
    } finally {
      await second.close();
    }
    // Closing the second leaves the first working.
    expect((await peer.client.send(new ListTablesCommand({}))).TableNames).toContain(name);
  });

  it("a failed condition with ReturnValuesOnConditionCheckFailure: ALL_OLD carries the item, unless noItemOnConditionFailure", async () => {
    const name = await table();
    await peer.client.send(new PutItemCommand({ TableName: name, Item: { pk: { S: "a" }, v: { N: "1" } } }));
    const err = await rejection(
      peer.client.send(
        new UpdateItemCommand({
          TableName: name,
          Key: { pk: { S: "a" } },
          UpdateExpression: "SET v = :next",
          ConditionExpression: "v = :stale",
          ExpressionAttributeValues: { ":next": { N: "3" }, ":stale": { N: "2" } },
          ReturnValuesOnConditionCheckFailure: "ALL_OLD",
        }),
      ),
    );
    expect(err).toBeInstanceOf(ConditionalCheckFailedException);
    const item = (err as ConditionalCheckFailedException).Item;
    console.log(`[dynamo-peer] ${peer.engine}: a failed condition returned ${item === undefined ? "no item" : "the item (ALL_OLD)"}`);
    expect(item).toEqual(peer.gaps.noItemOnConditionFailure ? undefined : { pk: { S: "a" }, v: { N: "1" } });
  });

  it("keeps a readable stream of the table's writes, unless noStreams", async () => {
    const name = await table();
    const { Table } = await peer.client.send(new DescribeTableCommand({ TableName: name }));
    await peer.client.send(new PutItemCommand({ TableName: name, Item: { pk: { S: "a" }, v: { N: "1" } } }));
    console.log(`[dynamo-peer] ${peer.engine}: LatestStreamArn ${Table?.LatestStreamArn ?? "absent"}`);
    if (peer.gaps.noStreams) {
      expect(Table?.StreamSpecification).toBeUndefined();
      expect(Table?.LatestStreamArn).toBeUndefined();
      return;
    }
    const streams = peer.streams;
    if (streams === undefined) throw new Error("an engine with streams has a streams client");
    expect(Table?.StreamSpecification).toEqual({ StreamEnabled: true, StreamViewType: "NEW_AND_OLD_IMAGES" });
    const { StreamDescription } = await streams.send(new DescribeStreamCommand({ StreamArn: Table?.LatestStreamArn }));
    const shard = StreamDescription?.Shards?.[0];
    expect(shard?.ShardId).toBeDefined();
    const { ShardIterator } = await streams.send(
      new GetShardIteratorCommand({ StreamArn: Table?.LatestStreamArn, ShardId: shard?.ShardId, ShardIteratorType: "TRIM_HORIZON" }),
    );
    // The write is on the first GetRecords after it (measured; the note).
    const { Records } = await streams.send(new GetRecordsCommand({ ShardIterator }));
    expect(Records?.map((r) => [r.eventName, r.dynamodb?.Keys, r.dynamodb?.NewImage])).toEqual([
      ["INSERT", { pk: { S: "a" } }, { pk: { S: "a" }, v: { N: "1" } }],
    ]);
  });

  it("commits a TransactWriteItems all at once, unless noTransactions (then it is an unknown operation that writes nothing)", async () => {
    const name = await table();
    const write = peer.client.send(
      new TransactWriteItemsCommand({
        TransactItems: [{ Put: { TableName: name, Item: { pk: { S: "a" } } } }, { Put: { TableName: name, Item: { pk: { S: "b" } } } }],
      }),
    );
    if (peer.gaps.noTransactions) {
      expect(await rejection(write)).toMatchObject({ name: "UnknownOperationException" });
    } else {
      await write;
    }
    const read = async (pk: string) => (await peer.client.send(new GetItemCommand({ TableName: name, Key: { pk: { S: pk } } }))).Item;
    const expected = peer.gaps.noTransactions ? undefined : expect.anything();
    expect(await read("a")).toEqual(expected);
    expect(await read("b")).toEqual(expected);
  });

  it("adds a global secondary index to a table that exists (UpdateTable), unless noIndexCreation (then an error, the table unchanged)", async () => {
    const name = await table();
    const add = peer.client.send(
      new UpdateTableCommand({
        TableName: name,
        AttributeDefinitions: [{ AttributeName: "gk", AttributeType: "S" }],
        GlobalSecondaryIndexUpdates: [
          { Create: { IndexName: "by-gk", KeySchema: [{ AttributeName: "gk", KeyType: "HASH" }], Projection: { ProjectionType: "ALL" } } },
        ],
      }),
    );
    if (peer.gaps.noIndexCreation) expect(await rejection(add)).toBeInstanceOf(Error);
    else await add;
    const { Table } = await peer.client.send(new DescribeTableCommand({ TableName: name }));
    expect((Table?.GlobalSecondaryIndexes ?? []).map((g) => g.IndexName)).toEqual(peer.gaps.noIndexCreation ? [] : ["by-gk"]);
  });

  it("refuses, on both engines, a table name DynamoDB refuses, and creates nothing", async () => {
    const before = (await peer.client.send(new ListTablesCommand({}))).TableNames ?? [];
    for (const name of ["ab", "a#b", "has space", "x".repeat(256)]) {
      const err = await rejection(
        peer.client.send(
          new CreateTableCommand({
            TableName: name,
            BillingMode: "PAY_PER_REQUEST",
            AttributeDefinitions: [{ AttributeName: "pk", AttributeType: "S" }],
            KeySchema: [{ AttributeName: "pk", KeyType: "HASH" }],
          }),
        ),
      );
      expect(err, name).toMatchObject({ name: "ValidationException" });
    }
    expect((await peer.client.send(new ListTablesCommand({}))).TableNames ?? []).toEqual(before);
  });
});

describe("the peer switch (MAM_DYNAMODB_PEER, MAM_TEST_BACKENDS), parsed once in tests/support/test-env.ts", () => {
  it("defaults to dynalite and every backend; an empty value is the default", () => {
    expect(parseTestEnv({})).toEqual({ MAM_DYNAMODB_PEER: "dynalite", MAM_TEST_BACKENDS: "all" });
    expect(parseTestEnv({ MAM_DYNAMODB_PEER: "", MAM_TEST_BACKENDS: "" })).toEqual({
      MAM_DYNAMODB_PEER: "dynalite",
      MAM_TEST_BACKENDS: "all",
    });
    expect(parseTestEnv({ MAM_DYNAMODB_PEER: "dynamodb-local", MAM_TEST_BACKENDS: "aws" })).toEqual({
      MAM_DYNAMODB_PEER: "dynamodb-local",
      MAM_TEST_BACKENDS: "aws",
    });
  });

  it("any other value is an error naming the variable and what it may be", () => {
    expect(() => parseTestEnv({ MAM_DYNAMODB_PEER: "localstack" })).toThrow(
      'MAM_DYNAMODB_PEER must be "dynalite" or "dynamodb-local", got "localstack"',
    );
    expect(() => parseTestEnv({ MAM_TEST_BACKENDS: "sqlite" })).toThrow('MAM_TEST_BACKENDS must be "all" or "aws", got "sqlite"');
  });
});
