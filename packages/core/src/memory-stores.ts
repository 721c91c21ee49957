import { createHash } from "node:crypto";
import { EVENT_PAGE_MAX_BYTES, invalidCursor } from "./bounds.ts";
import { conflictFor } from "./conflicts.ts";
import { MamError } from "./errors.ts";
import { type ChangeNote, type ChangeQuery, type ChangeRow, changeRowsOf } from "./feed.ts";
import { leaseHolds } from "./leases.ts";
import {
  type Clock,
  type EvidenceChange,
  evidenceWriteOf,
  type FeedPage,
  type JobChange,
  type JobStore,
  type LeaseExpectation,
  type OwedQuery,
  type Page,
  type ReportStore,
} from "./ports.ts";
import {
  type AgentUsage,
  type DispatchRecord,
  type EventLogEntry,
  type JobRecord,
  LEASE_FIELDS,
  type Lease,
  type LeaseKind,
  type NotificationIntent,
  type Status,
} from "./schemas.ts";

/**
 * Reference adapters: the ports kept in memory, with no I/O, for pure unit tests
 * (`tests/unit`). They pass the same contract suites as the SQLite, DynamoDB, file
 * and S3 adapters (`tests/contract/memory.test.ts`), so a unit test on them sees the
 * behaviour the real stores have; they are never part of a deployment. Like every
 * JobStore adapter, `MemoryJobStore` belongs behind `guardJobStore`.
 *
 * Every method runs to completion without awaiting anything, so each write is atomic
 * with respect to every other call: a conditional write here is the condition and
 * the write in one synchronous step. Records are copied in and out, so no caller can
 * change what is stored, or what another caller was handed.
 */
export class MemoryJobStore implements JobStore {
  readonly #jobs = new Map<string, JobRecord>();
  readonly #dispatches = new Map<string, DispatchRecord>();
  readonly #events = new Map<string, EventLogEntry[]>();
  /** The change feed: a row's position is its index + 1. */
  readonly #changes: ChangeRow[] = [];
  readonly #clock: Clock;

  /** `clock` stamps each feed row's commit time (`at`); the system clock by default. */
  constructor(options: { clock?: Clock } = {}) {
    this.#clock = options.clock ?? { now: () => new Date() };
  }

