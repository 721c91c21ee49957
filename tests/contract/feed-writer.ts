/**
 * A writer process for the feed's concurrency test (feed-concurrency.test.ts): its own
 * SQLite connection on the shared WAL file, opened as a process on the data dir opens
 * it, committing `count` jobs of three writes each (register, claim, complete) as fast
 * as it can. Prints "done <rows>" when finished. Not a test file: the test spawns it.
 */
import { OPERATOR, parseFlags, randomIds, registerJob, systemClock, transitionJob } from "@mam/core";
import { openEmbeddedJobStore } from "@mam/local";

const [dbFile, prefix, countText] = process.argv.slice(2);
if (dbFile === undefined || prefix === undefined || countText === undefined) throw new Error("usage: feed-writer <db> <prefix> <count>");
const store = openEmbeddedJobStore(dbFile);
const deps = { jobs: store.jobs, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
let rows = 0;
for (let i = 0; i < Number(countText); i++) {
  const jobId = `${prefix}-${i}`;
  await registerJob(deps, { job_id: jobId, prompt: "p", agent: "codex" }, OPERATOR);
  await transitionJob(deps, jobId, { action: "claim", expectedSeq: 0 }, OPERATOR);
  await transitionJob(deps, jobId, { action: "completed", expectedSeq: 1 }, OPERATOR);
  rows += 3;
}
await store.close();
process.stdout.write(`done ${rows}\n`);
