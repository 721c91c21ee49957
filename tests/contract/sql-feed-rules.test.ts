/**
 * The feed rules compiled to SQL, on better-sqlite3 through the driver seam
 * (`BetterSqliteDriver`, an in-memory database per test): the suite in
 * sql-feed-rules.suite.ts, 3,000 generated writes. D1 runs the same suite in
 * tests/d1/sql-feed-rules.test.ts (`npm run test:d1`).
 */
import { BetterSqliteDriver } from "@mam/local";
import Database from "better-sqlite3";
import { sqlFeedRulesContract } from "./sql-feed-rules.suite.ts";

sqlFeedRulesContract(
  "better-sqlite3 (in memory)",
  async () => {
    const driver = new BetterSqliteDriver(new Database(":memory:"), { groupCommit: false });
    return { driver, close: () => driver.close() };
  },
  { cases: 3000, casesPerBatch: 100 },
);
