/**
 * core's JobStoreBase: the rules every store keeps, checked before a primitive is
 * asked; the conditional writes it hands an adapter, as data; the record cache and
 * the commit hooks, reached by every write method (listed by reflection, so a write
 * method added later without them fails here). The contract suite
 * (tests/contract/job-store.suite.ts) shows the same refusals on every adapter; this
 * shows that a refused call never reaches a primitive, and what the primitives receive.
 */
import {
  type AtomicOutcome,
  type AtomicWrite,
  type Commit,
  type DerivedKeys,
  type EventLogEntry,
  type FeedPage,
  type FeedQuery,
  type JobListing,
  type JobRecord,
  JobStoreBase,
  MamError,
  MemoryJobStore,
  NO_CONCURRENCY_CHECK,
  type NotificationIntent,
  type Position,
  type RecordWrite,
  type UpdateOutcome,
  WRITE_METHODS,
  type WriteMethod,
} from "@mam/core";
import { beforeEach, describe, expect, it } from "vitest";
import { jobRecord as job } from "../support/records.ts";
import { rejection } from "../support/rejection.ts";

const AT = "2025-01-15T12:00:00.000Z";

const intent: NotificationIntent = { id: "i-1", event: "completed", seq: 1, created_at: AT };

/** The memory reference, recording every primitive it is asked, and holding a read when told to. */
class RecordingStore extends MemoryJobStore {
  readonly calls: { method: string; args: unknown[] }[] = [];
  hold: Promise<void> | undefined;
  version: number | undefined;

  #log(method: string, args: unknown[]): void {
    this.calls.push({ method, args: structuredClone(args) });
  }
  protected override async readRecord(jobId: string): Promise<JobRecord | undefined> {
    this.#log("readRecord", [jobId]);
    const hold = this.hold;
    const record = await super.readRecord(jobId);
    await hold;
    return record;
  }
  protected override insertRecord(record: JobRecord, keys: Required<DerivedKeys>, note: object): Promise<boolean> {
    this.#log("insertRecord", [record, keys, note]);
    return super.insertRecord(record, keys, note);
  }
  protected override updateRecord(write: RecordWrite): Promise<UpdateOutcome> {
    this.#log("updateRecord", [write]);
    return super.updateRecord(write);
  }
  protected override writeAtomically(writes: readonly AtomicWrite[]): Promise<AtomicOutcome> {
    this.#log("writeAtomically", [writes]);
    return super.writeAtomically(writes);
  }
  protected override insertEvent(entry: EventLogEntry): Promise<void> {
    this.#log("insertEvent", [entry]);
    return super.insertEvent(entry);
  }
  protected override queryJobs(listing: JobListing, after: Position | undefined, limit: number): Promise<JobRecord[]> {
    this.#log("queryJobs", [listing, after, limit]);
    return super.queryJobs(listing, after, limit);
  }
  protected override queryFeed(query: FeedQuery): Promise<FeedPage> {
    this.#log("queryFeed", [query]);
    return super.queryFeed(query);
  }
  protected override queryEvents(jobId: string, after: Position | undefined, limit: number): Promise<EventLogEntry[]> {
    this.#log("queryEvents", [jobId, after, limit]);
    return super.queryEvents(jobId, after, limit);
  }
}

/** The same, with a data-version probe the test moves by hand (on SQLite: `PRAGMA data_version`). */
class VersionedStore extends RecordingStore {
  override version = 1;
  override dataVersion(): number {
    return this.version;
  }
}

let store: RecordingStore;
beforeEach(() => {
  store = new RecordingStore();
});

