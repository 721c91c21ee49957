import { mkdtempSync, rmSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";

/** A fresh directory under the OS temp dir, named `mam-<name>-XXXXXX`, and how to remove it. */
export interface TempDir {
  readonly dir: string;
  remove(): Promise<void>;
  removeSync(): void;
}

function handle(dir: string): TempDir {
  return {
    dir,
    remove: () => rm(dir, { recursive: true, force: true }),
    removeSync: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** The one temp-dir helper. */
export async function tempDir(name: string): Promise<TempDir> {
  return handle(await mkdtemp(path.join(tmpdir(), `mam-${name}-`)));
}

/** `tempDir` for synchronous hooks. */
export function tempDirSync(name: string): TempDir {
  return handle(mkdtempSync(path.join(tmpdir(), `mam-${name}-`)));
}
