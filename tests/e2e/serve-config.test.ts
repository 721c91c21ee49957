/**
 * A bad configuration stops `mam serve` before it starts: one message naming the
 * variable, exit 1 (`config.invalid`), no stack trace, nothing written.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { refusedServe } from "../support/serve-process.ts";
import { type TempDir, tempDir } from "../support/temp-dir.ts";

let tmp: TempDir;
beforeAll(async () => {
  tmp = await tempDir("serve-config");
});
afterAll(async () => {
  await tmp?.remove();
});

describe("e2e: mam serve refuses a bad configuration at start-up", () => {
  it("issue 17: a MAM_OPERATOR_TOKEN shorter than 32 characters: exit 1, naming it, no stack trace, the token never printed, nothing written", async () => {
    const dataDir = join(tmp.dir, "short-operator-token");
    const { code, stderr } = await refusedServe(dataDir, { MAM_OPERATOR_TOKEN: "Q" });
    expect(code, stderr).toBe(1);
    expect(stderr).toContain("MAM_OPERATOR_TOKEN must be at least 32 characters");
    expect(stderr).not.toMatch(/^\s+at /m);
    expect(stderr).not.toMatch(/serving on/);
    expect(stderr).not.toContain('"Q"');
    expect(existsSync(dataDir)).toBe(false);
  }, 30_000);
});
