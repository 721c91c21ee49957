/**
 * The feed rules compiled to SQL on Cloudflare's D1, the engine they are compiled for
 * (workerd under Miniflare, `d1-binding.ts`; nothing here imitates D1): the suite in
 * tests/contract/sql-feed-rules.suite.ts, 1,000 generated writes, batched as D1 runs a
 * store's batch (`D1Driver`).
 */
import { D1Driver, sql } from "@mam/local";
import { afterAll } from "vitest";
import { sqlFeedRulesContract } from "../contract/sql-feed-rules.suite.ts";
import { type D1Peer, startD1 } from "./d1-binding.ts";

let peer: Promise<D1Peer> | undefined;

afterAll(async () => {
  await (await peer)?.dispose();
});

async function dropTables(driver: D1Driver): Promise<void> {
  const tables = await driver.query(
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_cf_%'",
  );
  if (tables.length > 0) await driver.batch(tables.map((t) => sql(`DROP TABLE "${String(t.name)}"`)));
}

sqlFeedRulesContract(
  "D1 (Miniflare, workerd)",
  async () => {
    peer ??= startD1();
    const driver = new D1Driver((await peer).db);
    await dropTables(driver);
    return { driver, close: () => dropTables(driver) };
  },
  { cases: 1000, casesPerBatch: 25 },
);
