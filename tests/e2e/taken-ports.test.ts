/**
 * A taken port is one line naming the variable to change, and exit 1 — never a
 * Node stack trace: for each listener of `mam serve` (what `npm start` runs) and of
 * `npm run offline` (scripts/offline.ts, which checks its ports before it starts
 * Java or any peer, so no Java is needed here). The port is really taken, by a
 * plain net server of this test.
 */
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runNode } from "../support/mam-process.ts";
import { refusedServe } from "../support/serve-process.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

let tmp: TempDir;
let taken: net.Server;
let port: number;

beforeAll(async () => {
  tmp = await tempDir("taken-ports");
  taken = net.createServer();
  await new Promise<void>((resolve, reject) => {
    taken.once("error", reject);
    taken.listen(0, "127.0.0.1", () => resolve());
  });
  port = (taken.address() as net.AddressInfo).port;
});
afterAll(async () => {
  await new Promise<void>((resolve) => taken?.close(() => resolve()));
  await tmp?.remove();
});

/** `npm run offline`'s script, expected to refuse at once: its exit code and what it said. */
async function refusedOffline(env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  // A check that failed to refuse would go on to start DynamoDB Local: stop it rather than hang.
  const run = await runNode(["--import", "tsx", path.join(ROOT, "scripts/offline.ts")], {
    cwd: ROOT,
    env: { MAM_DATA_DIR: path.join(tmp.dir, "offline"), ...env },
    killAfterMs: 20_000,
  });
  return { code: run.status, stdout: run.stdout, stderr: run.stderr };
}

const lines = (text: string) => text.split("\n").filter((l) => l !== "");

describe("mam serve on a taken port", () => {
  it.each(["MAM_PORT", "MAM_MQTT_PORT"])("%s taken: exit 1, one line naming it, no stack trace", async (variable) => {
    const { code, stderr } = await refusedServe(path.join(tmp.dir, `serve-${variable}`), { [variable]: String(port) });
    expect(code).toBe(1);
    expect(lines(stderr)).toEqual([`mam serve: port ${port} is taken (${variable}); set ${variable} to a free port`]);
    expect(stderr).not.toMatch(/^\s+at /m);
  });
});

describe("npm run offline on a taken port", () => {
  it.each(["MAM_OFFLINE_PORT", "MAM_OFFLINE_LAMBDA_PORT", "MAM_OFFLINE_MQTT_PORT"])(
    "%s taken: exit 1 before anything starts, one line naming it, no stack trace",
    async (variable) => {
      const { code, stdout, stderr } = await refusedOffline({ [variable]: String(port) });
      expect(code).toBe(1);
      expect(lines(stderr)).toEqual([`offline: port ${port} is taken (${variable}); set ${variable} to a free port`]);
      expect(stderr).not.toMatch(/^\s+at /m);
      expect(stdout).toBe("");
    },
  );

  it("a port that is not a number: exit 1, one line naming the variable", async () => {
    const { code, stderr } = await refusedOffline({ MAM_OFFLINE_PORT: "three thousand" });
    expect(code).toBe(1);
    expect(lines(stderr)).toEqual([`offline: MAM_OFFLINE_PORT must be a port number (0 to 65535), got "three thousand"`]);
  });
});
