/**
 * The feed rules compiled to SQL (`feedRowStatements`) make, on a real engine, the
 * rows the imperative `changeRowsOf` made before the rules (tests/support/feed-oracle.ts),
 * for generated writes run as the SQL store's batch runs them: the record before in
 * `jobs`, then, in one batch, the UPDATE that writes the record after and captures
 * `feed_before` (`feedBeforeCapture` of a shape the write could be declared with:
 * its class and some of the fields it leaves alone or removes, `declaredShape`) and
 * stamps a token, and that shape's feed statements. The rows read back, in cursor
 * order, are the oracle's drafts; statements carrying another token insert nothing.
 * Run on every driver of the seam: better-sqlite3 (tests/contract/sql-feed-rules.test.ts)
 * and D1 under Miniflare (tests/d1/sql-feed-rules.test.ts).
 */
import { CHANGE_KINDS, type ChangeDraft, CREATE_SHAPE } from "@mam/core";
import { feedBeforeCapture, feedRowStatements, SQL_LIMITS, type SqlDriver, type SqlStatement, sql } from "@mam/local";
import { describe, expect, it } from "vitest";
import { declaredPins, declaredShape, type FeedWrite, feedWrites, kindCounts } from "../support/feed-cases.ts";
import { oracleChangeRowsOf } from "../support/feed-oracle.ts";

export interface SqlFeedRulesSubject {
  readonly driver: SqlDriver;
  close(): Promise<void>;
}

const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

/** The capture of `shape` as the store assigns it (none when its rules read nothing of the record before). */
function captureOf(shape: Parameters<typeof feedBeforeCapture>[0]): string {
  const capture = feedBeforeCapture(shape);
  return capture === undefined ? "" : `feed_before = ${capture}, `;
}

/** The layout the rules read: `jobs` with the columns the store mirrors (status, transition_seq), and `changes`. */
const LAYOUT = [
  sql("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, status TEXT, transition_seq INTEGER, doc TEXT, feed_before TEXT, write_token TEXT)"),
  sql("CREATE TABLE changes (cursor INTEGER PRIMARY KEY AUTOINCREMENT, job_id, at, row)"),
];

/** The write of case `i` as its own job, and the statements of its batch: the write, other tokens' feed statements, its own. */
function writeOf(
  w: FeedWrite,
  i: number,
): {
  readonly jobId: string;
  readonly write: FeedWrite;
  readonly setup: SqlStatement[];
  readonly feed: SqlStatement[];
  readonly stray: SqlStatement[];
} {
  const jobId = `feed-rules-${i}`;
  const after = { ...w.after, job_id: jobId };
  const before = w.before === undefined ? undefined : { ...w.before, job_id: jobId };
  const token = `write-${i}`;
  const shape = declaredShape(w, i);
  const pins = declaredPins(w);
  const insert = (record: typeof after, stamp: string) =>
    sql(
      "INSERT INTO jobs (job_id, status, transition_seq, doc, feed_before, write_token) VALUES (?, ?, ?, ?, NULL, ?)",
      jobId,
      record.status,
      record.transition_seq,
      JSON.stringify(record),
      stamp,
    );
  const setup =
    before === undefined
      ? [insert(after, token)]
      : [
          insert(before, `earlier-${i}`),
          sql(
            `UPDATE jobs SET ${captureOf(shape)}status = ?, transition_seq = ?, doc = ?, write_token = ? WHERE job_id = ?`,
            after.status,
            after.transition_seq,
            JSON.stringify(after),
            token,
            jobId,
          ),
        ];
  return {
    jobId,
    write: { before, after, note: w.note },
    setup,
    feed: feedRowStatements(jobId, token, w.note, shape, pins),
    // The token of the row as it stood before this write, and one no write stamped.
    stray: [
      ...feedRowStatements(jobId, `earlier-${i}`, w.note, shape, pins),
      ...feedRowStatements(jobId, "never-stamped", w.note, shape, pins),
    ],
  };
}

