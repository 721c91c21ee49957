import { createHash, randomBytes } from "node:crypto";
import { ACTIONS, FREE_FORM_MAX_BYTES, JOB_ID_PATTERN, JobRecordSchema, type Status } from "@mam/core";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dynamoDigestAnd, s3Objects, sqliteDigest, sqliteJobField, treeObjects } from "../seed/harness.ts";
import {
  anyKey,
  type BodyBytes,
  badAttemptSegment,
  badJobIdSegment,
  bodyOf,
  boundedString,
  canonical,
  cursorArb,
  deepValue,
  FILL_UNITS,
  type FieldSpec,
  freeForm,
  jsonBody,
  loneSurrogateString,
  type Mode,
  numberLikeQuery,
  obj,
  Raw,
  specialNumber,
  specialString,
  textOfBytes,
  utf8,
  wrongType,
} from "../support/adversarial.ts";
import { type AwsPeers, type AwsPorts, startAwsPeers } from "../support/aws-backend.ts";
import { DYNAMODB_PEER } from "../support/aws-peers.ts";
import { type LocalPorts, localPorts } from "../support/local-backend.ts";
import { runsBackend } from "../support/test-env.ts";
import {
  type ApiPorts,
  CANDIDATE_DISPATCH,
  candidateScenario,
  type Harness,
  type HarnessOptions,
  makeHarness,
  type PortsFactory,
  type Res,
} from "./harness.ts";

/**
 * The property suite (issue 8): arbitrary and adversarial requests on every route
 * that takes input, with agent and operator tokens, on the embedded backend (SQLite
 * and files) and the AWS one (DynamoDB on dynalite or DynamoDB Local, S3 on s3rver). For every
 * generated request:
 *  1. never a 5xx; every 4xx is application/problem+json with a `detail`;
 *  2. every refusal leaves the stores as they were: every row and every report byte
 *     (two allowances, counted and printed: a new, unreferenced, content-addressed
 *     `evidence/<sha256>` copy whose bytes hash to its name, which a refused finalize
 *     may leave, as docs/decisions.md "Integrity" says; and a new empty directory of
 *     the file store); reads, and the gate's refusals, write nothing;
 *  3. every accepted value reads back as it was sent (GET the job, its events, the
 *     dispatch, the verification), and the job is transitionable afterwards (an
 *     operator's cancel with the current seq succeeds, or the job is already terminal).
 *
 * Half the cases are well-formed (a token the route admits, the case's own job,
 * valid fields, free-form values up to and a byte past their limits), so most are
 * accepted and property 3 is exercised; the other half attack. Every case gets a
 * fresh job set up as it needs (status, dispatches, a staged or finalized report);
 * each property has its own stores, renewed every ROTATE cases.
 *
 * MAM_PROPERTY_RUNS sets the runs per property per backend (8 by default, so `npm
 * test` stays fast; the reliability tier sets e.g. 100); MAM_PROPERTY_SEED changes the
 * seed (a fixed one by default; fast-check prints the seed and path of a failure, and
 * MAM_PROPERTY_PATH replays it); MAM_PROPERTY_SHRINK=1 shrinks a failure to a smaller
 * counterexample (slow); MAM_PROPERTY_DEBUG=1 prints each case's status and reason.
 */

const RUNS = Number(process.env.MAM_PROPERTY_RUNS ?? 8);
const SEED = Number(process.env.MAM_PROPERTY_SEED ?? 20261120);
const SHRINK = process.env.MAM_PROPERTY_SHRINK === "1";
/** The JSON body limit (the app's default). */
const JSON_LIMIT = 1024 * 1024;
/** A report limit smaller than the default 10 MiB, so bodies at and over it are cheap; the same code enforces either. */
const REPORT_LIMIT = 64 * 1024;
const REPORT = "# Report\n\nAll tests pass.\n";

/** Stand-ins replaced in a request's text once the case's jobs exist; as long as the ids they stand for, so sizes hold. */
const JOB = "JOB_ID_PLACEHOLDER";
const OTHER = "OTHER_PLACEHOLDER_";
const NEW_ID = "NEW_ID_PLACEHOLDER";
/** Stands for the case's owed intent id (a UUID). */
const INTENT = "INTENT_ID_PLACEHOLDER_00000000000000";
const newJobId = (): string => `p-${randomBytes(8).toString("hex")}`;
if (new Set([newJobId().length, JOB.length, OTHER.length, NEW_ID.length]).size !== 1)
  throw new Error("placeholders must be as long as job ids");

// ---- backends

/** What a refusal must leave as it was: every row (one digest) and every report object (by key). */
interface Snapshot {
  /** Every row, less each job's `agent_usage` (see `usage`). */
  readonly rows: string;
  readonly objects: ReadonlyMap<string, string>;
  /** Each job's `agent_usage` (JSON), by job: what an agent's request reserved against its quotas. */
  readonly usage: ReadonlyMap<string, string>;
}

/**
 * A quota reservation is made before the bytes are written and is never given back
 * (docs/decisions.md, "Fail closed: a reservation is never given back"): a request
 * refused after it (a body that turned out too large, a finalize with no report)
 * leaves its job's `agent_usage` grown. That, and only growth, is the one write a
 * refusal may leave in the job store; it is counted and reported, like orphans.
 */
const USAGE = "agent_usage";

interface PropertyBackend {
  readonly name: string;
  readonly factory: PortsFactory;
  snapshot(ports: ApiPorts): Promise<Snapshot>;
}

const sqlite: PropertyBackend = {
  name: "sqlite",
  factory: localPorts,
  async snapshot(ports) {
    const p = ports as LocalPorts;
    return { rows: sqliteDigest(p.dbFile, [USAGE]), objects: await treeObjects(p.reportRoot), usage: sqliteJobField(p.dbFile, USAGE) };
  },
};

function awsBackend(peers: () => AwsPeers): PropertyBackend {
  return {
    name: "dynamodb+s3",
    factory: (opts) => peers().ports(opts),
    async snapshot(ports) {
      const p = ports as AwsPorts;
      const [rows, objects] = await Promise.all([
        dynamoDigestAnd(peers().dynamo.client, p.tableName, [USAGE], USAGE),
        s3Objects(peers().s3.client, p.bucket),
      ]);
      return { rows: rows.digest, objects, usage: rows.values };
    },
  };
}

const EVIDENCE_KEY = /(?:^|\/)evidence\/([0-9a-f]{64})$/;

interface Changes {
  /** What a refusal may not do. */
  readonly changed: string[];
  /** New content-addressed copies whose bytes hash to their names: nothing references them (docs/decisions.md, "Integrity"). */
  readonly orphans: string[];
  /** New directories of the file store with no file in them: no bytes, nothing reads them. */
  readonly emptyDirs: string[];
  /** Jobs whose `agent_usage` grew: a reservation a refusal keeps (`USAGE`). */
  readonly reservations: string[];
}

/** Whether a job's `agent_usage` only grew (or stayed): events and bytes never go down. */
function usageGrew(before: string | undefined, after: string | undefined): boolean {
  const read = (v: string | undefined) => (v === undefined ? null : (JSON.parse(v) as { events?: number; bytes?: number } | null));
  const [b, a] = [read(before), read(after)];
  if (a === null) return b === null;
  return (a.events ?? 0) >= (b?.events ?? 0) && (a.bytes ?? 0) >= (b?.bytes ?? 0);
}

/**
 * What changed between two snapshots, less two allowances, each counted and
 * reported: a new content-addressed copy whose bytes hash to its name, and a new
 * directory holding no file (the file store creates an attempt's directories before
 * an upload that is then refused; S3 has none).
 */
function changes(before: Snapshot, after: Snapshot): Changes {
  const changed: string[] = [];
  const orphans: string[] = [];
  const emptyDirs: string[] = [];
  const reservations: string[] = [];
  if (before.rows !== after.rows) changed.push("the job store's rows");
  for (const [job, now] of after.usage) {
    const was = before.usage.get(job);
    if (was === now) continue;
    if (usageGrew(was, now)) reservations.push(job);
    else changed.push(`${USAGE} of ${job} went from ${was} to ${now}`);
  }
  for (const [key, value] of before.objects) {
    const now = after.objects.get(key);
    if (now === undefined) changed.push(`removed ${key}`);
    else if (now !== value) changed.push(`rewrote ${key}`);
  }
  const added = [...after.objects.keys()].filter((k) => !before.objects.has(k));
  for (const key of added) {
    const sha = EVIDENCE_KEY.exec(key)?.[1];
    if (sha !== undefined && after.objects.get(key)?.startsWith(`${sha}:`)) orphans.push(key);
  }
  const files = [...after.objects.entries()].filter(([, v]) => v !== "dir").map(([k]) => k);
  for (const key of added) {
    if (orphans.includes(key)) continue;
    if (after.objects.get(key) === "dir") {
      const inside = files.filter((f) => f.startsWith(`${key}/`));
      if (inside.length === 0) {
        emptyDirs.push(key);
        continue;
      }
      if (inside.every((f) => orphans.includes(f) || !added.includes(f))) continue;
    }
    changed.push(`added ${key}${after.objects.get(key) === "dir" ? " (a directory)" : ""}`);
  }
  return { changed, orphans, emptyDirs, reservations };
}

// ---- counting

interface RouteTally {
  cases: number;
  statuses: Map<number, number>;
  /** Well-formed cases, and how many of them were accepted. */
  clean: number;
  cleanAccepted: number;
  orphans: number;
  emptyDirs: number;
  reservations: number;
}

