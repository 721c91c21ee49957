import { join, resolve } from "node:path";

/**
 * The embedded data directory, shared by `mam serve` and the CLI's `--data-dir`
 * mode: `<dir>/mam.db` (SQLite, WAL), `<dir>/reports/`, `<dir>/credentials.json`,
 * and `.private` once `secureDataDir` has made all of it private. The dir is 0700,
 * its files 0600, its directories 0700.
 *
 * A module of its own (`@mam/local/data-dir-paths`), importing nothing but
 * `node:path`: the CLI names a data dir in every mode, and an API-mode command
 * must not load SQLite to do it.
 */
export function dataDirPaths(dir: string) {
  const root = resolve(dir);
  return {
    root,
    database: join(root, "mam.db"),
    reports: join(root, "reports"),
    credentials: join(root, "credentials.json"),
    /** The embedded broker's persistent sessions (a LevelDB database, 0700). */
    broker: join(root, "broker"),
    /** Which token name owns each persistent session of the broker (JSON, 0600; beside `broker`). */
    brokerOwners: join(root, "broker-owners.json"),
  };
}