describe("JobStoreBase: the guard", () => {
  it("refuses a bad job id on every call that names a job before any primitive is asked", async () => {
    const id = "../escape";
    const calls = [
      store.create(job(id)),
      store.get(id),
      store.transition(id, 0, { from: ["pending"], set: { status: "running" } }),
      store.recordEvidence(id, { guard: { newAttempt: 1 } }),
      store.replaceNotification(id, intent),
      store.reviseNotification(id, intent),
      store.settleNotification(id, "i-1"),
      store.holdLease(id, "finalize", null, { heldBy: "l-1" }),
      store.chargeUsage(id, undefined, { attempt_id: 1, events: 1, bytes: 0, attempt_bytes: 0 } as never),
      store.recordDispatch({
        job_id: id,
        attempt_id: 1,
        agent_session_uuid: "s",
        pane_process_generation: 0,
        anchor: { started_at: AT },
        recorded_at: AT,
      }),
      store.getDispatch(id, 1),
      store.appendEvent({ job_id: id, id: "e", at: AT, event: "started" }),
      store.settlePublished({ job_id: id, id: "e", at: AT, event: "published" } as EventLogEntry, "i-1"),
      store.listEvents(id, { limit: 1 }),
      store.listChanges({ limit: 1, jobId: id }),
    ];
    for (const call of calls) {
      const err = await rejection(call);
      expect(err).toBeInstanceOf(MamError);
      expect(err).toMatchObject({ code: "input.jobId", issues: [{ path: "job_id", message: expect.any(String) }] });
    }
    // A job id that is not even a string is refused the same way, not with a TypeError.
    expect(await rejection(store.create({ ...job("x"), job_id: undefined as never }))).toMatchObject({ code: "input.jobId" });
    expect(store.calls).toEqual([]);
  });

  it("refuses a bad limit, a cursor of another listing, an invalid record or dispatch, and a bad change, before any primitive is asked", async () => {
    const refused = [
      store.list({ limit: 0 }),
      store.listOwed(-1),
      store.listQuarantined({ limit: 1.5 }),
      store.listEvents("j", { limit: Number.NaN }),
      store.list({ limit: 1, cursor: "garbage" }),
      store.create({ ...job("j"), status: "finished" as never }),
      store.recordDispatch({
        job_id: "j",
        attempt_id: 0,
        agent_session_uuid: "s",
        pane_process_generation: 0,
        anchor: { started_at: AT },
        recorded_at: AT,
      }),
      store.transition("j", 0, { from: ["pending"], set: { progress: { a: 1 } }, unset: ["progress"] }),
      store.transition("j", 0, { from: ["pending"], set: { created_at: AT } as never }),
      store.transition("j", 0, { from: ["pending"], set: {}, unset: ["prompt"] as never }),
      store.recordEvidence("j", { guard: {}, set: { latest_attempt: 3 } as never }),
    ];
    const codes = [];
    for (const call of refused) codes.push(((await rejection(call)) as MamError).code);
    expect(codes).toEqual([
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "input.invalid",
      "internal",
      "internal",
      "internal",
      "internal",
    ]);
    // No dispatch of an attempt the schema refuses can exist: nothing to ask either.
    expect(await store.getDispatch("j", 0)).toBeUndefined();
    expect(store.calls).toEqual([]);
  });

  it("refuses a lease write that is not core's (an unknown kind, an invalid lease, a release not by id, no expectation) before any primitive is asked", async () => {
    await store.create(job("j"));
    store.calls.length = 0;
    const lease = { id: "l-1", attempt_id: 1, since: AT, expires_at: AT };
    const refusals = [
      store.holdLease("j", "lock" as never, lease, { freeAt: AT }),
      store.holdLease("j", "finalize", { ...lease, attempt_id: 0 }, { freeAt: AT }),
      store.holdLease("j", "finalize", { ...lease, extra: 1 } as never, { freeAt: AT }),
      store.holdLease("j", "finalize", null, { freeAt: AT }),
      store.holdLease("j", "finalize", lease, { freeAt: "yesterday" }),
      store.holdLease("j", "finalize", lease, {} as never),
    ];
    for (const refused of refusals) {
      const e = await rejection(refused);
      expect(e instanceof MamError && e.code === "internal", String(e)).toBe(true);
    }
    expect(store.calls).toEqual([]);
    expect(await store.holdLease("j", "finalize", lease, { freeAt: AT })).toBe(true);
    expect(store.calls).toEqual([
      {
        method: "updateRecord",
        args: [
          {
            jobId: "j",
            conditions: [
              { kind: "statusIn", statuses: ["pending", "running"] },
              { kind: "leaseFree", field: "finalize_in_progress", at: AT, attempt: 1 },
            ],
            set: { finalize_in_progress: lease },
            unset: [],
            bump: [],
            keys: {},
          },
        ],
      },
    ]);
  });
});

