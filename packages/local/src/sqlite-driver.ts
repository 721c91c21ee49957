import { KeptByKey } from "@mam/core";
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
 * **Group commit** (as `SqliteJobStore` does today, and on by default): the batches
 * handed over in one turn of the event loop are run, at its end, in one transaction,
 * each batch in a savepoint of its own. Each batch is still its own unit: one that
 * fails rolls back to its savepoint and rejects alone, and the others commit; a
 * commit that fails rejects them all, none having committed. What is saved is a
 * transaction (and, in WAL, a commit record) per batch under load. A batch resolves
 * only once the group committed.
 *
 * The connection is the caller's (opened, configured — WAL, `busy_timeout` — and
 * closed by `close()`).
 */
export class BetterSqliteDriver implements SqlDriver {
  readonly engine = ENGINE;
  readonly #db: Database.Database;
  readonly #statements = new KeptByKey<string, Database.Statement>(STATEMENT_CACHE_SIZE);
  readonly #groupCommit: boolean;
  /** One batch: a transaction of its own, or a savepoint when nested in `#groupTransaction`. */
  readonly #batch: Database.Transaction<(statements: readonly SqlStatement[]) => SqlResult[]>;
  /** A group's batches in one transaction, each in its savepoint, each outcome kept. */
  readonly #groupTransaction: Database.Transaction<(group: readonly PendingBatch[]) => BatchOutcome[]>;
  /** The batches waiting for the group commit at the end of this turn. */
  #group: PendingBatch[] | undefined;

  constructor(db: Database.Database, options: { groupCommit?: boolean } = {}) {
    this.#db = db;
    this.#groupCommit = options.groupCommit ?? true;
    this.#batch = db.transaction((statements: readonly SqlStatement[]) => statements.map((s) => this.#run(s)));
    this.#groupTransaction = db.transaction((group: readonly PendingBatch[]) =>
      group.map((pending): BatchOutcome => {
        try {
          return { ok: true, results: this.#batch(pending.statements) };
        } catch (error) {
          return { ok: false, error };
        }
      }),
    );
  }

  // Not an async function: it hands back the promise the group commit settles, with no
  // extra turns to adopt it (the relay's settle awaits this on bench/notify's path).
  batch(statements: readonly SqlStatement[]): Promise<SqlResult[]> {
    try {
      for (let index = 0; index < statements.length; index++) checkStatement(ENGINE, statements[index] as SqlStatement, index);
      if (statements.length === 0) return Promise.resolve([]);
      if (!this.#groupCommit) return Promise.resolve(this.#batch.immediate(statements));
    } catch (error) {
      return Promise.reject(engineError(error));
    }
    return new Promise<SqlResult[]>((resolve, reject) => {
      if (this.#group === undefined) {
        this.#group = [];
        setImmediate(() => this.#commitGroup());
      }
      this.#group.push({ statements, resolve, reject });
    });
  }

  /** Runs and commits the batches of this turn as one transaction; answers each. */
  #commitGroup(): void {
    const group = this.#group;
    this.#group = undefined;
    if (group === undefined) return;
    let outcomes: readonly BatchOutcome[];
    try {
      // Alone in its turn, a batch is its own transaction, without a savepoint.
      const [only] = group;
      outcomes =
        group.length === 1 && only !== undefined
          ? [{ ok: true, results: this.#batch.immediate(only.statements) }]
          : this.#groupTransaction.immediate(group);
    } catch (error) {
      for (const pending of group) pending.reject(engineError(error));
      return;
    }
    group.forEach((pending, i) => {
      const outcome = outcomes[i];
      if (outcome?.ok) pending.resolve(outcome.results);
      else pending.reject(engineError(outcome?.error));
    });
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

  /** Commits the batches already asked for (the group of this turn), then closes the connection. */
  async close(): Promise<void> {
    this.#commitGroup();
    this.#statements.clear();
    if (this.#db.open) this.#db.close();
  }

  #run(statement: SqlStatement): SqlResult {
    const prepared = this.#prepare(statement.sql);
    if (!prepared.reader) return { rows: [], changes: prepared.run(...statement.params).changes };
    const rows = prepared.all(...statement.params) as SqlRow[];
    // A reader that writes is DML with RETURNING: one row per row it changed.
    return { rows, changes: prepared.readonly ? 0 : rows.length };
  }

  #prepare(text: string): Database.Statement {
    return this.#statements.get(text, () => this.#db.prepare(text));
  }
}

interface PendingBatch {
  readonly statements: readonly SqlStatement[];
  resolve(results: SqlResult[]): void;
  reject(error: unknown): void;
}

type BatchOutcome = { readonly ok: true; readonly results: SqlResult[] } | { readonly ok: false; readonly error: unknown };

function engineError(error: unknown): unknown {
  if (!(error instanceof Error) || error.name !== "SqliteError") return error;
  const code = (error as Error & { code?: unknown }).code;
  const constraint = (typeof code === "string" && code.startsWith("SQLITE_CONSTRAINT")) || isConstraintMessage(error.message);
  return new SqlBatchError(ENGINE, error.message, constraint, error);
}
