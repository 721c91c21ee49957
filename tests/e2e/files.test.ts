import { chmod, chown, mkdir, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import http from "node:http";
import { join } from "node:path";
import { EXIT_CODES } from "@mam/cli";
import { MamError } from "@mam/core";
import { dataDirPaths, SqliteJobStore, secureDataDir } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { refusedServe, type ServeProcess, startServeProcess } from "../support/serve-process.ts";
import { tempDir } from "../support/temp-dir.ts";

/**
 * What `mam serve` leaves on disk and what it says about a dropped upload, against a
 * real process and a real HTTP client (issue 8, "Files and answers").
 */
const modeOf = async (p: string): Promise<number> => (await stat(p)).mode & 0o777;

describe("e2e: mam serve keeps its data dir private", () => {
  let dir: string;
  let served: ServeProcess;
  let operator: string;

  beforeAll(async () => {
    // A data dir as an older version left it: 0755, with a 0644 database and 0644
    // reports in 0755 directories.
    dir = (await tempDir("e2e-files")).dir;
    await chmod(dir, 0o755);
    const old = new SqliteJobStore(dataDirPaths(dir).database);
    old.close();
    await chmod(dataDirPaths(dir).database, 0o644);
    await mkdir(join(dir, "reports", "old-job", "1"), { recursive: true, mode: 0o755 });
    await writeFile(join(dir, "reports", "old-job", "1", "report-final.md"), "# old\n", { mode: 0o644 });
    for (const d of ["reports", "reports/old-job", "reports/old-job/1"]) await chmod(join(dir, d), 0o755);
    await chmod(join(dir, "reports", "old-job", "1", "report-final.md"), 0o644);

    served = await startServeProcess(dir);
    operator = JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8")).operator_token;
  }, 30_000);

  afterAll(async () => {
    if (served) await served.stop();
    await rm(dir, { recursive: true, force: true });
  });

  const call = async (method: string, path: string, body?: unknown, token = operator) => {
    const res = await fetch(new URL(path, served.url), {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    // biome-ignore lint/suspicious/noExplicitAny: JSON answers read field by field
    return { status: res.status, body: (await res.json()) as Record<string, any> };
  };

  it("tightens, at start, a 0755 data dir to 0700, and what an older version left 0644/0755 to 0600/0700", async () => {
    expect(await modeOf(dir)).toBe(0o700);
    expect(await modeOf(dataDirPaths(dir).database)).toBe(0o600);
    for (const d of ["reports", "reports/old-job", "reports/old-job/1"]) expect(await modeOf(join(dir, d)), d).toBe(0o700);
    expect(await modeOf(join(dir, "reports", "old-job", "1", "report-final.md"))).toBe(0o600);
    const line = JSON.parse(await served.line((l) => l.includes('"data dir made private"')));
    expect(line.tightened).toBeGreaterThanOrEqual(6);
  });

  it("creates the database (its -wal and -shm too), credentials and report files 0600, report directories 0700", async () => {
    const reg = await call("POST", "/v1/jobs", { job_id: "modes", prompt: "p", agent: "codex" });
    expect(reg.status).toBe(201);
    const dispatch = await call("POST", "/v1/jobs/modes/dispatches", {
      attempt_id: 1,
      agent_session_uuid: "0c9a2d11-0000-4000-8000-000000000001",
      pane_process_generation: 1,
    });
    expect(dispatch.status).toBe(201);
    const staged = await fetch(new URL("/v1/jobs/modes/attempts/1/report", served.url), {
      method: "PUT",
      headers: { authorization: `Bearer ${operator}`, "content-type": "text/markdown" },
      body: "# Report\n\nprivate\n",
    });
    expect(staged.status).toBe(201);
    expect((await call("POST", "/v1/jobs/modes/attempts/1/finalize", { side_effects: [] })).status).toBe(200);

    const p = dataDirPaths(dir);
    for (const file of [p.database, `${p.database}-wal`, `${p.database}-shm`, p.credentials]) expect(await modeOf(file), file).toBe(0o600);
    for (const d of ["reports/modes", "reports/modes/1", "reports/modes/1/evidence"]) expect(await modeOf(join(dir, d)), d).toBe(0o700);
    const attempt = join(dir, "reports", "modes", "1");
    const reports = (await readdir(attempt)).filter((f) => f !== "evidence");
    expect(reports.sort()).toEqual(["report-final.md", "report-manifest.json"]);
    for (const f of reports) expect(await modeOf(join(attempt, f)), f).toBe(0o600);
    // the write-once copy the finalize pinned is read-only as well as private
    const pinned = await readdir(join(attempt, "evidence"));
    expect(pinned).toHaveLength(1);
    for (const f of pinned) expect(await modeOf(join(attempt, "evidence", f)), f).toBe(0o400);
  });

  it("a client that drops its upload mid-body is logged as an abort: no 5xx, no stack, nothing staged", async () => {
    expect((await call("POST", "/v1/jobs", { job_id: "dropped", prompt: "p", agent: "codex" })).status).toBe(201);
    const agent = (
      await call("POST", "/v1/jobs/dropped/dispatches", {
        attempt_id: 1,
        agent_session_uuid: "0c9a2d11-0000-4000-8000-000000000002",
        pane_process_generation: 1,
      })
    ).body.agent_token as string;

    // Expect: 100-continue, so the body starts only once the server has taken the
    // request; then a part of the body, then the connection is dropped.
    const drop = (path: string, method: string, headers: Record<string, string>) =>
      new Promise<void>((resolve, reject) => {
        const req = http.request(new URL(path, served.url), {
          method,
          headers: { ...headers, "content-length": String(1024 * 1024), expect: "100-continue" },
        });
        req.on("continue", () => {
          req.write(Buffer.alloc(64 * 1024, "a"), () => {
            req.destroy();
            resolve();
          });
        });
        req.on("response", () => reject(new Error("the server answered before the body was complete")));
        req.on("error", () => undefined);
      });
    await drop("/v1/jobs/dropped/attempts/1/report", "PUT", {
      authorization: `Bearer ${agent}`,
      "content-type": "text/markdown",
      "x-request-id": "dropped-upload",
    });
    await drop("/v1/jobs", "POST", {
      authorization: `Bearer ${operator}`,
      "content-type": "application/json",
      "x-request-id": "dropped-json",
    });

    for (const id of ["dropped-upload", "dropped-json"]) {
      const line = JSON.parse(await served.line((l) => l.includes(`"request_id":"${id}"`)));
      expect(line).toMatchObject({ msg: "request", request_id: id, status: 499, client_aborted: true });
      expect(line.level).toBe("info");
      const aboutIt = served
        .stdout()
        .split("\n")
        .filter((l) => l.includes(id));
      expect(aboutIt, "one line, and no 'unexpected error' with a stack").toHaveLength(1);
      expect(aboutIt[0]).not.toMatch(/stack|\bat /);
    }
    expect(served.stdout()).not.toMatch(/aborted a request/);
    expect(await readdir(join(dir, "reports", "dropped", "1"))).toEqual([]);
  });
});

describe("e2e: mam serve refuses a data dir it cannot make private", () => {
  it("one that belongs to another user: exit 1, saying why, and nothing written in it", async () => {
    let foreign: string;
    let cleanup = async () => {};
    if (process.getuid?.() === 0) {
      foreign = (await tempDir("e2e-foreign")).dir;
      await chmod(foreign, 0o755);
      await chown(foreign, 65534, 65534);
      cleanup = () => rm(foreign, { recursive: true, force: true });
    } else {
      foreign = "/"; // root's: never ours, and nothing is tried on it before the refusal
    }
    try {
      const { code, stderr } = await refusedServe(foreign);
      expect(code).toBe(1);
      expect(stderr).toContain("cannot be made private (0700)");
      expect(stderr).toMatch(/belongs to uid \d+, not to this user/);
      if (foreign !== "/") {
        expect(await modeOf(foreign)).toBe(0o755);
        expect(await readdir(foreign)).toEqual([]);
      }
    } finally {
      await cleanup();
    }
  }, 30_000);
});

describe("secureDataDir (what mam serve runs first)", () => {
  let base: string;
  beforeAll(async () => {
    base = (await tempDir("secure")).dir;
  });
  afterAll(() => rm(base, { recursive: true, force: true }));

  async function looseDataDir(name: string): Promise<string> {
    const dir = join(base, name);
    await mkdir(join(dir, "reports", "j", "1"), { recursive: true });
    await writeFile(join(dir, "mam.db"), "", { mode: 0o644 });
    await writeFile(join(dir, "reports", "j", "1", "report-final.md"), "r", { mode: 0o644 });
    for (const d of [dir, join(dir, "reports"), join(dir, "reports", "j"), join(dir, "reports", "j", "1")]) await chmod(d, 0o755);
    return dir;
  }

  it("refuses, with config.invalid (exit 1) naming why, a data dir of another user or one that is a file, and changes nothing", async () => {
    const dir = await looseDataDir("foreign");
    const uid = (await stat(dir)).uid;
    const err = (() => {
      try {
        secureDataDir(dir, { uid: uid + 1 });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(MamError);
    expect((err as MamError).code).toBe("config.invalid");
    expect(EXIT_CODES[(err as MamError).code]).toBe(1);
    expect((err as MamError).message).toContain(`belongs to uid ${uid}, not to this user (uid ${uid + 1})`);
    expect(await modeOf(dir)).toBe(0o755);
    expect(await modeOf(join(dir, "mam.db"))).toBe(0o644);

    await writeFile(join(base, "a-file"), "");
    expect(() => secureDataDir(join(base, "a-file"))).toThrow(/not a directory/);
  });

  it("walks the whole tree once, then checks only the entries at the top; links are never followed", async () => {
    const dir = await looseDataDir("once");
    const outside = join(base, "outside.txt");
    await writeFile(outside, "not the service's", { mode: 0o644 });
    await symlink(outside, join(dir, "reports", "link"));

    expect(secureDataDir(dir)).toEqual({ tightened: 6, walked: true });
    expect(await modeOf(join(dir, "reports", "j", "1", "report-final.md"))).toBe(0o600);
    expect(await modeOf(join(dir, "reports", "j", "1"))).toBe(0o700);
    expect(await modeOf(join(dir, ".private"))).toBe(0o600);
    expect(await modeOf(outside)).toBe(0o644);

    // Loosened again behind its back: the top is checked at every start, the tree once.
    await chmod(join(dir, "mam.db"), 0o644);
    await chmod(join(dir, "reports", "j", "1", "report-final.md"), 0o644);
    expect(secureDataDir(dir)).toEqual({ tightened: 1, walked: false });
    expect(await modeOf(join(dir, "mam.db"))).toBe(0o600);
    expect(await modeOf(dir)).toBe(0o700);
  });
});
