/**
 * The `mam` command's own rules, beside what each command does: a failed publish
 * names its error in both modes; a flag the chosen mode would ignore is refused,
 * saying why; no data dir is ever created outside `mam serve`; every command and
 * command group answers --help; the README's table lists every command; the exit
 * code map is total; bin/mam prints nothing but the command's own output.
 */
import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createApp, createTokenService, SCOPES } from "@mam/api";
import { EXIT_CODES, runCli } from "@mam/cli";
import { createMamClient, ok } from "@mam/client";
import { ERROR_TABLE, parseFlags, randomIds, systemClock } from "@mam/core";
import { MqttPublisher, openDataDir } from "@mam/local";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { deadPort } from "../support/dead-port.ts";
import { runMam } from "../support/mam-process.ts";
import { tempDir } from "../support/temp-dir.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

let root: string;
beforeEach(async () => {
  root = (await tempDir("cli-usage")).dir;
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

/** `node packages/cli/bin/mam.js ...` in `cwd`, with no MAM_* variable: its exit status and streams. */
const mamProcess = (args: readonly string[], cwd: string) => runMam(args, { cwd });

describe("e2e: the mam command", () => {
  it("a publish that fails after the commit names the broker's error in both modes; it exits 2 on the store (the command publishes) and 0 over the API (the service owes it)", async () => {
    // One data dir: the app in-process serves it (its fetch is the CLI's), and the CLI opens it in --data-dir mode.
    // Nobody listens on the broker port: both publishes fail after their commit.
    const dataDir = path.join(root, "data");
    await mkdir(dataDir);
    const mqttPort = await deadPort();
    const store = openDataDir(dataDir, { allowAbsolute: false });
    const publisher = new MqttPublisher({ url: `mqtt://127.0.0.1:${mqttPort}`, connectTimeoutMs: 500, publishTimeoutMs: 1000 });
    const tokens = createTokenService({ signingKey: "cli-usage-signing-key-0123456789abcdef", clock: systemClock });
    const operator = tokens.mintOperator(SCOPES);
    const app = createApp({
      deps: { jobs: store.jobs, reports: store.reports, publisher, clock: systemClock, ids: randomIds, flags: parseFlags({}) },
      tokens,
      log: () => undefined,
    });
    const appFetch: typeof fetch = async (input, init) => app.fetch(new Request(input, init));
    try {
      const client = createMamClient({ baseUrl: "http://mam.test", token: operator, fetch: appFetch });
      for (const job of ["unpublished-api", "unpublished-embedded"]) {
        await ok(client.POST("/v1/jobs", { body: { job_id: job, prompt: "p", agent: "codex" } }));
      }
      const runs = {
        api: {
          io: { ...captureIo({}), fetch: appFetch },
          args: ["--job", "unpublished-api", "--api", "http://mam.test", "--token", operator],
        },
        embedded: { io: captureIo({ MAM_MQTT_PORT: String(mqttPort) }), args: ["--job", "unpublished-embedded", "--data-dir", dataDir] },
      };
      const docs: Record<string, { published: boolean; publish_error?: { code: string; message: string } }> = {};
      for (const [mode, { io, args }] of Object.entries(runs)) {
        const code = await runCli(["publish-event", "--event", "started", ...args, "--json"], io);
        const stderr = io.err.join("");
        // --api exits 2 only when the service cannot be reached; this one answered.
        expect(code, `${mode}: ${stderr}`).toBe(mode === "api" ? 0 : 2);
        const doc = JSON.parse(io.out.join(""));
        docs[mode] = doc;
        expect(doc, mode).toMatchObject({
          published: false,
          record: { status: "running" },
          publish_error: { code: "publish.unreachable" },
        });
        expect(stderr, mode).toContain(`started committed (seq 1) but not published: ${doc.publish_error.message}`);
        expect(stderr, mode).not.toMatch(/unknown|did not say why/);
        expect(stderr, mode).toMatch(/stays owed/);
      }
      expect(Object.keys(docs.embedded!).sort()).toEqual(Object.keys(docs.api!).sort());
    } finally {
      await publisher.close();
      store.close();
    }
  }, 30_000);

  it("--token without --api is refused, saying why (exit 1), and so is a flag the chosen mode would ignore", async () => {
    const dataDir = path.join(root, "data");
    const cases: { args: string[]; env?: Record<string, string>; says: RegExp }[] = [
      { args: ["--token", "t"], says: /--token needs --api URL \(or MAM_API_URL\)/ },
      { args: ["--token", "t", "--data-dir", dataDir], says: /--token is sent to the service in API mode; with --data-dir/ },
      // MAM_API_URL chooses API mode as --api does; --data-dir overrides it, and --token then has nowhere to go.
      { args: ["--token", "t", "--data-dir", dataDir], env: { MAM_API_URL: "http://127.0.0.1:9" }, says: /with --data-dir/ },
      { args: ["--api", "http://127.0.0.1:9", "--data-dir", dataDir], says: /--api and --data-dir choose different modes/ },
      { args: ["--api", "http://127.0.0.1:9", "--mqtt-url", "mqtt://127.0.0.1:9"], says: /--mqtt-url is for --data-dir mode/ },
      { args: ["--api", "not a url"], says: /--api must be a URL/ },
    ];
    for (const c of cases) {
      const io = captureIo(c.env ?? {});
      const code = await runCli(["publish-event", "--job", "j", "--event", "started", ...c.args, "--json"], io);
      expect(code, c.args.join(" ")).toBe(1);
      expect(io.err.join(""), c.args.join(" ")).toMatch(c.says);
      expect(JSON.parse(io.out.join(""))).toMatchObject({ error: { code: "input.invalid" } });
    }
    // With MAM_API_URL, --token is what API mode sends: not refused (the service, unreachable here, is exit 2).
    const io = captureIo({ MAM_API_URL: `http://127.0.0.1:${await deadPort()}` });
    expect(await runCli(["publish-event", "--job", "j", "--event", "started", "--token", "t"], io)).toBe(2);
    expect(existsSync(dataDir), "nothing created the data dir").toBe(false);
  });

  it("never creates a data dir it was not asked to use: no stray ./.mam, no store in a dir that had none", async () => {
    // bin/mam in a directory of its own, with no MAM_* variable: no data dir named, none at ./.mam.
    const run = await mamProcess(["publish-event", "--job", "j", "--event", "started", "--json"], root);
    expect(run.status, run.stderr).toBe(1);
    expect(run.stderr).toMatch(/no data dir: give --data-dir DIR \(or MAM_DATA_DIR\).*or --api URL/);
    expect(JSON.parse(run.stdout), "stdout is the one JSON document, nothing before it").toMatchObject({
      error: { code: "input.invalid" },
    });
    expect(await readdir(root), "no ./.mam").toEqual([]);
    // `mam verify` there, with neither --data-dir nor --report-dir: one line naming both.
    const verify = await mamProcess(["verify", "--job", "j", "--attempt", "1", "--json"], root);
    expect(verify.status, verify.stderr).toBe(1);
    expect(verify.stderr.trimEnd().split("\n")).toHaveLength(1);
    expect(verify.stderr).toMatch(/which report\? --data-dir DIR .*--report-dir DIR/);
    expect(JSON.parse(verify.stdout)).toMatchObject({ error: { code: "input.invalid" } });
    expect(await readdir(root), "no ./.mam").toEqual([]);

    // A named dir that holds no store is refused as it is: the CLI never makes one (mam serve does).
    const empty = path.join(root, "empty");
    await mkdir(empty);
    const missing = path.join(root, "missing");
    for (const dir of [empty, missing]) {
      const io = captureIo({});
      expect(await runCli(["publish-event", "--job", "j", "--event", "started", "--data-dir", dir], io), dir).toBe(1);
      expect(io.err.join("")).toMatch(/holds no mam store \(no mam\.db\); the CLI never creates one/);
      const verify = captureIo({});
      expect(await runCli(["verify", "--job", "j", "--attempt", "1", "--data-dir", dir], verify), dir).toBe(1);
      expect(verify.err.join("")).toMatch(/holds no mam store \(no mam\.db\); the CLI never creates one/);
    }
    expect(await readdir(empty)).toEqual([]);
    expect(existsSync(missing)).toBe(false);
  }, 30_000);

  it("every command and command group answers --help (exit 0), and mam help <command> is the same page", async () => {
    const commands = ["publish-event", "finalize", "verify", "token create", "serve"];
    for (const name of commands) {
      const io = captureIo({});
      expect(await runCli([...name.split(" "), "--help"], io), name).toBe(0);
      expect(io.out.join(""), name).toMatch(new RegExp(`Usage: mam ${name}`));
      if (name !== "serve") {
        const again = captureIo({});
        expect(await runCli(["help", ...name.split(" ")], again)).toBe(0);
        expect(again.out).toEqual(io.out);
      }
    }
    const group = captureIo({});
    expect(await runCli(["token", "--help"], group)).toBe(0);
    expect(group.out.join("")).toMatch(/token create/);
    const bare = captureIo({});
    expect(await runCli(["token"], bare)).toBe(1);
    expect(bare.err.join("")).toMatch(/token create/);
    const unknown = captureIo({});
    expect(await runCli(["token", "revoke"], unknown)).toBe(1);
    expect(unknown.err.join("")).toMatch(/unknown command "token revoke"/);
  });

  it("token create signs with the data dir's key, and has no API mode", async () => {
    const dataDir = path.join(root, "data");
    await mkdir(dataDir);
    await writeFile(
      path.join(dataDir, "credentials.json"),
      JSON.stringify({
        operator_token: "unused",
        signing_key: "cli-usage-signing-key-0123456789abcdef",
        mqtt: { username: "u", password: "p" },
      }),
    );
    const io = captureIo({});
    expect(await runCli(["token", "create", "--scope", "read", "--data-dir", dataDir, "--json"], io), io.err.join("")).toBe(0);
    const { token, scopes } = JSON.parse(io.out.join(""));
    expect(scopes).toEqual(["read"]);
    const principal = createTokenService({ signingKey: "cli-usage-signing-key-0123456789abcdef", clock: systemClock }).verify(token);
    expect(principal).toMatchObject({ kind: "operator", scopes: ["read"] });
    expect(principal).not.toHaveProperty("name");

    // --name: who the token is for; a subscriber's persistent sessions belong to it (issue 17).
    const named = captureIo({});
    expect(
      await runCli(["token", "create", "--scope", "read", "--name", "dashboard", "--data-dir", dataDir, "--json"], named),
      named.err.join(""),
    ).toBe(0);
    const minted = JSON.parse(named.out.join(""));
    expect(minted).toMatchObject({ scopes: ["read"], name: "dashboard" });
    expect(
      createTokenService({ signingKey: "cli-usage-signing-key-0123456789abcdef", clock: systemClock }).verify(minted.token),
    ).toMatchObject({
      kind: "operator",
      name: "dashboard",
    });
    // --ttl: seconds, or a duration (issue 22: `--ttl 8h` for a dashboard's read token).
    for (const [ttl, seconds] of [
      ["8h", 28_800],
      ["30m", 1_800],
      ["7d", 604_800],
      ["90", 90],
    ] as const) {
      const timed = captureIo({});
      expect(
        await runCli(["token", "create", "--scope", "read", "--ttl", ttl, "--data-dir", dataDir, "--json"], timed),
        timed.err.join(""),
      ).toBe(0);
      const answer = JSON.parse(timed.out.join(""));
      expect(answer.ttl_seconds, ttl).toBe(seconds);
      const p = createTokenService({ signingKey: "cli-usage-signing-key-0123456789abcdef", clock: systemClock }).verify(answer.token);
      expect(
        p.kind === "operator" && p.expiresAt !== undefined && Math.round((Date.parse(p.expiresAt) - Date.now()) / 1000),
        ttl,
      ).toBeGreaterThan(seconds - 60);
    }
    const badTtl = captureIo({});
    expect(await runCli(["token", "create", "--scope", "read", "--ttl", "8 hours", "--data-dir", dataDir], badTtl)).toBe(1);
    expect(badTtl.err.join("")).toMatch(/--ttl must be seconds or a duration/);
    const badName = captureIo({});
    expect(await runCli(["token", "create", "--scope", "read", "--name", "no spaces", "--data-dir", dataDir], badName)).toBe(1);
    expect(badName.err.join("")).toMatch(/name/);

    const api = captureIo({});
    expect(await runCli(["token", "create", "--scope", "read", "--api", "http://127.0.0.1:9"], api)).toBe(1);
    expect(api.err.join("")).toMatch(/has no API mode/);
    const nowhere = captureIo({});
    expect(await runCli(["token", "create", "--scope", "read", "--data-dir", path.join(root, "missing")], nowhere)).toBe(1);
    expect(nowhere.err.join("")).toMatch(/no signing key/);
  });

  it("the README's command table lists every command mam --help lists", async () => {
    const io = captureIo({});
    await runCli(["--help"], io);
    const help = io.out.join("");
    const listed = [...help.slice(help.indexOf("Commands:")).matchAll(/^ {2}([a-z-]+(?: [a-z-]+)?) {2,}/gm)].map((m) => m[1]!);
    expect(listed).toEqual(expect.arrayContaining(["publish-event", "finalize", "verify", "token create", "serve"]));
    const readme = await readFile(path.join(ROOT, "README.md"), "utf8");
    const table = [...readme.matchAll(/^\| `mam ([a-z-]+(?: [a-z][a-z-]*)?)[ `]/gm)].map((m) => m[1]!);
    expect(table.sort()).toEqual([...listed].sort());
  });

  it("maps every error code of core's closed set to exit 1 or 2, unreachable ones (retryable) to 2", () => {
    for (const [code, entry] of Object.entries(ERROR_TABLE)) {
      const exit = (EXIT_CODES as Record<string, number>)[code];
      expect([1, 2], code).toContain(exit);
      if (entry.retryable) expect(exit, `${code} is retryable: nothing refused it`).toBe(2);
    }
    expect(Object.keys(EXIT_CODES).sort()).toEqual(Object.keys(ERROR_TABLE).sort());
  });
});
