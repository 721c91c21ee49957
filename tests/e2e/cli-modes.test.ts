/**
 * Each `mam` command, run the same way in both modes — over the API (`--api`, an
 * agent's token) and on the store (`--data-dir`) — prints one `--json` shape: the
 * API's answer. Both modes run against one service (`startService`, what `mam serve`
 * runs, in-process): the API mode through its HTTP port, the embedded mode on its
 * data dir and its broker, each on a job of its own taken through the same steps.
 * `verify` reads and writes nothing, so both modes verify the same job, the one the
 * service finalized, and must print the same document; `verify --report-dir`, a
 * report directory in place, is its own flag.
 */
import { mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { type RunningService, runCli, startService } from "@mam/cli";
import { createMamClient, ok } from "@mam/client";
import { parseConfig } from "@mam/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { tempDir } from "../support/temp-dir.ts";

type Mode = "api" | "embedded";
type Who = "agent" | "operator";

interface Lane {
  readonly job: string;
  /** `<tree>/report-final.md`: the agent's own report. */
  readonly report: string;
  readonly tree: string;
  /** The flags that choose the mode, as the job's agent or as an operator (the API tells them apart by token). */
  readonly modeArgs: Record<Who, readonly string[]>;
  /** The environment: in embedded mode, where the service's broker listens (the CLI publishes there itself). */
  readonly env: Record<string, string>;
}

let root: string;
let service: RunningService;
const lanes = {} as Record<Mode, Lane>;

beforeAll(async () => {
  root = (await tempDir("cli-modes")).dir;
  const dataDir = path.join(root, "data");
  service = await startService(parseConfig({ MAM_DATA_DIR: dataDir, MAM_PORT: "0", MAM_MQTT_PORT: "0" }), () => undefined);
  const operator = createMamClient({ baseUrl: service.url, token: service.operatorToken });
  for (const mode of ["api", "embedded"] as const) {
    const job = `modes-${mode}`;
    await ok(operator.POST("/v1/jobs", { body: { job_id: job, prompt: "fix the flaky test", agent: "codex" } }));
    const dispatch = await ok(
      operator.POST("/v1/jobs/{job_id}/dispatches", {
        params: { path: { job_id: job } },
        body: { attempt_id: 1, agent_session_uuid: "0c9a2d11-0000-4000-8000-000000000001", pane_process_generation: 1 },
      }),
    );
    const tree = path.join(root, `tree-${mode}`);
    await mkdir(tree);
    await writeFile(path.join(tree, "report-final.md.tmp"), "# done\n\npushed a1b2c3d\n");
    lanes[mode] = {
      job,
      tree,
      report: path.join(tree, "report-final.md"),
      modeArgs:
        mode === "api"
          ? {
              agent: ["--api", service.url, "--token", dispatch.agent_token],
              operator: ["--api", service.url, "--token", service.operatorToken],
            }
          : { agent: ["--data-dir", dataDir], operator: ["--data-dir", dataDir] },
      env: mode === "api" ? {} : { MAM_MQTT_PORT: new URL(service.mqttUrl).port },
    };
  }
}, 30_000);

afterAll(async () => {
  await service?.stop();
  await rm(root, { recursive: true, force: true });
});

/** A JSON value's shape: its keys, recursively, and the type of each leaf; an array by the shapes of its elements. */
type Shape = string | Shape[] | { [key: string]: Shape };
function shapeOf(value: unknown): Shape {
  if (value === null) return "null";
  if (Array.isArray(value)) {
    const shapes = new Set(value.map((v) => JSON.stringify(shapeOf(v))));
    return [...shapes].sort().map((s) => JSON.parse(s) as Shape);
  }
  if (typeof value === "object") {
    const o = value as Record<string, unknown>;
    return Object.fromEntries(
      Object.keys(o)
        .sort()
        .map((k) => [k, shapeOf(o[k])]),
    );
  }
  return typeof value;
}

/**
 * `published` is said only where the answer knows: the command itself publishes in
 * --data-dir mode (true); over the API, `mam serve`'s relay publishes every commit and
 * the answer has no `published` (docs/decisions.md, "One publish path per process").
 */
function publishedIn(mode: Mode): Record<string, unknown> {
  return mode === "embedded" ? { published: true } : {};
}

function withoutPublished(doc: unknown): unknown {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return doc;
  const { published, ...rest } = doc as Record<string, unknown>;
  if (published !== undefined) expect(published).toBe(true);
  return rest;
}

/**
 * `record.agent_usage` is what the service charged an agent's token against its job's
 * quotas: over the API an agent's event is charged; in --data-dir mode the agent holds
 * the store's files themselves, nothing is charged and the record has none
 * (docs/decisions.md, "Quotas bound a token, not the data dir").
 */
function withoutUsage(doc: unknown, mode: Mode, who: Step["who"]): unknown {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return doc;
  const { record, ...rest } = doc as Record<string, unknown>;
  if (record === null || typeof record !== "object") return doc;
  const { agent_usage: usage, ...fields } = record as Record<string, unknown>;
  if (mode === "embedded") expect(usage).toBeUndefined();
  else if (who === "agent") expect(usage).toMatchObject({ events: expect.any(Number) });
  return { ...rest, record: fields };
}

/** One run of `mam <args> --json` in a mode: its exit code and the one JSON document it printed. */
async function mam(mode: Mode, step: Step): Promise<{ code: number; doc: unknown; stderr: string }> {
  const lane = lanes[mode];
  const io = captureIo(lane.env);
  const code = await runCli([...step.args(lane), ...lane.modeArgs[step.who], "--json"], io);
  expect(io.out.length, `${mode}: one JSON document on stdout; stderr:\n${io.err.join("")}`).toBe(1);
  return { code, doc: JSON.parse(io.out[0]!), stderr: io.err.join("") };
}

const SIDE_EFFECT = ["--side-effect", "git_push=a1b2c3d"];

interface Step {
  readonly name: string;
  /** Who runs it: the agent with its own token, or (verify is operator-only over the API) an operator. */
  readonly who: Who;
  readonly args: (lane: Lane) => readonly string[];
  readonly exit: number;
  readonly check?: (doc: unknown, mode: Mode) => void;
  /** Both modes on the same job (what the step reads, it reads from the service's store): the same document, not only its shape. */
  readonly same?: true;
}

/** `mam verify` of the job the service finalized (the API lane's), in either mode: `--api`, or `--data-dir` on the store itself. */
const verifyServiceCopy =
  (...more: string[]) =>
  () => ["verify", "--job", lanes.api.job, "--attempt", "1", ...more];

/** The steps, in order (each lane's job moves through them), with the exit code each must end with. */
const STEPS: readonly Step[] = [
  {
    name: "publish-event --event started",
    who: "agent",
    args: (l) => ["publish-event", "--job", l.job, "--event", "started", "--attempt", "1"],
    exit: 0,
    check: (doc, mode) => expect(doc).toMatchObject({ ...publishedIn(mode), record: { status: "running" } }),
  },
  {
    name: "finalize",
    who: "agent",
    args: (l) => ["finalize", "--job", l.job, "--attempt", "1", "--report", l.report, ...SIDE_EFFECT],
    exit: 0,
    check: (doc) =>
      expect(doc).toMatchObject({ manifest: { attempt_id: 1, side_effects: [{ kind: "git_push" }] }, manifest_sha256: expect.any(String) }),
  },
  {
    name: "verify (the store's copy of the attempt)",
    who: "operator",
    args: verifyServiceCopy(),
    exit: 0,
    same: true,
    check: (doc) => expect(doc).toMatchObject({ ok: true, manifest: { attempt_id: 1 }, manifest_sha256: expect.any(String) }),
  },
  {
    name: "verify, refused (an artifact the manifest lacks)",
    who: "operator",
    args: verifyServiceCopy("--expected-artifacts", "pr_url"),
    exit: 1,
    same: true,
    check: (doc) => expect(doc).toMatchObject({ ok: false, reason: expect.stringContaining("pr_url") }),
  },
  {
    name: "publish-event --event completed --finalize-report",
    who: "agent",
    args: (l) => ["publish-event", "--job", l.job, "--event", "completed", "--attempt", "1", "--finalize-report", l.report, ...SIDE_EFFECT],
    exit: 0,
    check: (doc, mode) =>
      expect(doc).toMatchObject({ ...publishedIn(mode), record: { status: "completed" }, finalized: { manifest: { attempt_id: 1 } } }),
  },
  {
    name: "verify after the completion (the live copy, and the copy the completion pinned)",
    who: "operator",
    args: verifyServiceCopy(),
    exit: 0,
    same: true,
    check: (doc) =>
      expect(doc).toMatchObject({
        ok: true,
        manifest: { attempt_id: 1, side_effects: [{ kind: "git_push" }] },
        matches_completion: true,
        pinned: { ok: true, report_sha256: expect.any(String), evidence_location: expect.stringMatching(/^mam-file:\/\/\//) },
      }),
  },
  {
    name: "verify after the completion, refused (an artifact the completion's manifest lacks)",
    who: "operator",
    args: verifyServiceCopy("--expected-artifacts", "git_push,pr_url"),
    exit: 1,
    same: true,
    check: (doc) => expect(doc).toMatchObject({ ok: false, reason: expect.stringContaining("pr_url"), pinned: { ok: true } }),
  },
  {
    name: "publish-event, refused (the job is terminal)",
    who: "agent",
    args: (l) => ["publish-event", "--job", l.job, "--event", "progress"],
    exit: 1,
    check: (doc) => expect(doc).toMatchObject({ error: { code: "job.transitionRefused", message: expect.any(String) } }),
  },
];

describe("e2e: each mam command prints one --json shape in both modes [--api and --data-dir]", () => {
  for (const step of STEPS) {
    it(`${step.name}: the same exit code and the same JSON shape over the API and on the store`, async () => {
      const api = await mam("api", step);
      const embedded = await mam("embedded", step);
      expect(api.code, `api: ${api.stderr}`).toBe(step.exit);
      expect(embedded.code, `embedded: ${embedded.stderr}`).toBe(step.exit);
      step.check?.(api.doc, "api");
      step.check?.(embedded.doc, "embedded");
      if (step.same) expect(embedded.doc).toEqual(api.doc);
      expect(shapeOf(withoutUsage(withoutPublished(embedded.doc), "embedded", step.who))).toEqual(
        shapeOf(withoutUsage(withoutPublished(api.doc), "api", step.who)),
      );
    });
  }
});

describe("e2e: mam verify --report-dir verifies a report directory in place, a flag of its own", () => {
  it("the embedded lane's own tree, finalized where it lies: verified there, even with MAM_API_URL set (the flag chooses), and no pinned copy", async () => {
    const lane = lanes.embedded;
    const io = captureIo({ MAM_API_URL: service.url });
    const code = await runCli(["verify", "--job", lane.job, "--attempt", "1", "--report-dir", lane.tree, "--json"], io);
    expect(code, io.err.join("")).toBe(0);
    const doc = JSON.parse(io.out.join("")) as Record<string, unknown>;
    expect(doc).toMatchObject({ ok: true, manifest: { attempt_id: 1, report_location: lane.report }, manifest_sha256: expect.any(String) });
    expect(Object.keys(doc).sort()).toEqual(["manifest", "manifest_sha256", "ok", "reason"]);
  });

  it("--report-dir beside --data-dir or --api is refused (exit 1), in one line naming both flags", async () => {
    for (const mode of ["--data-dir", "--api"] as const) {
      const io = captureIo();
      const flag = mode === "--api" ? [mode, service.url, "--token", service.operatorToken] : [mode, path.join(root, "data")];
      const code = await runCli(
        ["verify", "--job", lanes.api.job, "--attempt", "1", "--report-dir", lanes.api.tree, ...flag, "--json"],
        io,
      );
      expect(code, mode).toBe(1);
      const lines = io.err.join("").trimEnd().split("\n");
      expect(lines, mode).toHaveLength(1);
      expect(lines[0]).toMatch(/--report-dir .*--data-dir \(or --api\)/);
      expect(JSON.parse(io.out.join(""))).toMatchObject({ error: { code: "input.invalid" } });
    }
  });

  it("--data-dir without --attempt is refused (exit 1): it verifies the store's copy of one attempt", async () => {
    const io = captureIo();
    expect(await runCli(["verify", "--job", lanes.api.job, "--data-dir", path.join(root, "data")], io)).toBe(1);
    expect(io.err.join("")).toMatch(/--attempt is required with --data-dir or --api.*--report-dir/);
  });
});
