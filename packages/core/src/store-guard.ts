import { invalidCursor, JOB_PAGE_MAX_BYTES, utf8Bytes } from "./bounds.ts";
import { assertJobId } from "./engine.ts";
import { MamError } from "./errors.ts";
import { type ChangeNote, ChangeNoteSchema, type ChangeQuery, storedFeedPage, storedRowsOf } from "./feed.ts";
import {
  type EvidenceChange,
  type FeedPage,
  FIXED_JOB_FIELDS,
  type JobChange,
  type JobStore,
  type LeaseExpectation,
  type OwedQuery,
  type Page,
  UNSETTABLE_JOB_FIELDS,
} from "./ports.ts";
import {
  type AgentUsage,
  AgentUsageSchema,
  AttemptId,
  type DispatchRecord,
  DispatchRecordSchema,
  type EventLogEntry,
  IsoTime,
  type JobRecord,
  JobRecordSchema,
  LEASE_FIELDS,
  type Lease,
  type LeaseKind,
  LeaseSchema,
  type NotificationIntent,
  type Status,
  zodIssues,
} from "./schemas.ts";

/** Top-level fields a transition may write: every field of the record but the fixed ones. */
const SETTABLE: ReadonlySet<string> = new Set(
  Object.keys(JobRecordSchema.shape).filter((k) => !(FIXED_JOB_FIELDS as readonly string[]).includes(k)),
);
const UNSETTABLE: ReadonlySet<string> = new Set(UNSETTABLE_JOB_FIELDS);
/** What an evidence write may set besides its counters. */
const EVIDENCE_SETTABLE: ReadonlySet<string> = new Set(["finalized_report"]);

const GUARDED = Symbol("mam.guardedJobStore");

/**
 * The rules every JobStore keeps, in one place, in front of any adapter (as
 * Powertools' persistence layer states its guarantees once for every store):
 *
 * - a job id matches `JOB_ID_PATTERN`, on every call that names a job, or the call
 *   is `input.jobId` and no store is asked: an adapter never builds a key, a path
 *   or a topic from an unsafe id;
 * - a record is created only if it is a `JobRecordSchema` record (`input.invalid`
 *   naming `record.<field>`), and a dispatch only if it is a `DispatchRecordSchema`
 *   one (`dispatch.<field>`): nothing stored can fail a later reader;
 * - a limit is a positive integer (`input.invalid` naming `query.limit`);
 * - a change writes only fields it may: `set` names fields of the record but the
 *   fixed ones (`FIXED_JOB_FIELDS`), `unset` only `UNSETTABLE_JOB_FIELDS`, and no
 *   field is in both; an evidence write sets `finalized_report` at most. A change
 *   that breaks this is core's own bug: `internal`, and nothing is written;
 * - a page of job records (`list`, `listQuarantined`) holds at most
 *   `JOB_PAGE_MAX_BYTES` of records' JSON, and at least one record: when the
 *   adapter's page is larger, the guard asks it again, from the same position, for
 *   the prefix that fits, so the adapter's own cursor lands after the last record
 *   kept (one more read, only for a page that overflowed);
 * - a page's cursor is honoured only by the listing that handed it out (the same
 *   listing, status filter or job): the guard wraps the adapter's own position in an
 *   envelope naming the listing, and anything else is `invalidCursor()` (`input.invalid`
 *   naming `query.cursor`) before any store is asked.
 *
 * The adapter behind it receives only what passed, with `set` stripped of absent
 * values, and hands back its own opaque positions; what it still refuses (a position
 * forged inside a well-formed envelope) it refuses with `invalidCursor()` too.
 * Wrapping twice is wrapping once.
 */
export function guardJobStore(store: JobStore): JobStore {
  if (isGuardedJobStore(store)) return store;
  return new GuardedJobStore(store);
}

/** Whether the rules above are already in front of `store` (a composition root's check). */
export function isGuardedJobStore(store: JobStore): boolean {
  return (store as { [GUARDED]?: true })[GUARDED] === true;
}

/** The refusal of a limit that is not a positive integer: the same on every store. */
export function invalidLimit(limit: unknown): MamError {
  return new MamError("input.invalid", `limit must be a positive integer, not ${String(limit)}`, {
    issues: [{ path: "query.limit", message: "a positive integer" }],
  });
}

function checkLimit(limit: number): number {
  if (!Number.isSafeInteger(limit) || limit < 1) throw invalidLimit(limit);
  return limit;
}

