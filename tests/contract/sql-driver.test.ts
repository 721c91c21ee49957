import path from "node:path";
import { BetterSqliteDriver } from "@mam/local";
import Database from "better-sqlite3";
import { type TempDir, tempDir } from "../support/temp-dir.ts";
import { sqlDriverContract } from "./sql-driver.suite.ts";

/** A connection as `mam serve` opens one: WAL, and a busy timeout so another connection's batch waits instead of failing. */
function connect(file: string): Database.Database {
  const db = new Database(file);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 5000");
  return db;
}

// The race runs each racer on a connection of its own to one database file. They share
// this process's one thread, so their batches interleave only between batches (each
// batch runs to its end synchronously); what the race proves here is that the
// conditional write and the token-keyed feed row stay one unit per batch across
// connections. On D1 (tests/d1/) the racers are concurrent requests.
for (const groupCommit of [true, false]) {
  sqlDriverContract(`better-sqlite3 (temp file, WAL, ${groupCommit ? "group commit" : "a transaction per batch"})`, async () => {
    const dir: TempDir = await tempDir("sql-driver");
    const file = path.join(dir.dir, "mam.db");
    const driver = new BetterSqliteDriver(connect(file), { groupCommit });
    return {
      driver,
      racer: async () => new BetterSqliteDriver(connect(file), { groupCommit }),
      close: async () => {
        await driver.close();
        await dir.remove();
      },
    };
  });
}
