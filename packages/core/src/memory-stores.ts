import { createHash } from "node:crypto";
import { invalidCursor } from "./bounds.ts";
import { MamError } from "./errors.ts";
import type { ChangeNote, ChangeRow } from "./feed.ts";
import { changeRowsOf } from "./feed-rules.ts";
import {
  type AtomicOutcome,
  type AtomicWrite,
  type FeedQuery,
  type JobListing,
  JobStoreBase,
  type JobStoreOptions,
  type Position,
  type StoreCapabilities,
  type UpdateOutcome,
} from "./persistence.ts";
import type { Clock, FeedPage, ReportStore } from "./ports.ts";
import {
  applyCountMove,
  applyRecordWrite,
  carriesMark,
  type DerivedKeys,
  owedPlaceOf,
  type RecordWrite,
  sortableTime,
  statusCountMove,
  writeHolds,
} from "./record-write.ts";
import type { DispatchRecord, EventLogEntry, JobRecord, Status } from "./schemas.ts";

/**
 * Reference adapters: the ports kept in memory, with no I/O, for pure unit tests
 * (`tests/unit`). They pass the same contract suites as the SQLite, DynamoDB, file
 * and S3 adapters (`tests/contract/memory.test.ts`), so a unit test on them sees the
 * behaviour the real stores have; they are never part of a deployment.
 *
 * `MemoryJobStore` is the reference of `JobStoreBase`'s primitives: it evaluates each
 * conditional write's conditions (`writeHolds`) and applies it (`applyRecordWrite`)
 * as record-write.ts defines them, which the SQL and DynamoDB adapters compile. Every
 * primitive runs to completion without awaiting anything, so each write is atomic
 * with respect to every other call. Records are copied in and out, so no caller can
 * change what is stored, or what another caller was handed.
 */
export class MemoryJobStore extends JobStoreBase {
  readonly #jobs = new Map<string, JobRecord>();
  readonly #dispatches = new Map<string, DispatchRecord>();
  readonly #events = new Map<string, EventLogEntry[]>();
  /** The counts per status, moved in the same synchronous step as each write (`statusCountMove`). */
  readonly #counts: Partial<Record<Status, number>> = {};
  /** The change feed: a row's position is its index + 1. */
  readonly #changes: ChangeRow[] = [];
  readonly #clock: Clock;

  /** `clock` stamps each feed row's commit time (`at`); the system clock by default. */
  constructor(options: JobStoreOptions & { clock?: Clock } = {}) {
    super(options);
    this.#clock = options.clock ?? { now: () => new Date() };
  }

  override get capabilities(): StoreCapabilities {
    return { atomicMultiWrite: true, countConsistency: "exact" };
  }

