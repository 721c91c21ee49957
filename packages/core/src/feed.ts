import * as z from "zod";
import type { Actor } from "./actor.ts";
import { IsoTime, JobId } from "./schemas.ts";

/**
 * The change feed: one row per committed change of any kind, in commit order, each
 * with an opaque cursor to resume after. What rows a write produces is declared once,
 * as data, from the record before and after the write (`FEED_RULES`, feed-rules.ts):
 * the SQLite and in-memory stores evaluate them in the write's own transaction
 * (`changeRowsOf`), the DynamoDB stream function on the stream record's old and new
 * images, and a store on a batch-only SQL engine compiles them into its batch
 * (`feedRowStatements`, `@mam/local`). No adapter decides what a change is.
 */
export const CHANGE_KINDS = [
  "job.registered",
  "job.transitioned",
  "dispatch.recorded",
  "report.staged",
  "report.upload_declared",
  "report.finalized",
  "observation.recorded",
  "observation.overflowed",
  "job.stale",
  "job.overdue",
  "intent.published",
  "intent.failed",
  "intent.superseded",
  "intent.quarantined",
  "intent.released",
] as const;
export const ChangeKindSchema = z.enum(CHANGE_KINDS);
export type ChangeKind = z.infer<typeof ChangeKindSchema>;

export const CHANGE_ACTOR_TYPES = ["operator", "agent", "gate", "service"] as const;
export const ChangeActorSchema = z.strictObject({
  type: z.enum(CHANGE_ACTOR_TYPES),
  /** The token's id (its `jti`), when a token caused the change; never the token. */
  token_id: z.string().min(1).max(128).optional(),
});
export type ChangeActor = z.infer<typeof ChangeActorSchema>;

/** mam's own doing (the sweep, a relay, a write made without a caller): no token. */
export const SERVICE_ACTOR: ChangeActor = { type: "service" };

/** The small, kind-specific facts of a row: scalars only. */
export const ChangeDataSchema = z.record(z.string().max(64), z.union([z.string().max(1024), z.number(), z.boolean()]));

export const ChangeRowSchema = z.strictObject({
  /** Opaque: pass it as `after` to read what follows this row. */
  cursor: z.string().min(1).max(1024),
  /** When the change committed (the store's clock), ISO-8601. */
  at: IsoTime,
  job_id: JobId,
  kind: ChangeKindSchema,
  actor: ChangeActorSchema,
  /** The intent the change carries, publishes, fails, supersedes, quarantines or releases. */
  intent_id: z.string().min(1).max(128).optional(),
  data: ChangeDataSchema.optional(),
});
export type ChangeRow = z.infer<typeof ChangeRowSchema>;

/** A row as a write produces it: the store adds where it sits (`cursor`) and when it committed (`at`). */
export type ChangeDraft = Omit<ChangeRow, "cursor" | "at">;

/**
 * What core tells the store about a write, beyond the record it changes: who made it,
 * and facts the record does not keep (a staged report's digest). Optional on every
 * write; absent, the change is the service's own.
 */
export interface ChangeNote {
  readonly actor?: ChangeActor;
  /** A report stage: what was staged. */
  readonly staged?: { readonly sha256: string; readonly bytes: number };
  /** An upload's declaration (`requestReportUpload`): what the uploader said it will send. Nothing is staged yet. */
  readonly declared?: { readonly sha256: string; readonly bytes: number };
  /** A new observation (not a coalesced repeat): who recorded it, the kind of signal and the state. */
  readonly observed?: { readonly source: string; readonly source_kind: string; readonly state: string };
  /** A source's class passed its bound (`evidence_overflow`): who, and which bound. */
  readonly overflowed?: { readonly source: string; readonly bound: string };
  /** The sweep marked the job stale or overdue (`markAttention`). */
  readonly marked?: { readonly mark: "stale" | "overdue" };
}

