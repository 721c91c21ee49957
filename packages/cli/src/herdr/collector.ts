import { type Clock, DEFAULT_SETTLE_WINDOW_MS, evidenceFor, isMamError, type ObservedState } from "@mam/core";
import { HerdrError, type HerdrSocket, type HerdrSubscriptionHandle } from "./herdr-socket.ts";
import { type HerdrAgentStatus, type HerdrPane, readEvent, readPane } from "./protocol.ts";

/** The latest dispatch of a job that is not terminal, as the collector maps panes to it. */
export interface WatchedDispatch {
  readonly job_id: string;
  /** The job's backend: its settle window sets the re-post period. */
  readonly agent: string;
  readonly attempt_id: number;
  readonly agent_session_uuid: string;
  readonly pane_process_generation: number;
  readonly pane_id?: string;
  readonly terminal_id?: string;
  readonly recorded_at: string;
}

/** What the collector posts: `POST /v1/jobs/{job_id}/observations`' body. */
export interface PaneObservation {
  readonly state: ObservedState;
  readonly source_kind: "pane_status";
  readonly attempt_id: number;
  readonly agent_session_uuid: string;
  readonly pane_process_generation: number;
  readonly pane_id?: string;
  readonly observed_at: string;
}

/** The collector's view of mam: the dispatches it may map panes to, and where it posts what it saw. */
export interface MamPort {
  /** The latest dispatch of every pending or running job that has one. */
  watchedDispatches(): Promise<readonly WatchedDispatch[]>;
  /** Resolves with whether mam coalesced it into the source's last state; rejects with mam's MamError. */
  postObservation(jobId: string, body: PaneObservation): Promise<{ readonly coalesced: boolean }>;
}

export interface CollectorOptions {
  readonly herdr: HerdrSocket;
  readonly mam: MamPort;
  readonly clock: Clock;
  /** One line per call, no newline; never given the token. */
  readonly log: (line: string) => void;
  /** Ends the collector: it closes herdr's connections and returns. */
  readonly signal: AbortSignal;
  /** How often mam's dispatches are read again (`--interval`). */
  readonly discoveryMs?: number;
  /** How often due re-posts and retries are looked for. */
  readonly tickMs?: number;
  /** Reconnection backoff: doubled after each failed connection, up to `maxMs`. */
  readonly backoff?: { readonly initialMs: number; readonly maxMs: number };
  /** Connect once, list, post what changed, and return (`--once`). */
  readonly once?: boolean;
}

const QUIESCENT: ReadonlySet<HerdrAgentStatus> = new Set(["idle", "done"]);

const keyOf = (d: { job_id: string; attempt_id: number }): string => `${d.job_id}#${d.attempt_id}`;
const paneKey = (paneId: string, terminalId: string): string => `${paneId}\u0000${terminalId}`;
const describe = (d: WatchedDispatch): string => `job ${d.job_id} attempt ${d.attempt_id}`;

interface Posted {
  readonly status: HerdrAgentStatus;
  readonly revision: number;
  readonly atMs: number;
}

/** One connection's session with herdr: its subscriptions, and how it ends. */
interface Session {
  readonly generation: number;
  readonly statusSubs: Map<string, HerdrSubscriptionHandle>;
  /** Panes whose status subscription is being opened. */
  readonly opening: Set<string>;
  /** The first list, subscriptions and second list are done: posting may start (never from a half-synced view). */
  ready: boolean;
  readonly closing: Set<HerdrSubscriptionHandle>;
  lost: () => void;
  readonly lostPromise: Promise<void>;
}