  /** Append the rows a committed write produces, in the same synchronous step as the write. */
  #record(before: JobRecord | undefined, after: JobRecord, note: ChangeNote | undefined): void {
    const at = this.#clock.now().toISOString();
    for (const draft of changeRowsOf(before, after, note)) {
      this.#changes.push({ ...structuredClone(draft), cursor: String(this.#changes.length + 1), at });
    }
  }

  async create(record: JobRecord, note?: ChangeNote): Promise<void> {
    if (this.#jobs.has(record.job_id)) throw new MamError("job.exists", `job ${record.job_id} already exists`);
    this.#jobs.set(record.job_id, structuredClone(record));
    this.#record(undefined, record, note);
  }

  async listChanges(query: ChangeQuery): Promise<FeedPage> {
    let from = 0;
    if (query.after !== undefined) {
      from = /^(0|[1-9][0-9]{0,15})$/.test(query.after) ? Number(query.after) : Number.NaN;
      if (!(from <= this.#changes.length)) throw invalidCursor();
    }
    const items: ChangeRow[] = [];
    let position = from;
    for (const row of this.#changes.slice(from)) {
      if (items.length === query.limit) break;
      if (query.upTo !== undefined && sortableTime(row.at) > sortableTime(query.upTo)) break;
      position = Number(row.cursor);
      if (query.jobId === undefined || row.job_id === query.jobId) items.push(structuredClone(row));
    }
    return { items, cursor: String(position) };
  }

  async get(jobId: string): Promise<JobRecord | undefined> {
    const record = this.#jobs.get(jobId);
    return record === undefined ? undefined : structuredClone(record);
  }

  async transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.#update(jobId, expectedSeq, change, true);
  }

  async recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.#update(jobId, null, evidenceWriteOf(change), false);
  }

  #update(jobId: string, expectedSeq: number | null, change: JobChange, bumpTransition: boolean): JobRecord {
    const current = this.#jobs.get(jobId);
    if (current === undefined) throw new MamError("job.notFound", `job ${jobId} does not exist`);
    const evidence = change.evidence ?? {};
    const latest = current.latest_attempt;
    const holds =
      (expectedSeq === null || current.transition_seq === expectedSeq) &&
      change.from.includes(current.status) &&
      (evidence.seq === undefined || current.evidence_seq === evidence.seq) &&
      (evidence.attempt === undefined || latest === evidence.attempt) &&
      (evidence.currentAttempt === undefined || latest === undefined || latest === evidence.currentAttempt) &&
      (evidence.newAttempt === undefined || (latest ?? 0) < evidence.newAttempt);
    if (!holds) throw conflictFor(structuredClone(current), expectedSeq, change.from, evidence);

    const next: Record<string, unknown> = { ...current };
    for (const field of change.unset ?? []) delete next[field];
    for (const [field, value] of Object.entries(change.set)) if (value !== undefined) next[field] = structuredClone(value);
    if (evidence.newAttempt !== undefined) next.latest_attempt = evidence.newAttempt;
    if (bumpTransition) next.transition_seq = current.transition_seq + 1;
    if (evidence.bump) next.evidence_seq = current.evidence_seq + 1;
    const record = next as JobRecord;
    this.#jobs.set(jobId, record);
    this.#record(current, record, change.note);
    return structuredClone(record);
  }

  async chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    const current = this.#jobs.get(jobId);
    if (current === undefined) throw new MamError("job.notFound", `job ${jobId} does not exist`);
    const stored = current.agent_usage;
    if ((stored?.events ?? 0) !== (prior?.events ?? 0) || (stored?.bytes ?? 0) !== (prior?.bytes ?? 0)) return false;
    this.#jobs.set(jobId, { ...current, agent_usage: structuredClone(next) });
    return true;
  }

  async holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    const current = this.#jobs.get(jobId);
    if (current === undefined) throw new MamError("job.notFound", `job ${jobId} does not exist`);
    if (!leaseHolds(current, kind, lease, expect)) return false;
    const next: Record<string, unknown> = { ...current };
    if (lease === null) delete next[LEASE_FIELDS[kind]];
    else next[LEASE_FIELDS[kind]] = structuredClone(lease);
    this.#jobs.set(jobId, next as JobRecord);
    return true;
  }

  async replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    const current = this.#jobs.get(jobId);
    if (current === undefined) throw new MamError("job.notFound", `job ${jobId} does not exist`);
    const next = { ...current, pending_notification: structuredClone(intent) };
    this.#jobs.set(jobId, next);
    this.#record(current, next, note);
  }

  async reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    const current = this.#jobs.get(jobId);
    if (current?.pending_notification?.id !== intent.id) return false;
    const next = { ...current, pending_notification: structuredClone(intent) };
    this.#jobs.set(jobId, next);
    this.#record(current, next, note);
    return true;
  }

  async settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    // No await between the two: nothing else runs in between, as one transaction.
    this.#append(entry);
    return this.#settle(entry.job_id, intentId, note);
  }

  async settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.#settle(jobId, intentId, note);
  }

  #settle(jobId: string, intentId: string, note: ChangeNote | undefined): boolean {
    const current = this.#jobs.get(jobId);
    if (current?.pending_notification?.id !== intentId) return false;
    const { pending_notification: _settled, ...rest } = current;
    this.#jobs.set(jobId, rest);
    this.#record(current, rest, note);
    return true;
  }

  async list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const records = [...this.#jobs.values()].filter((r) => query.status === undefined || r.status === query.status);
    return newestFirstPage(records, (r) => r.updated_at, query);
  }

  async listOwed(limit: number, query: OwedQuery = {}): Promise<readonly JobRecord[]> {
    const dueBy = query.dueBy === undefined ? undefined : sortableTime(query.dueBy);
    const owed: [string, JobRecord][] = [];
    for (const record of this.#jobs.values()) {
      const intent = record.pending_notification;
      if (intent === undefined || intent.quarantined_at !== undefined) continue;
      const due = sortableTime(intent.retry_at ?? intent.created_at);
      if (dueBy === undefined || due <= dueBy) owed.push([due, record]);
    }
    owed.sort(([a, x], [b, y]) => compare([a, x.job_id], [b, y.job_id]));
    return owed.slice(0, limit).map(([, r]) => structuredClone(r));
  }

  async listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    const records = [...this.#jobs.values()].filter((r) => r.pending_notification?.quarantined_at !== undefined);
    return newestFirstPage(records, (r) => r.pending_notification?.quarantined_at ?? "", query);
  }

  async recordDispatch(dispatch: DispatchRecord): Promise<void> {
    const key = `${dispatch.job_id}/${dispatch.attempt_id}`;
    if (this.#dispatches.has(key)) {
      throw new MamError("dispatch.exists", `attempt ${dispatch.attempt_id} of job ${dispatch.job_id} was already dispatched`);
    }
    this.#dispatches.set(key, structuredClone(dispatch));
  }

  async getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    const dispatch = this.#dispatches.get(`${jobId}/${attemptId}`);
    return dispatch === undefined ? undefined : structuredClone(dispatch);
  }

  /** An entry whose id the job's log already holds is a no-op: the first one stays. */
  async appendEvent(entry: EventLogEntry): Promise<void> {
    this.#append(entry);
  }

  #append(entry: EventLogEntry): void {
    const log = this.#events.get(entry.job_id) ?? [];
    if (log.some((e) => e.id === entry.id)) return;
    log.push(structuredClone(entry));
    log.sort((a, b) => compare(eventKey(a), eventKey(b)));
    this.#events.set(entry.job_id, log);
  }

  async listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    const after = query.cursor === undefined ? undefined : decodePosition(query.cursor);
    const log = (this.#events.get(jobId) ?? []).filter((e) => after === undefined || compare(eventKey(e), after) > 0);
    const items: EventLogEntry[] = [];
    let bytes = 0;
    for (const entry of log) {
      const size = new TextEncoder().encode(JSON.stringify(entry)).byteLength;
      if (items.length === query.limit || (items.length > 0 && bytes + size > EVENT_PAGE_MAX_BYTES)) {
        return { items, cursor: encodePosition(eventKey(items[items.length - 1] as EventLogEntry)) };
      }
      items.push(structuredClone(entry));
      bytes += size;
    }
    return { items };
  }
}