describe("JobStoreBase: conditional writes as data", () => {
  it("hands the adapter the checked record with its derived keys, and a change as one conditional write without absent values", async () => {
    const { evidence_seq: _legacy, ...withoutEvidenceSeq } = job("j");
    await store.create(withoutEvidenceSeq as JobRecord);
    await store.transition("j", 0, {
      from: ["pending"],
      set: { status: "running", agent_session: undefined, updated_at: "2025-01-15T13:00:00Z", pending_notification: intent },
      unset: ["progress", "progress"],
      evidence: { newAttempt: 1, bump: true },
    });
    expect(store.calls).toEqual([
      {
        method: "insertRecord",
        args: [job("j"), { status: "pending", recency: job("j").updated_at, owed: null, candidate: null, attention: null }, {}],
      },
      {
        method: "updateRecord",
        args: [
          {
            jobId: "j",
            conditions: [
              { kind: "transitionSeqIs", seq: 0 },
              { kind: "statusIn", statuses: ["pending"] },
              { kind: "latestAttemptBelow", attempt: 1 },
            ],
            // Every transition is activity, at its updated_at (issue 20).
            set: {
              status: "running",
              updated_at: "2025-01-15T13:00:00Z",
              pending_notification: intent,
              latest_attempt: 1,
              activity_at: "2025-01-15T13:00:00Z",
            },
            // A new dispatch removes the candidate and overdue marks and the old deadline; activity clears the stale mark.
            unset: ["progress", "candidate_at", "overdue_since", "deadline_at", "stale_since"],
            bump: ["transition_seq", "evidence_seq"],
            // The recency key is the sortable form of updated_at; the owed place is derived from the intent.
            keys: {
              status: "running",
              recency: "2025-01-15T13:00:00.000Z",
              owed: { part: "due", at: "2025-01-15T12:00:00.000Z", intentId: "i-1" },
              candidate: null,
            },
            feed: {},
          },
        ],
      },
    ]);
  });

  it("a transition with NO_CONCURRENCY_CHECK drops only the sequence condition; its conflict still names the status", async () => {
    await store.create(job("j"));
    await store.transition("j", 7 as never, { from: ["pending"], set: { status: "running" } }).catch(() => undefined);
    store.calls.length = 0;
    const after = await store.transition("j", NO_CONCURRENCY_CHECK, { from: ["pending"], set: { status: "running" } });
    expect(after.transition_seq).toBe(1);
    expect((store.calls[0]!.args[0] as RecordWrite).conditions).toEqual([{ kind: "statusIn", statuses: ["pending"] }]);
    const refused = await rejection(store.transition("j", NO_CONCURRENCY_CHECK, { from: ["pending"], set: { status: "cancelled" } }));
    expect(refused).toMatchObject({ code: "job.transitionRefused" });
  });

  it("settlePublished asks the adapter's atomic multi-write for the line and the settle (optional) together, once, settled or not", async () => {
    await store.create(job("j", { pending_notification: intent }));
    const line = (id: string) => ({ job_id: "j", id, at: AT, event: "published" }) as EventLogEntry;
    store.calls.length = 0;
    expect(await store.settlePublished(line("p-1"), "i-1")).toBe(true);
    expect(store.calls.map((c) => c.method)).toEqual(["writeAtomically"]);
    const [parts] = store.calls[0]!.args as [AtomicWrite[]];
    expect(parts.map((p) => [p.kind, p.kind === "update" && p.optional === true])).toEqual([
      ["insertEvent", false],
      ["update", true],
    ]);
    store.calls.length = 0;
    // Settled already: the same one write keeps the line and settles nothing, and says so.
    expect(await store.settlePublished(line("p-2"), "i-1")).toBe(false);
    expect(store.calls.map((c) => c.method)).toEqual(["writeAtomically"]);
    expect((await store.listEvents("j", { limit: 10 })).items.map((e) => e.id)).toEqual(["p-1", "p-2"]);
  });

  it("wraps core's position in a cursor naming its listing, and hands the adapter that position back", async () => {
    for (const id of ["a", "b", "c"]) await store.create(job(id, { updated_at: `2025-01-15T12:0${id.charCodeAt(0) - 96}:00.000Z` }));
    const first = await store.list({ limit: 1 });
    const position = ["2025-01-15T12:03:00.000Z", "c"];
    expect(JSON.parse(Buffer.from(first.cursor ?? "", "base64url").toString("utf8"))).toEqual({ l: "jobs", c: JSON.stringify(position) });
    store.calls.length = 0;
    const second = await store.list({ limit: 1, cursor: first.cursor ?? "" });
    expect(second.items.map((j) => j.job_id)).toEqual(["b"]);
    // One more than asked: whether another page exists, so the last page carries no cursor.
    expect(store.calls).toEqual([{ method: "queryJobs", args: [{ kind: "recent" }, position, 2] }]);
    // The same position under another listing's name is not a cursor of this one.
    const forged = Buffer.from(JSON.stringify({ l: "jobs/pending", c: JSON.stringify(position) })).toString("base64url");
    expect(await rejection(store.list({ limit: 1, cursor: forged }))).toMatchObject({ code: "input.invalid" });
    expect((await store.list({ status: "pending", limit: 5, cursor: forged })).items.map((j) => j.job_id)).toEqual(["b", "a"]);
  });
});

