import { createHash, randomUUID } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { type Harness, type HarnessOptions, makeHarness, type PortsFactory, type Res } from "./harness.ts";

const PROBLEM = /^application\/problem\+json/;

/** One Server-Sent Event as a client parses it. */
export interface SseEvent {
  readonly id?: string;
  readonly event: string;
  readonly data: string;
  readonly retry?: number;
}

/** Parse complete SSE blocks out of `buffer`; what is left is an incomplete block. */
export function parseSse(buffer: string): { events: SseEvent[]; rest: string } {
  const events: SseEvent[] = [];
  const blocks = buffer.split("\n\n");
  const rest = blocks.pop() ?? "";
  for (const block of blocks) {
    const fields: Record<string, string> = {};
    for (const line of block.split("\n")) {
      const at = line.indexOf(":");
      if (at <= 0) continue;
      const key = line.slice(0, at);
      fields[key] = (fields[key] === undefined ? "" : `${fields[key]}\n`) + line.slice(at + 1).replace(/^ /, "");
    }
    if (fields.data === undefined && fields.retry === undefined) continue;
    events.push({
      ...(fields.id === undefined ? {} : { id: fields.id }),
      event: fields.event ?? "message",
      data: fields.data ?? "",
      ...(fields.retry === undefined ? {} : { retry: Number(fields.retry) }),
    });
  }
  return { events, rest };
}

/** An open stream: read events one at a time as they arrive, or to the end. */
export interface OpenStream {
  readonly status: number;
  readonly headers: Headers;
  next(): Promise<SseEvent | undefined>;
  /** Events until `pred` holds (the matching one included); fails if the stream ends first. */
  until(pred: (e: SseEvent) => boolean): Promise<SseEvent[]>;
  /** Every event until the server ends the stream. */
  toEnd(): Promise<SseEvent[]>;
  cancel(): Promise<void>;
}

export async function openStream(h: Harness, path: string, token: string, headers: Record<string, string> = {}): Promise<OpenStream> {
  const res = await h.app.request(path, { headers: { authorization: `Bearer ${token}`, ...headers } });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const queue: SseEvent[] = [];
  let ended = false;
  const next = async (): Promise<SseEvent | undefined> => {
    while (queue.length === 0 && !ended) {
      const { value, done } = await reader.read();
      if (done) ended = true;
      else {
        const parsed = parseSse(buffer + decoder.decode(value, { stream: true }));
        buffer = parsed.rest;
        queue.push(...parsed.events);
      }
    }
    return queue.shift();
  };
  return {
    status: res.status,
    headers: res.headers,
    next,
    async until(pred) {
      const seen: SseEvent[] = [];
      for (;;) {
        const e = await next();
        if (e === undefined) throw new Error(`the stream ended before the event awaited; saw ${JSON.stringify(seen)}`);
        seen.push(e);
        if (pred(e)) return seen;
      }
    },
    async toEnd() {
      const seen: SseEvent[] = [];
      for (let e = await next(); e !== undefined; e = await next()) seen.push(e);
      return seen;
    },
    cancel: () => reader.cancel(),
  };
}

const rowOf = (e: SseEvent) =>
  JSON.parse(e.data) as { cursor: string; job_id: string; kind: string; actor: { type: string; token_id?: string } };

/**
 * The change feed over HTTP (`GET /v1/events`, `GET /v1/events/stream`), through
 * `app.request()`, over one family of adapters; every answer checked against the
 * served document (the harness's Ajv check). `streams` says whether the stream's
 * tests can run there (DynamoDB on dynalite has no stream to derive rows from).
 */