class Tally {
  readonly routes = new Map<string, RouteTally>();
  total = 0;
  add(route: string, status: number, mode: Mode, traces?: Changes): void {
    const t = this.routes.get(route) ?? {
      cases: 0,
      statuses: new Map(),
      clean: 0,
      cleanAccepted: 0,
      orphans: 0,
      emptyDirs: 0,
      reservations: 0,
    };
    t.cases += 1;
    t.statuses.set(status, (t.statuses.get(status) ?? 0) + 1);
    if (mode === "clean") {
      t.clean += 1;
      if (status < 400) t.cleanAccepted += 1;
    }
    if (traces?.orphans.length) t.orphans += 1;
    if (traces?.emptyDirs.length) t.emptyDirs += 1;
    if (traces?.reservations.length) t.reservations += 1;
    this.routes.set(route, t);
    this.total += 1;
  }
  report(backend: string, ms: number): string {
    const lines = [`[properties] ${backend}: ${this.total} cases in ${(ms / 1000).toFixed(1)} s (MAM_PROPERTY_RUNS=${RUNS}, seed ${SEED})`];
    for (const [route, t] of this.routes) {
      const statuses = [...t.statuses.entries()]
        .sort(([a], [b]) => a - b)
        .map(([s, n]) => `${s}x${n}`)
        .join(" ");
      const orphans = t.orphans > 0 ? `; ${t.orphans} refusal(s) left an unreferenced evidence copy` : "";
      const dirs = t.emptyDirs > 0 ? `; ${t.emptyDirs} refusal(s) left empty directories` : "";
      const kept = t.reservations > 0 ? `; ${t.reservations} refusal(s) kept an agent's quota reservation` : "";
      lines.push(`  ${route}: ${t.cases} (${statuses}; well-formed ${t.cleanAccepted}/${t.clean} accepted${orphans}${dirs}${kept})`);
    }
    return lines.join("\n");
  }
}

// ---- the job a case runs against

const TERMINAL_STATUSES = ["completed", "error", "cancelled"] as const;

/** Valid job ids that are also names every JS object answers to, or words a careless parser takes for values. */
const ODD_JOB_IDS = [
  "constructor",
  "toString",
  "hasOwnProperty",
  "valueOf",
  "prototype",
  "isPrototypeOf",
  "NaN",
  "null",
  "undefined",
  "0",
  "A".repeat(64),
];

interface JobPlan {
  /** `random`, or one of ODD_JOB_IDS (used once per harness; a random id after that). */
  readonly name: string;
  readonly status: Status;
  readonly attempts: 0 | 1 | 2;
  readonly staged: boolean;
  readonly finalized: boolean;
  readonly expected: readonly string[];
  readonly agent: string;
  readonly autoComplete: boolean;
}

interface CaseJob {
  readonly jobId: string;
  readonly plan: JobPlan;
  /** The job's transition_seq once set up. */
  readonly seq: number;
  readonly agentToken: string | undefined;
  readonly staleToken: string | undefined;
}

/** transition_seq after set-up: claim is 1, a terminal transition after it 2. */
const seqOf = (plan: Pick<JobPlan, "status">): number => (plan.status === "pending" ? 0 : plan.status === "running" ? 1 : 2);

function jobPlanArb(over: Partial<Record<keyof JobPlan, fc.Arbitrary<unknown>>> = {}): fc.Arbitrary<JobPlan> {
  return fc
    .record({
      name: fc.oneof({ weight: 12, arbitrary: fc.constant("random") }, { weight: 1, arbitrary: fc.constantFrom(...ODD_JOB_IDS) }),
      status: fc.oneof(
        { weight: 3, arbitrary: fc.constant<Status>("running") },
        { weight: 2, arbitrary: fc.constant<Status>("pending") },
        { weight: 1, arbitrary: fc.constantFrom<Status>(...TERMINAL_STATUSES) },
      ),
      attempts: fc.oneof({ weight: 4, arbitrary: fc.constant<1>(1) }, { weight: 1, arbitrary: fc.constantFrom<0 | 2>(0, 2) }),
      staged: fc.boolean(),
      finalized: fc.boolean(),
      expected: fc.oneof({ weight: 3, arbitrary: fc.constant([]) }, { weight: 1, arbitrary: fc.constant(["commit"]) }),
      agent: fc.constantFrom("codex", "claude-code"),
      autoComplete: fc.boolean(),
      ...over,
    })
    .map((p) => p as JobPlan);
}

/** `value` four times in five, otherwise its negation. */
const mostly = (value: boolean): fc.Arbitrary<boolean> =>
  fc.oneof({ weight: 4, arbitrary: fc.constant(value) }, { weight: 1, arbitrary: fc.constant(!value) });

/** The odd names each harness has used already. */
const usedNames = new WeakMap<Harness, Set<string>>();

/**
 * The case's job, set up by the operator as the plan says; each set-up request must
 * succeed (a failure here is a finding too). An odd name is as valid as a random id,
 * only not as long: sizes "at the limit" may then be off by a few bytes.
 */
async function makeJob(h: Harness, plan: JobPlan): Promise<CaseJob> {
  const used = usedNames.get(h) ?? new Set<string>();
  usedNames.set(h, used);
  const jobId = plan.name !== "random" && !used.has(plan.name) ? plan.name : newJobId();
  used.add(jobId);
  const op = h.operator;
  const ok = (res: Res, status: number, what: string) => expect(res.status, `set-up ${what}: ${res.text.slice(0, 400)}`).toBe(status);
  ok(
    await h.call("POST", "/v1/jobs", {
      token: op,
      json: { job_id: jobId, prompt: "p", agent: plan.agent, auto_complete: plan.autoComplete, expected_artifacts: plan.expected },
    }),
    201,
    "register",
  );
  const tokens: string[] = [];
  for (let attempt = 1; attempt <= plan.attempts; attempt++) {
    const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, { token: op, json: { ...CANDIDATE_DISPATCH, attempt_id: attempt } });
    ok(res, 201, "dispatch");
    tokens.push(res.body.agent_token);
  }
  if (plan.status !== "pending") {
    ok(await h.call("POST", `/v1/jobs/${jobId}/transitions`, { token: op, json: { action: "claim", expected_seq: 0 } }), 200, "claim");
  }
  if (plan.attempts > 0 && (plan.staged || plan.finalized)) {
    const path = `/v1/jobs/${jobId}/attempts/${plan.attempts}`;
    ok(await h.call("PUT", `${path}/report`, { token: op, body: REPORT, headers: { "content-type": "text/markdown" } }), 201, "stage");
    if (plan.finalized) {
      const side_effects = plan.expected.map((kind) => ({ kind, reference: "abc123" }));
      ok(await h.call("POST", `${path}/finalize`, { token: op, json: { side_effects } }), 200, "finalize");
    }
  }
  if ((TERMINAL_STATUSES as readonly string[]).includes(plan.status)) {
    const action = plan.status === "cancelled" ? "cancel" : plan.status;
    ok(await h.call("POST", `/v1/jobs/${jobId}/transitions`, { token: op, json: { action, expected_seq: 1 } }), 200, action);
  }
  return { jobId, plan, seq: seqOf(plan), agentToken: tokens.at(-1), staleToken: tokens.length > 1 ? tokens[0] : undefined };
}

// ---- tokens

const TOKEN_KINDS = ["operator", "agent", "agent-stale", "agent-other-job", "agent-undispatched", "read-only", "none", "forged"] as const;
type TokenKind = (typeof TOKEN_KINDS)[number];

/**
 * Who sends a case. Well-formed: the operator, or the case's agent where one may
 * call the route. To attack: anyone, the refused kinds as often as the admitted ones.
 */
const tokenArb = (agentAllowed: boolean, mode: Mode): fc.Arbitrary<TokenKind> =>
  mode === "clean"
    ? agentAllowed
      ? fc.constantFrom<TokenKind>("operator", "agent")
      : fc.constant<TokenKind>("operator")
    : fc.oneof(
        { weight: 2, arbitrary: fc.constant<TokenKind>("operator") },
        { weight: agentAllowed ? 2 : 1, arbitrary: fc.constant<TokenKind>("agent") },
        { weight: 3, arbitrary: fc.constantFrom<TokenKind>(...TOKEN_KINDS.filter((k) => k !== "operator" && k !== "agent")) },
      );

interface Shared {
  /** A job of its own, dispatched: its agent's token is bound elsewhere. */
  readonly otherJobId: string;
  readonly otherAgent: string;
}

function tokenFor(kind: TokenKind, h: Harness, shared: Shared, job: CaseJob | undefined): string | undefined {
  switch (kind) {
    case "operator":
      return h.operator;
    case "agent":
      return job?.agentToken ?? (job === undefined ? shared.otherAgent : h.tokens.mintAgent(job.jobId, 1).token);
    case "agent-stale":
      return job?.staleToken ?? h.tokens.mintAgent(job?.jobId ?? shared.otherJobId, 7).token;
    case "agent-other-job":
      return shared.otherAgent;
    case "agent-undispatched":
      return h.tokens.mintAgent(newJobId(), 1).token;
    case "read-only":
      return h.tokens.mintOperator(["read"]);
    case "none":
      return undefined;
    case "forged": {
      const t = h.operator;
      return `${t.slice(0, -2)}${t.endsWith("AA") ? "BB" : "AA"}`;
    }
    default:
      return kind satisfies never;
  }
}

// ---- one request, its invariants

