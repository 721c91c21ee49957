import type { JobStoreOptions } from "@mam/core";
import Database from "better-sqlite3";
import { SqlJobStore, sqlStoreError } from "./sql-job-store.ts";
import { BetterSqliteDriver } from "./sqlite-driver.ts";
import { migrateSqlite } from "./sqlite-migrations.ts";

/**
 * The embedded JobStore: the SQL store (`SqlJobStore`) over better-sqlite3, on one
 * SQLite file in WAL mode, so readers never block the writer and several processes
 * (`mam serve`, the CLI) can share it. Its driver commits the batches asked in one
 * turn of the event loop as one transaction, each in a savepoint of its own (group
 * commit: `BetterSqliteDriver`), which is what bench/notify's rate rests on.
 *
 * What it adds to the SQL store: opening the file (WAL, `busy_timeout`, a WAL that
 * shrinks back after a burst), the layout brought to this code's version at open
 * (`migrateSqlite`: refused, `store.version`, when the file is newer than this code),
 * and the probe that lets the base keep its record cache (`dataVersion`).
 */
export class SqliteJobStore extends SqlJobStore {
  readonly #db: Database.Database;
  #dataVersion: Database.Statement | undefined;

  /** A database file (made if absent), `:memory:`, or a connection opened by the caller (the store then owns it). */
  constructor(database: string | Database.Database, options: JobStoreOptions = {}) {
    const db = openJobDatabase(database);
    super(new BetterSqliteDriver(db), options);
    this.#db = db;
  }

  /**
   * SQLite's `PRAGMA data_version` on this store's connection: it changes whenever
   * another connection (another process, the CLI, another store on the file) has
   * committed since it was last asked, and never for this connection's own commits.
   * Asking is a read transaction that reads no row. The base keeps its record cache
   * only while it stands still.
   */
  override dataVersion(): number {
    this.#dataVersion ??= this.#db.prepare("PRAGMA data_version").pluck();
    try {
      return this.#dataVersion.get() as number;
    } catch (e) {
      throw sqlStoreError(e);
    }
  }
}

/** The connection, configured, with its layout brought to this code's version (or closed and refused). */
function openJobDatabase(database: string | Database.Database): Database.Database {
  const db = typeof database === "string" ? new Database(database) : database;
  try {
    db.pragma("busy_timeout = 5000");
    if (!db.memory) {
      db.pragma("journal_mode = WAL");
      // A WAL that grew under a burst shrinks back after the next checkpoint.
      db.pragma("journal_size_limit = 67108864");
      db.pragma("mmap_size = 268435456");
    }
    // One transaction per step; refused (store.version) when the file is newer than this code.
    migrateSqlite(db);
  } catch (e) {
    db.close();
    throw sqlStoreError(e);
  }
  return db;
}