describe("JobStoreBase: the record cache", () => {
  it("is refused over an adapter without a data-version probe, naming why", () => {
    expect(() => new MemoryJobStore({ cache: {} })).toThrow(/no dataVersion probe/);
  });

  it("answers a repeated read from what it read, while the version stands still", async () => {
    const cached = new VersionedStore({ cache: { capacity: 2 } });
    await cached.create(job("a"));
    expect(await cached.get("a")).toEqual(job("a"));
    expect(await cached.get("a")).toEqual(job("a"));
    expect(cached.calls.filter((c) => c.method === "readRecord")).toHaveLength(1);
    cached.version = 2; // another writer committed
    expect(await cached.get("a")).toEqual(job("a"));
    expect(cached.calls.filter((c) => c.method === "readRecord")).toHaveLength(2);
  });

  it("does not keep a read that was in flight while a write went through", async () => {
    const cached = new VersionedStore({ cache: {} });
    await cached.create(job("a"));
    let release!: () => void;
    cached.hold = new Promise((r) => {
      release = r;
    });
    const stale = cached.get("a"); // reads pending, then waits
    cached.hold = undefined;
    await cached.transition("a", 0, { from: ["pending"], set: { status: "running" } });
    release();
    expect((await stale)?.status).toBe("pending"); // what it read, handed back, but not kept
    expect((await cached.get("a"))?.status).toBe("running");
  });

  it("keeps at most `capacity` records, the oldest read going first, and hands out frozen records", async () => {
    const cached = new VersionedStore({ cache: { capacity: 2 } });
    for (const id of ["a", "b", "c"]) await cached.create(job(id));
    const reads = () => cached.calls.filter((c) => c.method === "readRecord").length;
    await cached.get("a");
    await cached.get("b");
    await cached.get("c"); // a goes
    const before = reads();
    await cached.get("b");
    await cached.get("c");
    expect(reads()).toBe(before);
    await cached.get("a");
    expect(reads()).toBe(before + 1);
    const record = (await cached.get("a")) as JobRecord;
    expect(Object.isFrozen(record)).toBe(true);
    expect(() => (record.expected_artifacts as string[]).push("x")).toThrow(TypeError);
  });
});

/**
 * One call of each write method, on a store holding job "j" (pending, owing intent
 * i-1, attempt 1 dispatched) — each call one that commits.
 */