function checkChange(change: JobChange): JobChange {
  const set: Record<string, unknown> = {};
  for (const [field, value] of Object.entries(change.set)) {
    if (value === undefined) continue;
    if (!SETTABLE.has(field)) throw new MamError("internal", `a change may not set ${field}`);
    set[field] = value;
  }
  const unset = [...new Set(change.unset ?? [])];
  for (const field of unset) {
    if (!UNSETTABLE.has(field)) throw new MamError("internal", `a change may not unset ${field}`);
    if (field in set) throw new MamError("internal", `a change may not both set and unset ${field}`);
  }
  return {
    from: change.from,
    set: set as JobChange["set"],
    ...(unset.length === 0 ? {} : { unset }),
    ...(change.evidence === undefined ? {} : { evidence: change.evidence }),
    ...(change.note === undefined ? {} : { note: checkNote(change.note) }),
  };
}

/** A note is core's own: one that is not a `ChangeNote` is core's bug (`internal`), and nothing is written. */
function checkNote(note: ChangeNote): ChangeNote;
function checkNote(note: ChangeNote | undefined): ChangeNote | undefined;
function checkNote(note: ChangeNote | undefined): ChangeNote | undefined {
  if (note === undefined) return undefined;
  const parsed = ChangeNoteSchema.safeParse(note);
  if (!parsed.success) throw new MamError("internal", "a change note is not valid", { issues: zodIssues(parsed.error, "note") });
  return parsed.data as ChangeNote;
}

function checkEvidenceChange(change: EvidenceChange): EvidenceChange {
  const note = change.note === undefined ? {} : { note: checkNote(change.note) };
  if (change.set === undefined) return { guard: change.guard, ...note };
  const set: Record<string, unknown> = {};
  for (const [field, value] of Object.entries(change.set)) {
    if (value === undefined) continue;
    if (!EVIDENCE_SETTABLE.has(field)) throw new MamError("internal", `an evidence write may not set ${field}`);
    set[field] = value;
  }
  return { guard: change.guard, set: set as NonNullable<EvidenceChange["set"]>, ...note };
}

/**
 * A charge is core's own: `next` a valid `agent_usage` whose counts only grow from
 * `prior`'s, one of them strictly (the adapters' condition compares the counts, so a
 * charge that grew neither could not tell itself from no charge). Otherwise core's bug:
 * `internal`, and nothing is written.
 */
function checkCharge(prior: AgentUsage | undefined, next: AgentUsage): AgentUsage {
  const parsed = AgentUsageSchema.safeParse(next);
  if (!parsed.success) throw new MamError("internal", "a usage charge is not valid", { issues: zodIssues(parsed.error, "usage") });
  const from = { events: prior?.events ?? 0, bytes: prior?.bytes ?? 0 };
  if (next.events < from.events || next.bytes < from.bytes || (next.events === from.events && next.bytes === from.bytes)) {
    throw new MamError("internal", "a usage charge must grow the counts it was read at");
  }
  return parsed.data;
}

/**
 * A lease write is core's own (`takeLease`, `releaseLease`): a known kind, a valid
 * lease or null, and an expectation that is a time or an id. Otherwise `internal`,
 * and nothing is written.
 */
function checkLease(kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Lease | null {
  if (!Object.hasOwn(LEASE_FIELDS, kind)) throw new MamError("internal", `no lease of kind ${String(kind)}`);
  const byId = "heldBy" in expect && typeof expect.heldBy === "string" && expect.heldBy !== "";
  const byTime = "freeAt" in expect && IsoTime.safeParse(expect.freeAt).success;
  if (!byId && !byTime) throw new MamError("internal", "a lease write expects a free lease at a time, or the one held by an id");
  if (lease === null) {
    if (!byId) throw new MamError("internal", "a lease is released only by its id");
    return null;
  }
  const parsed = LeaseSchema.safeParse(lease);
  if (!parsed.success) throw new MamError("internal", "a lease is not valid", { issues: zodIssues(parsed.error, "lease") });
  return parsed.data;
}

// ---- cursors: the adapter's position, in an envelope naming the listing it belongs to

/** base64url of the UTF-8 of `text`, unpadded (the same text `btoa` over its UTF-8 bytes gives, with `-_` and no `=`). */
function toBase64Url(text: string): string {
  return Buffer.from(text, "utf8").toString("base64url");
}

function fromBase64Url(encoded: string): string {
  if (!/^[A-Za-z0-9_-]*$/.test(encoded)) throw invalidCursor();
  const binary = atob(encoded.replaceAll("-", "+").replaceAll("_", "/") + "=".repeat((4 - (encoded.length % 4)) % 4));
  return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(binary, (c) => c.charCodeAt(0)));
}

