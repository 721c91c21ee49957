/**
 * The feed's read path (docs/decisions.md, "The feed's read path"): a page of rows as
 * a store wrote them, spliced into the wire's JSON without parsing, must be the JSON
 * of the same rows parsed; and the persistence base must wrap each row's position in the same
 * cursor it hands out for parsed rows, which resumes after that row.
 */
import {
  type ChangeRow,
  changeRowsOf,
  type FeedPage,
  type FeedQuery,
  type JobRecord,
  MemoryJobStore,
  type StoredChangeRow,
  storedFeedPage,
  storedRowJson,
  storedRowsOf,
} from "@mam/core";
import { describe, expect, it } from "vitest";
import { jobRecord } from "../support/records.ts";

const AT = "2026-11-20T10:00:00.000Z";
const record = (over: Partial<JobRecord> = {}): JobRecord =>
  jobRecord("feed-stored-1", { agent: "codex", iteration: 1, created_at: AT, updated_at: AT, ...over });

/** The rows of a job registered, claimed and completed (with its intent), stored as SQLite stores them. */
function storedLife(): StoredChangeRow[] {
  const actor = { actor: { type: "agent" as const, token_id: "tok-\u00e9-1" } };
  const created = record();
  const running = record({ status: "running", transition_seq: 1 });
  const done = record({
    status: "completed",
    transition_seq: 2,
    pending_notification: { id: "intent-1", event: "completed", seq: 2, created_at: AT },
  });
  const drafts = [
    ...changeRowsOf(undefined, created, actor),
    ...changeRowsOf(created, running, actor),
    ...changeRowsOf(running, done, actor),
  ];
  return drafts.map(({ job_id, ...row }, i) => ({ cursor: String(i + 1), at: AT, job_id, json: JSON.stringify(row) }));
}

/** A store whose feed answers pages of stored rows, as SqliteJobStore does. */
class StoredFeedStore extends MemoryJobStore {
  constructor(readonly rows: StoredChangeRow[]) {
    super();
  }
  protected override async queryFeed(query: FeedQuery): Promise<FeedPage> {
    const after = query.after === undefined ? 0 : Number(query.after);
    const page = this.rows.filter((r) => Number(r.cursor) > after).slice(0, query.limit);
    return storedFeedPage(page, page.at(-1)?.cursor ?? String(after));
  }
}

/** The same rows answered parsed, as the other stores answer. */
class ParsedFeedStore extends StoredFeedStore {
  protected override async queryFeed(query: FeedQuery): Promise<FeedPage> {
    const page = await super.queryFeed(query);
    return { items: [...page.items], cursor: page.cursor };
  }
}

describe("the feed's stored rows", () => {
  it("splices each stored row into the same JSON as the parsed row, and parses items only when read", () => {
    const rows = storedLife();
    expect(rows.length).toBeGreaterThanOrEqual(3);
    const page = storedFeedPage(rows, "9");
    expect(storedRowsOf(page)).toBe(rows);
    expect(storedRowsOf({ items: [], cursor: "9" })).toBeUndefined();
    const parsed: ChangeRow[] = page.items;
    expect(parsed.map((r) => r.kind)).toEqual(["job.registered", "job.transitioned", "job.transitioned"]);
    expect(page.items).toBe(parsed);
    for (const [i, r] of rows.entries()) expect(JSON.parse(storedRowJson(r))).toStrictEqual(parsed[i]);
    expect(JSON.parse(storedRowJson({ cursor: "1", at: AT, job_id: "j", json: "{}" }))).toStrictEqual({ cursor: "1", at: AT, job_id: "j" });
  });

  it("the persistence base wraps each stored row's position as it wraps a parsed row's, and a row's cursor resumes after it", async () => {
    const rows = storedLife();
    const stored = new StoredFeedStore(rows);
    const whole = await stored.listChanges({ limit: 100 });
    expect(storedRowsOf(whole)?.map((r) => r.cursor)).toEqual(whole.items.map((r) => r.cursor));
    expect(whole.items.map((r) => r.cursor).every((c) => /^[A-Za-z0-9_-]+$/.test(c) && !["1", "2", "3"].includes(c))).toBe(true);
    const rest = await stored.listChanges({ limit: 100, after: whole.items[0]!.cursor });
    expect(rest.items.map((r) => r.kind)).toEqual(whole.items.slice(1).map((r) => r.kind));
    expect(rest.cursor).toBe(whole.cursor);
    // The same envelope as the parsed path (a store answering plain rows at the same positions).
    const parsedPage = await new ParsedFeedStore(rows).listChanges({ limit: 100 });
    expect(storedRowsOf(parsedPage)).toBeUndefined();
    expect(parsedPage.items.map((r) => r.cursor)).toEqual(whole.items.map((r) => r.cursor));
    expect(parsedPage.cursor).toBe(whole.cursor);
    await expect(stored.listChanges({ limit: 1, after: "MQ" })).rejects.toMatchObject({
      code: "input.invalid",
      issues: [{ path: "query.after" }],
    });
  });
});
