/**
 * The seed suite's own guarantees: every behaviour B-01..B-42 has a test named for
 * it, and the fingerprint B-18 and B-26 rely on sees every kind of write.
 */
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { bookkeeping, newIntent, OPERATOR, recordDispatch, registerJob, transitionJob } from "@mam/core";
import { describe, expect, it } from "vitest";
import { describeBackends } from "./harness.ts";
import { utf8 } from "./scenario.ts";

const SEED_DIR = fileURLToPath(new URL("./", import.meta.url));

describe("seed suite coverage", () => {
  it("every behaviour B-01..B-42 has a test whose name starts with its ID", () => {
    const names = readdirSync(SEED_DIR)
      .filter((f) => f.endsWith(".test.ts"))
      .flatMap((f) => [...readFileSync(`${SEED_DIR}${f}`, "utf8").matchAll(/\bit(?:\.each\([\s\S]*?\))?\(\s*"(B-\d\d) /g)])
      .map((m) => m[1]);
    const missing = Array.from({ length: 42 }, (_, i) => `B-${String(i + 1).padStart(2, "0")}`).filter((id) => !names.includes(id));
    expect(missing).toEqual([]);
  });
});

describeBackends("seed harness: the fingerprint", (backend) => {
  it("changes with every kind of write the stores take, and only then", async () => {
    const b = backend();
    const deps = b.deps();
    const seen = new Set<string>();
    const step = async (what: string, write: () => Promise<unknown>) => {
      const before = await b.fingerprint();
      expect(await b.fingerprint(), `${what}: stable when nothing is written`).toBe(before);
      await write();
      const after = await b.fingerprint();
      expect(after, `${what}: seen`).not.toBe(before);
      expect(seen.has(after), `${what}: a new state`).toBe(false);
      seen.add(after);
    };
    let jobId = "";
    await step("a job row", async () => {
      jobId = (await registerJob(deps, { prompt: "p", agent: "claude-code" })).job_id;
    });
    await step("a transition", () => transitionJob(deps, jobId, { action: "claim", expectedSeq: 0 }, OPERATOR));
    await step("bookkeeping (no seq bump)", () => bookkeeping(deps, jobId, { pending_notification: newIntent(deps, "progress", 1) }));
    await step("a dispatch row", () => recordDispatch(deps, jobId, { attempt_id: 1, agent_session_uuid: "s", pane_process_generation: 0 }));
    await step("an event row", () => deps.jobs.appendEvent({ job_id: jobId, at: deps.clock.now().toISOString(), id: "e1", event: "x" }));
    await step("a report object", () => deps.reports.put("reports/a/1", "report-final.md.tmp", utf8("one")));
    await step("a report object's bytes", () => deps.reports.put("reports/a/1", "report-final.md.tmp", utf8("two")));
    await step("a rename", () => deps.reports.promote("reports/a/1", "report-final.md.tmp", "report-final.md"));
  });
});
