/**
 * `npm run test:d1`: the SQL driver contract on Cloudflare's D1, the real engine
 * (workerd, the runtime Workers run on, with D1's SQLite inside a Durable Object),
 * run locally by Miniflare and driven from Node: D1Driver runs here, in Node, and each
 * batch is run by a Worker inside workerd on its D1 binding (`d1-binding.ts`). Nothing
 * here imitates D1. Then what the engine itself refuses, without the driver in front,
 * so the seam's limits are checked against D1's own (docs/adapters.md, "The SQL
 * driver seam").
 */
import { D1Driver, SQL_LIMITS } from "@mam/local";
import { beforeAll, describe, expect, it } from "vitest";
import { sqlDriverContract } from "../contract/sql-driver.suite.ts";
import { d1ForFile } from "./d1-binding.ts";

/** One Miniflare (one workerd process) per file; each test gets the database emptied of the last one's tables. */
const d1 = d1ForFile();
const database = d1.database;
const emptyDatabase = async (): Promise<void> => void (await d1.emptied());

sqlDriverContract("D1 (Miniflare, workerd)", async () => {
  await emptyDatabase();
  const db = await database();
  return {
    driver: new D1Driver(db),
    // Every racer is a driver of its own on the binding; their batches are concurrent
    // requests into workerd, which D1's Durable Object serialises.
    racer: async () => new D1Driver(await database()),
    close: emptyDatabase,
  };
});

describe("D1 itself (Miniflare), without the driver's checks in front", () => {
  beforeAll(async () => {
    await emptyDatabase();
  });

  async function refusal(promise: Promise<unknown>): Promise<string> {
    try {
      await promise;
    } catch (error) {
      return (error as Error).message;
    }
    return "(not refused)";
  }

  it(`binds ${SQL_LIMITS.paramsPerStatement} parameters and refuses one more: the seam's limit is the engine's`, async () => {
    const db = await database();
    // A column per parameter: a sum of 101 would first meet D1's expression depth limit (100).
    const select = (n: number) =>
      db
        .prepare(`SELECT ${Array.from({ length: n }, (_, i) => `? AS p${i}`).join(", ")}`)
        .bind(...Array.from({ length: n }, () => 1))
        .all();
    const row = (await select(SQL_LIMITS.paramsPerStatement)).results?.[0] as Record<string, unknown>;
    expect(Object.keys(row)).toHaveLength(SQL_LIMITS.paramsPerStatement);
    expect(await refusal(select(SQL_LIMITS.paramsPerStatement + 1))).toMatch(/too many SQL variables/);
  });

  it(`runs ${SQL_LIMITS.statementBytes} bytes of SQL and refuses one more`, async () => {
    const db = await database();
    const statement = (bytes: number) => db.prepare(`SELECT 1${" ".repeat(bytes - "SELECT 1".length)}`).all();
    expect((await statement(SQL_LIMITS.statementBytes)).results).toHaveLength(1);
    expect(await refusal(statement(SQL_LIMITS.statementBytes + 1))).toMatch(/statement too long|SQLITE_TOOBIG/);
  });

  it("stores a value at the documented value size, and refuses a row well past it (SQLITE_TOOBIG)", async () => {
    const db = await database();
    await db.prepare("CREATE TABLE sized (a TEXT, b TEXT)").all();
    await db.prepare("INSERT INTO sized (a) VALUES (?)").bind("x".repeat(SQL_LIMITS.valueBytes)).all();
    // Two values, each inside the value size, making a row past it: only the store can keep rows small.
    const half = "y".repeat(SQL_LIMITS.valueBytes * 0.75);
    expect(await refusal(db.prepare("INSERT INTO sized (a, b) VALUES (?, ?)").bind(half, half).all())).toMatch(/too big|SQLITE_TOOBIG/);
  });

  it("refuses an expression deeper than 100 (a sum of 101 terms): a store builds no long chains of AND or +", async () => {
    const db = await database();
    const sum = (terms: number) => db.prepare(`SELECT ${Array.from({ length: terms }, () => "1").join(" + ")} AS total`).all();
    expect((await sum(100)).results).toEqual([{ total: 100 }]);
    expect(await refusal(sum(101))).toMatch(/Expression tree is too large/);
  });

  it("has no interactive transaction: BEGIN and SAVEPOINT are refused; the batch is the only atomic unit", async () => {
    const db = await database();
    expect(await refusal(db.batch([db.prepare("BEGIN"), db.prepare("SELECT 1")]))).toMatch(/transaction/i);
    expect(await refusal(db.prepare("SAVEPOINT s").all())).toMatch(/transaction|SAVEPOINT/i);
  });

  it("refuses TEMP tables (SQLITE_AUTH): the old values a write captures live in a column of the row, not in a scratch table", async () => {
    const db = await database();
    expect(await refusal(db.prepare("CREATE TEMP TABLE scratch (v TEXT)").all())).toMatch(/not authorized|SQLITE_AUTH/);
  });
});
