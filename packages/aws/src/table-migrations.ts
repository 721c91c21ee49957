import {
  type AttributeValue,
  DescribeTableCommand,
  type DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  ScanCommand,
  type ScanCommandOutput,
  UpdateItemCommand,
  UpdateTableCommand,
} from "@aws-sdk/client-dynamodb";
import { MamError, type MigrationResult, type MigrationStep, pendingSteps, storeBehindCode } from "@mam/core";
import { COUNTED, JOB_ITEM_SK } from "./job-item.ts";
import { storeFailure } from "./sdk-errors.ts";
import { JOB_TABLE_DEFINITION, JOB_TABLE_INDEX } from "./table-definition.ts";

/**
 * The job table's schema versions and the steps between them.
 *
 * The version is ONE item of the table, `pk = SCHEMA`, `sk = VERSION`, `version` a
 * number (and `steps`, what each step did, for operators): a property of the table's
 * layout, read with one GetItem where a function starts. No job item carries a
 * version: a step that rewrites items knows from the item itself whether it was
 * rewritten (each step's `up` is idempotent), and a version on every item would be
 * read on every request and written on every write for nothing. The item has no index
 * attribute, so no listing and no sweep ever reads it; the stream's consumers skip it
 * (it is not a job item, `isJobImage`).
 *
 * A table without the item is version 1: every table made before versions existed.
 * A table `createJobTable` makes is stamped at the latest version.
 *
 *   version 1 ... the layout of every table before versions (no SCHEMA item)
 *   version 2 ... the SCHEMA/VERSION item itself (no job item changes)
 *   version 3 ... the attention index (issue 20), which a table made before it lacks
 *   version 4 ... the counts per status (issue 22): every job item from before them marked counted
 *
 * Who runs the steps: `mam migrate --table NAME` runs all of them; a function, where
 * it starts (`prepareJobTable`), runs the steps marked `cheap` (a few requests, no
 * scan) and refuses to start behind any other with `store.version` naming that
 * command. A table newer than the code is refused by both, naming both versions. The
 * version is bumped (conditionally: never backwards, never past a step that did not
 * run) only after a step's `up` completed, so a crash between the two re-runs the step.
 */
export const TABLE_VERSION_KEY = { pk: "SCHEMA", sk: "VERSION" } as const;

export interface TableTarget {
  readonly client: DynamoDBClient;
  readonly tableName: string;
  /** Who runs the step: a function where it starts (`cheap`), or `mam migrate` (`all`); the runner says. */
  readonly run?: "cheap" | "all";
}

/** The first version of the table: the one a table without the version item is at. */
const UNVERSIONED = 1;

export const TABLE_STEPS: readonly MigrationStep<TableTarget>[] = [
  {
    version: 2,
    describe: "the table's schema version item (pk SCHEMA, sk VERSION); no job item changes",
    cheap: true,
    // The bump after it is the whole step.
    up: () => {},
  },
  {
    version: 3,
    describe:
      "the attention index (GSI attention: attn_pk, attn_at; issue 20): one DescribeTable where the stack's template or createJobTable made it; on a table made before it, `mam migrate` adds it and waits until DynamoDB has back-filled it",
    // Cheap where the index is there (every stack deployed from this template); where it
    // is not, a function refuses, naming `mam migrate`, which adds it.
    cheap: true,
    up: (target) => ensureJobTableIndex(target, JOB_TABLE_INDEX.attention),
  },
  {
    version: 4,
    describe:
      "the counts per status (issue 22): every job item from before them is marked counted (one conditional UpdateItem each, after a Scan), and the feed writer counts it once, from the stream record of that mark; items this code creates are counted from their create",
    // A Scan of the table: `mam migrate` runs it, a function refuses behind it.
    up: async (target) => {
      await markJobItemsCounted(target);
    },
  },
];

/** The version this code reads and writes. */
export const TABLE_SCHEMA_VERSION = UNVERSIONED + TABLE_STEPS.length;

/** The command that runs every step on a table (named in a refusal). */
export const migrateCommand = (tableName: string): string => `mam migrate --table ${tableName}`;

export async function readTableVersion(target: TableTarget): Promise<number> {
  let item: Record<string, AttributeValue> | undefined;
  try {
    const out = await target.client.send(
      new GetItemCommand({
        TableName: target.tableName,
        Key: { pk: { S: TABLE_VERSION_KEY.pk }, sk: { S: TABLE_VERSION_KEY.sk } },
        ConsistentRead: true,
        ProjectionExpression: "#v",
        ExpressionAttributeNames: { "#v": "version" },
      }),
    );
    item = out.Item;
  } catch (err) {
    throw storeFailure(err, `read the schema version of table ${target.tableName}`);
  }
  if (item === undefined) return UNVERSIONED;
  const raw = item.version?.N;
  const version = Number(raw);
  if (!Number.isSafeInteger(version) || version < UNVERSIONED) {
    throw new MamError("store.version", `table ${target.tableName}'s schema version item holds ${String(raw)}, not a version`);
  }
  return version;
}

