import { KeptByKey, MamError } from "@mam/core";

/**
 * The SQL driver seam: what an SQLite-dialect store needs of an engine, asynchronous
 * and batch-shaped so that a synchronous library (better-sqlite3, `sqlite-driver.ts`)
 * and an engine reached only through batches (Cloudflare D1, `d1-driver.ts`) serve the
 * same store. Modelled on Emmett's `emmett-sqlite` driver seam (`eventStoreDriver.ts`
 * and its D1 driver); one contract suite (tests/contract/sql-driver.suite.ts) runs on
 * every driver, D1 through Miniflare included (`npm run test:d1`).
 *
 * A store on this seam never runs JavaScript between two statements that must agree:
 * what a later statement needs of an earlier one it reads in SQL, in the same batch
 * (a conditional `UPDATE … RETURNING` that records the old values it overwrote in a
 * column, read back by the next statement keyed by a token the batch carries; see
 * docs/adapters.md, "The SQL driver seam"). So there is no interactive transaction
 * here, and none is needed.
 */
export interface SqlDriver {
  /** Which engine this is, for messages and metrics (`better-sqlite3`, `d1`). */
  readonly engine: string;

  /**
   * Runs `statements` in order, atomically, as one unit: either every statement
   * commits or none does. No other writer's statement runs between two statements of
   * the batch, and no JavaScript of the caller runs between them either (the batch is
   * handed over whole). Resolves with one result per statement, in order.
   *
   * A statement that fails (a CHECK, UNIQUE or NOT NULL violation, a syntax error)
   * rejects the batch with a `SqlBatchError` and leaves nothing of it: the
   * statements before it are rolled back. A batch that breaks one of the seam's limits
   * (`SQL_LIMITS`) or holds a transaction-control statement is refused before any of
   * it runs, with `MamError` `store.unsupported`. An empty batch resolves `[]`.
   */
  batch(statements: readonly SqlStatement[]): Promise<SqlResult[]>;

  /**
   * One read: the rows of `sql` with `params` bound, as one consistent snapshot. The
   * same limits and refusals as `batch`. A read that must agree with a write is a
   * statement of the write's batch instead.
   */
  query(sql: string, params?: readonly SqlValue[]): Promise<SqlRow[]>;

  /** Releases the connection; the driver takes no statement after. */
  close(): Promise<void>;
}

/** A value bound to a `?` parameter or read from a column. No booleans or bigints: D1 and better-sqlite3 differ on both. */
export type SqlValue = string | number | null;

export type SqlRow = Record<string, SqlValue>;

/** One statement of a batch: SQLite-dialect SQL with positional `?` parameters. */
export interface SqlStatement {
  readonly sql: string;
  readonly params: readonly SqlValue[];
}

/** What one statement of a batch gave back. */
export interface SqlResult {
  /** Its rows: a query's, or what `RETURNING` returned; `[]` for any other statement. */
  readonly rows: SqlRow[];
  /**
   * The rows the statement inserted, updated or deleted (0 for a query). With
   * `RETURNING`, equal to `rows.length`. A conditional write learns here whether its
   * condition held. Stores on this seam use no triggers: better-sqlite3 leaves a
   * trigger's rows out of this count, and D1 under Miniflare counts them in.
   */
  readonly changes: number;
}

/** Shorthand for a statement: `sql("UPDATE jobs SET … WHERE seq = ?", seq)`. */
export function sql(text: string, ...params: SqlValue[]): SqlStatement {
  return { sql: text, params };
}

/**
 * The limits every driver holds a batch to: D1's (developers.cloudflare.com/d1/platform/limits/,
 * the Durable Object SQL limits being the same), the narrowest engine the seam
 * serves, so a statement that passes on better-sqlite3 also runs on D1.
 */