  /** Append the rows a committed write produces, in the same synchronous step as the write. */
  #record(before: JobRecord | undefined, after: JobRecord, note: ChangeNote | undefined): void {
    const at = this.#clock.now().toISOString();
    for (const draft of changeRowsOf(before, after, note)) {
      this.#changes.push({ ...structuredClone(draft), cursor: String(this.#changes.length + 1), at });
    }
  }

  protected async insertRecord(record: JobRecord, _keys: Required<DerivedKeys>, note: ChangeNote): Promise<boolean> {
    if (this.#jobs.has(record.job_id)) return false;
    this.#jobs.set(record.job_id, structuredClone(record));
    applyCountMove(this.#counts, statusCountMove(undefined, record.status));
    this.#record(undefined, record, note);
    return true;
  }

  protected async readRecord(jobId: string): Promise<JobRecord | undefined> {
    const record = this.#jobs.get(jobId);
    return record === undefined ? undefined : structuredClone(record);
  }

  protected async updateRecord(write: RecordWrite): Promise<UpdateOutcome> {
    return this.#update(write);
  }

  #update(write: RecordWrite): UpdateOutcome {
    const current = this.#jobs.get(write.jobId);
    if (current === undefined || !writeHolds(current, write)) {
      return { written: false, current: current === undefined ? undefined : structuredClone(current) };
    }
    const next = applyRecordWrite(current, write);
    this.#jobs.set(write.jobId, next);
    applyCountMove(this.#counts, statusCountMove(current.status, next.status));
    if (write.feed !== undefined) this.#record(current, next, write.feed);
    return { written: true, record: structuredClone(next) };
  }

  /**
   * The parts decided in order, as one commit would run them (an earlier part may
   * change what a later one reads), on a scratch copy first: a required update that
   * does not hold then leaves everything as it was; otherwise the same parts are
   * written (a line already logged left as it is), in one synchronous step.
   */
  protected override async writeAtomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome> {
    const scratch = new Map<string, JobRecord | undefined>();
    const decided: boolean[] = [];
    for (const w of writes) {
      if (w.kind !== "update") continue;
      const current = scratch.has(w.write.jobId) ? scratch.get(w.write.jobId) : this.#jobs.get(w.write.jobId);
      const holds = current !== undefined && writeHolds(current, w.write);
      if (!holds && w.optional !== true) return { committed: false };
      if (holds && current !== undefined) scratch.set(w.write.jobId, applyRecordWrite(current, w.write));
      decided.push(holds);
    }
    const held: boolean[] = [];
    let at = 0;
    for (const w of writes) {
      if (w.kind === "insertEvent") {
        this.#append(w.entry);
        continue;
      }
      const holds = decided[at++] === true;
      if (holds) this.#update(w.write);
      if (w.optional === true) held.push(holds);
    }
    return { committed: true, held };
  }

  protected async queryCounts(): Promise<Partial<Record<Status, number>>> {
    return { ...this.#counts };
  }

  protected async queryFeed(query: FeedQuery): Promise<FeedPage> {
    let from = 0;
    if (query.after !== undefined) {
      from = /^(0|[1-9][0-9]{0,15})$/.test(query.after) ? Number(query.after) : Number.NaN;
      if (!(from <= this.#changes.length)) throw invalidCursor();
    }
    const items: ChangeRow[] = [];
    let position = from;
    for (const row of this.#changes.slice(from)) {
      if (items.length === query.limit) break;
      if (query.upTo !== undefined && sortableTime(row.at) > query.upTo) break;
      position = Number(row.cursor);
      if (query.jobId === undefined || row.job_id === query.jobId) items.push(structuredClone(row));
    }
    return { items, cursor: String(position) };
  }

  /** Every row is readable at once (no delay), and a job's listing counts positions in the whole feed: the head is the row count. */
  protected async queryFeedHead(_jobId: string | undefined): Promise<string> {
    return String(this.#changes.length);
  }

  protected async queryJobs(listing: JobListing, after: Position | undefined, limit: number): Promise<JobRecord[]> {
    const keyed: [Position, JobRecord][] = [];
    for (const r of this.#jobs.values()) {
      if (listing.kind === "recent") {
        if (listing.mark !== undefined && !carriesMark(r, listing.mark, listing.dueBy)) continue;
        if (listing.status === undefined || r.status === listing.status) keyed.push([[sortableTime(r.updated_at), r.job_id], r]);
      } else if (r.pending_notification?.quarantined_at !== undefined) {
        keyed.push([[sortableTime(r.pending_notification.quarantined_at), r.job_id], r]);
      }
    }
    return keyed
      .filter(([k]) => after === undefined || compare(k, after) < 0)
      .sort(([a], [b]) => compare(b, a))
      .slice(0, limit)
      .map(([, r]) => structuredClone(r));
  }

  protected async queryOwed(limit: number, dueBy: string | undefined): Promise<JobRecord[]> {
    const owed: [string, JobRecord][] = [];
    for (const record of this.#jobs.values()) {
      const intent = record.pending_notification;
      if (intent === undefined) continue;
      const place = owedPlaceOf(intent);
      if (place.part === "due" && (dueBy === undefined || place.at <= dueBy)) owed.push([place.at, record]);
    }
    owed.sort(([a, x], [b, y]) => compare([a, x.job_id], [b, y.job_id]));
    return owed.slice(0, limit).map(([, r]) => structuredClone(r));
  }

  protected async queryCandidates(limit: number, dueBy: string): Promise<JobRecord[]> {
    return this.#byKey(limit, dueBy, (r) => r.candidate_at);
  }

  protected async queryAttention(limit: number, dueBy: string): Promise<JobRecord[]> {
    return this.#byKey(limit, dueBy, (r) => r.attention_at);
  }

  /** Records whose time `key` (sortable) is at or before `dueBy`, by (key, job_id) ascending: a sparse index's reference. */
  #byKey(limit: number, dueBy: string, key: (r: JobRecord) => string | undefined): JobRecord[] {
    const due: [string, JobRecord][] = [];
    for (const record of this.#jobs.values()) {
      const k = key(record);
      if (k === undefined) continue;
      const at = sortableTime(k);
      if (at <= dueBy) due.push([at, record]);
    }
    due.sort(([a, x], [b, y]) => compare([a, x.job_id], [b, y.job_id]));
    return due.slice(0, limit).map(([, r]) => structuredClone(r));
  }

  protected async insertDispatch(dispatch: DispatchRecord): Promise<boolean> {
    const key = `${dispatch.job_id}/${dispatch.attempt_id}`;
    if (this.#dispatches.has(key)) return false;
    this.#dispatches.set(key, structuredClone(dispatch));
    return true;
  }

  protected async readDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    const dispatch = this.#dispatches.get(`${jobId}/${attemptId}`);
    return dispatch === undefined ? undefined : structuredClone(dispatch);
  }

  /** An entry whose id the job's log already holds is a no-op: the first one stays. */
  protected async insertEvent(entry: EventLogEntry): Promise<void> {
    this.#append(entry);
  }

  #append(entry: EventLogEntry): void {
    const log = this.#events.get(entry.job_id) ?? [];
    if (log.some((e) => e.id === entry.id)) return;
    log.push(structuredClone(entry));
    log.sort((a, b) => compare(eventKey(a), eventKey(b)));
    this.#events.set(entry.job_id, log);
  }

  protected async queryEvents(jobId: string, after: Position | undefined, limit: number): Promise<EventLogEntry[]> {
    return (this.#events.get(jobId) ?? [])
      .filter((e) => after === undefined || compare(eventKey(e), after) > 0)
      .slice(0, limit)
      .map((e) => structuredClone(e));
  }
}

function compare(a: Position, b: Position): number {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1;
  return 0;
}

const eventKey = (e: EventLogEntry): Position => [sortableTime(e.at), e.id];

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
