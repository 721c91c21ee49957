import path from "node:path";
import { startService } from "@mam/cli";
import { type ChangeDraft, changeRowsOf, type JobRecord, parseConfig } from "@mam/core";
import { SqliteJobStore } from "@mam/local";
import Database from "better-sqlite3";
import { jobRecord } from "../tests/support/records.ts";
import { fixed, grouped, machineNote, median, sizeFromEnv, tempDir, verdict } from "./support/measure.ts";

/**
 * Reading the change feed: MAM_BENCH_FEED_ROWS (100,000) committed changes read
 * through `GET /v1/events` pages of 1,000 (`mam serve`'s app over SQLite, in this
 * process, over HTTP on loopback with the operator token; each page's JSON parsed by
 * the reader, each next page asked with the cursor it handed back), against the same
 * rows read by a bare better-sqlite3 keyset query (`WHERE cursor > ? ORDER BY cursor
 * LIMIT 1000`, each row's JSON parsed), on the same file. Also the feed read through
 * the store port alone (the guard, which wraps each row's cursor), to say where the
 * time goes: SQL and JSON in the store, the cursors, then HTTP and the JSON of the page.
 *
 * The rows are written straight into the `changes` table in one transaction, shaped by
 * core's own `changeRowsOf` (registered, claimed, completed with an intent): the
 * benchmark measures reading, not committing.
 *
 * Goal: mam >= 0.5x the bare query's rows/s (median of MAM_BENCH_FEED_ROUNDS (3) rounds).
 */

const ROWS = sizeFromEnv("MAM_BENCH_FEED_ROWS", process.env.MAM_BENCH_FEED_ROWS, 100_000);
const ROUNDS = sizeFromEnv("MAM_BENCH_FEED_ROUNDS", process.env.MAM_BENCH_FEED_ROUNDS, 3);
const PAGE = 1000;
const RATIO_GOAL = 0.5;
const AT = "2026-11-20T10:00:00.000Z";

/** One job as this bench's rows carry it: the kit's record builder, at AT. */
const job = (id: string, over: Partial<JobRecord> = {}): JobRecord =>
  jobRecord(id, { agent: "codex", iteration: 1, created_at: AT, updated_at: AT, ...over });

/** The rows of one job's life: registered, claimed, completed (with the intent it owes). */
function lifeOf(i: number): ChangeDraft[] {
  const id = `bench-feed-${i}`;
  const actor = { actor: { type: "agent" as const, token_id: "4f1c2b3a-5d6e-4f70-8a9b-0c1d2e3f4a5b" } };
  const created = job(id);
  const running = job(id, { status: "running", transition_seq: 1 });
  const done = job(id, {
    status: "completed",
    transition_seq: 2,
    pending_notification: { id: `intent-${i}`, event: "completed", seq: 2, created_at: AT },
  });
  return [...changeRowsOf(undefined, created, actor), ...changeRowsOf(created, running, actor), ...changeRowsOf(running, done, actor)];
}