interface Request {
  readonly method: string;
  /** With placeholders. */
  readonly path: string;
  readonly body?: BodyBytes;
  readonly raw?: { readonly bytes: Uint8Array; readonly contentType?: string; readonly contentLength?: string; readonly chunks?: number };
  readonly headers?: Record<string, string>;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function resolve(text: string, job: CaseJob | undefined, shared: Shared, newId: string, replace: Record<string, string> = {}): string {
  let out = text
    .replaceAll(JOB, job?.jobId ?? shared.otherJobId)
    .replaceAll(OTHER, shared.otherJobId)
    .replaceAll(NEW_ID, newId);
  for (const [from, to] of Object.entries(replace)) out = out.replaceAll(from, to);
  return out;
}

/** A short description of a request for a failure message: no megabytes of padding. */
function describeRequest(req: Request, token: TokenKind): string {
  const body =
    req.body ??
    (req.raw ? { bytes: req.raw.bytes, shape: `${req.raw.bytes.length} raw bytes`, contentType: req.raw.contentType } : undefined);
  const text = body === undefined || req.raw ? "" : decoder.decode(body.bytes);
  const shown = text.length > 600 ? `${text.slice(0, 300)} …(${text.length} chars)… ${text.slice(-200)}` : text;
  return `${req.method} ${req.path} as ${token}${body ? ` [${body.shape}, ${String(body.contentType)}]` : ""}${
    req.headers ? ` headers ${JSON.stringify(req.headers)}` : ""
  } ${shown}`;
}

/** Chunks of `bytes`, streamed: a body without a Content-Length, as a chunked upload sends it. */
function streamOf(bytes: Uint8Array, chunks: number): ReadableStream<Uint8Array> {
  const size = Math.max(1, Math.ceil(bytes.length / chunks));
  let at = 0;
  return new ReadableStream<Uint8Array>({
    pull(ctrl) {
      if (at >= bytes.length) return ctrl.close();
      ctrl.enqueue(bytes.slice(at, at + size));
      at += size;
    },
  });
}

interface Outcome {
  readonly res: Res;
  /** The JSON the server parsed, when the body was JSON. */
  readonly sent: unknown;
  readonly label: string;
  /** The stores before the request. */
  readonly before: Snapshot;
  /** The job the path named, when it named the case's job or the shared other one. */
  readonly target: string | undefined;
}

/** Run a case's request; assert properties 1 and 2; return what property 3 needs. */
async function attempt(
  ctx: Ctx,
  route: string,
  req: Request,
  kind: TokenKind,
  job: CaseJob | undefined,
  mode: Mode,
  opts: { readOnly?: boolean; replace?: Record<string, string> } = {},
): Promise<Outcome> {
  const { h, shared, backend } = ctx;
  const newId = newJobId();
  const path = resolve(req.path, job, shared, newId, opts.replace);
  const label = `${backend.name} ${describeRequest({ ...req, path }, kind)}`;
  const headers: Record<string, string> = { ...req.headers };
  let body: Uint8Array | ReadableStream<Uint8Array> | undefined;
  let sent: unknown;
  const b = req.body;
  if (b !== undefined) {
    const text = resolve(decoder.decode(b.bytes), job, shared, newId, opts.replace);
    // Only a UTF-8 body survives decoding; keep the invalid bytes of a "not UTF-8" body as they were.
    body = b.shape === "not UTF-8" ? b.bytes : encoder.encode(text);
    if (b.contentType !== undefined) headers["content-type"] = b.contentType;
    if (b.contentLength !== undefined) headers["content-length"] = b.contentLength;
    try {
      sent = JSON.parse(text);
    } catch {
      sent = undefined;
    }
  } else if (req.raw !== undefined) {
    body = req.raw.chunks !== undefined ? streamOf(req.raw.bytes, req.raw.chunks) : req.raw.bytes;
    if (req.raw.contentType !== undefined) headers["content-type"] = req.raw.contentType;
    if (req.raw.contentLength !== undefined) headers["content-length"] = req.raw.contentLength;
  }
  const before = await backend.snapshot(h.ports);
  const linesBefore = h.lines.length;
  const token = tokenFor(kind, h, shared, job);
  const res = await h.call(req.method, path, {
    ...(token === undefined ? {} : { token }),
    ...(body === undefined ? {} : { body }),
    headers,
  });
  // 1. Never a 5xx, and nothing the app did not expect.
  expect(res.status, `${label}\n→ ${res.status} ${res.text.slice(0, 600)}`).toBeLessThan(500);
  const unexpected = h.lines.slice(linesBefore).filter((l) => l.includes('"unexpected error"'));
  expect(unexpected, label).toEqual([]);
  let traces: Changes | undefined;
  if (res.status >= 400 || opts.readOnly) {
    if (res.status >= 400) {
      expect(res.headers.get("content-type"), `${label}\n→ ${res.status} ${res.text.slice(0, 300)}`).toMatch(/^application\/problem\+json/);
      expect(res.body?.status, label).toBe(res.status);
      expect(typeof res.body?.detail === "string" && res.body.detail.length > 0, `${label}: a problem without a detail: ${res.text}`).toBe(
        true,
      );
    }
    // 2. A refusal (and a read) leaves every row and every report byte as it was.
    traces = changes(before, await backend.snapshot(h.ports));
    expect(traces.changed, `${label}\n→ ${res.status} ${res.text.slice(0, 300)}\nwrote: ${traces.changed.join(", ")}`).toEqual([]);
    // Only an agent's request is charged, and a read reserves nothing.
    if (kind !== "agent" || res.status < 400) expect(traces.reservations, `${label}: reserved against a quota`).toEqual([]);
  }
  ctx.tally.add(route, res.status, mode, traces);
  if (process.env.MAM_PROPERTY_DEBUG) {
    const why = res.body?.errors?.[0] ? `${res.body.errors[0].path}: ${res.body.errors[0].message}` : (res.body?.detail ?? "");
    console.log(`${mode} ${route} ${kind} ${res.status} ${String(why).slice(0, 120)}`);
  }
  const target = req.path.includes(`/v1/jobs/${JOB}`)
    ? (job?.jobId ?? shared.otherJobId)
    : req.path.includes(`/v1/jobs/${OTHER}`)
      ? shared.otherJobId
      : undefined;
  return { res, sent, label, before, target };
}

/** Property 3's second half: the job takes an operator's cancel with its current seq, or is terminal already. */
async function expectTransitionable(ctx: Ctx, jobId: string, label: string): Promise<void> {
  const { h } = ctx;
  const read = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
  expect(read.status, `${label}: GET after: ${read.text.slice(0, 300)}`).toBe(200);
  expect(
    JobRecordSchema.safeParse(read.body).success,
    `${label}: the record read back is not a JobRecord: ${read.text.slice(0, 300)}`,
  ).toBe(true);
  if ((TERMINAL_STATUSES as readonly string[]).includes(read.body.status)) return;
  const cancel = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
    token: h.operator,
    json: { action: "cancel", expected_seq: read.body.transition_seq },
  });
  expect(cancel.status, `${label}: cancel after: ${cancel.text.slice(0, 300)}`).toBe(200);
  expect(cancel.body.status).toBe("cancelled");
}

const same = (a: unknown, b: unknown, what: string): void => expect(canonical(a), what).toBe(canonical(b));

async function readJob(ctx: Ctx, jobId: string, label: string): Promise<Record<string, unknown>> {
  const res = await ctx.h.call("GET", `/v1/jobs/${jobId}`, { token: ctx.h.operator });
  expect(res.status, `${label}: GET job: ${res.text.slice(0, 300)}`).toBe(200);
  return res.body;
}

async function readAllEvents(ctx: Ctx, jobId: string, label: string): Promise<Record<string, unknown>[]> {
  const items: Record<string, unknown>[] = [];
  let cursor: string | undefined;
  do {
    const res = await ctx.h.call("GET", `/v1/jobs/${jobId}/events${cursor === undefined ? "" : `?cursor=${encodeURIComponent(cursor)}`}`, {
      token: ctx.h.operator,
    });
    expect(res.status, `${label}: GET events: ${res.text.slice(0, 300)}`).toBe(200);
    items.push(...res.body.items);
    cursor = res.body.next_cursor;
  } while (cursor !== undefined);
  return items;
}

// ---- field arbitraries shared by routes

const ARTIFACT_KIND = /^[a-z][a-z0-9_]{0,63}$/;
const seqArb = (seq: number): fc.Arbitrary<unknown> =>
  fc.oneof({ weight: 8, arbitrary: fc.constant(seq) }, { weight: 1, arbitrary: fc.constantFrom(seq + 1, Math.max(0, seq - 1), 0) });
const badSeqArb = (seq: number): fc.Arbitrary<unknown> =>
  fc.oneof(
    fc.constantFrom(-1, 1.5, `${seq}`, null),
    fc.constantFrom(
      new Raw("-0"),
      new Raw(`${seq}.0`),
      new Raw(`${seq}e0`),
      new Raw("1e300"),
      new Raw("9007199254740993"),
      new Raw("1e999"),
    ),
    wrongType,
  );
const artifactsArb = fc.array(fc.oneof(fc.constant("commit"), fc.stringMatching(ARTIFACT_KIND)), { maxLength: 3 });
const badArtifactsArb = fc.oneof(
  fc.constant(Array.from({ length: 33 }, (_, i) => `k${i}`)),
  fc.constantFrom(["Bad"], ["a".repeat(65)], [""], ["commit", 1], "commit"),
  wrongType,
);
const roleArb = fc.constantFrom("Worker", "Reviewer");
const badRoleArb = fc.oneof(fc.constantFrom("worker", "Admin", "", "Reviewer "), wrongType);

function sideEffectArb(kinds: readonly string[], mode: Mode): fc.Arbitrary<unknown> {
  return bodyOf(
    [
      {
        name: "kind",
        valid: fc.oneof(fc.constantFrom("commit", ...kinds), fc.stringMatching(ARTIFACT_KIND)),
        bad: fc.oneof(fc.constantFrom("Bad", "", "a".repeat(65), "commit!"), wrongType),
        absent: mode === "clean" ? 0 : 1,
      },
      {
        name: "reference",
        valid: boundedString(FREE_FORM_MAX_BYTES.sideEffectReference, fc.string({ unit: "grapheme", minLength: 1, maxLength: 24 }), mode),
        bad: fc.oneof(fc.constantFrom("", "   ", "\t\n"), wrongType),
        absent: mode === "clean" ? 0 : 1,
      },
    ],
    mode,
  );
}
const sideEffectsArb = (kinds: readonly string[], mode: Mode) => fc.array(sideEffectArb(kinds, mode), { maxLength: 3 });
const badSideEffectsArb = fc.oneof(
  fc.constant(Array.from({ length: 65 }, (_, i) => ({ kind: "commit", reference: `r${i}` }))),
  fc.constantFrom({}, [null], "commit=abc"),
  wrongType,
);

