import { MamError } from "@mam/core";
import { SQL_LIMITS, SqlBatchError, type SqlDriver, type SqlStatement, type SqlValue, sql } from "@mam/local";
import { afterEach, beforeEach, describe, expect, it } from "vitest";

/**
 * What a database under test gives the suite: a driver on a fresh, empty database,
 * `racer()` for another driver on the same database (another connection where the
 * engine has connections) for the race tests, and how to let it all go.
 */
export interface SqlDriverFixture {
  readonly driver: SqlDriver;
  racer(): Promise<SqlDriver>;
  close(): Promise<void>;
}

/** How many racers contend for one transition, and how many times the race runs (MAM_RACE_TRIALS). */
export const RACERS = 32;
const TRIALS = Number(process.env.MAM_RACE_TRIALS ?? 5);

const SCHEMA: SqlStatement[] = [
  sql(`CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed')),
    seq INTEGER NOT NULL,
    winner TEXT,
    before_status TEXT,
    write_token TEXT
  )`),
  sql(`CREATE TABLE changes (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    from_status TEXT,
    to_status TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE
  )`),
  sql("CREATE TABLE wide (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"),
];

/**
 * A transition as the SQL store on this seam will write it, one batch, no JavaScript
 * between its statements:
 *
 *   UPDATE … WHERE seq = expected   captures the old status into before_status (an
 *     RETURNING                     assignment's right side reads the old row) and
 *                                   stamps the batch's token
 *   INSERT INTO changes … SELECT    reads the captured old value and the new one,
 *     … WHERE write_token = token   only if this batch's UPDATE matched
 *
 * A lost condition changes nothing: the UPDATE matches no row, so no row carries the
 * token, so the INSERT selects nothing.
 */
function transition(jobId: string, expectedSeq: number, to: string, token: string): SqlStatement[] {
  return [
    sql(
      `UPDATE jobs SET before_status = status, status = ?, seq = seq + 1, winner = ?, write_token = ?
       WHERE job_id = ? AND seq = ? RETURNING job_id, status, seq, before_status`,
      to,
      token,
      token,
      jobId,
      expectedSeq,
    ),
    sql(
      `INSERT INTO changes (job_id, from_status, to_status, token)
       SELECT job_id, before_status, status, write_token FROM jobs WHERE job_id = ? AND write_token = ?`,
      jobId,
      token,
    ),
  ];
}

function placeholders(n: number): string {
  return Array.from({ length: n }, () => "?").join(", ");
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error("expected a rejection");
}