export const SQL_LIMITS = {
  /** Bound parameters per statement (D1: "Maximum bound parameters per query 100"). */
  paramsPerStatement: 100,
  /** Bytes of SQL text per statement, UTF-8 (D1: "Maximum SQL statement length 100,000 bytes"). */
  statementBytes: 100_000,
  /** Bytes of one bound string value, UTF-8 (D1: "Maximum string, BLOB or table row size 2,000,000 bytes"). */
  valueBytes: 2_000_000,
  /**
   * SELECTs joined in one compound SELECT (`UNION ALL`): D1 refuses a sixth ("too
   * many terms in compound SELECT", measured under Miniflare; SQLite's default is 500).
   * Not checked by `checkStatement` (it would have to parse the SQL): a store that
   * builds compound SELECTs keeps to it. The feed rules build none (their rules are
   * rows of `json_each`, sql-feed-rules.ts), and tests/d1 runs them.
   */
  compoundSelectTerms: 5,
} as const;

/**
 * A batch refused by the engine: a statement failed and nothing of the batch was
 * kept. `constraint` says whether SQLite reported a constraint violation (CHECK,
 * UNIQUE, NOT NULL, PRIMARY KEY, FOREIGN KEY): the data refused the write, as opposed
 * to a fault (syntax, a missing table, I/O).
 */
export class SqlBatchError extends Error {
  override readonly name = "SqlBatchError";
  readonly engine: string;
  readonly constraint: boolean;

  constructor(engine: string, message: string, constraint: boolean, cause: unknown) {
    super(`${engine}: ${message}`, { cause });
    this.engine = engine;
    this.constraint = constraint;
  }
}

// Transaction control belongs to the driver: a statement of the caller's that opened,
// ended or nested a transaction would break the batch's all-or-nothing (and D1 has no
// interactive transaction to offer).
const TRANSACTION_CONTROL = /^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b/i;

const utf8 = new TextEncoder();

/** SQL texts already found within the limits and free of transaction control (the text alone decides both). */
const CHECKED_TEXTS = new KeptByKey<string, true>();

/**
 * Refuses, before anything runs, a statement outside `SQL_LIMITS` or one that
 * controls the transaction: `MamError` `store.unsupported`, naming the limit.
 */
export function checkStatement(engine: string, statement: SqlStatement, index = 0): void {
  const params = statement.params;
  if (params.length > SQL_LIMITS.paramsPerStatement) {
    refuseStatement(engine, index, `binds ${params.length} parameters, more than the ${SQL_LIMITS.paramsPerStatement} a statement may`);
  }
  // A store's SQL is a few dozen texts, checked once each (encoding a text to count its
  // bytes was a tenth of a transition's time on better-sqlite3).
  CHECKED_TEXTS.get(statement.sql, () => {
    if (TRANSACTION_CONTROL.test(statement.sql)) refuseStatement(engine, index, "controls the transaction, which belongs to the driver");
    const bytes = utf8.encode(statement.sql).length;
    if (bytes > SQL_LIMITS.statementBytes) {
      refuseStatement(engine, index, `is ${bytes} bytes of SQL, more than the ${SQL_LIMITS.statementBytes} a statement may`);
    }
    return true;
  });
  for (let at = 0; at < params.length; at++) {
    const value = params[at];
    // A string of n UTF-16 units is at most 3n bytes of UTF-8: only a long one is encoded to count.
    if (typeof value === "string" && value.length * 3 > SQL_LIMITS.valueBytes) {
      const valueBytes = utf8.encode(value).length;
      if (valueBytes > SQL_LIMITS.valueBytes) {
        refuseStatement(
          engine,
          index,
          `binds ${valueBytes} bytes at parameter ${at + 1}, more than the ${SQL_LIMITS.valueBytes} a value may`,
        );
      }
    }
  }
}

function refuseStatement(engine: string, index: number, why: string): never {
  throw new MamError("store.unsupported", `${engine}: statement ${index} of the batch ${why}; nothing was run`, {
    details: { engine, statement: index },
  });
}

/** Whether an engine's message reports a constraint violation (both engines name SQLite's result code). */
export function isConstraintMessage(message: string): boolean {
  return /SQLITE_CONSTRAINT|constraint failed/i.test(message);
}
