/**
 * A fake herdr server: a real Unix-socket server (node:net) speaking the part of
 * herdr's socket protocol `mam watch herdr` uses, as herdr's own schema file states it:
 *
 *   repository ogulcancelik/herdr, file docs/next/api/herdr-api.schema.json,
 *   commit 10974c822d607f03e20e9741ec027910f0c1f93a (protocol 20, schema_version 1);
 *   transport as src/api/server.rs (`handle_connection`, `stream_subscriptions`) at
 *   the same commit.
 *
 * - Newline-delimited JSON; herdr reads ONE request line per connection. An ordinary
 *   request gets one answer line, then the connection ends; `events.subscribe` gets an
 *   acknowledgement and the connection stays open, one pushed event per line.
 * - A request is `{id, method, params}`; a success `{id, result: {type, ...}}`; an
 *   error `{id, error: {code, message}}` (`error_response`); a line that is not a
 *   request (bad JSON, an unknown method) gets `invalid_request` with an empty id.
 * - `pane.list` (`PaneListParams`: optional `workspace_id`) answers
 *   `{type: "pane_list", panes: [PaneInfo]}`.
 * - `events.subscribe` (`EventsSubscribeParams`: `subscriptions: [Subscription]`)
 *   answers `{type: "subscription_started"}`. `pane.agent_status_changed` requires
 *   `pane_id` (a pane that does not exist: `pane_not_found`, as herdr's pane get) and
 *   may filter on `agent_status`.
 * - Pushed lifecycle events are `EventEnvelope`s with snake_case kinds:
 *   `{event: "pane_created", data: {type: "pane_created", pane}}`,
 *   `{event: "pane_closed" | "pane_exited", data: {type, pane_id, workspace_id}}`.
 *   The status change is a `SubscriptionEventEnvelope` with the dotted kind:
 *   `{event: "pane.agent_status_changed", data: {pane_id, workspace_id, agent_status,
 *   agent, ...}}` — no revision.
 * - Subscriptions belong to their connection; nothing is replayed after a reconnect.
 *
 * Tests drive it (`createPane`, `setStatus`, `closePane`, `exitPane`, `dropConnections`)
 * and read what it was asked (`requests`), waiting on events, never on time.
 */
