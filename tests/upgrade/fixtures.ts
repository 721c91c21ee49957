/**
 * The captured storage fixtures (fixtures/storage/v<N>/, made by
 * scripts/capture-storage-fixtures.ts on the commit whose storage they hold), restored
 * where the upgrade tests open them with this code: a data dir copied to a temp dir;
 * a job table and its bucket put back, item by item and object by object, on the
 * test's DynamoDB and S3 peers.
 */
import { readFileSync } from "node:fs";
import { chmod, cp, readFile } from "node:fs/promises";
import path from "node:path";
import { type AttributeValue, BatchWriteItemCommand, DeleteItemCommand, type DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { CreateBucketCommand, PutObjectCommand, type S3Client } from "@aws-sdk/client-s3";
import { createJobTable, TABLE_VERSION_KEY } from "@mam/aws";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const ROOT = path.resolve(import.meta.dirname, "..", "..");

export const fixtureDir = (version: number): string => path.join(ROOT, "fixtures", "storage", `v${version}`);

/** The capture's signing key (tests/api/harness.ts's test key): tokens for a restored store are minted with it. */
export const FIXTURE_SIGNING_KEY = "test-signing-key-0123456789abcdef-0123456789";
/** The bucket the capture wrote to: its manifests name `s3://mam-fixture/...`, so the restore uses it again. */
export const FIXTURE_BUCKET = "mam-fixture";

/** What the capture left, job by job (fixtures/storage/v<N>/jobs.json). */
export interface JobExpectation {
  readonly status: string;
  readonly transition_seq: number;
  readonly evidence_seq: number;
  readonly completed_by?: string;
  readonly completed_evidence?: Record<string, unknown>;
  readonly owed_intent_id?: string;
  readonly quarantined?: boolean;
  readonly agent_usage?: Record<string, unknown>;
  readonly upload_in_flight?: Record<string, unknown>;
  readonly finalize_in_progress?: Record<string, unknown>;
}

export function expectations(version: number, backend: "data-dir" | "dynamodb"): Readonly<Record<string, JobExpectation>> {
  const all = JSON.parse(readFileSync(path.join(fixtureDir(version), "jobs.json"), "utf8")) as Record<
    string,
    Record<string, JobExpectation>
  >;
  const mine = all[backend];
  if (mine === undefined) throw new Error(`fixtures/storage/v${version}/jobs.json has no ${backend}`);
  return mine;
}

/** A copy of the fixture's data dir in a temp dir of its own (0700, as mam serve keeps it). */
export async function copyDataDir(version: number): Promise<TempDir> {
  const t = await tempDir(`upgrade-v${version}`);
  await cp(path.join(fixtureDir(version), "data-dir"), t.dir, { recursive: true });
  await chmod(t.dir, 0o700);
  return t;
}

/**
 * The fixture's table, put back as `tableName`: made as a table of that version was
 * (the v1 layout has no version item: `createJobTable` stamps one, which is removed),
 * then every captured item written back as it was.
 */
export async function restoreTable(client: DynamoDBClient, tableName: string, version: number): Promise<void> {
  await createJobTable(client, tableName);
  if (version === 1) {
    await client.send(
      new DeleteItemCommand({ TableName: tableName, Key: { pk: { S: TABLE_VERSION_KEY.pk }, sk: { S: TABLE_VERSION_KEY.sk } } }),
    );
  }
  const items = JSON.parse(await readFile(path.join(fixtureDir(version), "dynamodb", "items.json"), "utf8")) as Record<
    string,
    AttributeValue
  >[];
  for (let i = 0; i < items.length; i += 25) {
    let requests = { [tableName]: items.slice(i, i + 25).map((Item) => ({ PutRequest: { Item } })) };
    for (let attempt = 0; requests[tableName] !== undefined && requests[tableName].length > 0; attempt++) {
      if (attempt > 10) throw new Error("restoreTable: the peer kept items unprocessed");
      const out = await client.send(new BatchWriteItemCommand({ RequestItems: requests }));
      requests = (out.UnprocessedItems ?? {}) as typeof requests;
    }
  }
}

/** The fixture's bucket, put back under its own name (once per S3 peer). */
export async function restoreBucket(client: S3Client, version: number): Promise<void> {
  await client.send(new CreateBucketCommand({ Bucket: FIXTURE_BUCKET }));
  const dir = path.join(fixtureDir(version), "dynamodb");
  const objects = JSON.parse(await readFile(path.join(dir, "s3-objects.json"), "utf8")) as {
    key: string;
    content_type?: string;
    metadata: Record<string, string>;
  }[];
  for (const o of objects) {
    await client.send(
      new PutObjectCommand({
        Bucket: FIXTURE_BUCKET,
        Key: o.key,
        Body: await readFile(path.join(dir, "s3", o.key)),
        Metadata: o.metadata,
        ...(o.content_type === undefined ? {} : { ContentType: o.content_type }),
      }),
    );
  }
}

/** The completed jobs of a fixture: each must re-verify against its pinned evidence. */
export function completedJobs(e: Readonly<Record<string, JobExpectation>>): string[] {
  return Object.entries(e)
    .filter(([, j]) => j.status === "completed")
    .map(([id]) => id);
}