/** The job segment of a path: the case's job; to attack, another job, one that does not exist, or not a job id. */
const jobSegmentArb = (mode: Mode): fc.Arbitrary<string> =>
  mode === "clean"
    ? fc.constant(JOB)
    : fc.oneof(
        { weight: 4, arbitrary: fc.constant(JOB) },
        { weight: 1, arbitrary: fc.constant(OTHER) },
        { weight: 1, arbitrary: fc.constant("no-such-job-000000") },
        { weight: 3, arbitrary: badJobIdSegment },
      );
const attemptSegmentArb = (latest: number, mode: Mode): fc.Arbitrary<string> =>
  mode === "clean"
    ? fc.constant(String(Math.max(1, latest)))
    : fc.oneof(
        { weight: 3, arbitrary: fc.constant(String(Math.max(1, latest))) },
        { weight: 1, arbitrary: fc.constant("1") },
        { weight: 3, arbitrary: badAttemptSegment },
      );

const ifMatchArb = (seq: number, mode: Mode): fc.Arbitrary<Record<string, string> | undefined> =>
  mode === "clean"
    ? fc.oneof(
        { weight: 6, arbitrary: fc.constant(undefined) },
        { weight: 1, arbitrary: fc.constantFrom(`"${seq}"`, "*").map((v) => ({ "if-match": v })) },
      )
    : fc.oneof(
        { weight: 2, arbitrary: fc.constant(undefined) },
        {
          weight: 1,
          arbitrary: fc
            .constantFrom(`"${seq}"`, "*", `W/"${seq}"`, `"${seq + 1}"`, "garbage", `"1", "2"`, `"99999999999999999999"`, `${seq}`, "")
            .map((v) => ({ "if-match": v })),
        },
      );

// ---- the suite

interface Ctx {
  readonly h: Harness;
  readonly shared: Shared;
  readonly backend: PropertyBackend;
  readonly tally: Tally;
  /** Before each case: every ROTATE cases, a fresh harness (stores), so a snapshot's cost stays bounded however many runs. */
  next(): Promise<void>;
}

const ROTATE = 25;

/** Something fast-check prints briefly in a counterexample. */
function printable<T extends object>(value: T, show: (v: T) => string): T {
  return Object.assign(value, { [fc.toStringMethod]: () => show(value) });
}

/** Half the cases well-formed, half attacks. */
const bothModes = <T>(build: (mode: Mode) => fc.Arbitrary<T>): fc.Arbitrary<T> => fc.oneof(build("clean"), build("attack"));

/** MAM_PROPERTY_PATH (with MAM_PROPERTY_SEED and `-t` naming one property) replays the failure fast-check printed. */
const fcParams = (): fc.Parameters<unknown> => ({
  numRuns: RUNS,
  seed: SEED,
  endOnFailure: !SHRINK,
  verbose: 1,
  ...(process.env.MAM_PROPERTY_PATH ? { path: process.env.MAM_PROPERTY_PATH } : {}),
});

const plainPlan = (over: Partial<JobPlan> = {}): JobPlan => ({
  name: "random",
  status: "running",
  attempts: 1,
  staged: false,
  finalized: false,
  expected: [],
  agent: "codex",
  autoComplete: false,
  ...over,
});

