import { statfs } from "node:fs/promises";
import { type DiskSpace, MamError } from "@mam/core";

/**
 * The free space on the disk that holds `dir` (the data dir: its database, reports
 * and broker sessions are all under it), as an unprivileged writer sees it:
 * statfs(2)'s `bavail * bsize`, the blocks left after the file system's reserve for
 * root. Read on every call (one statfs, a few microseconds; see docs/decisions.md),
 * never cached. A disk that cannot be asked is the retryable `store.unavailable`,
 * naming no server path.
 */
export function statfsDiskSpace(dir: string): DiskSpace {
  return {
    async freeBytes() {
      try {
        const s = await statfs(dir);
        return s.bavail * s.bsize;
      } catch (e) {
        const code = (e as { code?: unknown }).code;
        throw new MamError(
          "store.unavailable",
          `the data dir's free space could not be read (${String(code ?? e)}); nothing was written; retry`,
          {
            cause: e,
          },
        );
      }
    },
  };
}