/** A time as it compares: UTC, fixed width (`toISOString`), so string order is time order. */
function sortableTime(iso: string): string {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? iso : new Date(t).toISOString();
}

type Position = readonly [string, string];

function compare(a: Position, b: Position): number {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1;
  return 0;
}

const eventKey = (e: EventLogEntry): Position => [sortableTime(e.at), e.id];

/** This store's own position in a listing (the guard wraps it in the cursor a caller sees). */
function encodePosition(position: Position): string {
  return JSON.stringify(position);
}

function decodePosition(cursor: string): Position {
  let value: unknown;
  try {
    value = JSON.parse(cursor);
  } catch (e) {
    throw invalidCursor(e);
  }
  if (Array.isArray(value) && value.length === 2 && typeof value[0] === "string" && typeof value[1] === "string") {
    return [value[0], value[1]];
  }
  throw invalidCursor();
}

/** Newest first by `time`, then job id; keyset-paged after the cursor's position. */
function newestFirstPage(records: JobRecord[], time: (r: JobRecord) => string, query: { limit: number; cursor?: string }): Page<JobRecord> {
  const after = query.cursor === undefined ? undefined : decodePosition(query.cursor);
  const keyed = records
    .map((r): [Position, JobRecord] => [[sortableTime(time(r)), r.job_id], r])
    .filter(([k]) => after === undefined || compare(k, after) < 0)
    .sort(([a], [b]) => compare(b, a));
  const page = keyed.slice(0, query.limit);
  const items = page.map(([, r]) => structuredClone(r));
  const last = page[page.length - 1];
  if (keyed.length > query.limit && last !== undefined) return { items, cursor: encodePosition(last[0]) };
  return { items };
}

/** A location is relative: plain segments of letters, digits, '_' and '-' (`reports/<job>/<attempt>`). */
const SEGMENT = /^[A-Za-z0-9_-]{1,128}$/;
/** A plain file name: no separators, not `.` or `..`. */
const NAME = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$/;

