import { migrateSqlite, type SqlStatement, sql } from "@mam/local";
import Database from "better-sqlite3";

/**
 * The job store's layout as SQL statements, taken from a fresh database that the
 * store's own migrations brought to this code's version: what a test creates on an
 * engine the migrations cannot open (D1 through Miniflare), so the layout there is
 * exactly the one `mam serve` runs on, never a second copy of the DDL.
 */
export function sqlLayoutStatements(): SqlStatement[] {
  const db = new Database(":memory:");
  try {
    migrateSqlite(db);
    const rows = db
      .prepare(
        "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, rowid",
      )
      .all() as { sql: string }[];
    return rows.map((r) => sql(r.sql));
  } finally {
    db.close();
  }
}
