import { rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type * as Api from "@mam/api";
import { type Deps, parseFlags, randomIds } from "@mam/core";
import { FileReportStore, MqttPublisher, openEmbeddedJobStore } from "@mam/local";
import { build } from "esbuild";
import type { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import { tempDir } from "../support/temp-dir.ts";
import { SIGNING_KEY, send } from "./harness.ts";

/**
 * The app bundled as for Lambda (esbuild, one file, outside any node_modules): the
 * swagger-ui-dist package is not there, so the docs assets answer a 404 problem
 * while every other route, /docs included, still works.
 */
describe("the app bundled without swagger-ui-dist", () => {
  let dir: string;
  let app: Hono;
  let closeJobs: (() => Promise<void>) | undefined;

  beforeAll(async () => {
    dir = (await tempDir("api-bundle")).dir;
    const entry = fileURLToPath(new URL("../../packages/api/src/index.ts", import.meta.url));
    const outfile = path.join(dir, "app.mjs");
    await build({ entryPoints: [entry], bundle: true, platform: "node", format: "esm", target: "node20", outfile, logLevel: "silent" });
    // The bundle carries its own copy of every module: use its token service too.
    const bundled = (await import(pathToFileURL(outfile).href)) as typeof Api;
    const embedded = openEmbeddedJobStore(":memory:");
    closeJobs = embedded.close;
    const clock = new TestClock("2026-11-20T10:00:00Z");
    const deps: Deps = {
      jobs: embedded.jobs,
      reports: new FileReportStore(dir, { allowAbsolute: false }),
      publisher: new MqttPublisher({ url: "mqtt://127.0.0.1:1" }),
      clock,
      ids: randomIds,
      flags: parseFlags({}),
    };
    app = bundled.createApp({
      deps,
      tokens: bundled.createTokenService({ signingKey: SIGNING_KEY, clock }),
      log: () => {},
    }) as unknown as Hono;
  }, 60_000);

  afterAll(async () => {
    await closeJobs?.();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("answers the asset route with a 404 problem, and still serves /docs, /openapi.json and /healthz", async () => {
    const asset = await send(app, "GET", "/docs/assets/swagger-ui.css");
    expect(asset.status).toBe(404);
    expect(asset.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    expect(asset.body).toMatchObject({ code: "route.notFound", status: 404 });
    expect((await send(app, "GET", "/docs")).status).toBe(200);
    expect((await send(app, "GET", "/openapi.json")).body.openapi).toBe("3.1.0");
    expect((await send(app, "GET", "/healthz")).body).toEqual({ ok: true });
  });
});