/** Record that `version`'s step completed: only forwards, and only from the version before it. */
async function bumpTableVersion(target: TableTarget, step: MigrationStep<TableTarget>, at: string): Promise<void> {
  try {
    await target.client.send(
      new PutItemCommand({
        TableName: target.tableName,
        Item: {
          pk: { S: TABLE_VERSION_KEY.pk },
          sk: { S: TABLE_VERSION_KEY.sk },
          version: { N: String(step.version) },
          updated_at: { S: at },
          last_step: { S: step.describe },
        },
        ConditionExpression: step.version - 1 === UNVERSIONED ? "attribute_not_exists(pk) OR #v = :prev" : "#v = :prev",
        ExpressionAttributeNames: { "#v": "version" },
        ExpressionAttributeValues: { ":prev": { N: String(step.version - 1) } },
      }),
    );
  } catch (err) {
    // Another runner recorded it (or a later one) first: the step is done either way.
    if ((err as { name?: string }).name === "ConditionalCheckFailedException" && (await readTableVersion(target)) >= step.version) return;
    throw storeFailure(err, `record schema version ${step.version} of table ${target.tableName}`);
  }
}

export interface TableMigrationOptions {
  /** `cheap`: run only steps marked cheap, refuse behind any other (where a function starts); `all`: `mam migrate`. */
  readonly run: "cheap" | "all";
  /** This code's steps unless a test hands others. */
  readonly steps?: readonly MigrationStep<TableTarget>[];
  /** Told after each step's version was recorded (tests stop a run there, as a crash would). */
  readonly onStep?: (version: number) => void;
  readonly now?: () => Date;
}

/**
 * Bring the table to the last of the steps, step by step, each recorded after its
 * `up` completed; refuse (`store.version`, nothing written) a table newer than the
 * steps know, and, with `run: "cheap"`, one behind a step that is not cheap (before
 * running any step: a function never leaves a table half way to a version it refuses).
 */
export async function migrateJobTable(target: TableTarget, opts: TableMigrationOptions): Promise<MigrationResult> {
  const steps = opts.steps ?? TABLE_STEPS;
  const store = `table ${target.tableName}`;
  const from = await readTableVersion(target);
  const pending = pendingSteps(steps, from, store, UNVERSIONED);
  const latest = from + pending.length;
  if (opts.run === "cheap" && pending.some((s) => s.cheap !== true)) {
    throw storeBehindCode(store, from, latest, migrateCommand(target.tableName));
  }
  const applied: { version: number; describe: string }[] = [];
  for (const step of pending) {
    await step.up({ ...target, run: opts.run });
    await bumpTableVersion(target, step, (opts.now?.() ?? new Date()).toISOString());
    applied.push({ version: step.version, describe: step.describe });
    opts.onStep?.(step.version);
  }
  return { from, to: pending.length === 0 ? from : latest, applied };
}

/** Where a function starts: the table at this code's version, by cheap steps only, or a refusal naming `mam migrate`. */
export function prepareJobTable(target: TableTarget): Promise<MigrationResult> {
  return migrateJobTable(target, { run: "cheap" });
}

/**
 * `store` (every method of which is async) with `ready` awaited before each call: how
 * a function waits for `prepareJobTable` without doing it at composition. So a cold
 * start still contacts nothing (a liveness probe or a docs page never needs the
 * table), the first request that uses the store pays the one GetItem, and a refusal
 * (`store.version`) is that request's answer. `ready` is memoized by the caller
 * (`once`: a failure is not remembered, so a table migrated meanwhile is seen at the
 * next request).
 */
