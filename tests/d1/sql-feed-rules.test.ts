/**
 * The feed rules compiled to SQL on Cloudflare's D1, the engine they are compiled for
 * (workerd under Miniflare, `d1-binding.ts`; nothing here imitates D1): the suite in
 * tests/contract/sql-feed-rules.suite.ts, 1,000 generated writes, batched as D1 runs a
 * store's batch (`D1Driver`).
 */
import { sqlFeedRulesContract } from "../contract/sql-feed-rules.suite.ts";
import { d1ForFile, dropTables } from "./d1-binding.ts";

const d1 = d1ForFile();

sqlFeedRulesContract(
  "D1 (Miniflare, workerd)",
  async () => {
    const driver = await d1.emptied();
    return { driver, close: () => dropTables(driver) };
  },
  { cases: 1000, casesPerBatch: 25 },
);