async function main(): Promise<void> {
  const tmp = await tempDir("bench-feed");
  try {
    const dataDir = path.join(tmp.dir, "data");
    const service = await startService(
      parseConfig({ MAM_DATA_DIR: dataDir, MAM_PORT: "0", MAM_MQTT_PORT: "0", MAM_SWEEP_INTERVAL_SECONDS: "3600" }),
      () => undefined,
    );
    const file = path.join(dataDir, "mam.db");
    const db = new Database(file);
    db.pragma("busy_timeout = 5000");
    const insert = db.prepare("INSERT INTO changes (job_id, at, row) VALUES (?, ?, ?)");
    db.transaction(() => {
      let written = 0;
      for (let i = 0; written < ROWS; i++) {
        for (const { job_id, ...row } of lifeOf(i)) {
          if (written === ROWS) break;
          insert.run(job_id, AT, JSON.stringify(row));
          written += 1;
        }
      }
    })();

    const bare = (): number => {
      const page = db.prepare("SELECT cursor, job_id, at, row FROM changes WHERE cursor > ? ORDER BY cursor LIMIT ?");
      let after = 0;
      let count = 0;
      for (;;) {
        const rows = page.all(after, PAGE) as { cursor: number; job_id: string; at: string; row: string }[];
        if (rows.length === 0) return count;
        for (const r of rows) {
          const parsed = { cursor: r.cursor, job_id: r.job_id, at: r.at, ...JSON.parse(r.row) };
          if (parsed.job_id === undefined) throw new Error("a row without its job");
        }
        count += rows.length;
        after = rows[rows.length - 1]!.cursor;
      }
    };

    const port = new SqliteJobStore(file);
    const guarded = port;
    const throughPort = async (): Promise<number> => {
      let after: string | undefined;
      let count = 0;
      for (;;) {
        const page = await guarded.listChanges({ limit: PAGE, ...(after === undefined ? {} : { after }) });
        if (page.items.length === 0) return count;
        count += page.items.length;
        after = page.cursor;
      }
    };

    // The reader's own share: decoding and parsing each page's JSON (what `res.json()` does, timed apart).
    let readerParseMs = 0;
    const overHttp = async (): Promise<number> => {
      let after: string | undefined;
      let count = 0;
      readerParseMs = 0;
      for (;;) {
        const url = `${service.url}/v1/events?limit=${PAGE}${after === undefined ? "" : `&after=${encodeURIComponent(after)}`}`;
        const res = await fetch(url, { headers: { authorization: `Bearer ${service.operatorToken}` } });
        if (res.status !== 200) throw new Error(`GET /v1/events answered ${res.status}: ${await res.text()}`);
        const bytes = await res.arrayBuffer();
        const parsing = performance.now();
        const page = JSON.parse(new TextDecoder().decode(bytes)) as { items: unknown[]; cursor: string };
        readerParseMs += performance.now() - parsing;
        if (page.items.length === 0) return count;
        count += page.items.length;
        after = page.cursor;
      }
    };

    const timed = async (fn: () => number | Promise<number>): Promise<{ rows: number; seconds: number }> => {
      const started = performance.now();
      const rows = await fn();
      return { rows, seconds: (performance.now() - started) / 1000 };
    };

    // Warm-up: each side once.
    await timed(bare);
    await timed(throughPort);
    await timed(overHttp);
    const ratios: number[] = [];
    const shares = { bare: [] as number[], port: [] as number[], http: [] as number[], parse: [] as number[] };
    for (let round = 1; round <= ROUNDS; round++) {
      const sides = round % 2 === 1 ? (["bare", "port", "http"] as const) : (["http", "port", "bare"] as const);
      const result: Record<string, { rows: number; seconds: number }> = {};
      for (const side of sides) result[side] = await timed(side === "bare" ? bare : side === "port" ? throughPort : overHttp);
      const rate = (s: string) => result[s]!.rows / result[s]!.seconds;
      for (const s of ["bare", "port", "http"] as const) {
        if (result[s]!.rows !== ROWS) throw new Error(`${s} read ${result[s]!.rows} rows, not ${ROWS}`);
        shares[s].push(result[s]!.seconds);
      }
      shares.parse.push(readerParseMs / 1000);
      ratios.push(rate("http") / rate("bare"));
      console.log(
        `round ${round}: bare ${grouped(Math.round(rate("bare")))} rows/s, store port ${grouped(Math.round(rate("port")))} rows/s, ` +
          `GET /v1/events ${grouped(Math.round(rate("http")))} rows/s: ${fixed(rate("http") / rate("bare"), 2)}x`,
      );
    }
    const ratio = median(ratios);
    const bareS = median(shares.bare);
    const portS = median(shares.port);
    const httpS = median(shares.http);
    const parseS = median(shares.parse);
    console.log(
      `where the time of reading ${grouped(ROWS)} rows over HTTP goes (medians): the bare query and JSON ${fixed(bareS * 1000, 0)} ms; ` +
        `the store port (its SQL, each row's cursor, and parsing each row's JSON) ${fixed(portS * 1000, 0)} ms; ` +
        `over HTTP, total ${fixed(httpS * 1000, 0)} ms, of which the reader decoding and parsing the pages' JSON ${fixed(parseS * 1000, 0)} ms ` +
        `and the rest (the server's SQL and cursors, splicing each stored row's JSON into the page, auth, HTTP both ways) ${fixed((httpS - parseS) * 1000, 0)} ms`,
    );
    console.log(`feed read: ${fixed(ratio, 2)}x the bare query (goal >= ${RATIO_GOAL}x): ${verdict(ratio >= RATIO_GOAL)}`);
    console.log(machineNote());
    await port.close();
    db.close();
    await service.stop();
  } finally {
    await tmp.dispose();
  }
}

await main();
