import { readFileSync } from "node:fs";
import { type AppOptions, createApp, createTokenService, SCOPES, type TokenService } from "@mam/api";
import {
  type Deps,
  type DiskSpace,
  type JobStore,
  type Publisher,
  parseFlags,
  type ReportStore,
  randomIds,
  type SweepPolicy,
} from "@mam/core";
import type { Hono } from "hono";
import { expect } from "vitest";
import { TestClock } from "../support/clock.ts";
import { documentCheckFor } from "./openapi-check.ts";

/** The ports an adapter family provides; the suite assembles Deps around them. */
export interface ApiPorts {
  readonly jobs: JobStore;
  readonly reports: ReportStore;
  readonly publisher: Publisher;
  /** The free space under the stores, for the disk floor; absent: no floor is kept (as on AWS). */
  readonly disk?: DiskSpace;
  close(): Promise<void>;
}

export interface PortsOptions {
  /** `unreachable`: a publisher of the same kind aimed at a broker nobody answers on. */
  readonly publisher: "working" | "unreachable";
  /** Topics the broker refuses a publish to while they are in the set (the test edits it). */
  readonly refusedTopics?: ReadonlySet<string>;
}

export type PortsFactory = (opts: PortsOptions) => Promise<ApiPorts>;

export const SIGNING_KEY = "test-signing-key-0123456789abcdef-0123456789";

/**
 * A pass-through over a real store that records which methods were called, so a
 * test can assert that a request never reached the store. Not a mock: every call
 * goes to the adapter. `fail` makes the named methods throw a plain Error instead
 * (fault injection for the 500 path).
 */
