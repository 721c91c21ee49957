import { mkdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { FileReportStore } from "./file-report-store.ts";
import { SqliteJobStore } from "./sqlite-job-store.ts";

/**
 * The embedded data directory, shared by `mam serve` and the CLI's `--data-dir`
 * mode: `<dir>/mam.db` (SQLite, WAL), `<dir>/reports/`, `<dir>/credentials.json`.
 */
export function dataDirPaths(dir: string) {
  const root = resolve(dir);
  return {
    root,
    database: join(root, "mam.db"),
    reports: join(root, "reports"),
    credentials: join(root, "credentials.json"),
  };
}

/**
 * `allowAbsolute`: the CLI finalizes an agent's report where it lies (an absolute
 * directory, the agent's own tree); the service only ever uses locations it derives
 * under the data dir, so `mam serve` turns absolute locations off.
 */
export function openDataDir(
  dir: string,
  opts: { allowAbsolute?: boolean } = {},
): { jobs: SqliteJobStore; reports: FileReportStore; close(): void } {
  const p = dataDirPaths(dir);
  mkdirSync(p.reports, { recursive: true });
  const jobs = new SqliteJobStore(p.database);
  const reports = new FileReportStore(p.root, { allowAbsolute: opts.allowAbsolute ?? true });
  return { jobs, reports, close: () => jobs.close() };
}

export interface Credentials {
  readonly operator_token: string;
  /** The key operator and agent tokens are signed with. */
  readonly signing_key: string;
  /** Only the service (and tools on its data dir) may publish under `mam/`. */
  readonly mqtt: { readonly username: string; readonly password: string };
}

/** `<data dir>/credentials.json`, written by `mam serve` on first start; undefined if absent. */
export async function readCredentials(dir: string): Promise<Credentials | undefined> {
  try {
    return JSON.parse(await readFile(dataDirPaths(dir).credentials, "utf8")) as Credentials;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
}
