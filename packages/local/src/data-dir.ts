import { chmodSync, closeSync, existsSync, lstatSync, mkdirSync, openSync, readdirSync, statSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import {
  type Clock,
  type CommitHook,
  type Deps,
  type DiskSpace,
  type Flags,
  MamError,
  type MigrationResult,
  type Publisher,
  randomIds,
  systemClock,
} from "@mam/core";
import type Database from "better-sqlite3";
import { dataDirPaths } from "./data-dir-paths.ts";
import { statfsDiskSpace } from "./disk-space.ts";
import { FileReportStore, REPORT_DIR_MODE, REPORT_FILE_MODE } from "./file-report-store.ts";
import { sqlStoreError } from "./sql-job-store.ts";
import { SqliteJobStore } from "./sqlite-job-store.ts";
import { migrateDatabaseFile } from "./sqlite-migrations.ts";

/** The data dir and everything under it are for this user alone: no bit for group or others. */
const DATA_DIR_MODE = 0o700;
const GROUP_AND_OTHERS = 0o077;
/** Present once `secureDataDir` has walked the whole data dir (see there). */
const WALKED_MARKER = ".private";

/**
 * The embedded JobStore as `mam serve` and the CLI compose it: the SQLite adapter,
 * with the base's record cache on (the file's `data_version` tells it of other
 * writers) and `hooks` told of each commit. `database` is a file, `:memory:`, or a
 * connection the store then owns; `close` closes the connection.
 */
export function openEmbeddedJobStore(
  database: string | Database.Database,
  opts: { hooks?: readonly CommitHook[] } = {},
): { jobs: SqliteJobStore; close(): Promise<void> } {
  const sqlite = new SqliteJobStore(database, { cache: {}, ...(opts.hooks === undefined ? {} : { hooks: opts.hooks }) });
  return { jobs: sqlite, close: () => sqlite.close() };
}

/**
 * Bring the data dir's job database to this code's schema version (made, 0600, if
 * absent), or refuse it (`store.version`) when it is newer than this code: what
 * `mam serve` does first, before it listens on anything, and `mam migrate --data-dir`.
 */
export function migrateDataDir(dir: string): MigrationResult {
  const p = dataDirPaths(dir);
  return readingDataDir(p.database, "database", () => {
    closeSync(openSync(p.database, "a", REPORT_FILE_MODE));
    return migrateDatabaseFile(p.database);
  });
}

/** What a person can do about each part of a data dir that cannot be read. */
const UNREADABLE_REMEDY = {
  database: "point MAM_DATA_DIR (or --data-dir) at a mam data dir, or move it away to start an empty one",
  reports: "move it away (a directory of reports is kept there)",
  credentials: "restore it, or move it away to have new ones written (tokens signed with the old key then stop working)",
} as const;

/**
 * `read()`, with a part of the data dir that is not what mam keeps there (not a
 * database, a directory where a file belongs, no right to it, not JSON) refused as
 * one line naming the file and what to change (`dataDirRefusal`).
 */
function readingDataDir<T>(path: string, part: keyof typeof UNREADABLE_REMEDY, read: () => T): T {
  try {
    return read();
  } catch (e) {
    throw dataDirRefusal(path, part, e);
  }
}

/**
 * What a failure to read a part of the data dir is answered with: a refusal of ours as
 * it is; busy (another process holds it locked), full, out of descriptors as the
 * store's own retryable answers, as on any later write (nothing to change, nothing to
 * move away); anything else `config.invalid` (exit 1), naming the file and what to
 * change, instead of the driver's or the file system's own words.
 */
function dataDirRefusal(path: string, part: keyof typeof UNREADABLE_REMEDY, e: unknown): MamError {
  if (e instanceof MamError) return e;
  const retryable = sqlStoreError(e);
  if (retryable instanceof MamError) return retryable;
  return new MamError(
    "config.invalid",
    `the data dir's ${part} ${path} cannot be read (${unreadableReason(e)}): ${UNREADABLE_REMEDY[part]}`,
    { cause: e },
  );
}

function unreadableReason(e: unknown): string {
  const code = (e as { code?: unknown } | null)?.code;
  if (code === "EISDIR") return "a directory, not a file";
  if (code === "EEXIST" || code === "ENOTDIR") return "a file, not a directory";
  if (code === "EACCES" || code === "EPERM") return "permission denied";
  // Never the parser's own words: V8 quotes the text around where it stopped, which in
  // credentials.json is the signing key or a token. Where it stopped is enough to look.
  if (e instanceof SyntaxError) {
    const at = /at position (\d+)/.exec(e.message)?.[1];
    return at === undefined ? "not JSON" : `not JSON at position ${at}`;
  }
  return e instanceof Error ? e.message : String(e);
}

/**
 * Core's ports over an open data dir (`openDataDir`): its stores, the publisher the
 * caller connected (to the broker `brokerOf` chose), the configuration's flags —
 * what `mam serve` and the `mam` command on a data dir both run core over.
 */
export function dataDirDeps(store: ReturnType<typeof openDataDir>, publisher: Publisher, flags: Flags, clock: Clock = systemClock): Deps {
  return { jobs: store.jobs, reports: store.reports, disk: store.disk, publisher, clock, ids: randomIds, flags };
}

/**
 * `allowAbsolute`: the CLI finalizes an agent's report where it lies (an absolute
 * directory, the agent's own tree); the service only ever uses locations it derives
 * under the data dir, so `mam serve` turns absolute locations off. `disk` is the free
 * space of the data dir's disk, for the disk floor (`Deps.disk`).
 */
export function openDataDir(
  dir: string,
  opts: { allowAbsolute?: boolean } = {},
): { jobs: SqliteJobStore; reports: FileReportStore; disk: DiskSpace; close(): void } {
  const p = dataDirPaths(dir);
  readingDataDir(p.reports, "reports", () => mkdirSync(p.reports, { recursive: true, mode: REPORT_DIR_MODE }));
  // SQLite would create the database 0644; made first, 0600, it is opened as it is,
  // and SQLite gives its -wal and -shm files the database file's mode.
  const { jobs, close } = readingDataDir(p.database, "database", () => {
    closeSync(openSync(p.database, "a", REPORT_FILE_MODE));
    return openEmbeddedJobStore(p.database);
  });
  const reports = new FileReportStore(p.root, { allowAbsolute: opts.allowAbsolute ?? true });
  return { jobs, reports, disk: statfsDiskSpace(p.root), close: () => void close() };
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
  const path = dataDirPaths(dir).credentials;
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw dataDirRefusal(path, "credentials", e);
  }
  return readingDataDir(path, "credentials", () => {
    const credentials = JSON.parse(text) as Partial<Credentials> | null;
    if (typeof credentials?.signing_key !== "string" || typeof credentials.operator_token !== "string") {
      throw new Error("no signing_key and operator_token in it");
    }
    return credentials as Credentials;
  });
}

