import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createApp, createTokenService } from "@mam/api";
import { type Deps, parseFlags, randomIds } from "@mam/core";
import { FileReportStore, MqttPublisher, SqliteJobStore } from "@mam/local";
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import type { Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import { tempDir } from "../support/temp-dir.ts";
import { SIGNING_KEY } from "./harness.ts";

/**
 * The OpenAPI document as served: third-party linters find nothing in it, and it
 * holds what a generated client needs (examples everywhere, the seq contract, the
 * headers, the media types as served). That every answer matches it is checked on
 * every request of the API suites (harness.ts, openapi-check.ts).
 */

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const BIN = path.join(ROOT, "node_modules/.bin");
const LINT = path.join(ROOT, "tests/api/lint");

// biome-ignore lint/suspicious/noExplicitAny: the document, read field by field
type Doc = any;

let dir: string;
let jobs: SqliteJobStore;
let app: Hono;
let doc: Doc;
let file: string;

beforeAll(async () => {
  dir = (await tempDir("openapi")).dir;
  jobs = new SqliteJobStore(":memory:");
  const clock = new TestClock("2026-11-20T10:00:00Z");
  const deps: Deps = {
    jobs,
    reports: new FileReportStore(dir, { allowAbsolute: false }),
    publisher: new MqttPublisher({ url: "mqtt://127.0.0.1:1" }),
    clock,
    ids: randomIds,
    flags: parseFlags({}),
  };
  app = createApp({ deps, tokens: createTokenService({ signingKey: SIGNING_KEY, clock }), log: () => {} }) as unknown as Hono;
  const res = await app.request("/openapi.json");
  expect(res.headers.get("content-type")).toMatch(/^application\/json/);
  doc = await res.json();
  file = path.join(dir, "openapi.json");
  await writeFile(file, JSON.stringify(doc, null, 2));
});

afterAll(async () => {
  await jobs?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const operations = (): [string, Doc][] =>
  Object.entries(doc.paths as Record<string, Record<string, Doc>>).flatMap(([p, ops]) =>
    Object.entries(ops).map(([m, op]): [string, Doc] => [`${m.toUpperCase()} ${p}`, op]),
  );

describe("the served OpenAPI document, linted", () => {
  it("Redocly's recommended ruleset reports 0 errors and 0 warnings", () => {
    const run = spawnSync(path.join(BIN, "redocly"), ["lint", file, "--config", path.join(LINT, "redocly.yaml"), "--format", "json"], {
      cwd: dir,
      encoding: "utf8",
      env: { ...process.env, REDOCLY_TELEMETRY: "off", REDOCLY_SUPPRESS_UPDATE_NOTICE: "true" },
      timeout: 120_000,
    });
    const report = JSON.parse(run.stdout.slice(run.stdout.indexOf("{")));
    expect(report.problems, `${file}: ${run.stderr}`).toEqual([]);
    expect(report.totals).toEqual({ errors: 0, warnings: 0, ignored: 0 });
    expect(run.status).toBe(0);
  }, 120_000);

  it("Spectral's oas ruleset reports 0 errors and 0 warnings", () => {
    const output = path.join(dir, "spectral.json");
    const run = spawnSync(
      path.join(BIN, "spectral"),
      ["lint", file, "--ruleset", path.join(LINT, "spectral.yaml"), "--format", "json", "--output", output, "--fail-severity", "hint"],
      { cwd: dir, encoding: "utf8", timeout: 120_000 },
    );
    expect(JSON.parse(readFileSync(output, "utf8")), `${file}: ${run.stdout} ${run.stderr}`).toEqual([]);
    expect(run.status).toBe(0);
  }, 120_000);
});

describe("the served OpenAPI document, read by a client", () => {
  it("has a realistic example on every operation's request and answers, and no generated placeholder", () => {
    // What Swagger UI shows for a schema without an example: the largest safe
    // integer, and `additionalProp1` for an open object.
    const text = JSON.stringify(doc);
    expect(text.includes("9007199254740991"), "9007199254740991 in the document").toBe(false);
    expect(text.includes("additionalProp1"), "additionalProp1 in the document").toBe(false);
    for (const [key, op] of operations()) {
      for (const p of op.parameters ?? []) expect(p.example ?? p.schema?.example, `${key} parameter ${p.name}`).toBeDefined();
      for (const [media, m] of Object.entries<Doc>(op.requestBody?.content ?? {})) {
        if (media === "application/octet-stream") continue; // bytes: the text/markdown example stands for them
        expect(m.example ?? m.examples, `${key} request ${media}`).toBeDefined();
      }
      for (const [status, r] of Object.entries<Doc>(op.responses)) {
        for (const [media, m] of Object.entries<Doc>(r.content ?? {})) {
          if (!/json/.test(media)) continue; // HTML, scripts, styles and images are what they are
          expect(m.example ?? m.examples, `${key} ${status} ${media}`).toBeDefined();
        }
      }
    }
  });

  it("every example is valid against its own schema (Ajv over the document)", () => {
    const ajv = new Ajv2020({ strict: false, allErrors: true });
    addFormats.default(ajv);
    ajv.addSchema({ ...doc, $id: "https://mam.test/openapi.json" });
    let checked = 0;
    const esc = (s: string) => s.replaceAll("~", "~0").replaceAll("/", "~1");
    for (const [p, ops] of Object.entries<Doc>(doc.paths)) {
      for (const [m, op] of Object.entries<Doc>(ops)) {
        const media: [string, Doc][] = [
          ...Object.entries<Doc>(op.requestBody?.content ?? {}).map(([t, x]): [string, Doc] => [`requestBody/content/${esc(t)}`, x]),
          ...Object.entries<Doc>(op.responses).flatMap(([s, r]) =>
            Object.entries<Doc>(r.content ?? {}).map(([t, x]): [string, Doc] => [`responses/${s}/content/${esc(t)}`, x]),
          ),
        ];
        for (const [at, x] of media) {
          if (!/json/.test(at)) continue;
          const validate = ajv.getSchema(`https://mam.test/openapi.json#/paths/${esc(p)}/${m}/${at}/schema`)!;
          const values = x.example !== undefined ? [x.example] : Object.values<Doc>(x.examples ?? {}).map((e) => e.value);
          for (const value of values) {
            expect(validate(value), `${m.toUpperCase()} ${p} ${at}: ${JSON.stringify(validate.errors)}`).toBe(true);
            checked++;
          }
        }
      }
    }
    expect(checked).toBeGreaterThan(40);
  });

  it("states the seq contract so a generated client can send a valid transition: expected_seq or If-Match, an example of each, a 400 naming both", () => {
    const op = doc.paths["/v1/jobs/{job_id}/transitions"].post;
    const ifMatch = op.parameters.find((p: Doc) => p.in === "header" && p.name.toLowerCase() === "if-match");
    expect(ifMatch).toMatchObject({ required: false, schema: { type: "string" } });
    const examples = Object.values<Doc>(op.requestBody.content["application/json"].examples).map((e) => e.value);
    expect(examples.some((v) => typeof v.expected_seq === "number")).toBe(true);
    expect(examples.some((v) => v.expected_seq === undefined)).toBe(true);
    expect(doc.components.schemas.TransitionRequest.description).toMatch(/If-Match/);
    const bad = op.responses["400"].content["application/problem+json"].example;
    expect(bad.detail).toMatch(/expected_seq/);
    expect(bad.detail).toMatch(/If-Match/);
    expect(bad.errors).toEqual([{ path: "body.expected_seq", message: "required" }]);
    expect(op.responses["412"]).toBeDefined();
  });

  it("declares ETag, Location, X-Request-Id, WWW-Authenticate and Retry-After where they are sent", () => {
    const register = doc.paths["/v1/jobs"].post.responses["201"].headers;
    expect(Object.keys(register)).toEqual(expect.arrayContaining(["ETag", "Location", "X-Request-Id"]));
    expect(Object.keys(doc.paths["/v1/jobs/{job_id}"].get.responses["200"].headers)).toContain("ETag");
    for (const [key, op] of operations()) {
      for (const [status, r] of Object.entries<Doc>(op.responses)) {
        expect(Object.keys(r.headers ?? {}), `${key} ${status}`).toContain("X-Request-Id");
        if (status === "401" || status === "403") expect(Object.keys(r.headers), `${key} ${status}`).toContain("WWW-Authenticate");
        if (status === "503") expect(Object.keys(r.headers), `${key} ${status}`).toContain("Retry-After");
      }
    }
  });

  it("declares the media types the app serves: JSON for /openapi.json, each asset's own type, HTML pages, problems", async () => {
    expect(Object.keys(doc.paths["/openapi.json"].get.responses["200"].content)).toEqual(["application/json"]);
    expect(doc.paths["/openapi.json"].get.responses["200"].content["application/json"].schema).toEqual({
      $ref: "#/components/schemas/OpenApiDocument",
    });
    expect(Object.keys(doc.paths["/docs/assets/{file}"].get.responses["200"].content).sort()).toEqual([
      "image/png",
      "text/css",
      "text/javascript",
    ]);
    expect(Object.keys(doc.paths["/assets/{file}"].get.responses["200"].content).sort()).toEqual(["text/css", "text/javascript"]);
    for (const p of ["/", "/docs"]) expect(Object.keys(doc.paths[p].get.responses["200"].content)).toEqual(["text/html"]);
    for (const [key, op] of operations()) {
      for (const [status, r] of Object.entries<Doc>(op.responses)) {
        if (Number(status) >= 400) expect(Object.keys(r.content), `${key} ${status}`).toEqual(["application/problem+json"]);
      }
    }
  });

  it("documents free-form JSON (progress, event data) as bounded objects a generator can type, without recursion", () => {
    const progress = doc.components.schemas.JobRecord.properties.progress;
    expect(progress).toMatchObject({ type: "object", additionalProperties: true, "x-max-depth": 16 });
    const refs = new Set<string>();
    const walk = (v: unknown): void => {
      if (Array.isArray(v)) v.forEach(walk);
      else if (v !== null && typeof v === "object") for (const [k, x] of Object.entries(v)) k === "$ref" ? refs.add(x as string) : walk(x);
    };
    // No component refers to itself, directly or through others: nothing a generator must unfold forever.
    const refsOf = (name: string): string[] => {
      refs.clear();
      walk(doc.components.schemas[name]);
      return [...refs].map((r) => r.split("/").pop()!);
    };
    for (const name of Object.keys(doc.components.schemas)) {
      const seen = new Set<string>();
      const stack = refsOf(name);
      while (stack.length > 0) {
        const next = stack.pop()!;
        expect(next, `${name} refers back to itself`).not.toBe(name);
        if (seen.has(next)) continue;
        seen.add(next);
        stack.push(...refsOf(next));
      }
    }
  });
});