/**
 * The state machine behind `mam watch herdr` (docs/decisions.md, "`mam watch herdr`").
 *
 * - A pane maps to the latest dispatch of a non-terminal job when its `pane_id` and
 *   `terminal_id` equal the dispatch's and, when herdr reports the agent's session,
 *   that session is the dispatch's. The first dispatch to name a pane holds it while
 *   its job is not terminal; a later one naming it is refused for good.
 * - `pane_closed` / `pane_exited` (or a mapped pane missing from a re-list: herdr
 *   replays nothing) end a mapping for good.
 * - It posts a mapped pane when its `(agent_status, revision)` differs from what it last
 *   posted for that dispatch, and re-posts a quiescent one (`idle`, `done`) at least
 *   every half settle window of the job's backend: mam coalesces the repeat, and that is
 *   the only way a watcher's quiescent span grows.
 * - Nothing is posted for a pane it cannot map, nor while herdr is not connected.
 */
export class HerdrCollector {
  readonly #o: CollectorOptions;
  readonly #tickMs: number;
  readonly #discoveryMs: number;
  /** The latest dispatch of each non-terminal job, by `job#attempt`. */
  #dispatches = new Map<string, WatchedDispatch>();
  /** Which dispatch holds each pane id. */
  readonly #holders = new Map<string, string>();
  /** Dispatches refused for naming a pane another running dispatch holds: for good. */
  readonly #refused = new Set<string>();
  /** Dispatches whose pane closed or exited: for good. */
  readonly #ended = new Set<string>();
  /** `(pane_id, terminal_id)` pairs that closed or exited. */
  readonly #endedPanes = new Set<string>();
  /** `(pane_id, terminal_id)` pairs seen in herdr (to tell a pane missed while disconnected). */
  readonly #seenPanes = new Set<string>();
  /** Dispatches already logged as unmappable or not matching, so each is said once. */
  readonly #said = new Set<string>();
  /** herdr's panes, as of the connected session's last list and events. */
  #panes = new Map<string, HerdrPane>();
  readonly #posted = new Map<string, Posted>();
  readonly #inFlight = new Set<string>();
  #session: Session | undefined;
  #generation = 0;
  #resyncing: Promise<void> | undefined;
  #resyncAgain = false;
  #mamFailing = false;
  #discoveryFailing = false;
  #discovering = false;
  /** Dispatches one look did not list, by how many looks in a row missed them. */
  readonly #missed = new Map<string, number>();

  constructor(options: CollectorOptions) {
    this.#o = options;
    this.#tickMs = options.tickMs ?? 1_000;
    this.#discoveryMs = options.discoveryMs ?? 5_000;
  }