/** The page as the caller sees it: the adapter's position wrapped with the listing's name. */
function wrapPage<T>(listing: string, page: Page<T>): Page<T> {
  if (page.cursor === undefined) return page;
  return { items: page.items, cursor: toBase64Url(JSON.stringify({ l: listing, c: page.cursor })) };
}

/** The adapter's position inside a cursor this listing handed out; `invalidCursor()` for anything else. */
function unwrapCursor(listing: string, cursor: string): string {
  let envelope: unknown;
  try {
    envelope = JSON.parse(fromBase64Url(cursor));
  } catch (e) {
    throw invalidCursor(e);
  }
  const { l, c } = (typeof envelope === "object" && envelope !== null ? envelope : {}) as { l?: unknown; c?: unknown };
  if (l !== listing || typeof c !== "string" || c === "") throw invalidCursor();
  return c;
}

const jobsListing = (status: Status | undefined): string => (status === undefined ? "jobs" : `jobs/${status}`);
const QUARANTINED_LISTING = "quarantined";
const eventsListing = (jobId: string): string => `events/${jobId}`;
/** One listing for the whole feed and each job's part of it: a position is the same row either way. */
const FEED_LISTING = "feed";

/** A feed cursor's refusal names `query.after`, the parameter it came in. */
function unwrapFeedCursor(cursor: string): string {
  try {
    return unwrapCursor(FEED_LISTING, cursor);
  } catch (e) {
    throw feedCursorRefusal(e);
  }
}

function feedCursorRefusal(cause: unknown): MamError {
  return new MamError(
    "input.invalid",
    "after is not a cursor this feed handed out; start without one, or pass a row's or a page's cursor",
    {
      issues: [{ path: "query.after", message: "not a cursor this feed handed out" }],
      cause,
    },
  );
}

/** A feed position's cursor: the same envelope as every listing's, its JSON built by hand (one a row, so it counts). */
const FEED_ENVELOPE_HEAD = `{"l":${JSON.stringify(FEED_LISTING)},"c":`;
const wrapFeedPosition = (position: string): string => toBase64Url(`${FEED_ENVELOPE_HEAD}${JSON.stringify(position)}}`);

function withCursor<Q extends { cursor?: string }>(query: Q, listing: string): Q {
  if (query.cursor === undefined) return query;
  return { ...query, cursor: unwrapCursor(listing, query.cursor) };
}

/** How many of `records`, from the first, fit in `JOB_PAGE_MAX_BYTES` of JSON: at least one. */
export function recordsWithinPageBytes(records: readonly JobRecord[], maxBytes = JOB_PAGE_MAX_BYTES): number {
  let bytes = 0;
  for (let i = 0; i < records.length; i++) {
    bytes += utf8Bytes(JSON.stringify(records[i]));
    if (bytes > maxBytes) return Math.max(i, 1);
  }
  return records.length;
}

/**
 * A page of at most `limit` records and `JOB_PAGE_MAX_BYTES`: a page over the bytes
 * is asked for again with the limit it fits in. Each ask is for fewer records than
 * the one before, down to one, so this ends.
 */
async function withinPageBytes(limit: number, read: (limit: number) => Promise<Page<JobRecord>>): Promise<Page<JobRecord>> {
  for (let ask = limit; ; ) {
    const page = await read(ask);
    const fit = recordsWithinPageBytes(page.items);
    if (fit >= page.items.length) return page;
    ask = fit;
  }
}

class GuardedJobStore implements JobStore {
  readonly [GUARDED] = true as const;
  readonly #store: JobStore;

  constructor(store: JobStore) {
    this.#store = store;
  }

  async create(record: JobRecord, note?: ChangeNote): Promise<void> {
    assertJobId(record.job_id);
    const parsed = JobRecordSchema.safeParse(record);
    if (!parsed.success) {
      throw new MamError("input.invalid", `job record ${record.job_id} is not valid`, { issues: zodIssues(parsed.error, "record") });
    }
    return note === undefined ? this.#store.create(parsed.data) : this.#store.create(parsed.data, checkNote(note));
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    assertJobId(jobId);
    return this.#store.get(jobId);
  }

