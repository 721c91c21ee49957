/**
 * What `mam watch herdr` reads of herdr's socket protocol, as herdr's own schema file
 * states it: ogulcancelik/herdr, docs/next/api/herdr-api.schema.json at commit
 * 10974c822d607f03e20e9741ec027910f0c1f93a (protocol 20, schema_version 1). Only the
 * parts the collector uses are typed here; every other field is kept and ignored, as
 * herdr's docs ask of a client ("Handle unknown fields gracefully").
 *
 * Transport (server.rs `handle_connection`): newline-delimited JSON over a Unix
 * socket, one request per connection. An ordinary request gets one answer line and
 * the connection ends; `events.subscribe` gets one acknowledgement line and then keeps
 * the connection open, pushing one event per line. A subscription's set is fixed when
 * it is made: a new pane needs a new connection.
 */

/** herdr's `AgentStatus`; mam's observed states carry the same five names. */
export const HERDR_AGENT_STATUSES = ["idle", "working", "blocked", "done", "unknown"] as const;
export type HerdrAgentStatus = (typeof HERDR_AGENT_STATUSES)[number];

export const isHerdrAgentStatus = (v: unknown): v is HerdrAgentStatus =>
  typeof v === "string" && (HERDR_AGENT_STATUSES as readonly string[]).includes(v);

/** `AgentSessionInfo`: the native session reference herdr stored for the pane's agent. */
export interface HerdrAgentSession {
  readonly source: string;
  readonly agent: string;
  /** `id`: `value` is the agent's session id; `path`: a path to its session file. */
  readonly kind: "id" | "path";
  readonly value: string;
}

/** `PaneInfo` (required: pane_id, terminal_id, workspace_id, tab_id, focused, agent_status, revision). */
export interface HerdrPane {
  readonly pane_id: string;
  readonly terminal_id: string;
  readonly workspace_id: string;
  readonly tab_id: string;
  readonly focused: boolean;
  readonly agent_status: HerdrAgentStatus;
  /** `uint64`: the pane's revision, which herdr moves on as the pane changes. */
  readonly revision: number;
  readonly agent?: string | null;
  readonly agent_session?: HerdrAgentSession | null;
  readonly [field: string]: unknown;
}

/** A request line: `{id, method, params}` (`request`: `id` required, each method's `params` required). */
export interface HerdrRequest {
  readonly id: string;
  readonly method: string;
  readonly params: Record<string, unknown>;
}

/** `Subscription` entries the collector makes (the request's dotted types). */
export type HerdrSubscription =
  | { readonly type: "pane.created" }
  | { readonly type: "pane.closed" }
  | { readonly type: "pane.exited" }
  | { readonly type: "pane.agent_status_changed"; readonly pane_id: string };

/** `error_response`: `{id, error: {code, message}}`. */
export interface HerdrErrorBody {
  readonly code: string;
  readonly message: string;
}

/**
 * A pushed line after a subscription's acknowledgement. Lifecycle events are
 * `EventEnvelope`s whose kind is snake_case (`pane_created`, `pane_closed`,
 * `pane_exited`) although the subscription asked for the dotted type; the status
 * change is a `SubscriptionEventEnvelope` whose kind is dotted
 * (`pane.agent_status_changed`) and whose data carries no revision.
 */
export type HerdrEvent =
  | { readonly event: "pane_created"; readonly data: { readonly type: "pane_created"; readonly pane: HerdrPane } }
  | {
      readonly event: "pane_closed";
      readonly data: { readonly type: "pane_closed"; readonly pane_id: string; readonly workspace_id: string };
    }
  | {
      readonly event: "pane_exited";
      readonly data: { readonly type: "pane_exited"; readonly pane_id: string; readonly workspace_id: string };
    }
  | {
      readonly event: "pane.agent_status_changed";
      readonly data: {
        readonly pane_id: string;
        readonly workspace_id: string;
        readonly agent_status: HerdrAgentStatus;
        readonly agent?: string | null;
      };
    };

/** A status a newer herdr may add is, to mam, a state it cannot read: `unknown` (never quiescent). */
const statusOf = (s: string): HerdrAgentStatus => (isHerdrAgentStatus(s) ? s : "unknown");

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/** A `PaneInfo` as the collector needs it, or undefined when a required field is missing or mistyped. */
export function readPane(v: unknown): HerdrPane | undefined {
  if (!isObject(v)) return undefined;
  const { pane_id, terminal_id, agent_status, revision } = v;
  if (typeof pane_id !== "string" || typeof terminal_id !== "string" || typeof agent_status !== "string") return undefined;
  if (typeof revision !== "number" || !Number.isInteger(revision) || revision < 0) return undefined;
  const session = v.agent_session;
  if (session !== undefined && session !== null && !readSession(session)) return undefined;
  return { ...v, agent_status: statusOf(agent_status) } as HerdrPane;
}

function readSession(v: unknown): v is HerdrAgentSession {
  return isObject(v) && (v.kind === "id" || v.kind === "path") && typeof v.value === "string";
}

/** One pushed line, typed when it is one of the events the collector subscribes to. */
export function readEvent(v: unknown): HerdrEvent | undefined {
  if (!isObject(v) || !isObject(v.data)) return undefined;
  const data = v.data;
  switch (v.event) {
    case "pane_created":
      return readPane(data.pane) === undefined ? undefined : (v as HerdrEvent);
    case "pane_closed":
    case "pane_exited":
      return typeof data.pane_id === "string" ? (v as HerdrEvent) : undefined;
    case "pane.agent_status_changed":
      if (typeof data.pane_id !== "string" || typeof data.agent_status !== "string") return undefined;
      return { event: "pane.agent_status_changed", data: { ...data, agent_status: statusOf(data.agent_status) } } as HerdrEvent;
    default:
      return undefined;
  }
}
