import { type D1DatabaseLike, D1Driver, type D1PreparedStatementLike, type D1ResultLike, sql } from "@mam/local";
import { Miniflare } from "miniflare";
import { afterAll } from "vitest";

/**
 * D1 as a Worker sees it, reached from Node. The Worker below runs inside workerd
 * (Miniflare's engine) and calls its real D1 binding, `env.DB`, exactly as a deployed
 * Worker would: `prepare(sql).bind(...params)` per statement, then `batch()` or
 * `all()`. Node sends it the statements as JSON (`dispatchFetch`) and gets D1's
 * results, or its error message, back. What Node holds is only that transport,
 * shaped as the driver's `D1DatabaseLike`: D1Driver runs unchanged over it.
 *
 * Why not Miniflare's own `getD1Database()` from Node: that is a proxy whose prepared
 * statements live in workerd and are freed there when Node garbage-collects their
 * proxies, and under the race suite it failed three times in about 800 trials of 32 racers with
 * `AssertionError: false == true` in Miniflare's proxy.worker.ts (a batch naming a
 * statement already freed), even with every statement still referenced. That is the
 * test tool's bridge, not D1; this path has no bridge objects to free.
 */
const WORKER = `
export default {
  async fetch(request, env) {
    const { op, statements } = await request.json();
    const prepared = statements.map((s) => env.DB.prepare(s.sql).bind(...s.params));
    try {
      const results = op === "batch" ? await env.DB.batch(prepared) : [await prepared[0].all()];
      return Response.json({ results: results.map((r) => ({ results: r.results, meta: r.meta })) });
    } catch (error) {
      return Response.json({ error: String(error && error.message) }, { status: 500 });
    }
  },
};
`;

interface Statement {
  readonly sql: string;
  readonly params: readonly unknown[];
}

export interface D1Peer {
  readonly db: D1DatabaseLike;
  dispose(): Promise<void>;
}

/** One workerd with one in-memory D1 database, and its binding reached from Node. */
export async function startD1(): Promise<D1Peer> {
  const miniflare = new Miniflare({ modules: true, script: WORKER, d1Databases: { DB: "mam-d1" } });
  await miniflare.ready;
  const send = async (op: "batch" | "all", statements: readonly Statement[]): Promise<D1ResultLike[]> => {
    const response = await miniflare.dispatchFetch("http://d1.test/", { method: "POST", body: JSON.stringify({ op, statements }) });
    const body = (await response.json()) as { results?: D1ResultLike[]; error?: string };
    if (body.error !== undefined) throw new Error(body.error);
    return body.results ?? [];
  };
  const statement = (sql: string, params: readonly unknown[]): D1PreparedStatementLike & Statement => ({
    sql,
    params,
    bind: (...values: unknown[]) => statement(sql, values),
    all: async () => {
      const [result] = await send("all", [{ sql, params }]);
      if (result === undefined) throw new Error("D1 answered no result");
      return result;
    },
  });
  const db: D1DatabaseLike = {
    prepare: (sql) => statement(sql, []),
    batch: (statements) => send("batch", statements as unknown as Statement[]),
  };
  return { db, dispose: () => miniflare.dispose() };
}

/** Emptied of every table a test made (D1's own `_cf_` tables and SQLite's stay). */
export async function dropTables(driver: D1Driver): Promise<void> {
  const tables = await driver.query(
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_cf_%'",
  );
  if (tables.length > 0) await driver.batch(tables.map((t) => sql(`DROP TABLE "${String(t.name)}"`)));
}

/**
 * One Miniflare (one workerd process) for a test file, started on first use and
 * disposed after the file: `database()` its D1 binding, `emptied()` a driver on it with
 * the last test's tables dropped.
 */
export function d1ForFile(): { database(): Promise<D1DatabaseLike>; emptied(): Promise<D1Driver> } {
  let peer: Promise<D1Peer> | undefined;
  afterAll(async () => {
    await (await peer)?.dispose();
  });
  const database = async () => {
    peer ??= startD1();
    return (await peer).db;
  };
  return {
    database,
    async emptied() {
      const driver = new D1Driver(await database());
      await dropTables(driver);
      return driver;
    },
  };
}
