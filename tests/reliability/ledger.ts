/**
 * What the reliability tests share: concurrent writers committing intents over the
 * HTTP API of `mam serve` (each request with no answer resolved from the job record
 * and its event log, never assumed), the ledger of every committed intent, and the
 * tally of what a subscriber received against it.
 */
import type { ReceivedMessage, Subscription } from "../support/subscriber.ts";

/** mulberry32: a small seeded generator, so a failing run can be replayed with its seed. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The seed of this run: `MAM_SOAK_SEED` to replay one, else a fresh one. Printed by the caller. */
export function soakSeed(): number {
  const given = process.env.MAM_SOAK_SEED;
  return given === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(given);
}

/** Where the service answers now; a restart replaces it. `up()` waits until it is up. */
export interface ServiceHandle {
  up(): Promise<string>;
  readonly token: string;
}

export interface Answer {
  readonly status: number;
  // biome-ignore lint/suspicious/noExplicitAny: the tests walk JSON answers whose shape each check states
  readonly body: any;
}

/** No answer within this long is a hang, which the tests refuse. */
const REQUEST_TIMEOUT_MS = 30_000;

export async function request(url: string, token: string, method: string, path: string, body?: unknown): Promise<Answer> {
  const res = await fetch(new URL(path, url), {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await res.text();
  return { status: res.status, body: text.length > 0 ? JSON.parse(text) : undefined };
}

/** An error that is a hang (our own timeout), not a connection the service dropped. */
export const isHang = (e: unknown): boolean => e instanceof DOMException && e.name === "TimeoutError";

export interface CommittedIntent {
  readonly id: string;
  readonly jobId: string;
  readonly seq: number;
}

/** Every intent committed, as the API answers and the job records say. */
export class Ledger {
  readonly byId = new Map<string, CommittedIntent>();
  readonly byJob = new Map<string, CommittedIntent[]>();
  /** Requests whose answer was lost (the service died under them), resolved from the record. */
  unanswered = 0;

  add(intent: CommittedIntent): void {
    if (this.byId.has(intent.id)) throw new Error(`intent ${intent.id} recorded twice`);
    this.byId.set(intent.id, intent);
    const list = this.byJob.get(intent.jobId) ?? [];
    list.push(intent);
    list.sort((a, b) => a.seq - b.seq);
    this.byJob.set(intent.jobId, list);
  }

  /** Each job's newest intent: owed until delivered, since nothing supersedes it. */
  latest(): CommittedIntent[] {
    return [...this.byJob.values()].map((list) => list[list.length - 1] as CommittedIntent);
  }
}

/** Register `n` jobs; their ids. */
export async function registerJobs(service: ServiceHandle, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const r = await request(await service.up(), service.token, "POST", "/v1/jobs", { prompt: `soak job ${i}`, agent: "codex" });
    if (r.status !== 201) throw new Error(`register: ${r.status} ${JSON.stringify(r.body)}`);
    ids.push(String(r.body.job_id));
  }
  return ids;
}

/** The intent committed at `seq` on `jobId`: the record's owed one, or the one its event log shows was published. */
async function intentAt(service: ServiceHandle, jobId: string, seq: number): Promise<string | undefined> {
  const url = await service.up();
  const rec = await request(url, service.token, "GET", `/v1/jobs/${jobId}`);
  if (rec.status !== 200) throw new Error(`read ${jobId}: ${rec.status}`);
  const owed = rec.body.pending_notification;
  if (owed?.seq === seq) return String(owed.id);
  let cursor: string | undefined;
  do {
    const q = `/v1/jobs/${jobId}/events?limit=1000${cursor === undefined ? "" : `&cursor=${encodeURIComponent(cursor)}`}`;
    const page = await request(url, service.token, "GET", q);
    if (page.status !== 200) throw new Error(`event log of ${jobId}: ${page.status}`);
    for (const entry of page.body.items) {
      const intent = entry.event === "published" ? entry.data?.payload?.data?.notification_intent : undefined;
      if (intent?.seq === seq) return String(intent.id);
    }
    cursor = page.body.next_cursor;
  } while (cursor !== undefined);
  return undefined;
}

/** The job's transition seq now. */
async function seqOf(service: ServiceHandle, jobId: string): Promise<number> {
  const rec = await request(await service.up(), service.token, "GET", `/v1/jobs/${jobId}`);
  if (rec.status !== 200) throw new Error(`read ${jobId}: ${rec.status}`);
  return Number(rec.body.transition_seq);
}

export interface WriterOptions {
  readonly service: ServiceHandle;
  readonly jobs: readonly string[];
  readonly commitsPerJob: number;
  readonly writers: number;
  readonly random: () => number;
  readonly ledger: Ledger;
  /** Every answer the service gave to a commit, with how many commits were done before it. */
  readonly onAnswer?: (answer: Answer, commits: number) => void;
  /**
   * A request without an answer (the service died under it): resolve it from the
   * record. Without this, such a request is a failure (the service should have answered).
   */
  readonly resolveUnanswered: boolean;
}

/**
 * `writers` concurrent writers, each owning its share of the jobs, commit
 * `commitsPerJob` intents on each (`started`, then `progress`, then `completed`),
 * each with the seq it knows (so a retry can never commit twice), picking which of
 * its jobs next at random. A request without an answer may or may not have committed:
 * the job's seq says which, and then the record or its event log names the intent.
 */
export async function runWriters(o: WriterOptions): Promise<void> {
  let commits = 0;
  const writer = async (own: string[]) => {
    const seqs = new Map<string, number>();
    for (const j of own) seqs.set(j, await seqOf(o.service, j));
    const left = new Map(own.map((j) => [j, o.commitsPerJob] as const));
    while (left.size > 0) {
      const open = [...left.keys()];
      const jobId = open[Math.floor(o.random() * open.length)] as string;
      const remaining = left.get(jobId) as number;
      const step = o.commitsPerJob - remaining;
      const event = step === 0 ? "started" : remaining === 1 ? "completed" : "progress";
      const known = seqs.get(jobId) as number;
      let answer: Answer | undefined;
      try {
        answer = await request(await o.service.up(), o.service.token, "POST", `/v1/jobs/${jobId}/events`, { event, expected_seq: known });
      } catch (e) {
        if (!o.resolveUnanswered || isHang(e)) throw e;
        o.ledger.unanswered++;
      }
      if (answer !== undefined) {
        o.onAnswer?.(answer, commits);
        if (answer.status !== 200) throw new Error(`${event} on ${jobId}: ${answer.status} ${JSON.stringify(answer.body)}`);
        const intent = answer.body.record.pending_notification;
        o.ledger.add({ id: String(intent.id), jobId, seq: Number(intent.seq) });
      } else {
        // No answer: did it commit? The record's seq says; the intent is then found, never assumed.
        const now = await seqOf(o.service, jobId);
        if (now === known) continue; // not committed: the same commit is tried again
        if (now !== known + 1) throw new Error(`${jobId} moved from seq ${known} to ${now} under one writer`);
        const id = await intentAt(o.service, jobId, now);
        if (id === undefined) throw new Error(`${jobId} committed seq ${now} but neither its record nor its event log names the intent`);
        o.ledger.add({ id, jobId, seq: now });
      }
      commits++;
      seqs.set(jobId, known + 1);
      if (remaining === 1) left.delete(jobId);
      else left.set(jobId, remaining - 1);
    }
  };
  const shares = Array.from({ length: o.writers }, (_, w) => o.jobs.filter((_, i) => i % o.writers === w));
  await Promise.all(shares.map(writer));
}

/** The intent id a notification carries; undefined for anything else on the filter (a barrier marker). */
export function intentIdOf(m: ReceivedMessage): string | undefined {
  try {
    const id = JSON.parse(m.payload)?.data?.notification_intent?.id;
    return typeof id === "string" ? id : undefined;
  } catch {
    return undefined;
  }
}

/** Resolves once every job's newest intent (owed until delivered: nothing supersedes it) has reached `sub`. */
export async function latestDelivered(sub: Subscription, ledger: Ledger, timeoutMs: number): Promise<void> {
  for (const intent of ledger.latest()) {
    await sub
      .waitFor((m) => intentIdOf(m) === intent.id, timeoutMs)
      .catch(() => {
        throw new Error(`the newest intent of ${intent.jobId} (${intent.id}, seq ${intent.seq}) never reached the subscriber`);
      });
  }
}

export interface Tally {
  readonly committed: number;
  readonly delivered: number;
  readonly superseded: number;
  /** Deliveries beyond the first of an intent (each carrying the same id). */
  readonly duplicated: number;
  readonly lost: number;
  /** Messages whose id no commit gave: must be none. */
  readonly unknown: number;
  readonly lostIds: readonly string[];
}

/** The intents each job's event log shows the broker acknowledged (a `published` entry, outcome `acknowledged`). */
export async function acknowledgedIds(service: ServiceHandle, jobs: readonly string[]): Promise<Set<string>> {
  const url = await service.up();
  const ids = new Set<string>();
  for (const jobId of jobs) {
    let cursor: string | undefined;
    do {
      const q = `/v1/jobs/${jobId}/events?limit=1000${cursor === undefined ? "" : `&cursor=${encodeURIComponent(cursor)}`}`;
      const page = await request(url, service.token, "GET", q);
      if (page.status !== 200) throw new Error(`event log of ${jobId}: ${page.status}`);
      for (const entry of page.body.items) {
        const id = entry.data?.payload?.data?.notification_intent?.id;
        if (entry.event === "published" && entry.data?.outcome === "acknowledged" && typeof id === "string") ids.add(id);
      }
      cursor = page.body.next_cursor;
    } while (cursor !== undefined);
  }
  return ids;
}

/**
 * Every committed intent reached the subscriber at least once, or was superseded: a
 * newer intent on the same job was committed before it was delivered (it is then
 * not owed any more). Anything else is lost — and so is any intent the broker
 * acknowledged (`acknowledged`, from the event logs): once a QoS 1 publish is
 * acknowledged it is queued in the subscriber's persistent session, on disk, so
 * "superseded" cannot excuse it. Messages are counted by intent id.
 * `supersededIds`: what the feed records as superseded, once the feed lands; until
 * then, "never acknowledged, and a newer intent exists on the job" stands in for it.
 */
export function tally(
  ledger: Ledger,
  received: readonly ReceivedMessage[],
  acknowledged: ReadonlySet<string>,
  supersededIds?: ReadonlySet<string>,
): Tally {
  const seen = new Map<string, number>();
  let unknown = 0;
  for (const m of received) {
    const id = intentIdOf(m);
    if (id === undefined) continue;
    if (!ledger.byId.has(id)) unknown++;
    seen.set(id, (seen.get(id) ?? 0) + 1);
  }
  let delivered = 0;
  let superseded = 0;
  let duplicated = 0;
  const lostIds: string[] = [];
  for (const [id, intent] of ledger.byId) {
    const n = seen.get(id) ?? 0;
    if (n > 0) {
      delivered++;
      duplicated += n - 1;
      continue;
    }
    const newer = (ledger.byJob.get(intent.jobId) ?? []).some((other) => other.seq > intent.seq);
    if (!acknowledged.has(id) && (supersededIds === undefined ? newer : supersededIds.has(id))) superseded++;
    else lostIds.push(id);
  }
  return { committed: ledger.byId.size, delivered, superseded, duplicated, lost: lostIds.length, unknown, lostIds };
}

/** A row of the change feed, as agreed between the feed, delivery and sessions engineers. */
export interface FeedRow {
  readonly cursor: string;
  readonly at: string;
  readonly job_id: string;
  readonly kind: string;
  readonly actor: { readonly type: string; readonly token_id?: string };
  readonly intent_id?: string;
  readonly data?: Record<string, unknown>;
}

/**
 * Every row of the change feed from the beginning: `GET /v1/events?after=<cursor>&limit=1000`
 * page by page, then — while some intent of `ledger` has no `job.transitioned` row yet
 * (the feed shows rows only up to now minus its stated delay) — `GET /v1/events/stream?after=<last cursor>`
 * (Server-Sent Events) until every one has one, or `timeoutMs` passes (then the check
 * fails on what is missing).
 */
export async function feedRows(service: ServiceHandle, ledger: Ledger, timeoutMs = 30_000): Promise<FeedRow[]> {
  const url = await service.up();
  const rows: FeedRow[] = [];
  const unseen = new Set(ledger.byId.keys());
  const take = (row: FeedRow) => {
    rows.push(row);
    if (row.kind === "job.transitioned" && row.intent_id !== undefined) unseen.delete(row.intent_id);
  };
  let after: string | undefined;
  for (;;) {
    const r = await request(
      url,
      service.token,
      "GET",
      `/v1/events?limit=1000${after === undefined ? "" : `&after=${encodeURIComponent(after)}`}`,
    );
    if (r.status !== 200) throw new Error(`GET /v1/events: ${r.status} ${JSON.stringify(r.body)}`);
    for (const row of r.body.items as FeedRow[]) take(row);
    after = String(r.body.cursor);
    if (r.body.items.length === 0) break;
  }
  if (unseen.size === 0) return rows;
  // The rest as the feed makes it readable: the stream pushes each row once it is.
  const stream = await fetch(new URL(`/v1/events/stream?after=${encodeURIComponent(after)}`, url), {
    headers: { authorization: `Bearer ${service.token}`, accept: "text/event-stream" },
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (stream.status !== 200 || stream.body === null) throw new Error(`GET /v1/events/stream: ${stream.status}`);
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for await (const chunk of stream.body) {
      buffer += decoder.decode(chunk, { stream: true });
      let end = buffer.indexOf("\n\n");
      while (end >= 0) {
        const data = buffer
          .slice(0, end)
          .split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart())
          .join("\n");
        buffer = buffer.slice(end + 2);
        if (data.length > 0) take(JSON.parse(data) as FeedRow);
        end = buffer.indexOf("\n\n");
      }
      if (unseen.size === 0) break;
    }
  } catch (e) {
    if (!isHang(e)) throw e;
  }
  return rows;
}

/**
 * Judged against the feed: every committed intent is in it (the `job.transitioned`
 * row that committed it), and the superseded ones as the feed records them
 * (`intent.superseded`, `intent_id` = the superseded intent).
 */
export function checkAgainstFeed(ledger: Ledger, rows: readonly FeedRow[]): { missing: string[]; superseded: Set<string> } {
  const committedInFeed = new Set(rows.filter((r) => r.kind === "job.transitioned" && r.intent_id !== undefined).map((r) => r.intent_id));
  const missing = [...ledger.byId.keys()].filter((id) => !committedInFeed.has(id));
  const superseded = new Set(
    rows.filter((r) => r.kind === "intent.superseded" && r.intent_id !== undefined).map((r) => r.intent_id as string),
  );
  return { missing, superseded };
}

export function printTally(what: string, t: Tally, extra: Record<string, unknown> = {}): void {
  const { lostIds: _, ...counts } = t;
  console.log(`${what}: ${JSON.stringify({ ...counts, ...extra })}`);
}
