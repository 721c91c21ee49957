/**
 * `mam events` (the change feed on the command line) in both modes against one
 * service (`startService`, what `mam serve` runs, in-process), and `mam serve` itself
 * stopping promptly with a feed stream open.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { type CliIo, type RunningService, runCli, startService } from "@mam/cli";
import { createMamClient, ok } from "@mam/client";
import { parseConfig } from "@mam/core";
import { dataDirPaths } from "@mam/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureIo } from "../support/cli-io.ts";
import { deadPort } from "../support/dead-port.ts";
import { startServeProcess } from "../support/serve-process.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

let tmp: TempDir;
let dataDir: string;
let service: RunningService;
let operator: ReturnType<typeof createMamClient>;

beforeAll(async () => {
  tmp = await tempDir("events");
  dataDir = path.join(tmp.dir, "data");
  service = await startService(parseConfig({ MAM_DATA_DIR: dataDir, MAM_PORT: "0", MAM_MQTT_PORT: "0" }), () => undefined);
  operator = createMamClient({ baseUrl: service.url, token: service.operatorToken });
  await ok(operator.POST("/v1/jobs", { body: { job_id: "events-1", prompt: "p", agent: "codex" } }));
  await ok(
    operator.POST("/v1/jobs/{job_id}/transitions", {
      params: { path: { job_id: "events-1" } },
      body: { action: "claim", expected_seq: 0 },
    }),
  );
});
afterAll(async () => {
  await service?.stop();
  await tmp?.remove();
});

const api = () => ["--api", service.url, "--token", service.operatorToken];
const lines = (out: readonly string[]) =>
  out
    .join("")
    .split("\n")
    .filter((l) => l !== "");

describe("mam events", () => {
  it("prints what is there, one JSON row per line, and exits 0; --after resumes after a row, in both modes alike", async () => {
    const io = captureIo();
    expect(await runCli(["events", ...api(), "--json"], io)).toBe(0);
    const rows = lines(io.out).map((l) => JSON.parse(l));
    expect(rows.map((r) => [r.job_id, r.kind])).toEqual([
      ["events-1", "job.registered"],
      ["events-1", "job.transitioned"],
    ]);
    const embedded = captureIo();
    expect(await runCli(["events", "--data-dir", dataDir, "--json"], embedded)).toBe(0);
    expect(lines(embedded.out).map((l) => JSON.parse(l))).toEqual(rows);

    const rest = captureIo();
    expect(await runCli(["events", ...api(), "--json", "--after", rows[0].cursor], rest)).toBe(0);
    expect(lines(rest.out).map((l) => JSON.parse(l).kind)).toEqual(["job.transitioned"]);
  });

  it("prints one human line per change: when, what, which job, the data, by whom", async () => {
    const io = captureIo();
    expect(await runCli(["events", ...api()], io)).toBe(0);
    const [registered, claimed] = lines(io.out);
    expect(registered).toMatch(/^\S+Z {2}job\.registered {2}events-1 {2}status=pending {2}\(by operator \S+\)$/);
    expect(claimed).toMatch(/job\.transitioned {2}events-1 {2}action=claim status=running transition_seq=1/);
  });

  it("--follow prints rows as they commit and stops on its signal, saying which --after resumes", async () => {
    const stop = new AbortController();
    const out: string[] = [];
    const err: string[] = [];
    let onLine: (() => void) | undefined;
    const io: CliIo = {
      env: {},
      stdout: (s) => {
        out.push(s);
        onLine?.();
      },
      stderr: (s) => err.push(s),
      signal: stop.signal,
    };
    const seen = (n: number) =>
      new Promise<void>((resolve) => {
        onLine = () => {
          if (lines(out).length >= n) resolve();
        };
        onLine();
      });
    const running = runCli(["events", ...api(), "--json", "--follow", "--interval", "20"], io);
    await seen(2);
    await ok(operator.POST("/v1/jobs", { body: { job_id: "events-followed", prompt: "p", agent: "codex" } }));
    await seen(3);
    stop.abort();
    expect(await running).toBe(0);
    const rows = lines(out).map((l) => JSON.parse(l));
    expect(rows.at(-1)).toMatchObject({ job_id: "events-followed", kind: "job.registered" });
    expect(err.join("")).toContain(`resume with --after ${rows.at(-1).cursor}`);
  });

  it("--limit N prints N rows and exits 0, in both modes and with --follow, saying which --after resumes after them", async () => {
    for (const id of ["events-limit-a", "events-limit-b"])
      await ok(operator.POST("/v1/jobs", { body: { job_id: id, prompt: "p", agent: "codex" } }));
    const all = captureIo();
    expect(await runCli(["events", ...api(), "--json"], all)).toBe(0);
    const rows = lines(all.out).map((l) => JSON.parse(l));
    expect(rows.length).toBeGreaterThan(3);

    for (const mode of [api(), ["--data-dir", dataDir], [...api(), "--follow", "--interval", "20"]]) {
      const io = captureIo();
      expect(await runCli(["events", ...mode, "--json", "--limit", "3"], io)).toBe(0);
      expect(lines(io.out).map((l) => JSON.parse(l))).toEqual(rows.slice(0, 3));
      const resume = /resume with --after (\S+)/.exec(io.err.join(""))?.[1];
      expect(io.err.join("")).toContain("printed --limit 3 rows");

      const rest = captureIo();
      expect(await runCli(["events", ...api(), "--json", "--limit", "1", "--after", resume!], rest)).toBe(0);
      expect(lines(rest.out).map((l) => JSON.parse(l))).toEqual([rows[3]]);
    }
  });

  it("exits 2 when the service cannot be reached", async () => {
    const io = captureIo();
    expect(await runCli(["events", "--api", `http://127.0.0.1:${await deadPort()}`, "--token", "x"], io)).toBe(2);
    expect(io.err.join("")).toMatch(/could not be reached/);
  });

  it("refuses a cursor the feed did not hand out with exit 1, naming --after's query parameter", async () => {
    const io = captureIo();
    expect(await runCli(["events", ...api(), "--after", "nonsense"], io)).toBe(1);
    expect(io.err.join("")).toMatch(/query\.after/);
  });
});

describe("mam serve with a feed stream open", () => {
  it("stops at once on SIGTERM, ending the stream, and exits 0", async () => {
    const dir = await tempDir("events-serve");
    const served = await startServeProcess(path.join(dir.dir, "data"));
    try {
      const token = JSON.parse(await readFile(dataDirPaths(path.join(dir.dir, "data")).credentials, "utf8")).operator_token;
      const res = await fetch(`${served.url}/v1/events/stream`, { headers: { authorization: `Bearer ${token}` } });
      expect(res.status).toBe(200);
      const reader = res.body!.getReader();
      // The stream is open: its first event has arrived.
      expect(new TextDecoder().decode((await reader.read()).value)).toContain("event: open");
      const exit = served.stop("SIGTERM");
      // The stream ends (the server closed it), and the process exits cleanly.
      for (let r = await reader.read(); !r.done; r = await reader.read()) {}
      expect(await exit).toBe(0);
      expect(served.stderr()).toContain("stopped");
    } finally {
      await served.stop("SIGKILL");
      await dir.remove();
    }
  }, 60_000);
});
