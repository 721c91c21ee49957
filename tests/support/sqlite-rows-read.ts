import Database from "better-sqlite3";

/**
 * A SQLite connection that counts the job rows its reads materialize, for the cost
 * tests and the benchmark: every row a read-only statement on the `jobs` table hands
 * back (`get`, `all`, `iterate`). A write's own `RETURNING` row is not a read (the
 * statement is not read-only), and neither is SQLite's `data_version` probe. Hand the
 * connection to `SqliteJobStore` (or `openEmbeddedJobStore`): the adapter itself
 * keeps no counter.
 */
export function countingConnection(file: string): { db: Database.Database; rowsRead(): number } {
  const db = new Database(file);
  let rows = 0;
  const prepare = db.prepare.bind(db);
  db.prepare = ((sql: string) => {
    const statement = prepare(sql);
    if (statement.reader && statement.readonly && /\bFROM jobs\b/i.test(sql)) count(statement);
    return statement;
  }) as typeof db.prepare;

  function count(statement: Database.Statement): void {
    const { get, all, iterate } = statement;
    statement.get = ((...params: unknown[]) => {
      const row = get.apply(statement, params);
      if (row !== undefined) rows += 1;
      return row;
    }) as typeof statement.get;
    statement.all = ((...params: unknown[]) => {
      const found = all.apply(statement, params);
      rows += found.length;
      return found;
    }) as typeof statement.all;
    statement.iterate = function* (...params: unknown[]) {
      for (const row of iterate.apply(statement, params)) {
        rows += 1;
        yield row;
      }
    } as typeof statement.iterate;
  }

  return { db, rowsRead: () => rows };
}
