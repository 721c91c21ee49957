import { randomUUID } from "node:crypto";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type AwsPeers, startAwsPeers } from "../support/aws-backend.ts";
import { makeHarness } from "./harness.ts";

// The feed's routes on the AWS adapters over dynalite. dynalite keeps no stream, and the
// DynamoDB feed is derived from the stream (docs/notifications.md): here no row can
// appear, so what is checked is the answer's shape, the cursor and the token rules. The
// rows themselves, on DynamoDB, are tests/engine/feed.test.ts (DynamoDB Local's stream).

let peers: AwsPeers;
beforeAll(async () => {
  peers = await startAwsPeers();
});
afterAll(async () => {
  await peers?.close();
});

describe("the change feed over HTTP, on the AWS adapters (dynalite: no stream, so no rows)", () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  it("answers an empty page with a cursor to continue from, refuses a foreign cursor naming query.after, and a token outside the header", async () => {
    const h = await makeHarness((opts) => peers.ports(opts), { feed: { streaming: false } }, cleanup);
    const reg = await h.call("POST", "/v1/jobs", {
      token: h.operator,
      json: { job_id: `aws-${randomUUID().slice(0, 8)}`, prompt: "p", agent: "codex" },
    });
    expect(reg.status).toBe(201);
    const page = await h.call("GET", "/v1/events", { token: h.operator });
    expect(page.status, page.text).toBe(200);
    expect(page.body.items).toEqual([]);
    const again = await h.call("GET", `/v1/events?after=${encodeURIComponent(page.body.cursor)}`, { token: h.operator });
    expect(again.body).toEqual({ items: [], cursor: page.body.cursor });
    const bad = await h.call("GET", "/v1/events?after=eyJsIjoiZmVlZCIsImMiOiJ4In0", { token: h.operator });
    expect(bad.status).toBe(400);
    expect(bad.body.errors.map((i: { path: string }) => i.path)).toEqual(["query.after"]);
    expect((await h.call("GET", `/v1/events?token=${h.operator}`)).status).toBe(401);
    const stream = await h.call("GET", "/v1/events/stream", { token: h.operator });
    expect(stream.status).toBe(200);
    expect(stream.text).toMatch(/^retry: \d+\n\n$/);
  });
});
