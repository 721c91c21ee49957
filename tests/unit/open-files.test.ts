import { writeFileSync } from "node:fs";
import path from "node:path";
import { connectionCap, softOpenFileLimit } from "@mam/local";
import { afterAll, describe, expect, it } from "vitest";
import { tempDirSync } from "../support/temp-dir.ts";

const tmp = tempDirSync("open-files");
afterAll(() => tmp.remove());

const limits = (soft: string) => {
  const file = path.join(tmp.dir, `limits-${soft}`);
  writeFileSync(
    file,
    `Limit                     Soft Limit           Hard Limit           Units\nMax open files            ${soft}                 4096                 files\n`,
  );
  return file;
};

describe("the connection cap under the open-file limit", () => {
  it("reads the soft limit from /proc/self/limits, and nothing from a file that is not there or says unlimited", () => {
    expect(softOpenFileLimit(limits("256"))).toBe(256);
    expect(softOpenFileLimit(limits("unlimited"))).toBeUndefined();
    expect(softOpenFileLimit(path.join(tmp.dir, "absent"))).toBeUndefined();
  });

  it("is the soft limit less the reserve (1024 assumed when unknown), never below 16, unless configured", () => {
    expect(connectionCap(0, 128, 256)).toBe(128);
    expect(connectionCap(0, 128, undefined)).toBe(896);
    expect(connectionCap(0, 128, 100)).toBe(16);
    expect(connectionCap(50, 128, 256)).toBe(50);
  });
});
