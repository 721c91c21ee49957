/**
 * Issue 19, part 7: every start-up failure of a root is one line naming what to
 * change, exit 1, no stack trace: a bad variable, a data dir that is not one (a file
 * where the directory belongs, a database that is not a database or is a directory,
 * credentials that are not JSON) — for `mam serve` and for the `mam` command on a
 * data dir. (Taken ports: tests/e2e/taken-ports.test.ts; a bad MAM_OPERATOR_TOKEN:
 * serve-config.test.ts; the Lambda roots: tests/functions/start-failures.test.ts.)
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runMam } from "../support/mam-process.ts";
import { refusedServe } from "../support/serve-process.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

let tmp: TempDir;
beforeAll(async () => {
  tmp = await tempDir("start-failures");
});
afterAll(async () => {
  await tmp?.remove();
});

const lines = (text: string) => text.split("\n").filter((l) => l !== "");

/** Each case: what to lay out in a fresh data dir's place, the environment, and what the one line must name. */
const CASES: readonly {
  readonly name: string;
  readonly lay: (dir: string) => void;
  readonly env?: Record<string, string>;
  readonly names: readonly string[];
}[] = [
  { name: "a bad variable", lay: () => undefined, env: { MAM_SWEEP_INTERVAL_SECONDS: "often" }, names: ["MAM_SWEEP_INTERVAL_SECONDS"] },
  { name: "the data dir is a file", lay: (dir) => writeFileSync(dir, "not a directory\n"), names: ["MAM_DATA_DIR", "not a directory"] },
  {
    name: "the database is not a database",
    lay: (dir) => {
      mkdirSync(dir, { mode: 0o700 });
      writeFileSync(join(dir, "mam.db"), "x".repeat(4096));
    },
    names: ["mam.db", "not a database", "MAM_DATA_DIR"],
  },
  {
    name: "the database is a directory",
    lay: (dir) => mkdirSync(join(dir, "mam.db"), { recursive: true, mode: 0o700 }),
    names: ["mam.db", "a directory", "MAM_DATA_DIR"],
  },
  {
    // Found only after the broker is up (the reports' directory is made when the store opens).
    name: "a file where the reports' directory belongs",
    lay: (dir) => {
      mkdirSync(dir, { mode: 0o700 });
      writeFileSync(join(dir, "reports"), "not a directory\n", { mode: 0o600 });
    },
    names: ["reports", "a file, not a directory", "move it away"],
  },
  {
    name: "the credentials are not JSON",
    lay: (dir) => {
      mkdirSync(dir, { mode: 0o700 });
      writeFileSync(join(dir, "credentials.json"), "{ not json", { mode: 0o600 });
    },
    names: ["credentials.json", "not JSON", "move it away"],
  },
];

describe("issue 19: a start-up failure is one line naming what to change, exit 1", () => {
  it.each(CASES)(
    "mam serve, $name",
    async ({ name, lay, env, names }) => {
      const dataDir = join(tmp.dir, `serve-${name.replace(/\W+/g, "-")}`);
      lay(dataDir);
      const { code, stderr } = await refusedServe(dataDir, env);
      expect(code, stderr).toBe(1);
      expect(lines(stderr), stderr).toHaveLength(1);
      expect(stderr).toMatch(/^mam serve: /);
      for (const n of names) expect(stderr).toContain(n);
      expect(stderr).not.toMatch(/^\s+at /m);
    },
    30_000,
  );

  it.each(CASES.filter((c) => c.name.startsWith("the database")))(
    "mam publish-event --data-dir, $name",
    async ({ name, lay, names }) => {
      const dataDir = join(tmp.dir, `cli-${name.replace(/\W+/g, "-")}`);
      lay(dataDir);
      const run = await runMam(["publish-event", "--job", "j-1", "--event", "started", "--data-dir", dataDir], { killAfterMs: 20_000 });
      expect(run.status, run.stderr).toBe(1);
      expect(lines(run.stderr), run.stderr).toHaveLength(1);
      for (const n of names) expect(run.stderr).toContain(n);
      expect(run.stderr).not.toContain("unexpected error");
      expect(run.stdout).toBe("");
    },
    30_000,
  );

  // A hand-edited credentials.json that lost a quote: the JSON parser's own message
  // quotes the text around where it stopped, which here is the signing key itself.
  it("mam serve and the mam command, credentials that are not JSON: the line quotes none of the secrets in them", async () => {
    const secret = "k3y-0123456789abcdefghijklmnopqrstuvwxyz";
    const dataDir = join(tmp.dir, "secret-in-bad-json");
    mkdirSync(dataDir, { mode: 0o700 });
    writeFileSync(join(dataDir, "credentials.json"), `{"signing_key": ${secret}, "operator_token": "t"}`, { mode: 0o600 });
    const serve = await refusedServe(dataDir);
    expect(serve.code, serve.stderr).toBe(1);
    expect(serve.stderr).toContain("credentials.json");
    expect(serve.stderr).toContain("not JSON");
    const run = await runMam(["token", "create", "--scope", "read", "--data-dir", dataDir], { killAfterMs: 20_000 });
    expect(run.status, run.stderr).toBe(1);
    expect(run.stderr).toContain("credentials.json");
    for (const out of [serve.stderr, run.stderr, run.stdout]) {
      for (let i = 0; i + 6 <= secret.length; i++) expect(out, out).not.toContain(secret.slice(i, i + 6));
    }
  }, 30_000);

  // A database another process holds locked is not a configuration to change, and
  // moving it away (the remedy for a file that is not a database) would set a live
  // store aside: it is the store's retryable busy answer, as on any later write.
  it("the mam command and mam serve on a database another process holds locked: busy, retry; never 'move it away'", async () => {
    const dataDir = join(tmp.dir, "locked-database");
    mkdirSync(dataDir, { mode: 0o700 });
    const holder = new Database(join(dataDir, "mam.db"));
    try {
      holder.exec("BEGIN EXCLUSIVE");
      const run = await runMam(["publish-event", "--job", "j-1", "--event", "started", "--data-dir", dataDir], { killAfterMs: 25_000 });
      const serve = await refusedServe(dataDir);
      for (const out of [run.stderr, serve.stderr]) {
        expect(lines(out), out).toHaveLength(1);
        expect(out).toMatch(/busy/);
        expect(out).not.toMatch(/move it away|config|not a database/);
      }
      expect(run.status, run.stderr).toBe(2);
      expect(serve.code, serve.stderr).toBe(2);
    } finally {
      holder.close();
    }
  }, 40_000);
});
