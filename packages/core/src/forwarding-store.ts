import type { ChangeNote, ChangeQuery } from "./feed.ts";
import type { EvidenceChange, FeedPage, JobChange, JobStore, LeaseExpectation, OwedQuery, Page } from "./ports.ts";
import type { AgentUsage, DispatchRecord, EventLogEntry, JobRecord, Lease, LeaseKind, NotificationIntent, Status } from "./schemas.ts";

/**
 * A JobStore that hands every call to `inner`: the base of a decorator (a cache, the
 * change relay), which overrides only the calls it adds something to.
 */
export class ForwardingJobStore implements JobStore {
  protected readonly inner: JobStore;

  constructor(inner: JobStore) {
    this.inner = inner;
  }

  create(record: JobRecord, note?: ChangeNote): Promise<void> {
    return this.inner.create(record, note);
  }
  get(jobId: string): Promise<JobRecord | undefined> {
    return this.inner.get(jobId);
  }
  transition(jobId: string, expectedSeq: number | null, change: JobChange): Promise<JobRecord> {
    return this.inner.transition(jobId, expectedSeq, change);
  }
  recordEvidence(jobId: string, change: EvidenceChange): Promise<JobRecord> {
    return this.inner.recordEvidence(jobId, change);
  }
  list(query: { status?: Status; limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    return this.inner.list(query);
  }
  chargeUsage(jobId: string, prior: AgentUsage | undefined, next: AgentUsage): Promise<boolean> {
    return this.inner.chargeUsage(jobId, prior, next);
  }
  holdLease(jobId: string, kind: LeaseKind, lease: Lease | null, expect: LeaseExpectation): Promise<boolean> {
    return this.inner.holdLease(jobId, kind, lease, expect);
  }
  recordDispatch(dispatch: DispatchRecord): Promise<void> {
    return this.inner.recordDispatch(dispatch);
  }
  getDispatch(jobId: string, attemptId: number): Promise<DispatchRecord | undefined> {
    return this.inner.getDispatch(jobId, attemptId);
  }
  appendEvent(entry: EventLogEntry): Promise<void> {
    return this.inner.appendEvent(entry);
  }
  listEvents(jobId: string, query: { limit: number; cursor?: string }): Promise<Page<EventLogEntry>> {
    return this.inner.listEvents(jobId, query);
  }
  replaceNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<void> {
    return this.inner.replaceNotification(jobId, intent, note);
  }
  reviseNotification(jobId: string, intent: NotificationIntent, note?: ChangeNote): Promise<boolean> {
    return this.inner.reviseNotification(jobId, intent, note);
  }
  settleNotification(jobId: string, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.inner.settleNotification(jobId, intentId, note);
  }
  settlePublished(entry: EventLogEntry, intentId: string, note?: ChangeNote): Promise<boolean> {
    return this.inner.settlePublished(entry, intentId, note);
  }
  listChanges(query: ChangeQuery): Promise<FeedPage> {
    return this.inner.listChanges(query);
  }
  listOwed(limit: number, query?: OwedQuery): Promise<readonly JobRecord[]> {
    return this.inner.listOwed(limit, query);
  }
  listQuarantined(query: { limit: number; cursor?: string }): Promise<Page<JobRecord>> {
    return this.inner.listQuarantined(query);
  }
}