export function apiFeedSuite(name: string, factory: PortsFactory): void {
  describe(`the change feed over HTTP, on ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}) => makeHarness(factory, { feed: { pollMs: 10 }, ...opts }, cleanup);
    const newId = () => `job-${randomUUID().slice(0, 12)}`;

    async function register(h: Harness): Promise<string> {
      const res = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: newId(), prompt: "p", agent: "codex" } });
      expect(res.status, res.text).toBe(201);
      return res.body.job_id;
    }
    async function dispatch(h: Harness, jobId: string, attempt = 1): Promise<string> {
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: attempt, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      return res.body.agent_token;
    }
    const claim = (h: Harness, jobId: string, token: string, seq = 0): Promise<Res> =>
      h.call("POST", `/v1/jobs/${jobId}/transitions`, { token, json: { action: "claim", expected_seq: seq } });
    const feed = (h: Harness, token: string, query = ""): Promise<Res> => h.call("GET", `/v1/events${query}`, { token });

    it("reads every committed change with its actor's token id (never the token), paged with an always-present cursor", async () => {
      const h = await harness();
      const jobId = await register(h);
      const agentToken = await dispatch(h, jobId);
      expect((await claim(h, jobId, agentToken)).status).toBe(200);
      const first = await feed(h, h.operator, "?limit=2");
      expect(first.status, first.text).toBe(200);
      expect(first.body.items.map((r: { kind: string }) => r.kind)).toEqual(["job.registered", "dispatch.recorded"]);
      const rest = await feed(h, h.operator, `?after=${encodeURIComponent(first.body.cursor)}`);
      expect(rest.body.items.map((r: { kind: string; data: unknown }) => [r.kind, r.data])).toEqual([
        ["job.transitioned", { action: "claim", status: "running", transition_seq: 1 }],
      ]);
      const operatorJti = h.tokens.verify(h.operator).tokenId;
      const agentJti = h.tokens.verify(agentToken).tokenId;
      expect([...first.body.items, ...rest.body.items].map((r: { actor: unknown }) => r.actor)).toEqual([
        { type: "operator", token_id: operatorJti },
        { type: "operator", token_id: operatorJti },
        { type: "agent", token_id: agentJti },
      ]);
      expect(first.text + rest.text).not.toContain(agentToken);
      const empty = await feed(h, h.operator, `?after=${encodeURIComponent(rest.body.cursor)}`);
      expect(empty.body).toEqual({ items: [], cursor: rest.body.cursor });
    });

    it("issue 17: an upload declaration is report.upload_declared by the agent who made it (what it declared), and the bytes that arrive report.staged", async () => {
      const h = await harness();
      const jobId = await register(h);
      const agentToken = await dispatch(h, jobId);
      const body = new TextEncoder().encode("# Report\n\nUploaded around the body limit.\n");
      const sha256 = createHash("sha256").update(body).digest("hex");
      const declared = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/report/upload`, {
        token: agentToken,
        json: { sha256, bytes: body.byteLength },
      });
      expect(declared.status, declared.text).toBe(200);
      const sent = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: agentToken,
        body,
        headers: { "content-type": "application/octet-stream" },
      });
      expect(sent.status, sent.text).toBe(201);
      const agentJti = h.tokens.verify(agentToken).tokenId;
      const rows = (await feed(h, h.operator)).body.items.slice(2);
      expect(rows.map((r: { kind: string; actor: unknown; data: unknown }) => [r.kind, r.actor, r.data])).toEqual([
        ["report.upload_declared", { type: "agent", token_id: agentJti }, { attempt_id: 1, sha256, bytes: body.byteLength }],
        ["report.staged", { type: "agent", token_id: agentJti }, { attempt_id: 1, sha256, bytes: body.byteLength }],
      ]);
    });

    it("issue 20: a new observation is observation.recorded (who, kind, state) by the watcher's token; a coalesced repeat adds no row", async () => {
      const h = await harness();
      const jobId = await register(h);
      const session = randomUUID();
      const res = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 1, agent_session_uuid: session, pane_process_generation: 1 },
      });
      expect(res.status, res.text).toBe(201);
      const watcher = h.tokens.mintOperator(["observe"], { name: "herdr-1" });
      const observe = (state: string) =>
        h.call("POST", `/v1/jobs/${jobId}/observations`, {
          token: watcher,
          json: {
            state,
            source_kind: "pane_status",
            attempt_id: 1,
            agent_session_uuid: session,
            pane_process_generation: 1,
            observed_at: h.clock.now().toISOString(),
          },
        });
      expect((await observe("working")).status).toBe(201);
      expect((await observe("idle")).status).toBe(201);
      expect((await observe("idle")).status).toBe(200);
      const rows = (await feed(h, h.operator)).body.items.slice(2);
      const watcherJti = h.tokens.verify(watcher).tokenId;
      expect(rows.map((r: { kind: string; actor: unknown; data: unknown }) => [r.kind, r.actor, r.data])).toEqual([
        [
          "observation.recorded",
          { type: "operator", token_id: watcherJti },
          { attempt_id: 1, source: "watcher:herdr-1", source_kind: "pane_status", state: "working" },
        ],
        [
          "observation.recorded",
          { type: "operator", token_id: watcherJti },
          { attempt_id: 1, source: "watcher:herdr-1", source_kind: "pane_status", state: "idle" },
        ],
      ]);
    });

    it("an agent token reads only its own job's rows", async () => {
      const h = await harness();
      const mine = await register(h);
      const theirs = await register(h);
      const agentToken = await dispatch(h, mine);
      await dispatch(h, theirs);
      const res = await feed(h, agentToken);
      expect(res.status, res.text).toBe(200);
      expect(new Set(res.body.items.map((r: { job_id: string }) => r.job_id))).toEqual(new Set([mine]));
      expect(res.body.items.map((r: { kind: string }) => r.kind)).toEqual(["job.registered", "dispatch.recorded"]);
      const everything = await feed(h, h.operator);
      expect(new Set(everything.body.items.map((r: { job_id: string }) => r.job_id))).toEqual(new Set([mine, theirs]));
    });

    it("issue 22: ?job_id= reads one job's rows for an operator, paged; an agent naming another job is 403, naming its own is its rows", async () => {
      const h = await harness();
      const mine = await register(h);
      const theirs = await register(h);
      const agentToken = await dispatch(h, mine);
      await dispatch(h, theirs);
      const one = await h.call("GET", `/v1/events?job_id=${theirs}&limit=1`, { token: h.operator });
      expect(one.status, one.text).toBe(200);
      expect(one.body.items.map((r: { job_id: string; kind: string }) => [r.job_id, r.kind])).toEqual([[theirs, "job.registered"]]);
      const rest = await h.call("GET", `/v1/events?job_id=${theirs}&after=${encodeURIComponent(one.body.cursor)}`, { token: h.operator });
      expect(rest.body.items.map((r: { job_id: string; kind: string }) => [r.job_id, r.kind])).toEqual([[theirs, "dispatch.recorded"]]);
      expect((await h.call("GET", `/v1/events?job_id=${theirs}`, { token: agentToken })).status).toBe(403);
      const own = await h.call("GET", `/v1/events?job_id=${mine}`, { token: agentToken });
      expect(new Set(own.body.items.map((r: { job_id: string }) => r.job_id))).toEqual(new Set([mine]));
      const bad = await h.call("GET", "/v1/events?job_id=not%20an%20id", { token: h.operator });
      expect(bad.status).toBe(400);
    });

    it("a cursor it did not hand out is a 400 problem naming query.after; a limit out of range names query.limit", async () => {
      const h = await harness();
      await register(h);
      for (const after of ["not-a-cursor", "eyJsIjoiam9icyIsImMiOiJ4In0", "eyJsIjoiZmVlZCIsImMiOiJ4In0"]) {
        const res = await feed(h, h.operator, `?after=${after}`);
        expect(res.status, after).toBe(400);
        expect(res.headers.get("content-type")).toMatch(PROBLEM);
        expect(res.body.errors.map((i: { path: string }) => i.path)).toEqual(["query.after"]);
      }
      for (const limit of ["0", "1001", "x"]) {
        const res = await feed(h, h.operator, `?limit=${limit}`);
        expect(res.status, limit).toBe(400);
        expect(res.body.errors.map((i: { path: string }) => i.path)).toEqual(["query.limit"]);
      }
      const stream = await h.call("GET", "/v1/events/stream", { token: h.operator, headers: { "last-event-id": "not-a-cursor" } });
      expect(stream.status).toBe(400);
      expect(stream.body.errors.map((i: { path: string }) => i.path)).toEqual(["query.after"]);
    });

    it("a token travels only in the Authorization header: ?token= alone and a cookie alone are 401, on both routes", async () => {
      const h = await harness();
      for (const path of ["/v1/events", "/v1/events/stream"]) {
        const inQuery = await h.call("GET", `${path}?token=${encodeURIComponent(h.operator)}`);
        expect(inQuery.status, path).toBe(401);
        expect(inQuery.body.code).toBe("auth.missing");
        for (const cookie of [`token=${h.operator}`, `Authorization=Bearer ${h.operator}`, `access_token=${h.operator}`]) {
          const inCookie = await h.call("GET", path, { headers: { cookie } });
          expect(inCookie.status, `${path} ${cookie.split("=")[0]}`).toBe(401);
        }
      }
    });

    it("needs the read scope of an operator", async () => {
      const h = await harness();
      const writer = h.tokens.mintOperator(["write"]);
      const res = await feed(h, writer);
      expect(res.status).toBe(403);
      expect(res.body.required_scope).toBe("read");
    });

    it("the stream sends each row as it commits (id: cursor, event: kind, data: row) and resumes after Last-Event-ID", async () => {
      const h = await harness();
      const jobId = await register(h);
      const stream = await openStream(h, "/v1/events/stream", h.operator);
      expect(stream.status).toBe(200);
      expect(stream.headers.get("content-type")).toMatch(/^text\/event-stream/);
      const registered = (await stream.until((e) => e.event === "job.registered")).at(-1)!;
      expect(registered.id).toBe(rowOf(registered).cursor);
      expect(rowOf(registered).job_id).toBe(jobId);
      // A commit after the stream opened arrives on it.
      const second = await register(h);
      const arrived = (await stream.until((e) => e.event === "job.registered")).at(-1)!;
      expect(rowOf(arrived).job_id).toBe(second);
      await stream.cancel();

      // Resuming after the first row: the second comes first, nothing before it.
      const resumed = await openStream(h, "/v1/events/stream", h.operator, { "last-event-id": registered.id! });
      const rows = (await resumed.until((e) => e.event === "job.registered")).filter((e) => e.id !== undefined);
      expect(rows.map((e) => rowOf(e).job_id)).toEqual([second]);
      await resumed.cancel();
    });

    it("issue 22: the stream says `event: head` once its backlog is sent, and ?job_id= narrows it to one job's rows", async () => {
      const h = await harness();
      const jobId = await register(h);
      const other = await register(h);
      const stream = await openStream(h, `/v1/events/stream?job_id=${jobId}`, h.operator);
      const backlog = await stream.until((e) => e.event === "head");
      expect(backlog.map((e) => e.event)).toEqual(["open", "job.registered", "head"]);
      expect(rowOf(backlog[1]!).job_id).toBe(jobId);
      expect(JSON.parse(backlog[2]!.data)).toEqual({ cursor: backlog[1]!.id });
      // Later rows of that job follow; the other job's never do, and no second head.
      await dispatch(h, other);
      await dispatch(h, jobId);
      const later = await stream.until((e) => e.event === "dispatch.recorded");
      expect(later.map((e) => e.event)).toEqual(["dispatch.recorded"]);
      expect(rowOf(later[0]!).job_id).toBe(jobId);
      await stream.cancel();
    });

    it("issue 22: ?from=head answers no rows and the head's cursor; after it, exactly the rows committed since", async () => {
      const h = await harness();
      const empty = await feed(h, h.operator, "?from=head");
      expect(empty.status, empty.text).toBe(200);
      expect(empty.body.items).toEqual([]);
      const first = await register(h);
      const fromEmpty = await feed(h, h.operator, `?after=${encodeURIComponent(empty.body.cursor)}`);
      expect(fromEmpty.body.items.map((r: { job_id: string }) => r.job_id)).toEqual([first]);

      const old = await register(h);
      await dispatch(h, old);
      const head = await feed(h, h.operator, "?from=head");
      expect(head.body.items).toEqual([]);
      expect((await feed(h, h.operator, `?after=${encodeURIComponent(head.body.cursor)}`)).body.items).toEqual([]);
      const later = await register(h);
      const agentToken = await dispatch(h, later);
      expect((await claim(h, later, agentToken)).status).toBe(200);
      const since = await feed(h, h.operator, `?after=${encodeURIComponent(head.body.cursor)}`);
      expect(since.body.items.map((r: { job_id: string; kind: string }) => [r.job_id, r.kind])).toEqual([
        [later, "job.registered"],
        [later, "dispatch.recorded"],
        [later, "job.transitioned"],
      ]);
      // An agent token's head is its own job's: after it, its job's later rows only.
      const agentHead = await feed(h, agentToken, "?from=head");
      expect(agentHead.status, agentHead.text).toBe(200);
      await register(h);
      const progress = await h.call("POST", `/v1/jobs/${later}/transitions`, {
        token: agentToken,
        json: { action: "progress", expected_seq: 1, fields: { progress: { step: 1 } } },
      });
      expect(progress.status, progress.text).toBe(200);
      const agentSince = await feed(h, agentToken, `?after=${encodeURIComponent(agentHead.body.cursor)}`);
      expect(agentSince.body.items.map((r: { job_id: string; kind: string }) => [r.job_id, r.kind])).toEqual([[later, "job.transitioned"]]);
    });

    it("issue 22: from=head with after or job_id is a 400 problem naming that field, on both routes; any other from names query.from", async () => {
      const h = await harness();
      const jobId = await register(h);
      const cursor = (await feed(h, h.operator, "?from=head")).body.cursor as string;
      for (const path of ["/v1/events", "/v1/events/stream"]) {
        for (const [query, fields] of [
          [`from=head&after=${encodeURIComponent(cursor)}`, ["query.after"]],
          [`from=head&job_id=${jobId}`, ["query.job_id"]],
          [`from=head&after=${encodeURIComponent(cursor)}&job_id=${jobId}`, ["query.after", "query.job_id"]],
          ["from=tail", ["query.from"]],
        ] as const) {
          const res = await h.call("GET", `${path}?${query}`, { token: h.operator });
          expect(res.status, `${path}?${query}`).toBe(400);
          expect(res.headers.get("content-type")).toMatch(PROBLEM);
          expect(res.body.code).toBe("input.invalid");
          expect(res.body.errors.map((i: { path: string }) => i.path).sort()).toEqual([...fields]);
        }
      }
    });

    it("issue 22: the stream from=head sends `event: head` at once, then only rows committed after it; Last-Event-ID still wins", async () => {
      const h = await harness();
      const before = await register(h);
      await dispatch(h, before);
      const stream = await openStream(h, "/v1/events/stream?from=head", h.operator);
      expect(stream.status).toBe(200);
      const opening = await stream.until((e) => e.event === "head");
      expect(opening.map((e) => e.event)).toEqual(["open", "head"]);
      const head = opening[1]!;
      expect(head.id).toBe(JSON.parse(head.data).cursor);
      expect((await feed(h, h.operator, "?from=head")).body.cursor).toBe(head.id);
      const after = await register(h);
      const arrived = await stream.until((e) => e.event === "job.registered");
      expect(arrived.map((e) => [e.event, rowOf(e).job_id])).toEqual([["job.registered", after]]);
      await stream.cancel();

      // A reconnect resumes where it left off: the header wins over from=head.
      const resumed = await openStream(h, "/v1/events/stream?from=head", h.operator, { "last-event-id": head.id! });
      const rows = await resumed.until((e) => e.event === "head");
      expect(rows.filter((e) => e.event === "job.registered").map((e) => rowOf(e).job_id)).toEqual([after]);
      await resumed.cancel();

      // Where responses cannot stream: the head alone, with its id, for the EventSource to resume from.
      const now = await makeHarness(factory, { feed: { streaming: false, retryMs: 1500 } }, cleanup);
      await register(now);
      const answer = await now.call("GET", "/v1/events/stream?from=head", { token: now.operator });
      const { events } = parseSse(answer.text);
      expect(events.map((e) => e.event)).toEqual(["message", "head"]);
      expect(events[1]!.id).toBe((await feed(now, now.operator, "?from=head")).body.cursor);
    });

    it("closes when its token expires (the test clock past the token's expiry)", async () => {
      const h = await harness();
      const jobId = await register(h);
      const agentToken = await dispatch(h, jobId);
      const stream = await openStream(h, "/v1/events/stream", agentToken);
      await stream.until((e) => e.event === "dispatch.recorded");
      h.clock.advance(25 * 3600 * 1000);
      const closing = (await stream.toEnd()).at(-1);
      expect(closing?.event).toBe("close");
      expect(JSON.parse(closing!.data).reason).toMatch(/expired/);
    });

    it("closes when its agent's attempt is retired by a newer dispatch", async () => {
      const h = await harness();
      const jobId = await register(h);
      const agentToken = await dispatch(h, jobId, 1);
      const stream = await openStream(h, "/v1/events/stream", agentToken);
      await stream.until((e) => e.event === "dispatch.recorded");
      await dispatch(h, jobId, 2);
      const closing = (await stream.toEnd()).at(-1);
      expect(closing?.event).toBe("close");
      expect(JSON.parse(closing!.data).reason).toMatch(/superseded by attempt 2/);
    });

    it("where responses cannot stream (Lambda), answers the rows there now with retry: and ends, resuming after Last-Event-ID", async () => {
      const h = await harness({ feed: { streaming: false, retryMs: 1500 } });
      const a = await register(h);
      const b = await register(h);
      const res = await h.call("GET", "/v1/events/stream", { token: h.operator });
      expect(res.status).toBe(200);
      const { events } = parseSse(res.text);
      expect(events[0]?.retry).toBe(1500);
      const rows = events.filter((e) => e.id !== undefined);
      expect(rows.map((e) => rowOf(e).job_id)).toEqual([a, b]);
      const after = await h.call("GET", "/v1/events/stream", { token: h.operator, headers: { "last-event-id": rows[0]!.id! } });
      expect(
        parseSse(after.text)
          .events.filter((e) => e.id !== undefined)
          .map((e) => rowOf(e).job_id),
      ).toEqual([b]);
    });

    it("bounds open streams: past the bound, a stream answers what is there and ends instead of holding a connection", async () => {
      const h = await harness({ feed: { pollMs: 10, maxStreams: 1 } });
      await register(h);
      const held = await openStream(h, "/v1/events/stream", h.operator);
      await held.until((e) => e.event === "job.registered");
      const extra = await h.call("GET", "/v1/events/stream", { token: h.operator });
      expect(extra.status).toBe(200);
      expect(parseSse(extra.text).events.filter((e) => e.event === "job.registered")).toHaveLength(1);
      await held.cancel();
    });

    it("ends every open stream at once when the service stops (its shutdown signal)", async () => {
      const shutdown = new AbortController();
      const h = await harness({ feed: { pollMs: 60_000, shutdown: shutdown.signal } });
      await register(h);
      const stream = await openStream(h, "/v1/events/stream", h.operator);
      await stream.until((e) => e.event === "job.registered");
      shutdown.abort();
      expect(await stream.toEnd()).toEqual([]);
    });
  });
}
