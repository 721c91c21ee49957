/**
 * The publish count's judge (issue 11, item 1), shared by the embedded backend's
 * (tests/e2e/publish-count.test.ts) and AWS's (tests/engine/publish-count.test.ts):
 * every committed intent delivered exactly once per topic (the job's and `mam/events`),
 * or superseded as the change feed records it, and nothing delivered that nobody committed.
 */
import type { ChangeFeed } from "@mam/core";
import { expect } from "vitest";
import type { Subscription } from "./subscriber.ts";

/** An intent a commit carried: its job, its id, and which commit it was (for the failure message). */
export interface Committed {
  readonly job: string;
  readonly intent: string;
  readonly what: string;
}

interface Tally {
  job: number;
  fanIn: number;
}

/** Messages per intent id and topic kind; anything that is not a notification (none is expected) is returned apart. */
export function tally(sub: Subscription): { byIntent: Map<string, Tally>; other: string[] } {
  const byIntent = new Map<string, Tally>();
  const other: string[] = [];
  for (const m of sub.received) {
    let id: unknown;
    try {
      id = JSON.parse(m.payload)?.data?.notification_intent?.id;
    } catch {
      id = undefined;
    }
    if (typeof id !== "string") {
      other.push(`${m.topic}: ${m.payload.slice(0, 80)}`);
      continue;
    }
    const t = byIntent.get(id) ?? { job: 0, fanIn: 0 };
    if (m.topic === "mam/events") t.fanIn++;
    else if (/^mam\/jobs\/[^/]+\/events$/.test(m.topic)) t.job++;
    else other.push(m.topic);
    byIntent.set(id, t);
  }
  return { byIntent, other };
}

/**
 * Delivered exactly once per topic, or superseded: never delivered, a newer intent
 * of the same job committed after it, and the change feed records it superseded (an
 * `intent.superseded` row naming it). Nothing delivered that was not committed.
 */
export async function expectDeliveredOrSuperseded(
  sub: Subscription,
  committed: readonly Committed[],
  supersededIds: (job: string) => Promise<ReadonlySet<string>>,
): Promise<{ delivered: number; superseded: number }> {
  const { byIntent, other } = tally(sub);
  expect(other, "only notifications on mam/#").toEqual([]);
  let delivered = 0;
  let superseded = 0;
  for (const [i, c] of committed.entries()) {
    const t = byIntent.get(c.intent) ?? { job: 0, fanIn: 0 };
    if (t.job === 0 && t.fanIn === 0) {
      const newer = committed.slice(i + 1).some((later) => later.job === c.job);
      expect(newer, `${c.what} (${c.intent}) was neither delivered nor superseded`).toBe(true);
      expect((await supersededIds(c.job)).has(c.intent), `${c.what}: never arrived, and the feed does not say it was superseded`).toBe(
        true,
      );
      superseded++;
      continue;
    }
    expect(t, `${c.what} (${c.intent}): one message per topic`).toEqual({ job: 1, fanIn: 1 });
    delivered++;
  }
  const known = new Set(committed.map((c) => c.intent));
  expect(
    [...byIntent.keys()].filter((id) => !known.has(id)),
    "messages for intents nobody committed",
  ).toEqual([]);
  return { delivered, superseded };
}

/** The intents the change feed records as superseded on one job (`intent.superseded` rows). */
export function supersededIn(feed: ChangeFeed): (job: string) => Promise<ReadonlySet<string>> {
  return async (job) => {
    const page = await feed.listChanges({ jobId: job, limit: 1000 });
    return new Set(page.items.filter((r) => r.kind === "intent.superseded" && r.intent_id !== undefined).map((r) => r.intent_id as string));
  };
}
