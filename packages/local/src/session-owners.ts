import { readFileSync } from "node:fs";
import { open, rename } from "node:fs/promises";
import { MamError } from "@mam/core";

/** The owners file, like everything under the data dir, is for this user alone. */
const OWNERS_FILE_MODE = 0o600;

/**
 * Which subscriber (a token's name) owns each persistent session of the embedded
 * broker, by client id. A session is claimed by the first logged-in `clean: false`
 * CONNECT with its id and released by its owner's `clean: true` CONNECT (which makes
 * aedes wipe it). With a file, every change is written (a temporary file, fsync,
 * rename) before the CONNECT it answers is accepted, so a crash never leaves a
 * session that anyone may claim; without one, ownership lives in memory.
 *
 * File: `{"version": 1, "owners": {"<client id>": "<name>"}}`.
 */
export class SessionOwners {
  readonly #owners: Map<string, string>;
  readonly #file: string | undefined;
  #writing: Promise<void> = Promise.resolve();

  private constructor(owners: Map<string, string>, file: string | undefined) {
    this.#owners = owners;
    this.#file = file;
  }

  /** Reads `file` (absent: nobody owns anything yet); a file that is not ours is refused, never overwritten. */
  static load(file: string | undefined): SessionOwners {
    const owners = new Map<string, string>();
    if (file === undefined) return new SessionOwners(owners, undefined);
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return new SessionOwners(owners, file);
      throw e;
    }
    const parsed = JSON.parse(text) as { version?: unknown; owners?: unknown };
    if (parsed.version !== 1 || typeof parsed.owners !== "object" || parsed.owners === null) {
      throw new MamError("config.invalid", `${file} is not a session owners file this version reads (version 1)`);
    }
    for (const [clientId, name] of Object.entries(parsed.owners)) {
      if (typeof name === "string") owners.set(clientId, name);
    }
    return new SessionOwners(owners, file);
  }

  owner(clientId: string): string | undefined {
    return this.#owners.get(clientId);
  }

  /** Persistent sessions owned by `name`. */
  countOf(name: string): number {
    let n = 0;
    for (const owner of this.#owners.values()) if (owner === name) n++;
    return n;
  }

  get size(): number {
    return this.#owners.size;
  }

  /** Records `name` as the session's owner; resolves once that is on disk. */
  claim(clientId: string, name: string): Promise<void> {
    this.#owners.set(clientId, name);
    return this.#save();
  }

  /** Forgets the session's owner (its owner started it afresh); resolves once that is on disk. */
  release(clientId: string): Promise<void> {
    if (!this.#owners.delete(clientId)) return Promise.resolve();
    return this.#save();
  }

  /** Writes one at a time, each the whole map as it is when it starts. */
  #save(): Promise<void> {
    const file = this.#file;
    if (file === undefined) return Promise.resolve();
    const next = this.#writing.then(async () => {
      const tmp = `${file}.tmp`;
      const fh = await open(tmp, "w", OWNERS_FILE_MODE);
      try {
        await fh.writeFile(`${JSON.stringify({ version: 1, owners: Object.fromEntries(this.#owners) })}\n`);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(tmp, file);
    });
    this.#writing = next.catch(() => undefined);
    return next;
  }
}