function propertySuite(backendOf: () => PropertyBackend, name: string): void {
  // Generous: a case on the AWS peers takes up to a few hundred ms.
  describe(`properties over ${name}`, { timeout: 60_000 + RUNS * 3_000 }, () => {
    const tally = new Tally();
    let started = 0;
    beforeAll(() => {
      started = performance.now();
    });
    const cleanup: (() => Promise<unknown>)[] = [];
    afterAll(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
      console.log(tally.report(backendOf().name, performance.now() - started));
    });

    /** One harness per property (a fresh one every ROTATE cases), and the other job whose agent's token every case may borrow. */
    async function context(opts: HarnessOptions = {}): Promise<Ctx> {
      const backend = backendOf();
      let own: (() => Promise<unknown>)[] = [];
      const close = async () => {
        for (const c of own.splice(0).reverse()) await c();
      };
      cleanup.push(close);
      const open = async (): Promise<{ h: Harness; shared: Shared }> => {
        const h = await makeHarness(backend.factory, { reportBodyLimit: REPORT_LIMIT, ...opts }, own);
        const otherJobId = newJobId();
        const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: otherJobId, prompt: "other", agent: "codex" } });
        expect(reg.status, reg.text).toBe(201);
        const d = await h.call("POST", `/v1/jobs/${otherJobId}/dispatches`, { token: h.operator, json: { ...CANDIDATE_DISPATCH } });
        expect(d.status, d.text).toBe(201);
        return { h, shared: { otherJobId, otherAgent: d.body.agent_token } };
      };
      let current = await open();
      let cases = 0;
      return {
        get h() {
          return current.h;
        },
        get shared() {
          return current.shared;
        },
        backend,
        tally,
        async next() {
          cases += 1;
          if (cases % ROTATE !== 0) return;
          await close();
          own = [];
          current = await open();
        },
      };
    }

    it("POST /v1/jobs: arbitrary registrations", async () => {
      const ctx = await context();
      const body = (mode: Mode) =>
        bodyOf(
          [
            {
              name: "job_id",
              valid: fc.oneof(
                { weight: 4, arbitrary: fc.constant(NEW_ID) },
                { weight: 1, arbitrary: fc.stringMatching(JOB_ID_PATTERN) },
                { weight: 1, arbitrary: fc.constantFrom(...ODD_JOB_IDS) },
              ),
              bad: fc.oneof(
                fc.constantFrom("", "-x", "_x", "a".repeat(65), "a/b", "a b", "ü", "..", "a#b", "a+b"),
                loneSurrogateString,
                wrongType,
              ),
              absent: 4,
            },
            {
              name: "prompt",
              valid: boundedString(FREE_FORM_MAX_BYTES.prompt, fc.string({ unit: "binary", maxLength: 60 }), mode),
              bad: wrongType,
              absent: mode === "clean" ? 0 : 1,
            },
            {
              name: "agent",
              valid: fc.oneof(
                fc.constantFrom("codex", "claude-code", "claude", "grok"),
                fc.string({ unit: "grapheme", minLength: 1, maxLength: 20 }),
              ),
              bad: fc.oneof(fc.constantFrom("", "a".repeat(65)), loneSurrogateString, wrongType),
              absent: mode === "clean" ? 0 : 1,
            },
            { name: "role", valid: roleArb, bad: badRoleArb, absent: 6 },
            { name: "expected_artifacts", valid: artifactsArb, bad: badArtifactsArb, absent: 6 },
            { name: "auto_complete", valid: fc.boolean(), bad: wrongType, absent: 6 },
          ],
          mode,
        );
      const caseArb = bothModes((mode) =>
        fc
          .record({ mode: fc.constant(mode), token: tokenArb(false, mode), body: jsonBody(body(mode), JSON_LIMIT, mode) })
          .map((c) => printable(c, (v) => describeRequest({ method: "POST", path: "/v1/jobs", body: v.body }, v.token))),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const { res, sent, label } = await attempt(
            ctx,
            "POST /v1/jobs",
            { method: "POST", path: "/v1/jobs", body: c.body },
            c.token,
            undefined,
            c.mode,
          );
          if (res.status >= 400) return;
          expect(res.status, label).toBe(201);
          const s = sent as Record<string, unknown>;
          const jobId = res.body.job_id as string;
          const read = await readJob(ctx, jobId, label);
          same(read, res.body, `${label}: the record read back is the one answered`);
          if (s.job_id !== undefined) expect(jobId, label).toBe(s.job_id);
          expect(read.prompt, `${label}: prompt`).toBe(s.prompt);
          expect(read.agent, `${label}: agent`).toBe(s.agent);
          expect(read.role, label).toBe(s.role ?? "Worker");
          same(read.expected_artifacts, s.expected_artifacts ?? [], `${label}: expected_artifacts`);
          expect(read.auto_complete, label).toBe(s.auto_complete ?? false);
          expect(read).toMatchObject({ status: "pending", transition_seq: 0 });
          await expectTransitionable(ctx, jobId, label);
        }),
        fcParams(),
      );
    });

    it("POST /v1/jobs/{id}/transitions: arbitrary actions, seqs and fields", async () => {
      const ctx = await context();
      const caseFor = (mode: Mode) =>
        fc.tuple(jobPlanArb(), tokenArb(true, mode)).chain(([plan, token]) => {
          const seq = seqOf(plan);
          const agent = token === "agent";
          // Well-formed: an action the job's status allows, and that the caller may take.
          const allowed: readonly string[] =
            mode === "attack" || (plan.status !== "pending" && plan.status !== "running")
              ? ACTIONS
              : ACTIONS.filter((a) => (plan.status === "pending" ? a !== "progress" : a !== "claim") && !(agent && a === "cancel"));
          return fc.constantFrom(...allowed).chain((action) => {
            const takesFields = action === "claim" || action === "progress";
            const terminal = action === "completed" || action === "error" || action === "cancel";
            const operatorOnly = mode === "clean" && agent;
            const fields: FieldSpec[] = [
              { name: "progress", valid: freeForm(FREE_FORM_MAX_BYTES.progress, mode), bad: wrongType, absent: 4 },
              {
                name: "agent_session",
                valid: fc.oneof(
                  fc.string({ unit: "grapheme", maxLength: 30 }),
                  fc.integer({ min: 255, max: 257 }).map((n) => "s".repeat(n)),
                ),
                bad: fc.oneof(loneSurrogateString, wrongType),
                absent: 8,
              },
            ];
            if (!operatorOnly) {
              fields.push(
                { name: "auto_complete", valid: fc.boolean(), bad: wrongType, absent: 24 },
                { name: "role", valid: roleArb, bad: badRoleArb, absent: 24 },
                { name: "expected_artifacts", valid: artifactsArb, bad: badArtifactsArb, absent: 24 },
              );
            }
            const top: FieldSpec[] = [
              {
                name: "action",
                valid: fc.oneof(
                  { weight: 8, arbitrary: fc.constant(action) },
                  { weight: mode === "clean" ? 0 : 1, arbitrary: fc.constantFrom(...ACTIONS) },
                ),
                bad: fc.oneof(fc.constantFrom("Claim", "", "complete", "delete", "__proto__"), wrongType),
                absent: mode === "clean" ? 0 : 1,
              },
              { name: "expected_seq", valid: seqArb(seq), bad: badSeqArb(seq), absent: mode === "clean" ? 0 : 2 },
            ];
            if (takesFields || mode === "attack")
              top.push({ name: "fields", valid: bodyOf(fields, mode), bad: wrongType, absent: takesFields ? 3 : 30 });
            if (!(operatorOnly && terminal)) top.push({ name: "notify", valid: fc.boolean(), bad: wrongType, absent: 8 });
            if (!operatorOnly) {
              top.push({
                name: "reason",
                valid: fc.oneof(
                  fc.string({ maxLength: 20 }),
                  fc.integer({ min: 1023, max: 1025 }).map((n) => "r".repeat(n)),
                ),
                bad: fc.oneof(loneSurrogateString, wrongType),
                absent: 8,
              });
            }
            return fc.record({
              mode: fc.constant(mode),
              plan: fc.constant(plan),
              token: fc.constant(token),
              job: jobSegmentArb(mode),
              headers: ifMatchArb(seq, mode),
              body: jsonBody(bodyOf(top, mode), JSON_LIMIT, mode),
            });
          });
        });
      const caseArb = bothModes(caseFor).map((c) =>
        printable(
          c,
          (v) =>
            `${JSON.stringify(v.plan)} ${describeRequest({ method: "POST", path: `/v1/jobs/${v.job}/transitions`, body: v.body, ...(v.headers ? { headers: v.headers } : {}) }, v.token)}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, c.plan);
          const req: Request = {
            method: "POST",
            path: `/v1/jobs/${c.job}/transitions`,
            body: c.body,
            ...(c.headers ? { headers: c.headers } : {}),
          };
          const { res, sent, label } = await attempt(ctx, "POST /v1/jobs/{id}/transitions", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          const jobId = res.body.job_id as string;
          const read = await readJob(ctx, jobId, label);
          for (const k of ["status", "transition_seq", "progress", "agent_session", "auto_complete", "role", "expected_artifacts"]) {
            same(read[k], res.body[k], `${label}: ${k} read back as answered`);
          }
          const fields = (sent as { fields?: Record<string, unknown> }).fields ?? {};
          for (const [k, v] of Object.entries(fields)) same(read[k], v, `${label}: fields.${k} round-trips`);
          await expectTransitionable(ctx, jobId, label);
        }),
        fcParams(),
      );
    });

    it("POST /v1/jobs/{id}/dispatches: arbitrary dispatch records", async () => {
      const ctx = await context();
      const caseFor = (mode: Mode) =>
        jobPlanArb({ staged: fc.constant(false), finalized: fc.constant(false) }).chain((plan) => {
          const latest = plan.attempts;
          const anchor = bodyOf(
            [
              {
                name: "started_at",
                valid: fc
                  .date({ min: new Date("1970-01-01T00:00:00Z"), max: new Date("2100-01-01T00:00:00Z"), noInvalidDate: true })
                  .chain((d) => fc.constantFrom(d.toISOString(), d.toISOString().replace("Z", "+05:30"))),
                bad: fc.oneof(fc.constantFrom("2026-13-01T00:00:00Z", "2026-11-20", "now", "2026-11-20T10:00:00", ""), wrongType),
                absent: 4,
              },
              {
                name: "workspace_revision",
                valid: fc.oneof(fc.stringMatching(/^[0-9a-f]{0,40}$/), fc.constant("r".repeat(128))),
                bad: fc.oneof(fc.constant("r".repeat(129)), loneSurrogateString, wrongType),
                absent: 4,
              },
            ],
            mode,
          );
          const body = bodyOf(
            [
              {
                name: "attempt_id",
                valid: fc.oneof(
                  { weight: 6, arbitrary: fc.constant(latest + 1) },
                  fc.integer({ min: 1, max: 1_000_000 }),
                  fc.constantFrom(latest, 1),
                ),
                bad: fc.oneof(
                  fc.constantFrom(0, -1, 1.5, 1_000_001, "2", null),
                  fc.constantFrom(new Raw(`${latest + 1}.0`), new Raw("1e0"), new Raw("-0"), new Raw("1e300")),
                  wrongType,
                ),
                absent: mode === "clean" ? 0 : 1,
              },
              {
                name: "agent_session_uuid",
                valid: fc.oneof(fc.uuid(), fc.string({ unit: "grapheme", minLength: 1, maxLength: 40 }), fc.constant("u".repeat(128))),
                bad: fc.oneof(fc.constantFrom("", "u".repeat(129)), loneSurrogateString, wrongType),
                absent: mode === "clean" ? 0 : 1,
              },
              {
                name: "pane_process_generation",
                valid: fc.oneof(fc.nat(), fc.constant(Number.MAX_SAFE_INTEGER)),
                bad: fc.oneof(
                  fc.constantFrom(-1, 1.5, "3"),
                  fc.constantFrom(new Raw("1e300"), new Raw("9007199254740993"), new Raw("1e20"), new Raw("-0")),
                  wrongType,
                ),
                absent: mode === "clean" ? 0 : 1,
              },
              {
                name: "pane_id",
                valid: fc.oneof(fc.string({ maxLength: 10 }), fc.constant("%".repeat(128))),
                bad: fc.oneof(fc.constant("p".repeat(129)), loneSurrogateString, wrongType),
                absent: 6,
              },
              { name: "anchor", valid: anchor, bad: wrongType, absent: 4 },
            ],
            mode,
          );
          return fc.record({
            mode: fc.constant(mode),
            plan: fc.constant(plan),
            token: tokenArb(false, mode),
            job: jobSegmentArb(mode),
            body: jsonBody(body, JSON_LIMIT, mode),
          });
        });
      const caseArb = bothModes(caseFor).map((c) =>
        printable(
          c,
          (v) =>
            `${JSON.stringify(v.plan)} ${describeRequest({ method: "POST", path: `/v1/jobs/${v.job}/dispatches`, body: v.body }, v.token)}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, c.plan);
          const req: Request = { method: "POST", path: `/v1/jobs/${c.job}/dispatches`, body: c.body };
          const { res, sent, label } = await attempt(ctx, "POST /v1/jobs/{id}/dispatches", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(201);
          const s = sent as Record<string, unknown>;
          const d = res.body.dispatch as Record<string, unknown>;
          const stored = await ctx.h.ports.jobs.getDispatch(d.job_id as string, d.attempt_id as number);
          same(stored, d, `${label}: the stored dispatch is the one answered`);
          for (const k of ["attempt_id", "agent_session_uuid", "pane_process_generation", "pane_id"]) {
            if (s[k] !== undefined) same(d[k], s[k], `${label}: ${k} round-trips`);
          }
          const anchor = (s.anchor ?? {}) as Record<string, unknown>;
          const storedAnchor = d.anchor as Record<string, unknown>;
          if (anchor.workspace_revision !== undefined) same(storedAnchor.workspace_revision, anchor.workspace_revision, label);
          if (anchor.started_at !== undefined)
            expect(Date.parse(storedAnchor.started_at as string), label).toBe(Date.parse(anchor.started_at as string));
          const read = await readJob(ctx, d.job_id as string, label);
          expect(read.latest_attempt, label).toBe(d.attempt_id);
          const asAgent = await ctx.h.call("GET", `/v1/jobs/${d.job_id}`, { token: res.body.agent_token });
          expect(asAgent.status, `${label}: the minted token reads its job: ${asAgent.text.slice(0, 200)}`).toBe(200);
          await expectTransitionable(ctx, d.job_id as string, label);
        }),
        fcParams(),
      );
    });

    it("PUT /v1/jobs/{id}/attempts/{n}/report: arbitrary bytes, lengths and attempts", async () => {
      const ctx = await context();
      const bytesArb = fc.oneof(
        { weight: 4, arbitrary: fc.uint8Array({ maxLength: 2048 }) },
        { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 200 }).map((s) => encoder.encode(s)) },
        {
          weight: 2,
          arbitrary: fc
            .tuple(fc.integer({ min: -2, max: 2 }), fc.constantFrom(...FILL_UNITS))
            .map(([d, u]) => encoder.encode(textOfBytes(REPORT_LIMIT + d, u))),
        },
        { weight: 1, arbitrary: fc.constant(new Uint8Array()) },
      );
      const caseFor = (mode: Mode) =>
        jobPlanArb({ finalized: fc.constant(false) }).chain((plan) =>
          fc.record({
            mode: fc.constant(mode),
            plan: fc.constant(plan),
            token: tokenArb(true, mode),
            job: jobSegmentArb(mode),
            attempt: attemptSegmentArb(plan.attempts, mode),
            bytes: bytesArb,
            contentType:
              mode === "clean"
                ? fc.constantFrom("text/markdown", "text/markdown; charset=utf-8", "application/octet-stream", undefined)
                : fc.constantFrom(undefined, "application/json", "", "text/html; charset=utf-16", "multipart/form-data; boundary=x"),
            length:
              mode === "clean"
                ? fc.constantFrom("none", "exact", "chunked-3")
                : fc.constantFrom("none", "chunked-1", "chunked-7", "short", "long", "garbage", "negative", "over-limit", "huge"),
          }),
        );
      const caseArb = bothModes(caseFor).map((c) =>
        printable(
          c,
          (v) =>
            `${JSON.stringify(v.plan)} PUT /v1/jobs/${v.job}/attempts/${v.attempt}/report as ${v.token}: ${v.bytes.length} bytes, ${String(v.contentType)}, length ${v.length}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, c.plan);
          const n = c.bytes.length;
          const lengthHeader: Record<string, string | undefined> = {
            exact: String(n),
            short: String(Math.max(0, n - 1)),
            long: String(n + 1),
            garbage: "12abc",
            negative: "-1",
            "over-limit": String(REPORT_LIMIT + 1),
            huge: "99999999999999999999",
          };
          const chunks = c.length.startsWith("chunked-") ? Number(c.length.slice(8)) : undefined;
          const contentLength = lengthHeader[c.length];
          const req: Request = {
            method: "PUT",
            path: `/v1/jobs/${c.job}/attempts/${c.attempt}/report`,
            raw: {
              bytes: c.bytes,
              ...(c.contentType === undefined ? {} : { contentType: c.contentType }),
              ...(contentLength === undefined ? {} : { contentLength }),
              ...(chunks === undefined ? {} : { chunks }),
            },
          };
          const { res, label, target } = await attempt(ctx, "PUT .../attempts/{n}/report", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(201);
          expect(res.body, label).toEqual({ sha256: createHash("sha256").update(c.bytes).digest("hex"), bytes: n });
          // Readable back: finalizing it hashes the same bytes.
          expect(target, label).toBeDefined();
          const path = `/v1/jobs/${target}/attempts/${c.attempt}`;
          const expected = (await readJob(ctx, target!, label)).expected_artifacts as string[];
          const side_effects = expected.map((kind) => ({ kind, reference: "abc123" }));
          const fin = await ctx.h.call("POST", `${path}/finalize`, { token: ctx.h.operator, json: { side_effects } });
          expect(fin.status, `${label}: finalize after: ${fin.text.slice(0, 300)}`).toBe(200);
          expect(fin.body.manifest, label).toMatchObject({ sha256: res.body.sha256, bytes: n });
          const v = await ctx.h.call("GET", `${path}/verification`, { token: ctx.h.operator });
          expect(v.body, `${label}: verification after: ${v.text.slice(0, 300)}`).toMatchObject({
            ok: true,
            manifest: { sha256: res.body.sha256 },
          });
          await expectTransitionable(ctx, target!, label);
        }),
        fcParams(),
      );
    });

    it("POST /v1/jobs/{id}/attempts/{n}/finalize: arbitrary side effects and attempts", async () => {
      const ctx = await context();
      const caseFor = (mode: Mode) =>
        jobPlanArb({ staged: mostly(true), finalized: fc.boolean() }).chain((plan) =>
          fc.record({
            mode: fc.constant(mode),
            plan: fc.constant(plan),
            token: tokenArb(true, mode),
            job: jobSegmentArb(mode),
            attempt: attemptSegmentArb(plan.attempts, mode),
            body: jsonBody(
              bodyOf(
                [
                  {
                    name: "side_effects",
                    valid: sideEffectsArb(plan.expected, mode),
                    bad: badSideEffectsArb,
                    absent: mode === "clean" ? 0 : 1,
                  },
                ],
                mode,
              ),
              JSON_LIMIT,
              mode,
            ),
          }),
        );
      const caseArb = bothModes(caseFor).map((c) =>
        printable(
          c,
          (v) =>
            `${JSON.stringify(v.plan)} ${describeRequest({ method: "POST", path: `/v1/jobs/${v.job}/attempts/${v.attempt}/finalize`, body: v.body }, v.token)}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, c.plan);
          const req: Request = { method: "POST", path: `/v1/jobs/${c.job}/attempts/${c.attempt}/finalize`, body: c.body };
          const { res, sent, label } = await attempt(ctx, "POST .../attempts/{n}/finalize", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          const manifest = res.body.manifest as Record<string, unknown>;
          same(manifest.side_effects, (sent as { side_effects: unknown }).side_effects, `${label}: side effects round-trip`);
          // Verified against the job's own expected artifacts: not ok only for want of their evidence.
          const v = await ctx.h.call("GET", `/v1/jobs/${manifest.job_id}/attempts/${manifest.attempt_id}/verification`, {
            token: ctx.h.operator,
          });
          expect(v.status, label).toBe(200);
          same(v.body.manifest, manifest, `${label}: the manifest read back is the one answered`);
          if (v.body.ok) expect(v.body.manifest_sha256, label).toBe(res.body.manifest_sha256);
          else expect(v.body.reason, `${label}: verification after: ${v.text.slice(0, 300)}`).toMatch(/^no side-effect evidence for /);
          await expectTransitionable(ctx, manifest.job_id as string, label);
        }),
        fcParams(),
      );
    });

    it("POST /v1/jobs/{id}/evaluations: arbitrary scenarios, the gate on (a refusal is a 200 that writes nothing)", async () => {
      const ctx = await context({ env: { MAM_AUTO_COMPLETE: "1" } });
      const candidate = candidateScenario(JOB);
      const paths: (string | number)[][] = [];
      const walk = (v: unknown, at: (string | number)[]): void => {
        paths.push(at);
        if (Array.isArray(v)) for (const [i, x] of v.entries()) walk(x, [...at, i]);
        else if (v !== null && typeof v === "object") for (const [k, x] of Object.entries(v)) walk(x, [...at, k]);
      };
      walk(candidate, []);
      /** The reference scenario with one or two values replaced (by anything, of any type) or removed. */
      const mutated = (mode: Mode) =>
        fc
          .array(
            fc.tuple(
              fc.nat(),
              mode === "clean"
                ? fc.oneof(wrongType, specialString, specialNumber, fc.constant(undefined))
                : fc.oneof(wrongType, specialString, specialNumber, fc.constant(undefined), deepValue),
            ),
            { minLength: 1, maxLength: 2 },
          )
          .map((edits) => {
            const copy = structuredClone(candidate) as Record<string, unknown>;
            for (const [i, value] of edits) {
              const p = paths[1 + (i % (paths.length - 1))]!;
              // An earlier edit may have replaced or removed a value on the way: then this edit is skipped.
              let parent: unknown = copy;
              for (const k of p.slice(0, -1))
                parent = parent !== null && typeof parent === "object" ? (parent as Record<string | number, unknown>)[k] : undefined;
              if (parent === null || typeof parent !== "object") continue;
              const last = p.at(-1)!;
              const target = parent as Record<string | number, unknown>;
              if (value === undefined && !Array.isArray(target)) delete target[last];
              else target[last] = value;
            }
            return copy;
          });
      /** The scenario's JSON exactly at the limit, or a byte or two either side. */
      const padded = fc.tuple(fc.integer({ min: -2, max: 2 }), fc.constantFrom(...FILL_UNITS)).map(([d, unit]) => {
        const base = utf8(JSON.stringify({ ...candidate, pad: "" }));
        const unitJson = utf8(JSON.stringify(unit)) - 2;
        const room = FREE_FORM_MAX_BYTES.scenario + d - base;
        const count = Math.floor(room / unitJson);
        return { ...candidate, pad: unit.repeat(count) + "x".repeat(room - count * unitJson) };
      });
      const withKeys = fc
        .array(fc.tuple(anyKey, wrongType), { minLength: 1, maxLength: 3 })
        .map((e) => obj([...Object.entries(candidate), ...e]));
      const scenarioArb = (mode: Mode) =>
        mode === "clean"
          ? fc.oneof(
              { weight: 3, arbitrary: fc.constant(candidate) },
              { weight: 3, arbitrary: mutated(mode) },
              { weight: 1, arbitrary: padded },
            )
          : fc.oneof(mutated(mode), withKeys, deepValue, wrongType, padded);
      const plans = jobPlanArb({
        status: fc.oneof(
          { weight: 4, arbitrary: fc.constant<Status>("running") },
          { weight: 1, arbitrary: fc.constantFrom<Status>("pending", "completed", "cancelled") },
        ),
        attempts: fc.oneof({ weight: 5, arbitrary: fc.constant<1>(1) }, { weight: 1, arbitrary: fc.constantFrom<0 | 2>(0, 2) }),
        staged: fc.constant(true),
        finalized: fc.oneof({ weight: 4, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
        agent: fc.oneof({ weight: 5, arbitrary: fc.constant("claude-code") }, { weight: 1, arbitrary: fc.constant("codex") }),
        autoComplete: fc.oneof({ weight: 5, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
      });
      const caseArb = bothModes((mode) =>
        fc.record({
          mode: fc.constant(mode),
          plan: plans,
          token: tokenArb(false, mode),
          job: jobSegmentArb(mode),
          body: jsonBody(bodyOf([{ name: "scenario", valid: scenarioArb(mode), bad: wrongType, absent: 0 }], mode), JSON_LIMIT, mode),
        }),
      ).map((c) =>
        printable(
          c,
          (v) =>
            `${JSON.stringify(v.plan)} ${describeRequest({ method: "POST", path: `/v1/jobs/${v.job}/evaluations`, body: v.body }, v.token)}`,
        ),
      );
      let committed = 0;
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, c.plan);
          const req: Request = { method: "POST", path: `/v1/jobs/${c.job}/evaluations`, body: c.body };
          const { res, label, before, target } = await attempt(ctx, "POST /v1/jobs/{id}/evaluations", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          expect(typeof res.body.committed, label).toBe("boolean");
          expect(target, label).toBeDefined();
          if (res.body.committed) {
            committed += 1;
            const read = await readJob(ctx, target!, label);
            expect(read, label).toMatchObject({ status: "completed", completed_by: "auto_complete" });
            const v = await ctx.h.call("GET", `/v1/jobs/${target}/attempts/${read.latest_attempt}/verification`, { token: ctx.h.operator });
            expect(v.body, `${label}: verification after the commit`).toMatchObject({ ok: true, pinned: { ok: true } });
          } else {
            // The gate's refusal is an answer, and it writes nothing.
            const c2 = changes(before, await ctx.backend.snapshot(ctx.h.ports));
            expect(c2.changed, `${label}: a gate refusal wrote: ${c2.changed.join(", ")}`).toEqual([]);
          }
          await expectTransitionable(ctx, target!, label);
        }),
        fcParams(),
      );
      console.log(`[properties] ${ctx.backend.name}: the gate committed in ${committed} of the evaluation cases`);
    });

    it("POST /v1/jobs/{id}/events: arbitrary events, seqs, finalize and data", async () => {
      const ctx = await context();
      const caseFor = (mode: Mode) =>
        fc.tuple(jobPlanArb({ staged: mostly(true) }), tokenArb(true, mode)).chain(([plan, token]) => {
          const seq = seqOf(plan);
          const events =
            mode === "clean" && plan.status === "pending"
              ? ["started", "completed", "error"]
              : mode === "clean" && plan.status === "running"
                ? ["progress", "completed", "error"]
                : ["started", "progress", "completed", "error"];
          const finalize = bodyOf(
            [
              {
                name: "attempt_id",
                valid:
                  mode === "clean"
                    ? fc.constant(Math.max(1, plan.attempts))
                    : fc.oneof({ weight: 3, arbitrary: fc.constant(Math.max(1, plan.attempts)) }, fc.constantFrom(1, 2, 3)),
                bad: fc.oneof(fc.constantFrom(0, -1, 1.5, "1", 1_000_001), wrongType),
                absent: mode === "clean" ? 0 : 1,
              },
              {
                name: "side_effects",
                valid: sideEffectsArb(plan.expected, mode),
                bad: badSideEffectsArb,
                absent: mode === "clean" ? 0 : 1,
              },
            ],
            mode,
          );
          const body = bodyOf(
            [
              {
                name: "event",
                valid: fc.constantFrom(...events),
                bad: fc.oneof(fc.constantFrom("cancel", "claim", "", "Started", "running"), wrongType),
                absent: mode === "clean" ? 0 : 1,
              },
              { name: "expected_seq", valid: seqArb(seq), bad: badSeqArb(seq), absent: 4 },
              { name: "finalize", valid: finalize, bad: wrongType, absent: 6 },
              { name: "data", valid: freeForm(FREE_FORM_MAX_BYTES.eventData, mode), bad: wrongType, absent: 3 },
            ],
            mode,
          );
          return fc.record({
            mode: fc.constant(mode),
            plan: fc.constant(plan),
            token: fc.constant(token),
            job: jobSegmentArb(mode),
            body: jsonBody(body, JSON_LIMIT, mode),
          });
        });
      const caseArb = bothModes(caseFor).map((c) =>
        printable(
          c,
          (v) =>
            `${JSON.stringify(v.plan)} ${describeRequest({ method: "POST", path: `/v1/jobs/${v.job}/events`, body: v.body }, v.token)}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, c.plan);
          const req: Request = { method: "POST", path: `/v1/jobs/${c.job}/events`, body: c.body };
          const { res, sent, label } = await attempt(ctx, "POST /v1/jobs/{id}/events", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          expect(res.body.warnings, `${label}: a store failed after the commit`).toBeUndefined();
          const record = res.body.record as Record<string, unknown>;
          const jobId = record.job_id as string;
          const read = await readJob(ctx, jobId, label);
          for (const k of ["status", "transition_seq", "finalized_report", "completed_evidence"])
            same(read[k], record[k], `${label}: ${k} as answered`);
          const s = sent as { data?: unknown; finalize?: { attempt_id: number; side_effects: unknown } };
          const logged = (await readAllEvents(ctx, jobId, label)).filter(
            (e) => e.event === "publish_event" && (e.data as { transition_seq?: number }).transition_seq === record.transition_seq,
          );
          expect(logged, `${label}: one publish_event line for the commit`).toHaveLength(1);
          same((logged[0]!.data as { data?: unknown }).data, s.data, `${label}: data round-trips through the event log`);
          if (s.finalize !== undefined) {
            same(res.body.finalized?.manifest?.side_effects, s.finalize.side_effects, `${label}: finalized side effects`);
            const v = await ctx.h.call("GET", `/v1/jobs/${jobId}/attempts/${s.finalize.attempt_id}/verification`, {
              token: ctx.h.operator,
            });
            same(v.body.manifest, res.body.finalized.manifest, `${label}: the manifest read back is the one answered`);
          }
          await expectTransitionable(ctx, jobId, label);
        }),
        fcParams(),
      );
    });

    it("GET /v1/jobs?status=&owed=&limit=&cursor=: arbitrary queries read and write nothing", async () => {
      const ctx = await context();
      for (const status of ["pending", "running", "completed", "cancelled", "error"] as const) await makeJob(ctx.h, plainPlan({ status }));
      const first = await ctx.h.call("GET", "/v1/jobs?limit=1", { token: ctx.h.operator });
      const byStatus = await ctx.h.call("GET", "/v1/jobs?status=pending&limit=1", { token: ctx.h.operator });
      expect(first.body.next_cursor, first.text).toEqual(expect.any(String));
      const statuses = fc.constantFrom("pending", "running", "completed", "error", "cancelled");
      // A cursor goes with the listing that handed it out: the unfiltered one here.
      const limitParam = fc.tuple(fc.constant("limit"), fc.integer({ min: 1, max: 200 }).map(String));
      const clean = fc
        .oneof(
          fc.tuple(fc.option(fc.tuple(fc.constant("status"), statuses), { nil: undefined }), fc.option(limitParam, { nil: undefined })),
          fc.tuple(fc.constant(["cursor", first.body.next_cursor as string] as const), fc.option(limitParam, { nil: undefined })),
        )
        .map((ps) =>
          (ps as readonly (readonly [string, string] | undefined)[]).filter((p): p is readonly [string, string] => p !== undefined),
        );
      const attack = fc.oneof(
        {
          weight: 2,
          arbitrary: fc.tuple(
            fc.constant("status"),
            fc.oneof(statuses, fc.constantFrom("", "Pending", "done", "pending,running"), specialString),
          ),
        },
        { weight: 1, arbitrary: fc.tuple(fc.constant("owed"), fc.constantFrom("quarantined", "", "all", "QUARANTINED")) },
        { weight: 2, arbitrary: fc.tuple(fc.constant("limit"), numberLikeQuery(200)) },
        {
          weight: 3,
          arbitrary: fc.tuple(fc.constant("cursor"), fc.oneof(cursorArb(first.body.next_cursor), cursorArb(byStatus.body.next_cursor))),
        },
        {
          weight: 1,
          arbitrary: fc.tuple(fc.constantFrom("foo", "__proto__", "constructor", "limit[]", "status[]", ""), fc.string({ maxLength: 5 })),
        },
      );
      const caseArb = bothModes((mode) =>
        fc.record({
          mode: fc.constant(mode),
          token: mode === "clean" ? fc.constantFrom<TokenKind>("operator", "read-only") : tokenArb(false, mode),
          params: mode === "clean" ? clean : fc.array(attack, { maxLength: 4 }),
          rawEncoding: fc.boolean(),
        }),
      ).map((c) => printable(c, (v) => `GET /v1/jobs?${queryOf(v.params, v.rawEncoding)} as ${v.token}`));
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          const req: Request = { method: "GET", path: `/v1/jobs?${queryOf(c.params, c.rawEncoding)}` };
          const { res, label } = await attempt(ctx, "GET /v1/jobs", req, c.token, undefined, c.mode, { readOnly: true });
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          const q = new URLSearchParams(req.path.split("?")[1]);
          const limit = q.get("limit");
          if (limit !== null && /^\d+$/.test(limit)) expect(res.body.items.length, label).toBeLessThanOrEqual(Number(limit));
          const status = q.get("status");
          for (const item of res.body.items) {
            expect(JobRecordSchema.safeParse(item).success, `${label}: an item is not a JobRecord`).toBe(true);
            if (status) expect(item.status, label).toBe(status);
          }
        }),
        fcParams(),
      );
    });

    it("GET /v1/jobs/{id}/events?limit=&cursor=: arbitrary pages read and write nothing", async () => {
      const ctx = await context();
      const job = await makeJob(ctx.h, plainPlan());
      for (let i = 0; i < 4; i++) {
        const res = await ctx.h.call("POST", `/v1/jobs/${job.jobId}/events`, {
          token: ctx.h.operator,
          json: { event: "progress", data: { i } },
        });
        expect(res.status, res.text).toBe(200);
      }
      const first = await ctx.h.call("GET", `/v1/jobs/${job.jobId}/events?limit=1`, { token: ctx.h.operator });
      expect(first.body.next_cursor, first.text).toEqual(expect.any(String));
      const clean = fc.oneof(
        fc.tuple(fc.constant("limit"), fc.integer({ min: 1, max: 1000 }).map(String)),
        fc.tuple(fc.constant("cursor"), fc.constantFrom(first.body.next_cursor as string)),
      );
      const attack = fc.oneof(
        { weight: 3, arbitrary: fc.tuple(fc.constant("limit"), numberLikeQuery(1000)) },
        { weight: 3, arbitrary: fc.tuple(fc.constant("cursor"), cursorArb(first.body.next_cursor)) },
        { weight: 1, arbitrary: fc.tuple(fc.constantFrom("foo", "__proto__", "status", "limit[]", ""), fc.string({ maxLength: 5 })) },
      );
      const caseArb = bothModes((mode) =>
        fc.record({
          mode: fc.constant(mode),
          token: mode === "clean" ? fc.constantFrom<TokenKind>("operator", "read-only", "agent") : tokenArb(true, mode),
          job: jobSegmentArb(mode),
          params: mode === "clean" ? fc.uniqueArray(clean, { maxLength: 2, selector: ([k]) => k }) : fc.array(attack, { maxLength: 3 }),
          rawEncoding: fc.boolean(),
        }),
      ).map((c) => printable(c, (v) => `GET /v1/jobs/${v.job}/events?${queryOf(v.params, v.rawEncoding)} as ${v.token}`));
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          const req: Request = { method: "GET", path: `/v1/jobs/${c.job}/events?${queryOf(c.params, c.rawEncoding)}` };
          const { res, label, target } = await attempt(ctx, "GET /v1/jobs/{id}/events", req, c.token, job, c.mode, { readOnly: true });
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          const q = new URLSearchParams(req.path.split("?")[1]);
          const limit = q.get("limit");
          if (limit !== null && /^\d+$/.test(limit)) expect(res.body.items.length, label).toBeLessThanOrEqual(Number(limit));
          // The case's job has events: its first page holds at least one (the other job has none).
          if (target === job.jobId && !q.has("cursor")) expect(res.body.items.length, label).toBeGreaterThan(0);
        }),
        fcParams(),
      );
    });

    it("POST /v1/recovery-sweeps: arbitrary bodies; owed intents (some refused by the broker) are swept, and their jobs stay transitionable", async () => {
      const ctx = await context({ sweep: { maxFailures: 2, backoffMs: 1000 } });
      const bodyArb = (mode: Mode) =>
        mode === "clean"
          ? fc.oneof(fc.constant(undefined), jsonBody(fc.constant({}), JSON_LIMIT, mode))
          : jsonBody(
              fc.oneof(
                fc.constant({}),
                fc.array(fc.tuple(anyKey, wrongType), { minLength: 1, maxLength: 2 }).map((e) => obj(e)),
              ),
              JSON_LIMIT,
              mode,
            );
      const caseArb = bothModes((mode) =>
        fc.record({
          mode: fc.constant(mode),
          token: tokenArb(false, mode),
          body: bodyArb(mode),
          refuse: fc.boolean(),
          advanceMs: fc.constantFrom(0, 1000, 3_600_000),
        }),
      ).map((c) =>
        printable(
          c,
          (v) =>
            `refuse ${v.refuse}, +${v.advanceMs} ms: ${describeRequest({ method: "POST", path: "/v1/recovery-sweeps", ...(v.body ? { body: v.body } : {}) }, v.token)}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const job = await makeJob(ctx.h, plainPlan());
          const progress = await ctx.h.call("POST", `/v1/jobs/${job.jobId}/transitions`, {
            token: ctx.h.operator,
            json: { action: "progress", expected_seq: 1, notify: true, fields: { progress: { owed: true } } },
          });
          expect(progress.status, progress.text).toBe(200);
          if (c.refuse) ctx.h.refusedTopics.add(`mam/jobs/${job.jobId}/events`);
          ctx.h.clock.advance(c.advanceMs);
          const req: Request = { method: "POST", path: "/v1/recovery-sweeps", ...(c.body ? { body: c.body } : {}) };
          const { res, label } = await attempt(ctx, "POST /v1/recovery-sweeps", req, c.token, job, c.mode);
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          for (const r of res.body.results as { job_id: string; outcome: string }[]) {
            expect(["sent", "failed", "quarantined"], `${label}: ${JSON.stringify(r)}`).toContain(r.outcome);
          }
          await expectTransitionable(ctx, job.jobId, label);
        }),
        fcParams(),
      );
    });

    it("POST /v1/jobs/{id}/notification-release: arbitrary bodies on owed, backed-off and quarantined intents", async () => {
      const ctx = await context({ sweep: { maxFailures: 2, backoffMs: 1000 } });
      const intentArb = (mode: Mode) =>
        mode === "clean"
          ? fc.oneof(fc.constant(undefined), jsonBody(fc.constantFrom({}, { intent_id: INTENT }), JSON_LIMIT, mode))
          : jsonBody(
              bodyOf(
                [
                  {
                    name: "intent_id",
                    valid: fc.oneof(fc.constant(INTENT), fc.uuid(), fc.string({ minLength: 1, maxLength: 128 })),
                    bad: fc.oneof(fc.constantFrom("", "i".repeat(129)), loneSurrogateString, wrongType),
                  },
                ],
                mode,
              ),
              JSON_LIMIT,
              mode,
            );
      const caseArb = bothModes((mode) =>
        fc.record({
          mode: fc.constant(mode),
          token: tokenArb(false, mode),
          job: jobSegmentArb(mode),
          state: fc.constantFrom("owed", "backed-off", "quarantined", "settled"),
          body: intentArb(mode),
        }),
      ).map((c) =>
        printable(
          c,
          (v) =>
            `${v.state}: ${describeRequest({ method: "POST", path: `/v1/jobs/${v.job}/notification-release`, ...(v.body ? { body: v.body } : {}) }, v.token)}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          await ctx.next();
          const { h } = ctx;
          const job = await makeJob(h, plainPlan());
          const progress = await h.call("POST", `/v1/jobs/${job.jobId}/transitions`, {
            token: h.operator,
            json: { action: "progress", expected_seq: 1, notify: true, fields: { progress: { owed: true } } },
          });
          expect(progress.status, progress.text).toBe(200);
          const intentId = progress.body.pending_notification.id as string;
          expect(intentId.length, "intent ids are as long as their placeholder").toBe(INTENT.length);
          // Refused by the broker once (backed off), twice (quarantined), or sent (nothing owed).
          const topic = `mam/jobs/${job.jobId}/events`;
          if (c.state !== "owed") {
            if (c.state !== "settled") h.refusedTopics.add(topic);
            for (let i = 0; i < (c.state === "quarantined" ? 2 : 1); i++) {
              h.clock.advance(1000);
              expect((await h.call("POST", "/v1/recovery-sweeps", { token: h.operator })).status).toBe(200);
            }
            h.refusedTopics.delete(topic);
          }
          const req: Request = { method: "POST", path: `/v1/jobs/${c.job}/notification-release`, ...(c.body ? { body: c.body } : {}) };
          const { res, label, target } = await attempt(ctx, "POST /v1/jobs/{id}/notification-release", req, c.token, job, c.mode, {
            replace: { [INTENT]: intentId },
          });
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          expect(typeof res.body.released, label).toBe("boolean");
          const read = await readJob(ctx, target!, label);
          same(read.pending_notification, res.body.record.pending_notification, `${label}: the owed intent read back is the one answered`);
          if (res.body.released) {
            expect(read.pending_notification, label).toBeDefined();
            for (const k of ["failures", "retry_at", "quarantined_at"]) expect(read.pending_notification, label).not.toHaveProperty(k);
          }
          await expectTransitionable(ctx, target!, label);
        }),
        fcParams(),
      );
    });

    it("GET /v1/jobs/{id} and GET .../attempts/{n}/verification?expected_artifacts=: arbitrary paths and queries read and write nothing", async () => {
      const ctx = await context();
      const job = await makeJob(ctx.h, plainPlan({ staged: true, finalized: true, expected: ["commit"] }));
      const kinds = fc.oneof(
        fc.constantFrom("commit", "", "commit,commit", " commit , other "),
        fc.stringMatching(/^[a-z][a-z0-9_]{0,10}(,[a-z][a-z0-9_]{0,10}){0,3}$/),
      );
      const badKinds = fc.oneof(
        fc.constantFrom("Commit", "a,,b", "-", ",".repeat(40), Array.from({ length: 33 }, (_, i) => `k${i}`).join(","), "k".repeat(4097)),
        specialString,
      );
      const caseArb = bothModes((mode) =>
        fc.record({
          mode: fc.constant(mode),
          route: fc.constantFrom("job", "verification"),
          token: mode === "clean" ? fc.constantFrom<TokenKind>("operator", "read-only") : tokenArb(true, mode),
          job: jobSegmentArb(mode),
          attempt: attemptSegmentArb(1, mode),
          params:
            mode === "clean"
              ? fc.option(
                  fc.tuple(fc.constant(["expected_artifacts", "x"] as const), kinds).map(([[k], v]) => [[k, v] as const]),
                  { nil: [] },
                )
              : fc.array(
                  fc.oneof(
                    fc.tuple(fc.constant("expected_artifacts"), fc.oneof(kinds, badKinds)),
                    fc.tuple(fc.constantFrom("foo", "__proto__", "limit"), fc.string({ maxLength: 5 })),
                  ),
                  { maxLength: 2 },
                ),
          rawEncoding: fc.boolean(),
        }),
      ).map((c) =>
        printable(
          c,
          (v) =>
            `GET /v1/jobs/${v.job}${v.route === "job" ? "" : `/attempts/${v.attempt}/verification`}?${queryOf(v.params, v.rawEncoding)} as ${v.token}`,
        ),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async (c) => {
          const path =
            c.route === "job"
              ? `/v1/jobs/${c.job}`
              : `/v1/jobs/${c.job}/attempts/${c.attempt}/verification?${queryOf(c.params, c.rawEncoding)}`;
          const route = c.route === "job" ? "GET /v1/jobs/{id}" : "GET .../attempts/{n}/verification";
          const { res, label } = await attempt(ctx, route, { method: "GET", path }, c.token, job, c.mode, { readOnly: true });
          if (res.status >= 400) return;
          expect(res.status, label).toBe(200);
          if (c.route === "job") expect(JobRecordSchema.safeParse(res.body).success, `${label}: not a JobRecord`).toBe(true);
          else expect(typeof res.body.ok === "boolean" && typeof res.body.reason === "string", `${label}: not a verification`).toBe(true);
        }),
        fcParams(),
      );
    });
  });
}

/** Percent-encode the UTF-8 bytes of `s` (a lone surrogate becomes U+FFFD, as any client sends it), all but `keep`. */
function percent(s: string, keep: RegExp): string {
  let out = "";
  for (const byte of Buffer.from(s, "utf8")) {
    const ch = String.fromCharCode(byte);
    out += byte < 0x80 && keep.test(ch) ? ch : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

function queryOf(params: readonly (readonly [string, string])[], rawEncoding: boolean): string {
  // Raw: as a careless client writes it, encoding only what would break the query apart ('%' and '+' left as they are).
  const keep = rawEncoding ? /[!$'()*+,;:@/?%A-Za-z0-9._~-]/ : /[A-Za-z0-9._~-]/;
  return params.map(([k, v]) => `${percent(k, keep)}=${percent(v, keep)}`).join("&");
}

if (runsBackend("embedded")) propertySuite(() => sqlite, "the embedded backend (SQLite, files)");

let peers: AwsPeers | undefined;
const aws = awsBackend(() => {
  if (peers === undefined) throw new Error("the AWS peers are not started");
  return peers;
});
describe("the AWS backend", () => {
  beforeAll(async () => {
    peers = await startAwsPeers();
  });
  afterAll(async () => {
    await peers?.close();
  });
  propertySuite(() => aws, `the AWS backend (DynamoDB on ${DYNAMODB_PEER}, S3 on s3rver)`);
});
