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

const ENGINE = "d1";

/**
 * What this driver uses of a Cloudflare D1 binding (`env.DB` in a Worker, or
 * Miniflare's `getD1Database()` from Node), typed by shape so that nothing of
 * Cloudflare's is a dependency of production code.
 */
export interface D1DatabaseLike {
  prepare(query: string): D1PreparedStatementLike;
  batch(statements: D1PreparedStatementLike[]): Promise<D1ResultLike[]>;
}

export interface D1PreparedStatementLike {
  bind(...values: unknown[]): D1PreparedStatementLike;
  all(): Promise<D1ResultLike>;
}

export interface D1ResultLike {
  results?: unknown[];
  meta: { changes?: number };
}

/**
 * The SQL driver seam on Cloudflare D1: a batch is one `D1Database.batch()` of
 * prepared statements, which D1 runs as one SQL transaction inside the database's
 * Durable Object (Cloudflare: "Batched statements are SQL transactions. If a statement
 * in the sequence fails, then an error is returned for that specific statement, and it
 * aborts or rolls back the entire sequence"), serialised with every other request to
 * that database. D1 has no interactive transaction (a statement that opens one is
 * refused here, as on every driver); the batch is the only atomic unit, which is why
 * the seam is batch-shaped.
 *
 * The seam's limits (`SQL_LIMITS`) are D1's; a batch outside them is refused here,
 * before it is sent, with `MamError` `store.unsupported` (D1 itself answers "too many
 * SQL variables" past 100 parameters).
 */
export class D1Driver implements SqlDriver {
  readonly engine = ENGINE;
  readonly #db: D1DatabaseLike;

  constructor(db: D1DatabaseLike) {
    this.#db = db;
  }

  async batch(statements: readonly SqlStatement[]): Promise<SqlResult[]> {
    for (const [index, statement] of statements.entries()) checkStatement(ENGINE, statement, index);
    if (statements.length === 0) return [];
    let results: D1ResultLike[];
    try {
      results = await this.#db.batch(statements.map((s) => this.#db.prepare(s.sql).bind(...s.params)));
    } catch (error) {
      throw engineError(error);
    }
    return results.map((result) => ({ rows: (result.results ?? []) as SqlRow[], changes: result.meta.changes ?? 0 }));
  }

  async query(sql: string, params: readonly SqlValue[] = []): Promise<SqlRow[]> {
    checkStatement(ENGINE, { sql, params });
    try {
      const result = await this.#db
        .prepare(sql)
        .bind(...params)
        .all();
      return (result.results ?? []) as SqlRow[];
    } catch (error) {
      throw engineError(error);
    }
  }

  /** The binding's lifetime is the Worker's (or Miniflare's, from Node): nothing to release here. */
  async close(): Promise<void> {}
}

function engineError(error: unknown): unknown {
  if (!(error instanceof Error)) return error;
  return new SqlBatchError(ENGINE, error.message, isConstraintMessage(error.message), error);
}