  async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    assertJobId(jobId);
    return this.#store.transition(jobId, expectedSeq, checkChange(change));
  }

  async recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    assertJobId(jobId);
    return this.#store.recordEvidence(jobId, checkEvidenceChange(change));
  }

  async chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    assertJobId(jobId);
    return this.#store.chargeUsage(jobId, prior, checkCharge(prior, next));
  }

  async holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    assertJobId(jobId);
    return this.#store.holdLease(jobId, kind, checkLease(kind, lease, expect), expect);
  }

  async replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    assertJobId(jobId);
    return note === undefined
      ? this.#store.replaceNotification(jobId, intent)
      : this.#store.replaceNotification(jobId, intent, checkNote(note));
  }

  async reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    assertJobId(jobId);
    return note === undefined
      ? this.#store.reviseNotification(jobId, intent)
      : this.#store.reviseNotification(jobId, intent, checkNote(note));
  }

  async settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    assertJobId(jobId);
    return note === undefined
      ? this.#store.settleNotification(jobId, intentId)
      : this.#store.settleNotification(jobId, intentId, checkNote(note));
  }

  async settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    assertJobId(entry.job_id);
    return note === undefined
      ? this.#store.settlePublished(entry, intentId)
      : this.#store.settlePublished(entry, intentId, checkNote(note));
  }

  async listChanges(query: ChangeQuery): Promise<FeedPage> {
    checkLimit(query.limit);
    if (query.jobId !== undefined) assertJobId(query.jobId);
    const after = query.after === undefined ? undefined : unwrapFeedCursor(query.after);
    let page: FeedPage;
    try {
      page = await this.#store.listChanges({
        limit: query.limit,
        ...(after === undefined ? {} : { after }),
        ...(query.jobId === undefined ? {} : { jobId: query.jobId }),
        ...(query.upTo === undefined ? {} : { upTo: query.upTo }),
      });
    } catch (e) {
      // A position forged inside a well-formed envelope: the adapter's refusal, named as the feed names it.
      if (e instanceof MamError && e.code === "input.invalid" && e.issues.some((i) => i.path === "query.cursor"))
        throw feedCursorRefusal(e);
      throw e;
    }
    // Rows as the store keeps them stay so (parsed only if read); each row's cursor is the envelope of its position.
    const stored = storedRowsOf(page);
    if (stored !== undefined) {
      return storedFeedPage(
        stored.map((r) => ({ cursor: wrapFeedPosition(r.cursor), at: r.at, job_id: r.job_id, json: r.json })),
        wrapFeedPosition(page.cursor),
      );
    }
    return { items: page.items.map((row) => ({ ...row, cursor: wrapFeedPosition(row.cursor) })), cursor: wrapFeedPosition(page.cursor) };
  }

  async list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    checkLimit(query.limit);
    const listing = jobsListing(query.status);
    const inner = withCursor(query, listing);
    return wrapPage(listing, await withinPageBytes(query.limit, (limit) => this.#store.list({ ...inner, limit })));
  }

  async listOwed(limit: number, query?: OwedQuery): Promise<readonly JobRecord[]> {
    return this.#store.listOwed(checkLimit(limit), query);
  }

  async listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    checkLimit(query.limit);
    const inner = withCursor(query, QUARANTINED_LISTING);
    return wrapPage(QUARANTINED_LISTING, await withinPageBytes(query.limit, (limit) => this.#store.listQuarantined({ ...inner, limit })));
  }

  async recordDispatch(dispatch: DispatchRecord): Promise<void> {
    assertJobId(dispatch.job_id);
    const parsed = DispatchRecordSchema.safeParse(dispatch);
    if (!parsed.success) {
      throw new MamError("input.invalid", `dispatch of job ${dispatch.job_id} is not valid`, {
        issues: zodIssues(parsed.error, "dispatch"),
      });
    }
    return this.#store.recordDispatch(parsed.data);
  }

  async getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    assertJobId(jobId);
    // No such attempt can have been recorded (recordDispatch refuses it): nothing to ask.
    if (!AttemptId.safeParse(attemptId).success) return undefined;
    return this.#store.getDispatch(jobId, attemptId);
  }

  async appendEvent(entry: EventLogEntry): Promise<void> {
    assertJobId(entry.job_id);
    return this.#store.appendEvent(entry);
  }

  async listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    assertJobId(jobId);
    checkLimit(query.limit);
    const listing = eventsListing(jobId);
    return wrapPage(listing, await this.#store.listEvents(jobId, withCursor(query, listing)));
  }
}