export function afterTableReady<T extends object>(store: T, ready: () => Promise<unknown>): T {
  return new Proxy(store, {
    get(target, prop) {
      const value: unknown = Reflect.get(target, prop, target);
      if (typeof value !== "function") return value;
      return async (...args: unknown[]) => {
        await ready();
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
}

/**
 * A storage step's way to an index of `JOB_TABLE_DEFINITION` a table made before it
 * lacks (a table the stack's template or `createJobTable` made has it: one
 * `DescribeTable`, nothing more). Where a function starts (`run: "cheap"`) a missing
 * index is refused, naming `mam migrate`; `mam migrate` (`run: "all"`) adds it with one
 * `UpdateTable` (DynamoDB back-fills it from the items) and waits until it is ACTIVE.
 */
export async function ensureJobTableIndex(target: TableTarget, indexName: string, opts: { timeoutMs?: number } = {}): Promise<void> {
  const { client, tableName } = target;
  const describe = async () => {
    try {
      return (await client.send(new DescribeTableCommand({ TableName: tableName }))).Table;
    } catch (err) {
      throw storeFailure(err, `describe table ${tableName}`);
    }
  };
  const found = (await describe())?.GlobalSecondaryIndexes?.find((g) => g.IndexName === indexName);
  if (found?.IndexStatus === "ACTIVE") return;
  if (found === undefined) {
    if (target.run !== "all") {
      throw new MamError(
        "store.version",
        `table ${tableName} has no index ${indexName}, which this mam reads: run \`${migrateCommand(tableName)}\` (or deploy the stack's template, which has it), then retry; nothing was written`,
        { details: { index: indexName, command: migrateCommand(tableName) } },
      );
    }
    const def = JOB_TABLE_DEFINITION.GlobalSecondaryIndexes.find((g) => g.IndexName === indexName);
    if (def === undefined) throw new MamError("internal", `no index ${indexName} in the job table's definition`);
    const names = new Set<string>(def.KeySchema.map((k) => k.AttributeName));
    try {
      await client.send(
        new UpdateTableCommand({
          TableName: tableName,
          AttributeDefinitions: JOB_TABLE_DEFINITION.AttributeDefinitions.filter((a) => names.has(a.AttributeName)).map((a) => ({ ...a })),
          GlobalSecondaryIndexUpdates: [
            {
              Create: {
                IndexName: def.IndexName,
                KeySchema: def.KeySchema.map((k) => ({ ...k })),
                Projection: { ...def.Projection },
              },
            },
          ],
        }),
      );
    } catch (err) {
      throw storeFailure(err, `add index ${indexName} to table ${tableName}`);
    }
  }
  const deadline = Date.now() + (opts.timeoutMs ?? 30 * 60_000);
  for (;;) {
    const index = (await describe())?.GlobalSecondaryIndexes?.find((g) => g.IndexName === indexName);
    if (index?.IndexStatus === "ACTIVE") return;
    if (Date.now() > deadline) throw storeFailure(new Error(`index ${indexName} did not become ACTIVE in time`), `add index ${indexName}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

/**
 * Storage step 4: mark every job item that is not yet counted (`COUNTED`), each with one
 * UpdateItem conditional on the mark being absent; returns how many it marked. It
 * counts nothing itself: the feed writer counts each marked job under the status its
 * stream record's new image holds, under that record's marker, as it counts a create.
 *
 *   the step ........ Scan: J unmarked (pending) ....... UpdateItem J: SET counted
 *   an agent ................. claim J (no mark: the feed writer counts nothing)
 *   the stream ...... J: pending -> running (uncounted) | J: running, now counted (+1 running)
 *
 * So a write racing the step is never lost nor counted twice: before the mark, no move
 * of J is counted (neither image carries it); the mark's own record counts J once under
 * the status it then had; every later move is counted from there. Running it again
 * (or after a crash) marks only what is still unmarked: nothing is counted twice.
 * Items created by an older mam while it runs are unmarked: deploy first, then migrate.
 */
export async function markJobItemsCounted(target: TableTarget): Promise<number> {
  const { client, tableName } = target;
  let marked = 0;
  let start: Record<string, AttributeValue> | undefined;
  do {
    let page: ScanCommandOutput;
    try {
      page = await client.send(
        new ScanCommand({
          TableName: tableName,
          ProjectionExpression: "pk, sk",
          FilterExpression: "sk = :job AND attribute_not_exists(#c)",
          ExpressionAttributeNames: { "#c": COUNTED },
          ExpressionAttributeValues: { ":job": { S: JOB_ITEM_SK } },
          ...(start === undefined ? {} : { ExclusiveStartKey: start }),
        }),
      );
    } catch (err) {
      throw storeFailure(err, `scan table ${tableName} for job items to count`);
    }
    for (const item of page.Items ?? []) {
      const pk = item.pk?.S;
      if (pk === undefined) continue;
      try {
        await client.send(
          new UpdateItemCommand({
            TableName: tableName,
            Key: { pk: { S: pk }, sk: { S: JOB_ITEM_SK } },
            UpdateExpression: "SET #c = :t",
            ConditionExpression: "attribute_exists(pk) AND attribute_not_exists(#c)",
            ExpressionAttributeNames: { "#c": COUNTED },
            ExpressionAttributeValues: { ":t": { BOOL: true } },
          }),
        );
        marked++;
      } catch (err) {
        // Marked meanwhile (another run of the step): counted once, by that mark.
        if ((err as { name?: string }).name === "ConditionalCheckFailedException") continue;
        throw storeFailure(err, `mark job item ${pk} counted`);
      }
    }
    start = page.LastEvaluatedKey;
  } while (start !== undefined);
  return marked;
}