const COMMITTING_CALLS: Record<WriteMethod, (s: JobStoreBase) => Promise<unknown>> = {
  create: (s) => s.create(job("k")),
  transition: (s) => s.transition("j", 1, { from: ["pending"], set: { status: "running" } }),
  recordEvidence: (s) => s.recordEvidence("j", { guard: { attempt: 1 } }),
  chargeUsage: (s) => s.chargeUsage("j", undefined, { attempt_id: 1, events: 1, bytes: 0, attempt_bytes: 0 } as never),
  holdLease: (s) => s.holdLease("j", "finalize", { id: "l-1", attempt_id: 1, since: AT, expires_at: AT }, { freeAt: AT }),
  writeObservations: (s) => s.writeObservations("j", 1, { attempt_id: 1, rev: 2, entries: [] }, { bump: false }),
  clearCandidate: (s) => s.clearCandidate("j", { evidenceSeq: 1, observationsRev: 1, transitionSeq: 1 }),
  postponeCandidate: (s) => s.postponeCandidate("j", AT, AT),
  markAttention: (s) =>
    s.markAttention("j", {
      kind: "stale",
      at: AT,
      expect: { status: "pending", transitionSeq: 1, evidenceSeq: 1, observationsRev: 1 },
      attention: null,
      intent: { ...intent, id: "i-stale", event: "stale" },
      replaces: "i-1",
    }),
  rekeyAttention: (s) => s.rekeyAttention("j", { status: "pending", transitionSeq: 1, evidenceSeq: 1, observationsRev: 1 }, AT),
  recordDispatch: (s) =>
    s.recordDispatch({
      job_id: "j",
      attempt_id: 2,
      agent_session_uuid: "s",
      pane_process_generation: 0,
      anchor: { started_at: AT },
      recorded_at: AT,
    }),
  appendEvent: (s) => s.appendEvent({ job_id: "j", id: "e-1", at: AT, event: "started" }),
  replaceNotification: (s) => s.replaceNotification("j", { ...intent, id: "i-2" }),
  reviseNotification: (s) => s.reviseNotification("j", { ...intent, failures: 1 }),
  settleNotification: (s) => s.settleNotification("j", "i-1"),
  settlePublished: (s) => s.settlePublished({ job_id: "j", id: "p-1", at: AT, event: "published" } as EventLogEntry, "i-1"),
};

describe("JobStoreBase: every write method reaches the commit hooks and the cache", () => {
  it("WRITE_METHODS names every public method of the base but the reads (by reflection), so a new write method is listed or fails here", () => {
    const reads = new Set([
      "constructor",
      "get",
      "list",
      "countByStatus",
      "listOwed",
      "listCandidates",
      "listAttention",
      "listQuarantined",
      "listEvents",
      "listChanges",
      "feedHead",
      "getDispatch",
      "onCommitted",
      "capabilities",
    ]);
    const methods = Object.getOwnPropertyNames(JobStoreBase.prototype).filter((m) => !reads.has(m));
    expect(methods.sort()).toEqual([...WRITE_METHODS].sort());
    expect(Object.keys(COMMITTING_CALLS).sort()).toEqual([...WRITE_METHODS].sort());
  });

  for (const method of WRITE_METHODS) {
    it(`${method}: tells each hook once it committed (a throwing hook fails nothing), and empties the cache`, async () => {
      const cached = new VersionedStore({ cache: {} });
      await cached.create(job("j", { transition_seq: 1, pending_notification: intent }));
      await cached.recordEvidence("j", { guard: { newAttempt: 1 } });
      // A candidate mark (the dispatch removed any), for the mark writes to move.
      await cached.writeObservations("j", 0, { attempt_id: 1, rev: 1, entries: [] }, { bump: false, candidate: AT });
      const seen: Commit[] = [];
      cached.onCommitted(() => {
        throw new Error("a hook that fails");
      });
      cached.onCommitted((commit) => seen.push(commit));
      await cached.get("j"); // kept
      const readsBefore = cached.calls.filter((c) => c.method === "readRecord").length;
      await COMMITTING_CALLS[method](cached);
      expect(seen.map((c) => c.method)).toContain(method);
      expect(seen.every((c) => c.method === method && c.jobId === (method === "create" ? "k" : "j"))).toBe(true);
      await cached.get("j");
      expect(cached.calls.filter((c) => c.method === "readRecord").length, "the cache was emptied").toBe(readsBefore + 1);
    });
  }

  it("a hook is told the record a transition or an intent write committed, and nothing of a write that did not commit", async () => {
    await store.create(job("j"));
    const seen: Commit[] = [];
    store.onCommitted((c) => seen.push(c));
    await store.replaceNotification("j", intent);
    await rejection(store.transition("j", 5, { from: ["pending"], set: { status: "running" } }));
    expect(await store.settleNotification("j", "other")).toBe(false);
    expect(seen).toHaveLength(1);
    expect(seen[0]?.record?.pending_notification).toEqual(intent);
  });
});
