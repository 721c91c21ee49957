/**
 * The agent install (`npm run package:agent`): the tarball is built, installed with
 * `npm install -g --prefix <tmp> --offline` outside the repository (as docs/agents.md
 * tells an agent's machine to), and the installed `mam` — run from that prefix, in a
 * directory outside the tree, with nothing of the repository's environment — prints
 * its help, refuses every data-dir mode command with one clear line and exit 1, and
 * works in API mode against a real `mam serve`.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { dataDirPaths } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AGENT_INSTALL_REFUSAL, type PackedAgent, packAgent } from "../../scripts/package-agent.mjs";
import type { ProcessRun } from "../support/mam-process.ts";
import { type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const ROOT = path.join(import.meta.dirname, "..", "..");

let tmp: TempDir;
let packed: PackedAgent;
/** The installed `mam`: `<prefix>/bin/mam`, the link `npm install -g` makes. */
let mam: string;
let away: string;
let serve: ServeProcess;
let token: string;

beforeAll(async () => {
  tmp = await tempDir("agent-package");
  packed = await packAgent({ outDir: path.join(tmp.dir, "build") });
  away = path.join(tmp.dir, "agent-home");
  mkdirSync(away);
  const prefix = path.join(away, "prefix");
  const install = await run(
    "npm",
    ["install", "-g", "--prefix", prefix, "--offline", "--no-audit", "--no-fund", "--no-update-notifier", packed.tarball],
    { npm_config_cache: path.join(tmp.dir, "npm-cache") },
  );
  expect(install.status, install.stderr).toBe(0);
  mam = path.join(prefix, "bin", "mam");
  const dataDir = path.join(tmp.dir, "service");
  serve = await startServeProcess(dataDir);
  token = (JSON.parse(readFileSync(dataDirPaths(dataDir).credentials, "utf8")) as { operator_token: string }).operator_token;
});
afterAll(async () => {
  await serve?.stop();
  await tmp?.remove();
});