export function sqlFeedRulesContract(
  name: string,
  open: () => Promise<SqlFeedRulesSubject>,
  options: { cases: number; casesPerBatch: number },
): void {
  describe(`the feed rules compiled to SQL: ${name}`, () => {
    it(`inserts exactly the oracle's rows, in order, for ${options.cases} generated writes; another token's statements insert nothing`, async () => {
      const subject = await open();
      try {
        const { driver } = subject;
        await driver.batch(LAYOUT);
        const writes = feedWrites(options.cases).map(writeOf);
        for (let start = 0; start < writes.length; start += options.casesPerBatch) {
          const group = writes.slice(start, start + options.casesPerBatch);
          const statements = group.flatMap((w) => [...w.setup, ...w.stray, ...w.feed]);
          const results = await driver.batch(statements);
          let at = 0;
          for (const w of group) {
            at += w.setup.length;
            const stray = results.slice(at, at + w.stray.length);
            at += w.stray.length;
            const feed = results.slice(at, at + w.feed.length);
            at += w.feed.length;
            expect(
              stray.map((r) => r.changes),
              `${w.jobId}: another token's statements`,
            ).toEqual(w.stray.map(() => 0));
            const inserted = feed.reduce((n, r) => n + r.changes, 0);
            expect(inserted, `${w.jobId}: rows inserted`).toBe(oracleChangeRowsOf(w.write.before, w.write.after, w.write.note).length);
          }
        }

        const stored = await driver.query("SELECT cursor, job_id, at, row FROM changes ORDER BY cursor");
        const byJob = new Map<string, ChangeDraft[]>();
        for (const r of stored) {
          expect(String(r.at)).toMatch(ISO);
          const draft = { job_id: String(r.job_id), ...(JSON.parse(String(r.row)) as Omit<ChangeDraft, "job_id">) };
          byJob.set(draft.job_id, [...(byJob.get(draft.job_id) ?? []), draft]);
        }
        const all: ChangeDraft[] = [];
        for (const w of writes) {
          const expected = oracleChangeRowsOf(w.write.before, w.write.after, w.write.note);
          expect(byJob.get(w.jobId) ?? [], `${w.jobId}: ${JSON.stringify(w.write)}`).toStrictEqual(expected);
          all.push(...expected);
        }
        const counts = kindCounts(all, CHANGE_KINDS);
        console.log(`feed rules on ${name}, ${options.cases} writes: rows per kind`, counts);
        for (const kind of CHANGE_KINDS) expect(counts[kind], kind).toBeGreaterThanOrEqual(1);
      } finally {
        await subject.close();
      }
    });

    it("a created record's row reads no feed_before; a write whose UPDATE matched nothing leaves no row", async () => {
      const subject = await open();
      try {
        const { driver } = subject;
        await driver.batch([
          ...LAYOUT,
          sql(
            "INSERT INTO jobs (job_id, status, transition_seq, doc, feed_before, write_token) VALUES ('j-1', 'pending', 0, ?, NULL, 't-0')",
            JSON.stringify({ job_id: "j-1", status: "pending", transition_seq: 0 }),
          ),
        ]);
        // A conditional UPDATE that lost (its condition failed): the token is not stamped.
        const transition = { writeClass: "transition", untouched: [], removed: [] } as const;
        const lost = await driver.batch([
          sql(
            `UPDATE jobs SET ${captureOf(transition)}transition_seq = 1, doc = json_set(doc, '$.transition_seq', 1), write_token = 't-1' WHERE job_id = 'j-1' AND transition_seq = 7`,
          ),
          ...feedRowStatements("j-1", "t-1", undefined, transition),
        ]);
        expect(lost.map((r) => r.changes)).toEqual(lost.map(() => 0));
        // Each class's rules merged into as few statements as the parameter limit allows, each well inside the seam's limits (D1's).
        for (const writeClass of ["create", "transition", "evidence", "intent"] as const) {
          const statements = feedRowStatements(
            "j-1",
            "t-0",
            { staged: { sha256: "a".repeat(64), bytes: 1 }, declared: { sha256: "b".repeat(64), bytes: 2 } },
            { writeClass, untouched: [], removed: [] },
          );
          expect(statements.length, writeClass).toBe(1);
          for (const s of statements) {
            expect(s.params.length).toBeLessThanOrEqual(SQL_LIMITS.paramsPerStatement);
            expect(new TextEncoder().encode(s.sql).length).toBeLessThanOrEqual(SQL_LIMITS.statementBytes);
          }
        }
        // The created record's own token: one job.registered row, the service's.
        await driver.batch(feedRowStatements("j-1", "t-0", undefined, CREATE_SHAPE));
        const rows = await driver.query("SELECT job_id, row FROM changes ORDER BY cursor");
        expect(rows.map((r) => ({ job_id: r.job_id, ...JSON.parse(String(r.row)) }))).toStrictEqual([
          { job_id: "j-1", kind: "job.registered", actor: { type: "service" }, data: { status: "pending" } },
        ]);
      } finally {
        await subject.close();
      }
    });
  });
}
