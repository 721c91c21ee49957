import type Database from "better-sqlite3";
import {
  checkStatement,
  isConstraintMessage,
  SqlBatchError,
  type SqlDriver,
  type SqlResult,
  type SqlRow,
  type SqlStatement,
  type SqlValue,
} from "./sql-driver.ts";

const ENGINE = "better-sqlite3";

/** Prepared statements kept per connection; past it the cache starts again (a store's SQL is a few dozen texts). */
const STATEMENT_CACHE_SIZE = 512;

/**
 * The SQL driver seam on better-sqlite3: a batch is one `db.transaction(…).immediate()`
 * (`BEGIN IMMEDIATE`: the write lock is taken before the first statement, so a batch
 * never fails half-way on a lock it could not upgrade), run synchronously to its end:
 * no JavaScript of the caller, and no other writer, between its statements. A
 * statement that throws rolls the whole transaction back. The limits of the seam
 * (`SQL_LIMITS`, D1's) are held here too, so a store tested on this driver does not
 * build a statement D1 would refuse.
 *
 * The connection is the caller's (opened, configured — WAL, `busy_timeout` — and
 * closed by `close()`).
 */
export class BetterSqliteDriver implements SqlDriver {
  readonly engine = ENGINE;
  readonly #db: Database.Database;
  readonly #statements = new Map<string, Database.Statement>();
  readonly #batch: Database.Transaction<(statements: readonly SqlStatement[]) => SqlResult[]>;

  constructor(db: Database.Database) {
    this.#db = db;
    this.#batch = db.transaction((statements: readonly SqlStatement[]) => statements.map((s) => this.#run(s)));
  }

  async batch(statements: readonly SqlStatement[]): Promise<SqlResult[]> {
    for (const [index, statement] of statements.entries()) checkStatement(ENGINE, statement, index);
    if (statements.length === 0) return [];
    try {
      return this.#batch.immediate(statements);
    } catch (error) {
      throw engineError(error);
    }
  }

  async query(sql: string, params: readonly SqlValue[] = []): Promise<SqlRow[]> {
    const statement = { sql, params };
    checkStatement(ENGINE, statement);
    try {
      return this.#run(statement).rows;
    } catch (error) {
      throw engineError(error);
    }
  }

  async close(): Promise<void> {
    this.#statements.clear();
    this.#db.close();
  }

  #run(statement: SqlStatement): SqlResult {
    const prepared = this.#prepare(statement.sql);
    if (!prepared.reader) return { rows: [], changes: prepared.run(...statement.params).changes };
    const rows = prepared.all(...statement.params) as SqlRow[];
    // A reader that writes is DML with RETURNING: one row per row it changed.
    return { rows, changes: prepared.readonly ? 0 : rows.length };
  }

  #prepare(text: string): Database.Statement {
    let prepared = this.#statements.get(text);
    if (prepared === undefined) {
      if (this.#statements.size >= STATEMENT_CACHE_SIZE) this.#statements.clear();
      prepared = this.#db.prepare(text);
      this.#statements.set(text, prepared);
    }
    return prepared;
  }
}

function engineError(error: unknown): unknown {
  if (!(error instanceof Error) || error.name !== "SqliteError") return error;
  const code = (error as Error & { code?: unknown }).code;
  const constraint = (typeof code === "string" && code.startsWith("SQLITE_CONSTRAINT")) || isConstraintMessage(error.message);
  return new SqlBatchError(ENGINE, error.message, constraint, error);
}
