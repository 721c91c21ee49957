import { type AttributeValue, type DynamoDBClient, GetItemCommand, PutItemCommand } from "@aws-sdk/client-dynamodb";
import { MamError, type MigrationResult, type MigrationStep, pendingSteps, storeBehindCode } from "@mam/core";
import { storeFailure } from "./sdk-errors.ts";

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
    await step.up(target);
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
