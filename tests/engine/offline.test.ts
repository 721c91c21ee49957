/**
 * `npm run offline` end to end: it is started as a child process on free ports, the
 * README's curl session (the very block the README shows, but for the URL) runs
 * against it with bash and curl, and a subscriber on its broker receives the
 * completion through the stream path (DynamoDB Local's stream -> our poller -> the
 * stream function under serverless-offline -> the IoT stand-in -> the broker), and the
 * API's change feed holds every row of the session, written by the feed writer. Then
 * SIGTERM stops it, and every piece with it.
 */
import { spawn } from "node:child_process";
import { mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deadPort } from "../support/dead-port.ts";
import { type Offline, ROOT, START_TIMEOUT_MS, startOffline } from "../support/offline.ts";
import { subscribe } from "../support/subscriber.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

/** The README's "A session with curl" block, as it is written, but for the URL (and a scenario file of this test's own). */
async function readmeSession(api: string, scenarioFile: string): Promise<string> {
  const readme = await readFile(path.join(ROOT, "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("## A session with curl"));
  const block = /```sh\n([\s\S]*?)```/.exec(section)?.[1];
  if (block === undefined) throw new Error("README.md: no sh block under '## A session with curl'");
  const urlLine = /^API=http:\/\/127\.0\.0\.1:\d+$/m;
  if (!urlLine.test(block)) throw new Error("README.md: the session no longer sets API=http://127.0.0.1:<port>");
  return block.replace(urlLine, `API=${api}`).replaceAll("/tmp/scenario.json", scenarioFile);
}

function portClosed(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(false);
    });
    socket.once("error", () => resolve(true));
  });
}

describe("npm run offline: the AWS shape on one machine", () => {
  let dir: TempDir;
  let offline: Offline | undefined;
  const ports = { api: 0, lambda: 0, mqtt: 0 };

  beforeAll(async () => {
    dir = await tempDir("offline");
    ports.api = await deadPort();
    ports.lambda = await deadPort();
    ports.mqtt = await deadPort();
  });

  afterAll(async () => {
    if (offline !== undefined && offline.child.exitCode === null) {
      offline.child.kill("SIGTERM");
      await offline.exited;
    }
    await dir?.remove();
  });

  it(
    "serves the README's curl session; the subscriber receives the completion through the stream path; SIGTERM stops every piece",
    async () => {
      const started = performance.now();
      offline = await startOffline(dir.dir, ports);
      const upInSeconds = (performance.now() - started) / 1000;
      console.log(`npm run offline: up in ${upInSeconds.toFixed(1)} s (by its own count: ${/is up in (.*):/.exec(offline.output())?.[1]})`);

      // The README's working directory: its data dir (.mam) and the fixtures it reads.
      await mkdir(path.join(dir.dir, "work"), { recursive: true });
      const work = path.join(dir.dir, "work");
      await symlink(path.join(dir.dir, ".mam"), path.join(work, ".mam"));
      await symlink(path.join(ROOT, "fixtures"), path.join(work, "fixtures"));
      const scenarioFile = path.join(dir.dir, "scenario.json");
      const script = await readmeSession(offline.api, scenarioFile);
      await writeFile(path.join(dir.dir, "session.sh"), script);

      const sub = await subscribe(offline.mqtt, "mam/jobs/+/events");
      try {
        const session = await new Promise<{ code: number | null; out: string }>((resolve) => {
          const bash = spawn("bash", ["-eo", "pipefail", path.join(dir.dir, "session.sh")], {
            cwd: work,
            stdio: ["ignore", "pipe", "pipe"],
          });
          let out = "";
          bash.stdout.on("data", (d) => {
            out += String(d);
          });
          bash.stderr.on("data", (d) => {
            out += String(d);
          });
          bash.once("exit", (code) => resolve({ code, out }));
        });
        expect(session.code, session.out).toBe(0);
        // The answers the README shows, in order: the agent refused the gate, the operator's evaluation committed.
        expect(session.out).toContain('"status":"pending"');
        expect(session.out).toContain("auth.forbidden");
        expect(session.out).toMatch(/"committed":true,"reason":"completed on evidence/);

        const completion = await sub.waitFor(
          (m) => m.topic === "mam/jobs/fix-flaky-test/events" && m.payload.includes('"completed"'),
          60_000,
        );
        const payload = JSON.parse(completion.payload) as { event: string; job_id: string; data: Record<string, unknown> };
        expect(payload).toMatchObject({
          event: "completed",
          job_id: "fix-flaky-test",
          data: { status: "completed", completed_by: "auto_complete" },
        });

        // The change feed holds every change of the session (the README's has no progress:
        // tests/engine/feed-session's has, and compares it row by row), once the
        // API's feed delay (30 s: DynamoDB Streams' lag, see docs/adapters.md) has passed.
        const { operator_token: token } = JSON.parse(await readFile(path.join(dir.dir, ".mam", "credentials.json"), "utf8")) as {
          operator_token: string;
        };
        const kinds = async (): Promise<string[]> => {
          const res = await fetch(`${offline?.api}/v1/events?limit=100`, { headers: { authorization: `Bearer ${token}` } });
          expect(res.status).toBe(200);
          const page = (await res.json()) as { items: { job_id: string; kind: string }[] };
          return page.items.filter((r) => r.job_id === "fix-flaky-test").map((r) => r.kind);
        };
        await expect
          .poll(kinds, { timeout: 120_000, interval: 2_000 })
          .toEqual([
            "job.registered",
            "dispatch.recorded",
            "job.transitioned",
            "report.staged",
            "report.finalized",
            "job.transitioned",
            "intent.published",
          ]);
      } finally {
        await sub.close();
      }

      offline.child.kill("SIGTERM");
      expect(await offline.exited).toBe(0);
      expect(offline.output()).toContain("SIGTERM: stopping");
      for (const port of [ports.api, ports.lambda, ports.mqtt]) expect(await portClosed(port)).toBe(true);
      const ddb = /DynamoDB Local http:\/\/127\.0\.0\.1:(\d+)/.exec(offline.output())?.[1];
      expect(ddb).toBeDefined();
      expect(await portClosed(Number(ddb))).toBe(true);
    },
    START_TIMEOUT_MS + 240_000,
  );
});
