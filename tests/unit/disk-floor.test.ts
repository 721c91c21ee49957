/** The disk floor (issue 17): an agent's write that would leave less than MAM_DISK_FLOOR_BYTES free is refused before anything is written. */
import { type DiskSpace, isMamError, keepDiskFloor, type MamError, parseFlags } from "@mam/core";
import { describe, expect, it } from "vitest";

const MiB = 1024 * 1024;

/** A disk that answers a fixed free space and counts how often it was asked. */
function disk(free: number): DiskSpace & { asked: number } {
  return {
    asked: 0,
    async freeBytes() {
      this.asked++;
      return free;
    },
  };
}

async function refusal(run: () => Promise<unknown>): Promise<MamError> {
  try {
    await run();
  } catch (e) {
    if (isMamError(e)) return e;
    throw e;
  }
  throw new Error("not refused");
}

describe("keepDiskFloor", () => {
  const flags = parseFlags({ MAM_DISK_FLOOR_BYTES: String(64 * MiB) });

  it("lets a write through that leaves the floor free, and refuses one that would not, naming the free bytes, the floor and the variable", async () => {
    await keepDiskFloor({ flags, disk: disk(100 * MiB) }, 36 * MiB);
    const e = await refusal(() => keepDiskFloor({ flags, disk: disk(100 * MiB) }, 36 * MiB + 1));
    expect(e.code).toBe("store.insufficientSpace");
    expect(e.retryable).toBe(true);
    expect(e.message).toContain(`${100 * MiB} bytes free`);
    expect(e.message).toContain(`floor of ${64 * MiB} bytes`);
    expect(e.message).toContain("MAM_DISK_FLOOR_BYTES");
    expect(e.message).toContain("nothing was written");
    expect(e.details).toEqual({ free_bytes: 100 * MiB, floor_bytes: 64 * MiB, variable: "MAM_DISK_FLOOR_BYTES" });
    // Already below it: even a write of no bytes is refused.
    expect((await refusal(() => keepDiskFloor({ flags, disk: disk(10 * MiB) }, 0))).message).toMatch(/bytes free, less than the floor/);
  });

  it("keeps no floor where there is no disk (AWS) or the floor is 0, and then asks nothing", async () => {
    await keepDiskFloor({ flags }, 10 * 1024 * MiB);
    const none = disk(0);
    await keepDiskFloor({ flags: parseFlags({ MAM_DISK_FLOOR_BYTES: "0" }), disk: none }, MiB);
    expect(none.asked).toBe(0);
  });

  it("is the default: 64 MiB", () => {
    expect(parseFlags({}).diskFloorBytes).toBe(64 * MiB);
  });
});
