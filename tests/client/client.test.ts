/**
 * @mam/client against the app in-process (its fetch is the app's): mam's conventions
 * — the bearer token, a problem as core's MamError with the problem's code, detail
 * and bad fields, a service that cannot be reached as `service.unreachable`.
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import { createApp, createTokenService, SCOPES } from "@mam/api";
import { createMamClient, ok } from "@mam/client";
import { type Deps, isMamError, type MamError, parseFlags, randomIds, systemClock } from "@mam/core";
import { FileReportStore, SqliteJobStore } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deadPort } from "../support/dead-port.ts";
import { tempDir } from "../support/temp-dir.ts";

const BASE = "http://mam.test";
let dir: string;
let jobs: SqliteJobStore;
let appFetch: typeof fetch;
let operator: string;

beforeAll(async () => {
  dir = (await tempDir("client")).dir;
  jobs = new SqliteJobStore(path.join(dir, "mam.db"));
  const deps: Deps = {
    jobs,
    reports: new FileReportStore(dir, { allowAbsolute: false }),
    publisher: { publish: async () => undefined },
    clock: systemClock,
    ids: randomIds,
    flags: parseFlags({}),
  };
  const tokens = createTokenService({ signingKey: "client-test-signing-key-0123456789abcdef", clock: systemClock });
  operator = tokens.mintOperator(SCOPES);
  const app = createApp({ deps, tokens, log: () => undefined });
  appFetch = async (input, init) => app.fetch(new Request(input, init));
});

afterAll(async () => {
  await jobs.close();
  await rm(dir, { recursive: true, force: true });
});

/** The MamError a call rejects with. */
async function refusal(call: Promise<unknown>): Promise<MamError> {
  const e = await call.then(
    () => undefined,
    (err: unknown) => err,
  );
  if (!isMamError(e)) throw new Error(`expected a MamError, got ${String(e)}`);
  return e;
}

describe("@mam/client", () => {
  it("sends the bearer token and answers with the typed body", async () => {
    const client = createMamClient({ baseUrl: BASE, token: operator, fetch: appFetch });
    const job = await ok(client.POST("/v1/jobs", { body: { prompt: "p", agent: "codex", job_id: "client-typed" } }));
    expect(job).toMatchObject({ job_id: "client-typed", status: "pending", transition_seq: 0 });
    const read = await ok(client.GET("/v1/jobs/{job_id}", { params: { path: { job_id: "client-typed" } } }));
    expect(read.job_id).toBe("client-typed");
  });

  it("a problem becomes core's MamError with the problem's code and detail, and its status and request id in details", async () => {
    const anonymous = createMamClient({ baseUrl: BASE, fetch: appFetch });
    const e = await refusal(ok(anonymous.GET("/v1/jobs")));
    expect(e.code).toBe("auth.missing");
    expect(e.message).toMatch(/Bearer/);
    expect(e.details).toMatchObject({ status: 401, problem_code: "auth.missing", request_id: expect.any(String) });

    const client = createMamClient({ baseUrl: BASE, token: operator, fetch: appFetch });
    const missing = await refusal(ok(client.GET("/v1/jobs/{job_id}", { params: { path: { job_id: "no-such-job" } } })));
    expect(missing.code).toBe("job.notFound");
  });

  it("a validation problem's bad fields become the MamError's issues", async () => {
    const client = createMamClient({ baseUrl: BASE, token: operator, fetch: appFetch });
    // biome-ignore lint/suspicious/noExplicitAny: a body the types refuse, sent on purpose
    const e = await refusal(ok(client.POST("/v1/jobs", { body: { prompt: "p", agent: "codex", colour: "red" } as any })));
    expect(e.code).toBe("input.invalid");
    expect(e.issues.length).toBeGreaterThan(0);
    expect(e.issues.every((i) => typeof i.path === "string" && typeof i.message === "string")).toBe(true);
  });

  it("a 409 carries the record as it now stands in details.current", async () => {
    const client = createMamClient({ baseUrl: BASE, token: operator, fetch: appFetch });
    await ok(client.POST("/v1/jobs", { body: { prompt: "p", agent: "codex", job_id: "client-stale" } }));
    const e = await refusal(
      ok(
        client.POST("/v1/jobs/{job_id}/transitions", {
          params: { path: { job_id: "client-stale" } },
          body: { action: "claim", expected_seq: 7 },
        }),
      ),
    );
    expect(e.code).toBe("job.transitionConflict");
    expect(e.details.current).toMatchObject({ job_id: "client-stale", transition_seq: 0 });
  });

  it("a service that cannot be reached is service.unreachable (retryable)", async () => {
    const client = createMamClient({ baseUrl: `http://127.0.0.1:${await deadPort()}`, token: operator });
    const e = await refusal(ok(client.GET("/healthz")));
    expect(e.code).toBe("service.unreachable");
    expect(e.retryable).toBe(true);
    expect(e.message).toMatch(/could not be reached/);
  });

  it("an answer that is not mam's problem is named by its status: a gateway's 502 unreachable, a stray 404 bad input", async () => {
    const gateway: typeof fetch = async () =>
      new Response("<html>bad gateway</html>", { status: 502, headers: { "content-type": "text/html" } });
    const e = await refusal(ok(createMamClient({ baseUrl: BASE, fetch: gateway }).GET("/healthz")));
    expect(e.code).toBe("service.unreachable");
    expect(e.details).toMatchObject({ status: 502 });

    // A routing problem is not one of core's codes: kept in the message, mapped to bad input.
    const client = createMamClient({ baseUrl: `${BASE}/not-mam`, token: operator, fetch: appFetch });
    const stray = await refusal(ok(client.GET("/healthz")));
    expect(stray.code).toBe("input.invalid");
    expect(stray.message).toMatch(/route\.notFound/);
  });
});