export function observed(store: JobStore, fail: readonly (keyof JobStore)[] = []): { store: JobStore; calls: string[] } {
  const calls: string[] = [];
  const proxy = new Proxy(store, {
    get(target, prop) {
      const value: unknown = Reflect.get(target, prop, target);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        calls.push(String(prop));
        if ((fail as readonly PropertyKey[]).includes(prop)) throw new Error("disk on fire at /var/secret/path");
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { store: proxy, calls };
}

export interface Harness {
  readonly app: Hono;
  readonly deps: Deps;
  readonly ports: ApiPorts;
  readonly tokens: TokenService;
  readonly clock: TestClock;
  /** All four scopes. */
  readonly operator: string;
  /** Store methods called, in order. */
  readonly calls: string[];
  /** Log lines written by the app. */
  readonly lines: string[];
  /** Topics the broker refuses while they are in the set. */
  readonly refusedTopics: Set<string>;
  call(method: string, path: string, req?: Req): Promise<Res>;
}

export interface HarnessOptions {
  readonly env?: Record<string, string>;
  /** MAM_READ_TOKEN_RATE_PER_MINUTE for the app (the schema's default, 600, unless given). */
  readonly readTokenRatePerMinute?: number;
  readonly publisher?: PortsOptions["publisher"];
  readonly jsonBodyLimit?: number;
  readonly reportBodyLimit?: number;
  readonly reportUploadLimit?: number;
  readonly failJobStore?: readonly (keyof JobStore)[];
  readonly sweep?: SweepPolicy;
  /** As a root with another publish path (the relay, the stream publisher) composes the app. */
  readonly publishInline?: boolean;
  readonly sweepGraceSeconds?: number;
  readonly sweepBudgetSeconds?: number;
  readonly feed?: AppOptions["feed"];
}

export interface Req {
  readonly token?: string;
  readonly json?: unknown;
  readonly body?: string | Uint8Array | ReadableStream<Uint8Array>;
  readonly headers?: Record<string, string>;
}

export interface Res {
  readonly status: number;
  readonly headers: Headers;
  readonly text: string;
  // biome-ignore lint/suspicious/noExplicitAny: a parsed JSON body, read field by field in assertions
  readonly body: any;
}

export async function makeHarness(factory: PortsFactory, opts: HarnessOptions, cleanup: (() => Promise<unknown>)[]): Promise<Harness> {
  const refusedTopics = new Set<string>();
  const ports = await factory({ publisher: opts.publisher ?? "working", refusedTopics });
  cleanup.push(() => ports.close());
  const clock = new TestClock("2026-11-20T10:10:00.000Z");
  const { store, calls } = observed(ports.jobs, opts.failJobStore);
  const deps: Deps = {
    jobs: store,
    reports: ports.reports,
    ...(ports.disk === undefined ? {} : { disk: ports.disk }),
    publisher: ports.publisher,
    clock,
    ids: randomIds,
    flags: parseFlags(opts.env ?? {}),
  };
  const tokens = createTokenService({ signingKey: SIGNING_KEY, clock });
  const lines: string[] = [];
  const appOpts: AppOptions = {
    deps,
    tokens,
    log: (l) => lines.push(l),
    ...(opts.jsonBodyLimit === undefined ? {} : { jsonBodyLimit: opts.jsonBodyLimit }),
    ...(opts.reportBodyLimit === undefined ? {} : { reportBodyLimit: opts.reportBodyLimit }),
    ...(opts.reportUploadLimit === undefined ? {} : { reportUploadLimit: opts.reportUploadLimit }),
    ...(opts.sweep === undefined ? {} : { sweep: opts.sweep }),
    ...(opts.readTokenRatePerMinute === undefined ? {} : { readTokenRatePerMinute: opts.readTokenRatePerMinute }),
    ...(opts.publishInline === undefined ? {} : { publishInline: opts.publishInline }),
    // The suites sweep intents they just committed: no grace unless a test asks for one (the schema's is 5 s).
    sweepGraceSeconds: opts.sweepGraceSeconds ?? 0,
    ...(opts.sweepBudgetSeconds === undefined ? {} : { sweepBudgetSeconds: opts.sweepBudgetSeconds }),
    // Through app.request() a stream is read to its end: by default the feed's stream
    // answers the rows there now and ends (as on Lambda); feed suites ask for streaming.
    feed: opts.feed ?? { streaming: false },
  };
  const app = createApp(appOpts) as unknown as Hono;
  const operator = tokens.mintOperator(SCOPES);
  return {
    app,
    deps,
    ports,
    tokens,
    clock,
    operator,
    calls,
    lines,
    refusedTopics,
    call: (method, path, req = {}) => send(app, method, path, req),
  };
}

export async function send(app: Hono, method: string, path: string, req: Req = {}): Promise<Res> {
  const headers = new Headers(req.headers);
  if (req.token !== undefined) headers.set("authorization", `Bearer ${req.token}`);
  let body = req.body;
  if (req.json !== undefined) {
    body = JSON.stringify(req.json);
    if (!headers.has("content-type")) headers.set("content-type", "application/json");
  }
  const init: RequestInit & { duplex?: "half" } = { method, headers };
  if (body !== undefined) init.body = body as NonNullable<RequestInit["body"]>;
  if (body instanceof ReadableStream) init.duplex = "half";
  const res = await app.request(path, init);
  // Every answer, on every route and every path through it, says which request it was.
  expect(res.headers.get("x-request-id"), `${method} ${path} answered ${res.status} without X-Request-Id`).toMatch(
    /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/,
  );
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const answer = { status: res.status, headers: res.headers, text, body: parsed };
  // Every answer is what the served document says it is (tests/api/openapi-check.ts).
  expect((await documentCheckFor(app)).check(method, path, answer), `${method} ${path} against /openapi.json`).toEqual([]);
  return answer;
}

/** A stream of `total` bytes in `chunk`-sized pieces, produced only as it is read; `pulled()` says how many left. */
export function lazyBytes(total: number, chunk = 64 * 1024): { stream: ReadableStream<Uint8Array>; pulled: () => number } {
  let sent = 0;
  const stream = new ReadableStream<Uint8Array>(
    {
      pull(ctrl) {
        if (sent >= total) return ctrl.close();
        const n = Math.min(chunk, total - sent);
        sent += n;
        ctrl.enqueue(new Uint8Array(n).fill(0x61));
      },
    },
    { highWaterMark: 0 },
  );
  return { stream, pulled: () => sent };
}

const FIXTURE = new URL("../../fixtures/watcher/finalized_candidate.json", import.meta.url);

/** The reference scenario (a finalized, idle claude-code pane), retargeted at `jobId`. */
export function candidateScenario(jobId: string): Record<string, unknown> {
  return JSON.parse(
    readFileSync(FIXTURE, "utf8").replaceAll('"job-4f2a"', JSON.stringify(jobId)).replaceAll("reports/job-4f2a/", `reports/${jobId}/`),
  );
}

/** The dispatch the reference scenario was collected under. */
export const CANDIDATE_DISPATCH = {
  attempt_id: 1,
  agent_session_uuid: "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa",
  pane_process_generation: 3,
  pane_id: "%12",
  anchor: { started_at: "2026-11-20T09:59:00Z" },
} as const;