export const ChangeNoteSchema = z.strictObject({
  actor: ChangeActorSchema.optional(),
  staged: z.strictObject({ sha256: z.string().max(64), bytes: z.number().int().min(0) }).optional(),
  declared: z.strictObject({ sha256: z.string().max(64), bytes: z.number().int().min(0) }).optional(),
  observed: z.strictObject({ source: z.string().max(140), source_kind: z.string().max(64), state: z.string().max(16) }).optional(),
  overflowed: z.strictObject({ source: z.string().max(140), bound: z.string().max(16) }).optional(),
  marked: z.strictObject({ mark: z.enum(["stale", "overdue"]) }).optional(),
});

/** The feed actor of an engine actor: an operator or an agent, with its token's id when a token was used. */
export function changeActorOf(actor: Actor | undefined): ChangeActor {
  if (actor === undefined) return SERVICE_ACTOR;
  const tokenId = actor.kind === "operator" ? actor.id : actor.tokenId;
  return { type: actor.kind, ...(tokenId === undefined ? {} : { token_id: tokenId }) };
}

/** The note a write made for `actor` carries. */
export function noteOf(actor: Actor | undefined, extra: Omit<ChangeNote, "actor"> = {}): ChangeNote {
  return { actor: changeActorOf(actor), ...extra };
}

/** What a feed read asks for. */
export interface ChangeQuery {
  /** A cursor this feed handed out: rows after it. Absent: from the beginning. */
  readonly after?: string;
  readonly limit: number;
  /** Only this job's rows (an agent's own job). */
  readonly jobId?: string;
  /** Only rows committed at or before this instant (ISO-8601): the page stops at the first later row. */
  readonly upTo?: string;
}

/**
 * A row as a store keeps it: its position, commit time and job, and the rest of the
 * row (`kind`, `actor`, `intent_id`, `data`) as the JSON object the store wrote from
 * `changeRowsOf`'s draft (`JSON.stringify` of the draft without `job_id`).
 */
export interface StoredChangeRow {
  readonly cursor: string;
  readonly at: string;
  readonly job_id: string;
  /** `{"kind":...,"actor":...}`: a JSON object, as the store wrote it. */
  readonly json: string;
}

const storedRows = new WeakMap<object, readonly StoredChangeRow[]>();

/**
 * A feed page over rows as the store keeps them: `items` is parsed on first read (and
 * kept), so a caller that only serializes the rows again (`GET /v1/events`) asks
 * `storedRowsOf(page)` and splices each row's JSON without parsing it. Rows are not
 * validated on the way back: only the store writes them, from core's own drafts
 * (docs/decisions.md, "The feed's read path").
 */
export function storedFeedPage(rows: readonly StoredChangeRow[], cursor: string): { readonly items: ChangeRow[]; readonly cursor: string } {
  let items: ChangeRow[] | undefined;
  const page = { cursor } as { items: ChangeRow[]; cursor: string };
  Object.defineProperty(page, "items", {
    enumerable: true,
    get: () => {
      items ??= rows.map(parseStoredRow);
      return items;
    },
  });
  storedRows.set(page, rows);
  return page;
}

/** The rows of a page made by `storedFeedPage`, as stored; `undefined` for any other page. */
export function storedRowsOf(page: object): readonly StoredChangeRow[] | undefined {
  return storedRows.get(page);
}

function parseStoredRow(r: StoredChangeRow): ChangeRow {
  return { cursor: r.cursor, at: r.at, job_id: r.job_id, ...(JSON.parse(r.json) as Omit<ChangeRow, "cursor" | "at" | "job_id">) };
}

/** A stored row as the wire's JSON object: `cursor`, `at`, `job_id`, then the stored fields, without parsing them. */
export function storedRowJson(r: StoredChangeRow): string {
  const head = `{"cursor":${JSON.stringify(r.cursor)},"at":${JSON.stringify(r.at)},"job_id":${JSON.stringify(r.job_id)}`;
  return r.json.length <= 2 ? `${head}}` : `${head},${r.json.slice(1)}`;
}