function objectKey(location: string, name: string): string {
  if (location.length === 0 || !location.split("/").every((s) => SEGMENT.test(s))) {
    throw new MamError("report.location", `not a report location: ${JSON.stringify(location)}`);
  }
  if (!NAME.test(name)) throw new MamError("report.location", `not a plain file name: ${JSON.stringify(name)}`);
  return `${location}/${name}`;
}

function digest(bytes: Uint8Array): { sha256: string; bytes: number } {
  return { sha256: createHash("sha256").update(bytes).digest("hex"), bytes: bytes.byteLength };
}

/**
 * The reference ReportStore: objects in a map, keyed as S3 keys them (relative
 * locations of plain segments only; an absolute location is `report.location`, as
 * on the service). A put collects its whole body before the object is replaced, so a
 * reader sees the old object or the new one. Addresses are `mam-memory:///<key>`.
 */
export class MemoryReportStore implements ReportStore {
  readonly #objects = new Map<string, Uint8Array>();

  async put(location: string, name: string, body: Uint8Array | AsyncIterable<Uint8Array>): Promise<{ sha256: string; bytes: number }> {
    const key = objectKey(location, name);
    let bytes: Uint8Array;
    if (body instanceof Uint8Array) bytes = Uint8Array.from(body);
    else {
      const chunks: Uint8Array[] = [];
      let size = 0;
      for await (const chunk of body) {
        chunks.push(Uint8Array.from(chunk));
        size += chunk.byteLength;
      }
      bytes = new Uint8Array(size);
      let at = 0;
      for (const chunk of chunks) {
        bytes.set(chunk, at);
        at += chunk.byteLength;
      }
    }
    this.#objects.set(key, bytes);
    return digest(bytes);
  }

  async getBytes(location: string, name: string): Promise<Uint8Array | undefined> {
    const bytes = this.#objects.get(objectKey(location, name));
    return bytes === undefined ? undefined : Uint8Array.from(bytes);
  }

  async read(location: string, name: string): Promise<AsyncIterable<Uint8Array> | undefined> {
    const bytes = await this.getBytes(location, name);
    if (bytes === undefined) return undefined;
    return (async function* () {
      yield bytes;
    })();
  }

  async exists(location: string, name: string): Promise<boolean> {
    return this.#objects.has(objectKey(location, name));
  }

  async promote(location: string, from: string, to: string): Promise<void> {
    const source = objectKey(location, from);
    const target = objectKey(location, to);
    const bytes = this.#objects.get(source);
    if (bytes === undefined) throw new MamError("report.notFound", `no report to promote: ${this.describe(location, from)} does not exist`);
    this.#objects.set(target, bytes);
    this.#objects.delete(source);
  }

  async hash(location: string, name: string): Promise<{ sha256: string; bytes: number } | undefined> {
    const bytes = this.#objects.get(objectKey(location, name));
    return bytes === undefined ? undefined : digest(bytes);
  }

  async delete(location: string, name: string): Promise<void> {
    this.#objects.delete(objectKey(location, name));
  }

  /** As the file store does: a retired object is removed. */
  async retire(location: string, name: string): Promise<void> {
    this.#objects.delete(objectKey(location, name));
  }

  async copyOnce(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
    sha256: string,
  ): Promise<{ bytes: number; created: boolean }> {
    const source = objectKey(from.location, from.name);
    const target = objectKey(to.location, to.name);
    const bytes = this.#objects.get(source);
    if (bytes === undefined) throw new MamError("report.notFound", `${this.describe(from.location, from.name)} does not exist`);
    if (digest(bytes).sha256 !== sha256) {
      throw new MamError("report.changed", `${this.describe(from.location, from.name)} changed after it was hashed`);
    }
    const existing = this.#objects.get(target);
    if (existing === undefined) {
      this.#objects.set(target, bytes);
      return { bytes: bytes.byteLength, created: true };
    }
    if (digest(existing).sha256 !== sha256) {
      throw new MamError("report.changed", `${this.describe(to.location, to.name)} exists and holds other bytes`);
    }
    return { bytes: existing.byteLength, created: false };
  }

  describe(location: string, name: string): string {
    return `mam-memory:///${objectKey(location, name)}`;
  }
}