import { once } from "node:events";
import { rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";

export type AgentStatus = "idle" | "working" | "blocked" | "done" | "unknown";
const STATUSES: readonly string[] = ["idle", "working", "blocked", "done", "unknown"];

/** `PaneInfo`'s required fields, and the optional ones the tests set. */
export interface FakePane {
  pane_id: string;
  terminal_id: string;
  workspace_id: string;
  tab_id: string;
  focused: boolean;
  agent_status: AgentStatus;
  revision: number;
  agent?: string | null;
  agent_session?: { source: string; agent: string; kind: "id" | "path"; value: string } | null;
}

/** A request line as it was read: every field kept, so a test can validate it against the schema. */
export interface RecordedRequest {
  readonly id: unknown;
  readonly method: unknown;
  readonly params: unknown;
  readonly [field: string]: unknown;
}

type Subscription = { type: string; pane_id?: string; agent_status?: string | null };

interface Subscriber {
  readonly socket: Socket;
  readonly subscriptions: readonly Subscription[];
}

const LIFECYCLE_TYPES = new Set(["pane.created", "pane.closed", "pane.exited"]);
/** The request types this fake knows (a subset of `Subscription`'s); others are refused as herdr would not be asked them. */
const KNOWN_TYPES = new Set([...LIFECYCLE_TYPES, "pane.agent_status_changed"]);

export class FakeHerdr {
  readonly path: string;
  /** Every request line it read, parsed (a line that was not JSON is not here). */
  readonly requests: RecordedRequest[] = [];
  /** Every line it wrote: answers, acknowledgements and pushed events. */
  readonly sent: unknown[] = [];
  readonly #server: Server;
  readonly #panes = new Map<string, FakePane>();
  readonly #subscribers = new Set<Subscriber>();
  readonly #sockets = new Set<Socket>();
  readonly #waiters = new Set<() => void>();

  private constructor(path: string) {
    this.path = path;
    this.#server = createServer((socket) => this.#accept(socket));
  }

  static async start(path: string): Promise<FakeHerdr> {
    const fake = new FakeHerdr(path);
    fake.#server.listen(path);
    await once(fake.#server, "listening");
    return fake;
  }

  /** A pane as `pane.list` shows it; emits `pane_created` to lifecycle subscribers. */
  createPane(pane: Partial<FakePane> & Pick<FakePane, "pane_id" | "terminal_id">): FakePane {
    const full: FakePane = { workspace_id: "w1", tab_id: "w1:t1", focused: false, agent_status: "unknown", revision: 1, ...pane };
    this.#panes.set(full.pane_id, full);
    this.#push("pane.created", { event: "pane_created", data: { type: "pane_created", pane: { ...full } } });
    return full;
  }

  /** herdr's screen detection moved the pane to `status`: its revision moves on, status subscribers are told. */
  setStatus(paneId: string, status: AgentStatus): void {
    const pane = this.#pane(paneId);
    pane.agent_status = status;
    pane.revision += 1;
    for (const sub of this.#subscribers) {
      const wants = sub.subscriptions.some(
        (s) => s.type === "pane.agent_status_changed" && s.pane_id === paneId && (s.agent_status == null || s.agent_status === status),
      );
      if (wants) {
        this.#write(sub.socket, {
          event: "pane.agent_status_changed",
          data: { pane_id: paneId, workspace_id: pane.workspace_id, agent_status: status, agent: pane.agent ?? null },
        });
      }
    }
    this.#wake();
  }

  closePane(paneId: string): void {
    this.#end(paneId, "closed");
  }

  exitPane(paneId: string): void {
    this.#end(paneId, "exited");
  }

  /** Every open connection dropped, as when herdr restarts: subscriptions are gone, nothing is replayed. */
  dropConnections(): void {
    for (const socket of this.#sockets) socket.destroy();
  }

  /** The requests made of `method`. */
  asked(method: string): RecordedRequest[] {
    return this.requests.filter((r) => r.method === method);
  }

  /** Open subscriptions to `type` (for a pane, with `paneId`). */
  subscribed(type: string, paneId?: string): number {
    return [...this.#subscribers].filter((s) =>
      s.subscriptions.some((x) => x.type === type && (paneId === undefined || x.pane_id === paneId)),
    ).length;
  }

  /** Resolves once `predicate` holds; re-checked whenever a request, connection or event happens. */
  async until(predicate: () => boolean, what: string, timeoutMs = 15_000): Promise<void> {
    if (predicate()) return;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters.delete(check);
        reject(new Error(`fake herdr: timed out waiting for ${what}`));
      }, timeoutMs);
      const check = () => {
        if (!predicate()) return;
        clearTimeout(timer);
        this.#waiters.delete(check);
        resolve();
      };
      this.#waiters.add(check);
    });
  }

  async stop(): Promise<void> {
    this.dropConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
    await rm(this.path, { force: true });
  }

  #pane(paneId: string): FakePane {
    const pane = this.#panes.get(paneId);
    if (pane === undefined) throw new Error(`fake herdr: no pane ${paneId}`);
    return pane;
  }

  #end(paneId: string, how: "closed" | "exited"): void {
    const pane = this.#pane(paneId);
    this.#panes.delete(paneId);
    const kind = `pane_${how}`;
    this.#push(`pane.${how}`, { event: kind, data: { type: kind, pane_id: paneId, workspace_id: pane.workspace_id } });
  }

  #push(type: string, envelope: unknown): void {
    for (const sub of this.#subscribers) if (sub.subscriptions.some((s) => s.type === type)) this.#write(sub.socket, envelope);
    this.#wake();
  }

  #wake(): void {
    for (const check of [...this.#waiters]) check();
  }

  #write(socket: Socket, line: unknown): void {
    if (socket.destroyed) return;
    this.sent.push(line);
    socket.write(`${JSON.stringify(line)}\n`);
  }

  #accept(socket: Socket): void {
    this.#sockets.add(socket);
    socket.setEncoding("utf8");
    let buffer = "";
    let handled = false;
    socket.on("error", () => {});
    socket.on("close", () => {
      this.#sockets.delete(socket);
      for (const sub of this.#subscribers) if (sub.socket === socket) this.#subscribers.delete(sub);
      this.#wake();
    });
    socket.on("data", (chunk: string) => {
      if (handled) return; // one request per connection: later lines are not read
      buffer += chunk;
      const nl = buffer.indexOf("\n");
      if (nl < 0) return;
      handled = true;
      const answer = this.#handle(socket, buffer.slice(0, nl).trim());
      if (answer !== undefined) this.#answerAndEnd(socket, answer);
    });
  }

  /** The answer to end the connection with, or undefined when it stays open as a subscription. */
  #handle(socket: Socket, line: string): unknown {
    let request: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(line);
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("not an object");
      request = parsed as Record<string, unknown>;
    } catch (e) {
      return {
        id: "",
        error: { code: "invalid_request", message: `invalid request: ${(e as Error).message}` },
      };
    }
    this.requests.push(request as RecordedRequest);
    this.#wake();
    const id = request.id;
    const params = request.params;
    if (typeof id !== "string" || params === null || typeof params !== "object") {
      return {
        id: "",
        error: { code: "invalid_request", message: "invalid request: id and params are required" },
      };
    }
    switch (request.method) {
      case "pane.list": {
        const workspace = (params as { workspace_id?: unknown }).workspace_id;
        const panes = [...this.#panes.values()].filter((p) => workspace == null || p.workspace_id === workspace).map((p) => ({ ...p }));
        return { id, result: { type: "pane_list", panes } };
      }
      case "events.subscribe":
        return this.#subscribe(socket, id, (params as { subscriptions?: unknown }).subscriptions);
      default:
        return {
          id: "",
          error: { code: "invalid_request", message: `invalid request: unknown method ${JSON.stringify(request.method)}` },
        };
    }
  }

  #subscribe(socket: Socket, id: string, subscriptions: unknown): unknown {
    if (!Array.isArray(subscriptions)) {
      return {
        id: "",
        error: { code: "invalid_request", message: "invalid request: missing field `subscriptions`" },
      };
    }
    const accepted: Subscription[] = [];
    for (const s of subscriptions as Subscription[]) {
      if (s === null || typeof s !== "object" || !KNOWN_TYPES.has(s.type)) {
        return {
          id: "",
          error: { code: "invalid_request", message: `invalid request: unknown subscription ${JSON.stringify(s)}` },
        };
      }
      if (s.type === "pane.agent_status_changed") {
        if (typeof s.pane_id !== "string") {
          return {
            id: "",
            error: { code: "invalid_request", message: "invalid request: missing field `pane_id`" },
          };
        }
        if (s.agent_status != null && !STATUSES.includes(s.agent_status)) {
          return {
            id: "",
            error: { code: "invalid_request", message: "invalid request: unknown agent_status" },
          };
        }
        if (!this.#panes.has(s.pane_id)) {
          return { id, error: { code: "pane_not_found", message: `pane ${s.pane_id} not found` } };
        }
      }
      accepted.push(s);
    }
    this.#write(socket, { id, result: { type: "subscription_started" } });
    this.#subscribers.add({ socket, subscriptions: accepted });
    this.#wake();
    return undefined;
  }

  #answerAndEnd(socket: Socket, answer: unknown): void {
    this.#write(socket, answer);
    socket.end();
  }
}