/** The SqlDriver contract: what every driver of the seam (better-sqlite3, D1) must do, observed through the seam alone. */
export function sqlDriverContract(name: string, make: () => Promise<SqlDriverFixture>): void {
  describe(`SqlDriver contract: ${name}`, () => {
    let fixture: SqlDriverFixture;
    let driver: SqlDriver;

    beforeEach(async () => {
      fixture = await make();
      driver = fixture.driver;
      await driver.batch(SCHEMA);
    });
    afterEach(async () => {
      await fixture.close();
    });

    const count = async (table: string) => (await driver.query(`SELECT count(*) AS n FROM ${table}`))[0]?.n;

    it("a batch answers one result per statement, in order: rows of a query and of RETURNING, and the rows each statement changed", async () => {
      const results = await driver.batch([
        sql("INSERT INTO jobs (job_id, status, seq) VALUES (?, 'pending', 0)", "a"),
        sql("INSERT INTO jobs (job_id, status, seq) VALUES (?, 'pending', 0) RETURNING job_id, seq", "b"),
        sql("UPDATE jobs SET seq = seq + 1 RETURNING job_id, seq"),
        sql("UPDATE jobs SET seq = seq + 1 WHERE job_id = ?", "nobody"),
        sql("SELECT job_id, seq FROM jobs ORDER BY job_id"),
      ]);
      expect(results.map((r) => r.changes)).toEqual([1, 1, 2, 0, 0]);
      expect(results[0]?.rows).toEqual([]);
      expect(results[1]?.rows).toEqual([{ job_id: "b", seq: 0 }]);
      expect([...(results[2]?.rows ?? [])].sort((x, y) => String(x.job_id).localeCompare(String(y.job_id)))).toEqual([
        { job_id: "a", seq: 1 },
        { job_id: "b", seq: 1 },
      ]);
      expect(results[3]?.rows).toEqual([]);
      expect(results[4]?.rows).toEqual([
        { job_id: "a", seq: 1 },
        { job_id: "b", seq: 1 },
      ]);
    });

    it("an empty batch answers nothing and runs nothing", async () => {
      expect(await driver.batch([])).toEqual([]);
    });

    it("values round-trip: text, integers, reals and NULL", async () => {
      const rows = await driver.query("SELECT ? AS t, ? AS i, ? AS r, ? AS n, ? AS u", ["é ✓ x", 9007199254740991, 1.5, null, ""]);
      expect(rows).toEqual([{ t: "é ✓ x", i: 9007199254740991, r: 1.5, n: null, u: "" }]);
    });

    it("a CHECK violation mid-batch leaves nothing of the batch: the statements before it are rolled back", async () => {
      await driver.batch([sql("INSERT INTO jobs (job_id, status, seq) VALUES ('kept', 'pending', 0)")]);
      const error = await rejection(
        driver.batch([
          sql("INSERT INTO jobs (job_id, status, seq) VALUES ('one', 'pending', 0)"),
          sql("UPDATE jobs SET seq = 7 WHERE job_id = 'kept'"),
          sql("INSERT INTO jobs (job_id, status, seq) VALUES ('two', 'nonsense', 0)"),
          sql("INSERT INTO jobs (job_id, status, seq) VALUES ('three', 'pending', 0)"),
        ]),
      );
      expect(error).toBeInstanceOf(SqlBatchError);
      expect((error as SqlBatchError).constraint).toBe(true);
      expect(await driver.query("SELECT job_id, seq FROM jobs")).toEqual([{ job_id: "kept", seq: 0 }]);
    });

    it("a UNIQUE violation mid-batch leaves nothing of the batch, RETURNING rows before it included", async () => {
      await driver.batch([sql("INSERT INTO jobs (job_id, status, seq) VALUES ('a', 'pending', 0)")]);
      const error = await rejection(
        driver.batch([
          sql("UPDATE jobs SET status = 'running', seq = 1 WHERE job_id = 'a' RETURNING seq"),
          sql("INSERT INTO changes (job_id, to_status, token) VALUES ('a', 'running', 't')"),
          sql("INSERT INTO changes (job_id, to_status, token) VALUES ('a', 'running', 't')"),
        ]),
      );
      expect(error).toBeInstanceOf(SqlBatchError);
      expect((error as SqlBatchError).constraint).toBe(true);
      expect(await driver.query("SELECT status, seq FROM jobs")).toEqual([{ status: "pending", seq: 0 }]);
      expect(await count("changes")).toBe(0);
    });

    it("a fault that is not a constraint (a missing table) mid-batch leaves nothing either, and says it is no constraint", async () => {
      const error = await rejection(
        driver.batch([sql("INSERT INTO jobs (job_id, status, seq) VALUES ('a', 'pending', 0)"), sql("INSERT INTO nowhere VALUES (1)")]),
      );
      expect(error).toBeInstanceOf(SqlBatchError);
      expect((error as SqlBatchError).constraint).toBe(false);
      expect(await count("jobs")).toBe(0);
    });

    it("a conditional write, UPDATE … WHERE seq = ? RETURNING: the current seq wins and returns the new row; a stale one changes nothing", async () => {
      await driver.batch([sql("INSERT INTO jobs (job_id, status, seq) VALUES ('a', 'pending', 0)")]);
      const won = await driver.batch([
        sql("UPDATE jobs SET status = 'running', seq = seq + 1 WHERE job_id = ? AND seq = ? RETURNING status, seq", "a", 0),
      ]);
      expect(won[0]).toEqual({ rows: [{ status: "running", seq: 1 }], changes: 1 });
      const stale = await driver.batch([
        sql("UPDATE jobs SET status = 'completed', seq = seq + 1 WHERE job_id = ? AND seq = ? RETURNING status, seq", "a", 0),
      ]);
      expect(stale[0]).toEqual({ rows: [], changes: 0 });
      expect(await driver.query("SELECT status, seq FROM jobs")).toEqual([{ status: "running", seq: 1 }]);
    });

    it("the old values the UPDATE captured are read by the next statement of the same batch, and a lost condition writes no feed row", async () => {
      await driver.batch([sql("INSERT INTO jobs (job_id, status, seq) VALUES ('a', 'pending', 0)")]);
      const won = await driver.batch(transition("a", 0, "running", "t-1"));
      expect(won[0]?.rows).toEqual([{ job_id: "a", status: "running", seq: 1, before_status: "pending" }]);
      expect(won[1]?.changes).toBe(1);
      const lost = await driver.batch(transition("a", 0, "completed", "t-2"));
      expect(lost.map((r) => r.changes)).toEqual([0, 0]);
      const next = await driver.batch(transition("a", 1, "completed", "t-3"));
      expect(next.map((r) => r.changes)).toEqual([1, 1]);
      expect(await driver.query("SELECT job_id, from_status, to_status, token FROM changes ORDER BY cursor")).toEqual([
        { job_id: "a", from_status: "pending", to_status: "running", token: "t-1" },
        { job_id: "a", from_status: "running", to_status: "completed", token: "t-3" },
      ]);
    });

    it(`a statement may bind ${SQL_LIMITS.paramsPerStatement} parameters; one more is refused (store.unsupported) before anything of the batch runs`, async () => {
      const values = (n: number): SqlValue[] => Array.from({ length: n }, (_, i) => i);
      const n = SQL_LIMITS.paramsPerStatement;
      const at = await driver.query(`SELECT ${Array.from({ length: n }, () => "?").join(" + ")} AS total`, values(n));
      expect(at).toEqual([{ total: (n * (n - 1)) / 2 }]);
      const error = await rejection(
        driver.batch([
          sql("INSERT INTO jobs (job_id, status, seq) VALUES ('a', 'pending', 0)"),
          { sql: `SELECT ${placeholders(SQL_LIMITS.paramsPerStatement + 1)}`, params: values(SQL_LIMITS.paramsPerStatement + 1) },
        ]),
      );
      expect(error).toBeInstanceOf(MamError);
      expect((error as MamError).code).toBe("store.unsupported");
      expect((error as MamError).message).toMatch(/statement 1 of the batch binds 101 parameters/);
      expect(await count("jobs")).toBe(0);
      await expect(driver.query(`SELECT ${placeholders(101)}`, values(101))).rejects.toMatchObject({ code: "store.unsupported" });
    });

    it("SQL text past the statement size, a value past the value size, and transaction control are refused before anything runs", async () => {
      const long = `SELECT 1 ${" ".repeat(SQL_LIMITS.statementBytes)}`;
      const big = "x".repeat(SQL_LIMITS.valueBytes + 1);
      for (const statement of [
        sql(long),
        sql("INSERT INTO wide (body) VALUES (?)", big),
        sql("BEGIN"),
        sql(" savepoint s1"),
        sql("COMMIT"),
      ]) {
        const error = await rejection(driver.batch([sql("INSERT INTO wide (body) VALUES ('first')"), statement]));
        expect(error).toBeInstanceOf(MamError);
        expect((error as MamError).code).toBe("store.unsupported");
      }
      expect(await count("wide")).toBe(0);
    });

    it("a value of a megabyte round-trips (inside the value size)", async () => {
      const body = "é".repeat(500_000);
      await driver.batch([sql("INSERT INTO wide (id, body) VALUES (1, ?)", body)]);
      const rows = await driver.query("SELECT length(body) AS chars, body FROM wide WHERE id = 1");
      expect(rows[0]?.chars).toBe(500_000);
      expect(rows[0]?.body === body).toBe(true);
    });

    it("concurrent batches on one driver stay units of their own: the one that fails leaves nothing, the others commit", async () => {
      const outcomes = await Promise.allSettled(
        Array.from({ length: 8 }, (_, i) =>
          driver.batch([
            sql("INSERT INTO jobs (job_id, status, seq) VALUES (?, 'pending', 0)", `unit-${i}`),
            sql("INSERT INTO changes (job_id, to_status, token) VALUES (?, 'pending', ?)", `unit-${i}`, i === 3 ? "unit-0" : `unit-${i}`),
          ]),
        ),
      );
      expect(outcomes.map((o) => o.status)).toEqual([
        "fulfilled",
        "fulfilled",
        "fulfilled",
        "rejected",
        "fulfilled",
        "fulfilled",
        "fulfilled",
        "fulfilled",
      ]);
      expect(outcomes[3]?.status === "rejected" && outcomes[3].reason).toBeInstanceOf(SqlBatchError);
      expect((await driver.query("SELECT job_id FROM jobs ORDER BY job_id")).map((r) => r.job_id)).toEqual([
        "unit-0",
        "unit-1",
        "unit-2",
        "unit-4",
        "unit-5",
        "unit-6",
        "unit-7",
      ]);
      expect(await count("changes")).toBe(7);
    });
    it(
      `${RACERS} concurrent batches racing for one conditional transition: exactly one wins, and only its feed row commits (${TRIALS} trials)`,
      async () => {
        const racers = await Promise.all(Array.from({ length: RACERS }, () => fixture.racer()));
        try {
          for (let trial = 0; trial < TRIALS; trial++) {
            const jobId = `race-${trial}`;
            await driver.batch([sql("INSERT INTO jobs (job_id, status, seq) VALUES (?, 'pending', 0)", jobId)]);
            const outcomes = await Promise.all(
              racers.map((racer, i) => racer.batch(transition(jobId, 0, "running", `${jobId}-racer-${i}`))),
            );
            const winners = outcomes.flatMap((results, i) => ((results[0]?.rows.length ?? 0) > 0 ? [i] : []));
            expect(winners).toHaveLength(1);
            const winner = `${jobId}-racer-${winners[0]}`;
            expect(outcomes.filter((results) => results[1]?.changes === 1)).toHaveLength(1);
            expect(await driver.query("SELECT status, seq, winner FROM jobs WHERE job_id = ?", [jobId])).toEqual([
              { status: "running", seq: 1, winner },
            ]);
            expect(await driver.query("SELECT token FROM changes WHERE job_id = ?", [jobId])).toEqual([{ token: winner }]);
          }
        } finally {
          await Promise.all(racers.map((racer) => (racer === driver ? undefined : racer.close())));
        }
        // A trial on D1 is 32 requests into workerd: under a second here, on a shared machine.
      },
      30_000 + TRIALS * 3_000,
    );

    it(`${RACERS} concurrent batches racing to create one row (INSERT … ON CONFLICT DO NOTHING RETURNING): exactly one creates it`, async () => {
      const racers = await Promise.all(Array.from({ length: RACERS }, () => fixture.racer()));
      try {
        const outcomes = await Promise.all(
          racers.map((racer, i) =>
            racer.batch([
              sql(
                "INSERT INTO jobs (job_id, status, seq, winner) VALUES ('once', 'pending', 0, ?) ON CONFLICT (job_id) DO NOTHING RETURNING winner",
                `racer-${i}`,
              ),
            ]),
          ),
        );
        const created = outcomes.flatMap((results) => results[0]?.rows ?? []);
        expect(created).toHaveLength(1);
        expect(outcomes.map((results) => results[0]?.changes ?? 0).reduce((a, b) => a + b, 0)).toBe(1);
        expect(await driver.query("SELECT winner FROM jobs WHERE job_id = 'once'")).toEqual(created);
      } finally {
        await Promise.all(racers.map((racer) => (racer === driver ? undefined : racer.close())));
      }
    });
  });
}
