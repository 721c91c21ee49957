import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { connect } from "node:net";
import { serve } from "@hono/node-server";
import { afterEach, describe, expect, it } from "vitest";
import { type Harness, makeHarness, type PortsFactory } from "./harness.ts";

const REPORT = "# Report\n\nNothing pushed, nothing called.\n";

/** One HTTP/1.1 request written on a socket as given (no framing header added), and the answer's status, headers and body. */
async function rawRequest(port: number, head: string, body = ""): Promise<{ status: number; headers: string; body: string }> {
  const socket = connect(port, "127.0.0.1");
  socket.write(`${head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n${body}`);
  let text = "";
  for await (const chunk of socket) text += String(chunk);
  const [headers = "", rest = ""] = text.split("\r\n\r\n", 2);
  return { status: Number(headers.split(" ")[1]), headers, body: rest };
}

/**
 * Issue 16: `POST .../finalize` with no body is `{"side_effects": []}`, over a real
 * HTTP server (@hono/node-server, as `mam serve` runs the app), on the wire as a
 * client writes it: no body and no framing header, `Content-Length: 0`, no
 * Content-Type. A body that says it is JSON and is not stays a 400 problem.
 */
export function apiFinalizeBodySuite(name: string, factory: PortsFactory): void {
  describe(`finalize with an empty body over ${name}, on a real HTTP server`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });

    async function served(): Promise<{ h: Harness; port: number }> {
      const h = await makeHarness(factory, {}, cleanup);
      const { port, close } = await new Promise<{ port: number; close: () => Promise<void> }>((resolve) => {
        const server = serve({ fetch: h.app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) =>
          resolve({ port: info.port, close: () => new Promise((done) => server.close(() => done())) }),
        );
      });
      cleanup.push(close);
      return { h, port };
    }

    async function stagedJob(h: Harness): Promise<{ jobId: string; agent: string }> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      expect(
        (await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "tidy", agent: "codex" } })).status,
      ).toBe(201);
      const d = await h.call("POST", `/v1/jobs/${jobId}/dispatches`, {
        token: h.operator,
        json: { attempt_id: 1, agent_session_uuid: randomUUID(), pane_process_generation: 1 },
      });
      const agent: string = d.body.agent_token;
      const staged = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: agent,
        body: REPORT,
        headers: { "content-type": "text/markdown" },
      });
      expect(staged.status, staged.text).toBe(201);
      return { jobId, agent };
    }

    it.each([
      ["no body and no framing header", ""],
      ["Content-Length: 0 and no Content-Type", "\r\nContent-Length: 0"],
    ])("issue 16: a finalize with %s is the empty list of side effects", async (_, framing) => {
      const { h, port } = await served();
      const { jobId, agent } = await stagedJob(h);
      const res = await rawRequest(port, `POST /v1/jobs/${jobId}/attempts/1/finalize HTTP/1.1\r\nAuthorization: Bearer ${agent}${framing}`);
      expect(res.status, res.body).toBe(200);
      const answer = JSON.parse(res.body);
      expect(answer.manifest).toMatchObject({ job_id: jobId, attempt_id: 1, side_effects: [] });
      // exactly what {"side_effects": []} gives: the manifest the service verifies
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(v.body).toMatchObject({ ok: true, manifest_sha256: answer.manifest_sha256 });
      const listed = await fetch(`http://127.0.0.1:${port}/v1/jobs/${jobId}/attempts/1/finalize`, {
        method: "POST",
        headers: { authorization: `Bearer ${agent}`, "content-type": "application/json" },
        body: JSON.stringify({ side_effects: [] }),
      });
      expect(listed.status).toBe(200);
      expect(((await listed.json()) as { manifest: { side_effects: unknown } }).manifest.side_effects).toEqual([]);
    });

    it.each([
      ["malformed JSON", '{"side_effects": ['],
      ["an empty body that says it is JSON", ""],
    ])("issue 16: %s is still a 400 problem naming the body, and finalizes nothing", async (_, body) => {
      const { h, port } = await served();
      const { jobId, agent } = await stagedJob(h);
      const res = await fetch(`http://127.0.0.1:${port}/v1/jobs/${jobId}/attempts/1/finalize`, {
        method: "POST",
        headers: { authorization: `Bearer ${agent}`, "content-type": "application/json" },
        body,
      });
      expect(res.status).toBe(400);
      expect(res.headers.get("content-type")).toMatch(/^application\/problem\+json/);
      const problem = (await res.json()) as { code: string; errors: { path: string }[] };
      expect(problem.code).toBe("input.invalid");
      expect(problem.errors[0]?.path).toBe("body");
      const v = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(v.body).toMatchObject({ ok: false, manifest: null });
    });
  });
}
