import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import type { ChangeRow } from "@mam/core";
import { SqliteJobStore } from "@mam/local";
import { afterEach, describe, expect, it } from "vitest";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const WRITER = new URL("./feed-writer.ts", import.meta.url).pathname;
const WRITERS = 4;
const JOBS_EACH = 60;

/** A writer process; resolves with the rows it committed once it exits cleanly. */
function startWriter(dbFile: string, prefix: string): { child: ChildProcess; done: Promise<number> } {
  const child = spawn(process.execPath, ["--import", "tsx", WRITER, dbFile, prefix, String(JOBS_EACH)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout?.on("data", (d: Buffer) => {
    out += d.toString();
  });
  child.stderr?.on("data", (d: Buffer) => {
    err += d.toString();
  });
  const done = new Promise<number>((resolve, reject) => {
    child.on("exit", (code) => {
      const m = /done (\d+)/.exec(out);
      if (code === 0 && m) resolve(Number(m[1]));
      else reject(new Error(`writer ${prefix} exited ${code}: ${err}`));
    });
  });
  return { child, done };
}

describe("the SQLite feed under concurrent writers", () => {
  let tmp: TempDir | undefined;
  const children: ChildProcess[] = [];
  afterEach(async () => {
    for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
    await tmp?.remove();
  });

  it("a reader paging with cursors while four processes commit skips no row and sees none twice, in commit order", async () => {
    tmp = await tempDir("feed-concurrency");
    const dbFile = path.join(tmp.dir, "mam.db");
    const reader = new SqliteJobStore(dbFile);
    const feed = reader;
    try {
      const writers = Array.from({ length: WRITERS }, (_, w) => startWriter(dbFile, `w${w}`));
      children.push(...writers.map((w) => w.child));
      let finished = false;
      const all = Promise.all(writers.map((w) => w.done)).finally(() => {
        finished = true;
      });

      // Page while they write, a few rows at a time, from the cursor each page hands back.
      const seen: ChangeRow[] = [];
      let after: string | undefined;
      let pagesWhileWriting = 0;
      for (;;) {
        const wasFinished = finished;
        const page = await feed.listChanges({ limit: 7, ...(after === undefined ? {} : { after }) });
        seen.push(...page.items);
        after = page.cursor;
        if (!wasFinished && page.items.length > 0) pagesWhileWriting += 1;
        // Stop only on an empty page read after every writer had exited.
        if (wasFinished && page.items.length === 0) break;
        if (page.items.length === 0) await new Promise((r) => setImmediate(r));
      }
      const committed = (await all).reduce((a, b) => a + b, 0);

      const whole = (await feed.listChanges({ limit: 1000 * WRITERS })).items;
      expect(whole).toHaveLength(committed);
      expect(committed).toBe(WRITERS * JOBS_EACH * 3);
      // Every row, once, in the order the whole feed holds them (commit order).
      expect(seen.map((r) => r.cursor)).toEqual(whole.map((r) => r.cursor));
      // The reader really paged while the writers committed.
      expect(pagesWhileWriting).toBeGreaterThan(1);
      // Each job's rows in its own commit order.
      const byJob = new Map<string, string[]>();
      for (const r of seen) byJob.set(r.job_id, [...(byJob.get(r.job_id) ?? []), `${r.kind}:${r.data?.action ?? ""}`]);
      expect(byJob.size).toBe(WRITERS * JOBS_EACH);
      for (const kinds of byJob.values())
        expect(kinds).toEqual(["job.registered:", "job.transitioned:claim", "job.transitioned:completed"]);
    } finally {
      await reader.close();
    }
  }, 120_000);
});