/**
 * Make the data dir private before `mam serve` keeps anything in it: created 0700 if
 * absent; an existing one must belong to this user (`uid`, the process's own by
 * default) and is made 0700. What lies in it loses whatever bits for group and
 * others an older version left (0755 directories, a 0644 database and reports);
 * links are left as they are and never followed. The entries at the top (database,
 * credentials, `reports/`) are checked at every start; the whole tree is walked once,
 * after which `.private` records that it was (a walk costs 15-30 µs an entry, 0.4 to
 * 0.7 s for 5,000 jobs' reports on a busy 2-core machine, and the tree only grows;
 * this version creates nothing loose). A data dir that
 * cannot be made private (another user's, a file system that keeps its mode, an
 * entry that cannot be changed) is refused with `config.invalid`, naming the reason,
 * before anything is written in it. Returns how many entries had to be tightened.
 */
export function secureDataDir(dir: string, opts: { uid?: number } = {}): { tightened: number; walked: boolean } {
  const root = resolve(dir);
  const uid = opts.uid ?? process.getuid?.();
  const refuse = (why: string, cause?: unknown): MamError =>
    new MamError("config.invalid", `the data dir ${root} (MAM_DATA_DIR) cannot be made private (0700): ${why}`, {
      issues: [{ path: "MAM_DATA_DIR", message: why }],
      ...(cause === undefined ? {} : { cause }),
    });
  try {
    mkdirSync(root, { recursive: true, mode: DATA_DIR_MODE });
  } catch (e) {
    const code = errorCode(e);
    throw refuse(code === "EEXIST" || code === "ENOTDIR" ? "it is not a directory" : `it could not be created (${code})`, e);
  }
  const st = statSync(root);
  if (!st.isDirectory()) throw refuse("it is not a directory");
  if (uid !== undefined && st.uid !== uid) {
    throw refuse(`it belongs to uid ${st.uid}, not to this user (uid ${uid}); use a directory of your own, or chown it`);
  }
  let tightened = 0;
  if ((st.mode & 0o777) !== DATA_DIR_MODE) {
    try {
      chmodSync(root, DATA_DIR_MODE);
    } catch (e) {
      throw refuse(`chmod failed (${errorCode(e)})`, e);
    }
    if ((statSync(root).mode & GROUP_AND_OTHERS) !== 0) throw refuse("its file system does not keep the mode it is given");
    tightened++;
  }
  // The root is private now: nobody else can add or swap an entry under it while this runs.
  const tighten = (entry: string): { isDir: boolean } | undefined => {
    let s: ReturnType<typeof lstatSync>;
    try {
      s = lstatSync(entry);
    } catch (e) {
      if (errorCode(e) === "ENOENT") return undefined;
      throw e;
    }
    if (s.isSymbolicLink()) return undefined;
    const mode = s.mode & 0o7777;
    if ((mode & GROUP_AND_OTHERS) !== 0) {
      try {
        chmodSync(entry, mode & ~GROUP_AND_OTHERS);
      } catch (e) {
        throw refuse(`${entry} could not be made private (${errorCode(e)})`, e);
      }
      tightened++;
    }
    return { isDir: s.isDirectory() };
  };
  const list = (d: string): string[] => {
    try {
      return readdirSync(d);
    } catch (e) {
      if (errorCode(e) === "ENOENT") return [];
      throw e;
    }
  };
  const walk = (d: string): void => {
    for (const name of list(d)) {
      const entry = join(d, name);
      if (tighten(entry)?.isDir) walk(entry);
    }
  };
  const marker = join(root, WALKED_MARKER);
  const walked = !existsSync(marker);
  if (walked) {
    walk(root);
    closeSync(openSync(marker, "a", REPORT_FILE_MODE));
  } else {
    for (const name of list(root)) tighten(join(root, name));
  }
  return { tightened, walked };
}

function errorCode(e: unknown): string {
  const code = (e as { code?: unknown }).code;
  return typeof code === "string" ? code : String(e);
}
