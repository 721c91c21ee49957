import { MamError } from "./errors.ts";

/**
 * One step of a store's schema, from `version - 1` to `version`. Each adapter keeps
 * its own ordered list (SQLite: `packages/local/src/sqlite-migrations.ts`; DynamoDB:
 * `packages/aws/src/table-migrations.ts`); the runner there applies the steps above
 * the stored version, one at a time, and records a step's version only after its
 * `up` completed. So `up` must be idempotent: a step that crashed halfway (or whose
 * version bump was lost) runs again from its start, and running it twice changes
 * nothing the first run did not. A step is never edited once released: a later
 * change is a new step (docs/adapters.md, "Storage versions and upgrades").
 */
export interface MigrationStep<Target> {
  /** The version the store is at once `up` completed; steps are numbered 1, 2, ... in order. */
  readonly version: number;
  /** What the step changes, in a sentence (printed by `mam migrate`). */
  readonly describe: string;
  /**
   * Cheap enough to run where a function starts (a few requests, no scan of the
   * items): the functions run cheap steps themselves and refuse to start behind any
   * other, naming the command that runs it.
   */
  readonly cheap?: boolean;
  readonly up: (target: Target) => void | Promise<void>;
}

/** The version a list of steps brings a store to (its last step's), checking they are numbered in order. */
export function latestVersion(steps: readonly MigrationStep<never>[], floor = 0): number {
  let expected = floor + 1;
  for (const step of steps) {
    if (step.version !== expected) {
      throw new MamError("internal", `migration steps out of order: found version ${step.version} where ${expected} was due`);
    }
    expected++;
  }
  return expected - 1;
}

/**
 * The steps a store at `found` still needs, in order; a store NEWER than every step
 * is refused (`store.version`): the code would misread a layout it does not know, so
 * it starts on nothing. `store` names the database or table in the message.
 */
export function pendingSteps<Target>(
  steps: readonly MigrationStep<Target>[],
  found: number,
  store: string,
  floor = 0,
): MigrationStep<Target>[] {
  const latest = latestVersion(steps, floor);
  if (found > latest) throw storeNewerThanCode(store, found, latest);
  return steps.filter((s) => s.version > found);
}

export function storeNewerThanCode(store: string, found: number, known: number): MamError {
  return new MamError(
    "store.version",
    `${store} is at schema version ${found}, newer than this mam knows (version ${known}): it was upgraded by a newer mam; run that version (or a newer one); nothing was read or written`,
    { details: { found_version: found, known_version: known } },
  );
}

export function storeBehindCode(store: string, found: number, known: number, command: string): MamError {
  return new MamError(
    "store.version",
    `${store} is at schema version ${found}, older than this mam (version ${known}), and the upgrade is not one a function runs at start: run \`${command}\`, then retry; nothing was written`,
    { details: { found_version: found, known_version: known, command } },
  );
}

/** What a migration run did: the version found, the version left, and the steps it applied. */
export interface MigrationResult {
  readonly from: number;
  readonly to: number;
  readonly applied: readonly { readonly version: number; readonly describe: string }[];
}
