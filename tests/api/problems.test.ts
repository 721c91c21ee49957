import { rm } from "node:fs/promises";
import { createApp, createTokenService, HTTP_STATUS, RETRY_AFTER_SECONDS } from "@mam/api";
import { type Deps, ERROR_TABLE, type JobStore, MamError, parseFlags, randomIds } from "@mam/core";
import { FileReportStore, MqttPublisher, SqliteJobStore } from "@mam/local";
import type { Hono } from "hono";
import { afterAll, describe, expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import { tempDir } from "../support/temp-dir.ts";
import { SIGNING_KEY, send } from "./harness.ts";

describe("each error code's HTTP status (core keeps code, title, retryable; the API maps each once)", () => {
  it("the map is total: every code of core's closed set has exactly one status, and nothing else does", () => {
    expect(Object.keys(HTTP_STATUS).sort()).toEqual(Object.keys(ERROR_TABLE).sort());
    for (const [code, status] of Object.entries(HTTP_STATUS)) {
      expect(status >= 400 && status <= 599, code).toBe(true);
      expect(ERROR_TABLE[code as keyof typeof ERROR_TABLE]).not.toHaveProperty("status");
    }
  });

  it("a 503 is a code worth retrying; a code not worth retrying is never a 503", () => {
    for (const [code, status] of Object.entries(HTTP_STATUS)) {
      if (status === 503) expect(ERROR_TABLE[code as keyof typeof ERROR_TABLE].retryable, code).toBe(true);
    }
  });

  describe("Retry-After on 503", () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterAll(async () => {
      for (const c of cleanup.reverse()) await c();
    });

    it("a store that cannot be reached is a 503 problem with Retry-After, and the same is declared in the document", async () => {
      const dir = (await tempDir("api-503")).dir;
      const store = new SqliteJobStore(":memory:");
      cleanup.push(
        () => rm(dir, { recursive: true, force: true }),
        () => store.close(),
      );
      const unreachable = new Proxy(store, {
        get(target, prop, receiver) {
          if (prop === "get") {
            return async () => {
              throw new MamError("store.unavailable", "the job store could not be reached");
            };
          }
          const value = Reflect.get(target, prop, receiver);
          return typeof value === "function" ? value.bind(target) : value;
        },
      }) as JobStore;
      const clock = new TestClock("2026-11-20T10:00:00Z");
      const deps: Deps = {
        jobs: unreachable,
        reports: new FileReportStore(dir, { allowAbsolute: false }),
        publisher: new MqttPublisher({ url: "mqtt://127.0.0.1:1" }),
        clock,
        ids: randomIds,
        flags: parseFlags({}),
      };
      const tokens = createTokenService({ signingKey: SIGNING_KEY, clock });
      const app = createApp({ deps, tokens, log: () => {} }) as unknown as Hono;
      const res = await send(app, "GET", "/v1/jobs/job-4f2a", { token: tokens.mintOperator(["read"]) });
      expect(res.status).toBe(503);
      expect(res.headers.get("content-type")).toMatch(/^application\/problem\+json/);
      expect(res.body).toMatchObject({ status: 503, code: "store.unavailable" });
      expect(res.headers.get("retry-after")).toBe(String(RETRY_AFTER_SECONDS));
    });
  });
});