/** A command in `away` (outside the repository) with only PATH (node's directory first) and `env`. */
function run(command: string, args: readonly string[], env: Record<string, string> = {}, stdin?: string): Promise<ProcessRun> {
  const child = spawn(command, args, {
    cwd: away,
    env: { PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? ""}`, HOME: away, ...env },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => {
    stdout += d.toString();
  });
  child.stderr.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  child.stdin.end(stdin ?? "");
  const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

/** An operator's POST to the service, expecting 201. */
async function post(route: string, body: unknown): Promise<Record<string, unknown>> {
  const res = await fetch(`${serve.url}${route}`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  expect(res.status, await res.clone().text()).toBe(201);
  return (await res.json()) as Record<string, unknown>;
}

/** `mam events --json`'s rows as [job, kind]. */
const feedRows = (stdout: string): [string, string][] =>
  stdout
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l) as { job_id: string; kind: string })
    .map((r) => [r.job_id, r.kind]);

describe("the agent install", () => {
  it("is one tarball with no dependencies whose code imports nothing but its own files and Node's built-ins", () => {
    expect(path.basename(packed.tarball)).toMatch(/^mam-agent-\d+\.\d+\.\d+\.tgz$/);
    const installed = path.join(away, "prefix", "lib", "node_modules", "mam-agent");
    const manifest = JSON.parse(readFileSync(path.join(installed, "package.json"), "utf8")) as Record<string, unknown>;
    expect(manifest).toMatchObject({ name: "mam-agent", bin: { mam: "bin/mam.js" }, engines: { node: ">=20.19" } });
    expect(manifest).not.toHaveProperty("dependencies");
    expect(readdirSync(installed)).not.toContain("node_modules");
    const code = packed.files.filter((f) => f.endsWith(".mjs") || f.endsWith(".js"));
    const specifiers = code.flatMap((f) =>
      [...readFileSync(path.join(installed, f), "utf8").matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|\brequire\s*\(\s*)"([^"]+)"/g)].map(
        (m) => m[1] as string,
      ),
    );
    expect(specifiers.length).toBeGreaterThan(0);
    expect(specifiers.filter((s) => !s.startsWith("./") && !s.startsWith("../") && !s.startsWith("node:"))).toEqual([]);
  });

  it("mam --help lists the commands, from outside the repository", async () => {
    const help = await run(mam, ["--help"]);
    expect(help.status).toBe(0);
    expect(help.stdout).toContain("Usage: mam <command>");
    expect(help.stdout).toContain("publish-event");
    expect(help.stdout).not.toContain(ROOT);
  });

  it("refuses the data-dir mode, mam serve and mam migrate with one line naming the agent install, exit 1, no stack trace", async () => {
    for (const args of [
      ["events", "--data-dir", path.join(tmp.dir, "service")],
      ["publish-event", "--job", "j", "--event", "started"],
      ["serve"],
      ["migrate", "--data-dir", path.join(tmp.dir, "service")],
    ]) {
      const refused = await run(mam, args);
      expect(refused.status, args.join(" ")).toBe(1);
      expect(refused.stderr).toBe(`mam ${args[0]}: ${AGENT_INSTALL_REFUSAL}\n`);
      expect(refused.stdout).toBe("");
    }
    const json = await run(mam, ["events", "--json"]);
    expect(json.status).toBe(1);
    expect(JSON.parse(json.stdout)).toEqual({ error: { code: "input.invalid", message: AGENT_INSTALL_REFUSAL } });
  });

  it("works in API mode against mam serve: mam events --api URL --token T --json prints the feed", async () => {
    const registered = await fetch(`${serve.url}/v1/jobs`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ job_id: "agent-install-1", prompt: "p", agent: "claude-code" }),
    });
    expect(registered.status).toBe(201);
    const events = await run(mam, ["events", "--api", serve.url, "--token", token, "--json"]);
    expect(events.status, events.stderr).toBe(0);
    expect(feedRows(events.stdout)).toContainEqual(["agent-install-1", "job.registered"]);
    // The same through the environment, as a hook runs it.
    const env = await run(mam, ["events", "--json"], { MAM_API_URL: serve.url, MAM_TOKEN: token });
    expect(env.status, env.stderr).toBe(0);
    expect(feedRows(env.stdout)).toContainEqual(["agent-install-1", "job.registered"]);
  });

  it("takes an agent's turn with its dispatch token: publish-event started, finalize (uploaded from the agent's tree), publish-event completed", async () => {
    await post("/v1/jobs", { job_id: "agent-install-2", prompt: "p", agent: "claude-code" });
    const dispatched = await post("/v1/jobs/agent-install-2/dispatches", {
      attempt_id: 1,
      agent_session_uuid: "3f2c1d0e-9b8a-4c7d-8e6f-5a4b3c2d1e0f",
      pane_process_generation: 1,
    });
    const agent = { MAM_API_URL: serve.url, MAM_TOKEN: String(dispatched.agent_token) };
    const started = await run(mam, ["publish-event", "--job", "agent-install-2", "--event", "started", "--json"], agent);
    expect(started.status, started.stderr).toBe(0);
    expect(JSON.parse(started.stdout)).toMatchObject({ record: { status: "running" } });
    writeFileSync(path.join(away, "report-final.md.tmp"), "# Report\n\nDone.\n");
    const completed = await run(
      mam,
      [
        "publish-event",
        "--job",
        "agent-install-2",
        "--event",
        "completed",
        "--attempt",
        "1",
        "--finalize-report",
        "report-final.md",
        "--json",
      ],
      agent,
    );
    expect(completed.status, completed.stderr).toBe(0);
    expect(JSON.parse(completed.stdout)).toMatchObject({ record: { status: "completed" }, finalized: { manifest: { attempt_id: 1 } } });
  });

  it("mam hook claude-code posts a Stop event from stdin: exit 0, nothing on stdout, nothing in its log, an idle observation recorded", async () => {
    const session = "7c6b5a49-3829-4f1e-8d7c-6b5a49382716";
    await post("/v1/jobs", { job_id: "agent-install-3", prompt: "p", agent: "claude-code" });
    const dispatched = await post("/v1/jobs/agent-install-3/dispatches", {
      attempt_id: 1,
      agent_session_uuid: session,
      pane_process_generation: 1,
    });
    const hookLog = path.join(away, "hook.log");
    const agent = { MAM_API_URL: serve.url, MAM_TOKEN: String(dispatched.agent_token), MAM_HOOK_LOG: hookLog };
    expect((await run(mam, ["publish-event", "--job", "agent-install-3", "--event", "started"], agent)).status).toBe(0);
    const stop = {
      session_id: session,
      cwd: away,
      hook_event_name: "Stop",
      stop_hook_active: false,
      background_tasks: [],
      session_crons: [],
    };
    const hook = await run(mam, ["hook", "claude-code"], agent, JSON.stringify(stop));
    expect(hook).toEqual({ status: 0, stdout: "", stderr: "" });
    expect(existsSync(hookLog)).toBe(false);
    const feed = await run(mam, ["events", "--json"], { MAM_API_URL: serve.url, MAM_TOKEN: token });
    const observed = feed.stdout
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => JSON.parse(l) as { job_id: string; kind: string; data?: { state?: string; source?: string } })
      .filter((r) => r.job_id === "agent-install-3" && r.kind === "observation.recorded");
    expect(observed.map((r) => [r.data?.source, r.data?.state])).toEqual([["agent:claude-code", "idle"]]);
  });
});