  /**
   * Runs until the signal aborts (or once, with `once`). Never throws for herdr or mam
   * failing; resolves with whether herdr was reached (and listed) at least once.
   */
  async run(): Promise<boolean> {
    const { signal } = this.#o;
    await this.#discover();
    if (this.#o.once) return this.#connect();
    let reached = false;
    const discovery = setInterval(() => void this.#discover(), this.#discoveryMs);
    const tick = setInterval(() => this.#reconcileAll(), this.#tickMs);
    const backoff = this.#o.backoff ?? { initialMs: 250, maxMs: 30_000 };
    let wait = backoff.initialMs;
    try {
      while (!signal.aborted) {
        const connected = await this.#connect();
        reached ||= connected;
        if (signal.aborted) break;
        if (connected) wait = backoff.initialMs;
        this.#o.log(`herdr: not connected; reconnecting in ${wait} ms`);
        await sleep(wait, signal);
        wait = Math.min(wait * 2, backoff.maxMs);
      }
    } finally {
      clearInterval(discovery);
      clearInterval(tick);
    }
    return reached;
  }

  /**
   * One session: subscribe to pane lifecycle events first (so nothing between the list
   * and the subscription is missed), list, subscribe per mapped pane, post what changed,
   * then hold until a connection drops or the signal aborts. True when it got as far as
   * the list.
   */
  async #connect(): Promise<boolean> {
    const generation = ++this.#generation;
    let lost = () => {};
    const lostPromise = new Promise<void>((resolve) => {
      lost = resolve;
    });
    const session: Session = { generation, statusSubs: new Map(), opening: new Set(), ready: false, closing: new Set(), lost, lostPromise };
    const onAbort = () => session.lost();
    this.#o.signal.addEventListener("abort", onAbort);
    let listed = false;
    let lifecycle: HerdrSubscriptionHandle | undefined;
    try {
      if (this.#o.once) {
        this.#session = session;
        await this.#list(session);
        session.ready = true;
        this.#logConnected();
        await Promise.all(this.#mappedKeys().map((key) => this.#reconcile(key)));
        return true;
      }
      lifecycle = await this.#o.herdr.subscribe([{ type: "pane.created" }, { type: "pane.closed" }, { type: "pane.exited" }], (line) =>
        this.#onLine(generation, line),
      );
      void lifecycle.ended.then(() => session.lost());
      this.#session = session;
      await this.#resync(session);
      listed = true;
      this.#logConnected();
      await session.lostPromise;
      return true;
    } catch (e) {
      this.#o.log(`herdr: ${e instanceof Error ? e.message : String(e)}`);
      return listed;
    } finally {
      this.#o.signal.removeEventListener("abort", onAbort);
      if (this.#session === session) this.#session = undefined;
      this.#panes = new Map();
      lifecycle?.close();
      for (const sub of session.statusSubs.values()) {
        session.closing.add(sub);
        sub.close();
      }
    }
  }

  #logConnected(): void {
    const mapped = [...this.#panes.values()].filter((pane) => this.#keyOfPane(pane) !== undefined).length;
    this.#o.log(`herdr: connected to ${this.#o.herdr.path}; ${this.#panes.size} panes listed, ${mapped} mapped`);
  }

  /** List herdr's panes, open a status subscription per mapped pane, list again if any opened (the gap), post. */
  async #resync(session: Session): Promise<void> {
    await this.#list(session);
    let opened = false;
    for (const key of this.#mappedKeys()) {
      const d = this.#dispatches.get(key);
      if (d?.pane_id === undefined || session.statusSubs.has(d.pane_id) || session.opening.has(d.pane_id)) continue;
      // A pane herdr does not list (or of another terminal) is subscribed to when pane_created names it.
      const pane = this.#panes.get(d.pane_id);
      if (pane === undefined || pane.terminal_id !== d.terminal_id) continue;
      if (await this.#subscribeStatus(session, d.pane_id)) opened = true;
      if (this.#session !== session) return;
    }
    if (opened) await this.#list(session);
    if (this.#session !== session) return;
    session.ready = true;
    this.#reconcileAll();
  }

  /** Resync the current session, one at a time: a request while one runs makes it run once more. */
  #resyncSoon(): void {
    const session = this.#session;
    if (session === undefined) return;
    if (this.#resyncing !== undefined) {
      this.#resyncAgain = true;
      return;
    }
    this.#resyncing = (async () => {
      do {
        this.#resyncAgain = false;
        try {
          await this.#resync(session);
        } catch (e) {
          this.#o.log(`herdr: ${e instanceof Error ? e.message : String(e)}`);
          session.lost();
          return;
        }
      } while (this.#resyncAgain && this.#session === session);
    })().finally(() => {
      this.#resyncing = undefined;
    });
  }

  async #list(session: Session): Promise<void> {
    const result = await this.#o.herdr.request("pane.list", {});
    if (this.#session !== session) return;
    if (result.type !== "pane_list" || !Array.isArray(result.panes)) throw new Error("herdr answered pane.list without a pane_list");
    const panes = new Map<string, HerdrPane>();
    for (const raw of result.panes) {
      const pane = readPane(raw);
      if (pane !== undefined) panes.set(pane.pane_id, pane);
    }
    // herdr replays nothing after a reconnect: a mapped pane it no longer lists closed meanwhile.
    for (const key of this.#mappedKeys()) {
      const d = this.#dispatches.get(key) as WatchedDispatch;
      const pair = paneKey(d.pane_id as string, d.terminal_id as string);
      const now = panes.get(d.pane_id as string);
      if (this.#seenPanes.has(pair) && (now === undefined || now.terminal_id !== d.terminal_id))
        this.#endPane(d.pane_id as string, d.terminal_id);
    }
    this.#panes = panes;
    for (const pane of panes.values()) this.#seenPanes.add(paneKey(pane.pane_id, pane.terminal_id));
  }

  async #subscribeStatus(session: Session, paneId: string): Promise<boolean> {
    session.opening.add(paneId);
    try {
      const sub = await this.#o.herdr.subscribe([{ type: "pane.agent_status_changed", pane_id: paneId }], (line) =>
        this.#onLine(session.generation, line),
      );
      // The session ended, or the pane's mapping did, while it was being opened.
      if (this.#session !== session || !this.#mappedPaneIds().includes(paneId)) {
        sub.close();
        return false;
      }
      session.statusSubs.set(paneId, sub);
      // A status subscription that ends unasked is a lost connection: reconnect and re-list.
      void sub.ended.then(() => {
        if (!session.closing.has(sub)) session.lost();
      });
      return true;
    } catch (e) {
      // The pane went away between the list and the subscription: its lifecycle event says so.
      if (e instanceof HerdrError) {
        this.#o.log(`herdr: no status subscription for pane ${paneId}: ${e.message}`);
        return false;
      }
      throw e;
    } finally {
      session.opening.delete(paneId);
    }
  }

  #onLine(generation: number, line: unknown): void {
    if (this.#session?.generation !== generation) return;
    const event = readEvent(line);
    if (event === undefined) return;
    switch (event.event) {
      case "pane_created": {
        const pane = event.data.pane;
        this.#panes.set(pane.pane_id, pane);
        this.#seenPanes.add(paneKey(pane.pane_id, pane.terminal_id));
        const key = this.#keyOfPane(pane);
        if (key !== undefined) {
          this.#resyncSoon();
          void this.#reconcile(key);
        }
        return;
      }
      case "pane_closed":
      case "pane_exited": {
        const paneId = event.data.pane_id;
        this.#endPane(paneId, this.#panes.get(paneId)?.terminal_id, event.event);
        return;
      }
      case "pane.agent_status_changed": {
        const pane = this.#panes.get(event.data.pane_id);
        if (pane === undefined) return;
        this.#panes.set(pane.pane_id, { ...pane, agent_status: event.data.agent_status });
        const key = this.#keyOfPane(pane);
        if (key !== undefined) void this.#reconcile(key);
        return;
      }
      default:
        event satisfies never;
    }
  }

  /** A pane closed or exited (or went missing): the mapping of the dispatch holding it ends for good. */
  #endPane(paneId: string, terminalId: string | undefined, why = "missing from herdr's list"): void {
    if (terminalId !== undefined) this.#endedPanes.add(paneKey(paneId, terminalId));
    this.#panes.delete(paneId);
    const sub = this.#session?.statusSubs.get(paneId);
    if (sub !== undefined) {
      this.#session?.closing.add(sub);
      this.#session?.statusSubs.delete(paneId);
      sub.close();
    }
    const key = this.#holders.get(paneId);
    const d = key === undefined ? undefined : this.#dispatches.get(key);
    if (key === undefined || d === undefined || this.#ended.has(key)) return;
    // A pane of another terminal under the same id is not the dispatch's pane.
    if (terminalId !== undefined && terminalId !== d.terminal_id) return;
    this.#ended.add(key);
    this.#o.log(`pane ${paneId} ${why}: ${describe(d)} is no longer mapped, for good`);
  }

  /** Read mam's dispatches again and settle which dispatch holds which pane. */
  async #discover(): Promise<void> {
    // One look at a time: a slow service never stacks them up.
    if (this.#discovering) return;
    this.#discovering = true;
    try {
      await this.#discoverOnce();
    } finally {
      this.#discovering = false;
    }
  }

  async #discoverOnce(): Promise<void> {
    let found: readonly WatchedDispatch[];
    try {
      found = await this.#o.mam.watchedDispatches();
      if (this.#discoveryFailing) this.#o.log("mam: dispatches read again");
      this.#discoveryFailing = false;
    } catch (e) {
      if (!this.#discoveryFailing) this.#o.log(`mam: could not read the dispatches: ${e instanceof Error ? e.message : String(e)}`);
      this.#discoveryFailing = true;
      return;
    }
    const before = new Set(this.#mappedPaneIds());
    const next = new Map(found.map((d) => [keyOf(d), d]));
    const jobs = new Set(found.map((d) => d.job_id));
    for (const [key, d] of this.#dispatches) {
      if (next.has(key)) {
        this.#missed.delete(key);
        continue;
      }
      // A newer attempt of the same job replaces it at once. Otherwise it is dropped only when
      // two looks in a row miss it: a job updated while its status's pages were read can be
      // skipped by one look, and dropping it would free its pane for a dispatch it must refuse.
      const missed = (this.#missed.get(key) ?? 0) + 1;
      if (!jobs.has(d.job_id) && missed < 2) {
        this.#missed.set(key, missed);
        next.set(key, d);
      } else this.#missed.delete(key);
    }
    this.#dispatches = next;
    for (const key of this.#posted.keys()) if (!next.has(key)) this.#posted.delete(key);
    for (const [paneId, key] of this.#holders) if (!this.#dispatches.has(key)) this.#holders.delete(paneId);
    // The first to name a pane holds it; order by when each was recorded, so a restart decides alike.
    const ordered = [...this.#dispatches.entries()].sort(([, a], [, b]) => a.recorded_at.localeCompare(b.recorded_at));
    for (const [key, d] of ordered) {
      if (this.#refused.has(key) || this.#ended.has(key)) continue;
      if (d.pane_id === undefined || d.pane_id === "" || d.terminal_id === undefined) {
        this.#sayOnce(key, `${describe(d)} recorded no ${d.pane_id ? "terminal_id" : "pane_id"}: no pane maps to it`);
        continue;
      }
      const holder = this.#holders.get(d.pane_id);
      if (holder === undefined) this.#holders.set(d.pane_id, key);
      else if (holder !== key) {
        this.#refused.add(key);
        const held = this.#dispatches.get(holder) as WatchedDispatch;
        this.#o.log(`refused: ${describe(d)} names pane ${d.pane_id}, which ${describe(held)} holds; nothing is posted for it`);
      }
    }
    const after = this.#mappedPaneIds();
    // A pane no longer mapped (its job ended, a newer attempt moved elsewhere): its status subscription goes.
    const session = this.#session;
    if (session !== undefined) {
      for (const [paneId, sub] of session.statusSubs) {
        if (after.includes(paneId)) continue;
        session.closing.add(sub);
        session.statusSubs.delete(paneId);
        sub.close();
      }
    }
    if (after.some((p) => !before.has(p))) this.#resyncSoon();
    this.#reconcileAll();
  }

  /** The dispatches holding a pane that may still be posted for. */
  #mappedKeys(): string[] {
    return [...this.#holders.values()].filter((key) => !this.#ended.has(key) && this.#dispatches.has(key));
  }

  #mappedPaneIds(): string[] {
    return this.#mappedKeys().map((key) => this.#dispatches.get(key)?.pane_id as string);
  }

  /** The dispatch `pane` maps to, if any. */
  #keyOfPane(pane: HerdrPane): string | undefined {
    const key = this.#holders.get(pane.pane_id);
    if (key === undefined || this.#ended.has(key)) return undefined;
    const d = this.#dispatches.get(key);
    if (d === undefined || d.terminal_id !== pane.terminal_id) return undefined;
    if (this.#endedPanes.has(paneKey(pane.pane_id, pane.terminal_id))) return undefined;
    const session = pane.agent_session;
    if (session !== undefined && session !== null && sessionIdOf(session) !== d.agent_session_uuid) {
      this.#sayOnce(`${key}:session`, `pane ${pane.pane_id} runs agent session ${session.value}, not ${describe(d)}'s: not mapped`);
      return undefined;
    }
    return key;
  }

  #reconcileAll(): void {
    if (this.#session?.ready !== true) return;
    for (const key of this.#mappedKeys()) void this.#reconcile(key);
  }

  /** Post the dispatch's pane if it changed since the last post, or re-post it if quiescent and due. */
  async #reconcile(key: string): Promise<void> {
    const d = this.#dispatches.get(key);
    if (d?.pane_id === undefined || this.#session?.ready !== true || this.#inFlight.has(key)) return;
    const pane = this.#panes.get(d.pane_id);
    if (pane === undefined || this.#keyOfPane(pane) !== key) return;
    const last = this.#posted.get(key);
    const nowMs = this.#o.clock.now().getTime();
    const changed = last === undefined || last.status !== pane.agent_status || last.revision !== pane.revision;
    const due = last !== undefined && QUIESCENT.has(pane.agent_status) && nowMs - last.atMs >= this.#repostAfterMs(d.agent);
    if (!changed && !due) return;
    this.#inFlight.add(key);
    const observedAt = new Date(nowMs).toISOString();
    try {
      const answer = await this.#o.mam.postObservation(d.job_id, {
        state: pane.agent_status,
        source_kind: "pane_status",
        attempt_id: d.attempt_id,
        agent_session_uuid: d.agent_session_uuid,
        pane_process_generation: d.pane_process_generation,
        pane_id: d.pane_id,
        observed_at: observedAt,
      });
      this.#posted.set(key, { status: pane.agent_status, revision: pane.revision, atMs: nowMs });
      if (this.#mamFailing) this.#o.log("mam: reachable again");
      this.#mamFailing = false;
      this.#o.log(
        `${answer.coalesced ? "re-posted" : "posted"} ${describe(d)} pane ${d.pane_id}: ${pane.agent_status} (revision ${pane.revision})`,
      );
    } catch (e) {
      if (retryable(e)) {
        // Not recorded as posted: the next tick tries again.
        if (!this.#mamFailing) this.#o.log(`mam: could not post for ${describe(d)}, will retry: ${errorText(e)}`);
        this.#mamFailing = true;
      } else {
        // A refusal is an answer: recorded as posted so the same state is not sent again until it changes or is due.
        this.#posted.set(key, { status: pane.agent_status, revision: pane.revision, atMs: nowMs });
        this.#o.log(`mam refused ${pane.agent_status} for ${describe(d)} pane ${d.pane_id}: ${errorText(e)}`);
      }
    } finally {
      this.#inFlight.delete(key);
    }
  }

  /** Half the backend's settle window, less one tick: so two posts are never further apart than half the window. */
  #repostAfterMs(backend: string): number {
    const half = (evidenceFor(backend)?.settleWindowMs ?? DEFAULT_SETTLE_WINDOW_MS) / 2;
    return Math.max(half - this.#tickMs, this.#tickMs);
  }

  #sayOnce(key: string, line: string): void {
    if (this.#said.has(key)) return;
    this.#said.add(key);
    this.#o.log(line);
  }
}

/**
 * The session id herdr reports for the pane's agent: the id itself, or for a session
 * file (`kind: path`, Claude Code's `<uuid>.jsonl`) the file's name without extension.
 */
function sessionIdOf(session: { readonly kind: string; readonly value: string }): string {
  if (session.kind === "id") return session.value;
  const name = session.value.split(/[\\/]/).pop() ?? "";
  const dot = name.lastIndexOf(".");
  return dot > 0 ? name.slice(0, dot) : name;
}

/** A service that could not be reached, a 5xx or a 429 is tried again; any other answer is mam's refusal. */
function retryable(e: unknown): boolean {
  if (!isMamError(e)) return true;
  const status = e.details.status;
  if (typeof status !== "number") return e.code === "service.unreachable" || e.code === "store.unavailable" || e.code === "internal";
  return status >= 500 || status === 429;
}

const errorText = (e: unknown): string => (e instanceof Error ? e.message : String(e));

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
