import { createHash, randomBytes } from "node:crypto";
import { type FileHandle, link, mkdir, open, readFile, realpath, rename, rmdir, stat, unlink } from "node:fs/promises";
import path from "node:path";
import { MamError, type ReportStore } from "@mam/core";

/** Large reads: hashing a big report is a few dozen system calls, not thousands. */
const CHUNK = 1024 * 1024;

/**
 * Reports are the service's alone: files 0600, directories 0700 (the umask can only
 * take bits away). A pinned copy is 0400: nothing, the service included, writes it
 * again in place.
 */
export const REPORT_FILE_MODE = 0o600;
export const PINNED_FILE_MODE = 0o400;
export const REPORT_DIR_MODE = 0o700;

/** The scheme of `describe` for an object in the store's own tree: a name, never a server path. */
export const FILE_STORE_SCHEME = "mam-file:";

const SHA256_HEX = /^[0-9a-f]{64}$/;

export interface FileReportStoreOptions {
  /**
   * Accept absolute locations as they are (default true): the CLI finalizes an
   * agent's report where it lies, in the agent's own tree. The service derives
   * every location itself and may pass false to refuse anything but a relative one.
   */
  readonly allowAbsolute?: boolean;
  /**
   * How the store creates each temp file it writes before renaming or linking it into
   * place (default: `fs.promises.open(file, "wx", mode)`). A seam for the disk-full
   * tests: one that creates the temp file and hands back a handle on Linux's /dev/full
   * makes the kernel answer the writes ENOSPC, with no mount and no root.
   */
  readonly createTemp?: (file: string, mode: number) => Promise<FileHandle>;
}

const createTempFile = (file: string, mode: number): Promise<FileHandle> => open(file, "wx", mode);

/**
 * The embedded ReportStore: one file per object under `root/<location>/<name>`.
 *
 * Atomicity comes from rename(2): `put` writes a hidden temp file in the same
 * directory, fsyncs it, renames it over the name and fsyncs the directory, so a
 * reader opens the old file or the complete new one, and a crash leaves at worst a
 * stray `.<name>.<random>.part`, never a torn object. `copyOnce` creates its target
 * with link(2) instead, which fails when the name exists: create-if-absent, atomic.
 *
 * An object in the store's own tree (a relative location) is described as
 * `mam-file:///<location>/<name>`; only an absolute location, the CLI's on the
 * agent's own tree, is described by its path.
 */
export class FileReportStore implements ReportStore {
  readonly #root: string;
  readonly #allowAbsolute: boolean;
  readonly #createTemp: (file: string, mode: number) => Promise<FileHandle>;
  #realRoot: Promise<string> | undefined;

  constructor(root: string, options: FileReportStoreOptions = {}) {
    this.#root = path.resolve(root);
    this.#allowAbsolute = options.allowAbsolute ?? true;
    this.#createTemp = options.createTemp ?? createTempFile;
  }

  put(location: string, name: string, body: Uint8Array | AsyncIterable<Uint8Array>): Promise<{ sha256: string; bytes: number }> {
    return onExhaustion(
      () => `put ${this.describe(location, name)}`,
      () => this.#put(location, name, body),
    );
  }

  async #put(location: string, name: string, body: Uint8Array | AsyncIterable<Uint8Array>): Promise<{ sha256: string; bytes: number }> {
    const file = await this.#file(location, name, { create: true });
    const dir = path.dirname(file);
    const temp = path.join(dir, `.${name}.${randomBytes(8).toString("hex")}.part`);
    const hash = createHash("sha256");
    let bytes = 0;
    const handle = await this.#createTemp(temp, REPORT_FILE_MODE);
    try {
      for await (const chunk of body instanceof Uint8Array ? [body] : body) {
        hash.update(chunk);
        bytes += chunk.byteLength;
        await writeAll(handle, chunk);
      }
      await handle.sync();
    } catch (e) {
      await handle.close().catch(() => undefined);
      await unlink(temp).catch(() => undefined);
      throw e;
    }
    await handle.close();
    try {
      await rename(temp, file);
    } catch (e) {
      await unlink(temp).catch(() => undefined);
      throw e;
    }
    await syncDirectory(dir);
    return { sha256: hash.digest("hex"), bytes };
  }

  getBytes(location: string, name: string): Promise<Uint8Array | undefined> {
    return onExhaustion(
      () => `getBytes ${this.describe(location, name)}`,
      () => this.#getBytes(location, name),
    );
  }

  async #getBytes(location: string, name: string): Promise<Uint8Array | undefined> {
    const file = await this.#file(location, name);
    try {
      return await readFile(file);
    } catch (e) {
      if (isAbsent(e)) return undefined;
      throw e;
    }
  }

  read(location: string, name: string): Promise<AsyncIterable<Uint8Array> | undefined> {
    return onExhaustion(
      () => `read ${this.describe(location, name)}`,
      () => this.#read(location, name),
    );
  }

  async #read(location: string, name: string): Promise<AsyncIterable<Uint8Array> | undefined> {
    // Open first, so "absent" is decided once and the stream reads that very file.
    const handle = await openIfPresent(await this.#file(location, name));
    return handle?.createReadStream({ highWaterMark: CHUNK, autoClose: true });
  }

  exists(location: string, name: string): Promise<boolean> {
    return onExhaustion(
      () => `exists ${this.describe(location, name)}`,
      () => this.#exists(location, name),
    );
  }

  async #exists(location: string, name: string): Promise<boolean> {
    try {
      return (await stat(await this.#file(location, name))).isFile();
    } catch (e) {
      if (isAbsent(e)) return false;
      throw e;
    }
  }

  promote(location: string, from: string, to: string): Promise<void> {
    return onExhaustion(
      () => `promote ${this.describe(location, to)}`,
      () => this.#promote(location, from, to),
    );
  }

  async #promote(location: string, from: string, to: string): Promise<void> {
    const source = await this.#file(location, from);
    const target = await this.#file(location, to);
    try {
      await rename(source, target);
    } catch (e) {
      if (isAbsent(e)) throw new MamError("report.notFound", `no ${from} to promote at ${this.describe(location, from)}`);
      throw e;
    }
    await syncDirectory(path.dirname(target));
  }

  hash(location: string, name: string): Promise<{ sha256: string; bytes: number } | undefined> {
    return onExhaustion(
      () => `hash ${this.describe(location, name)}`,
      () => this.#hash(location, name),
    );
  }

  async #hash(location: string, name: string): Promise<{ sha256: string; bytes: number } | undefined> {
    const handle = await openIfPresent(await this.#file(location, name));
    if (handle === undefined) return undefined;
    // One buffer, reused for every read: a stream would allocate a fresh chunk each
    // time (measured: 0.4x openssl's throughput and ~40k page faults per GiB).
    const hash = createHash("sha256");
    const buffer = Buffer.allocUnsafe(CHUNK);
    let bytes = 0;
    try {
      for (;;) {
        const { bytesRead } = await handle.read(buffer, 0, CHUNK, null);
        if (bytesRead === 0) break;
        hash.update(buffer.subarray(0, bytesRead));
        bytes += bytesRead;
      }
    } finally {
      await handle.close();
    }
    return { sha256: hash.digest("hex"), bytes };
  }

  delete(location: string, name: string): Promise<void> {
    return onExhaustion(
      () => `delete ${this.describe(location, name)}`,
      () => this.#delete(location, name),
    );
  }

  async #delete(location: string, name: string): Promise<void> {
    const file = await this.#file(location, name);
    try {
      await unlink(file);
    } catch (e) {
      if (isAbsent(e)) return;
      throw e;
    }
    await syncDirectory(path.dirname(file));
  }

  /** A retired object is removed (unlinked, its directory fsynced): on a disk, nothing else would ever reclaim it. */
  retire(location: string, name: string): Promise<void> {
    return onExhaustion(
      () => `retire ${this.describe(location, name)}`,
      () => this.#delete(location, name),
    );
  }

  /**
   * Copy while hashing into a hidden temp file beside the target, fsync it, and only
   * if the bytes are the ones the caller hashed, link(2) it to the target name (EEXIST:
   * the target exists, and is then checked instead), remove the temp name and fsync
   * the directory. A refusal removes what it made, directories included.
   */
  copyOnce(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
    sha256: string,
  ): Promise<{ bytes: number; created: boolean }> {
    return onExhaustion(
      () => `pin ${this.describe(to.location, to.name)}`,
      () => this.#copyOnce(from, to, sha256),
    );
  }

  async #copyOnce(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
    sha256: string,
  ): Promise<{ bytes: number; created: boolean }> {
    if (!SHA256_HEX.test(sha256)) throw new MamError("input.invalid", "copyOnce needs a SHA-256 digest: 64 lowercase hex digits");
    const source = await this.#file(from.location, from.name);
    const target = await this.#file(to.location, to.name);
    const input = await openIfPresent(source);
    if (input === undefined) {
      throw new MamError("report.notFound", `nothing to pin: ${this.describe(from.location, from.name)} does not exist`);
    }
    const dir = path.dirname(target);
    let madeFrom: string | undefined;
    let temp: string | undefined;
    let created = false;
    try {
      madeFrom = await mkdir(dir, { recursive: true, mode: REPORT_DIR_MODE });
      temp = path.join(dir, `.${to.name}.${randomBytes(8).toString("hex")}.part`);
      const bytes = await copyHashing(input, temp, sha256, () => this.describe(from.location, from.name), this.#createTemp);
      try {
        await link(temp, target);
        created = true;
      } catch (e) {
        if ((e as { code?: unknown }).code !== "EEXIST") throw e;
      }
      await unlink(temp);
      temp = undefined;
      await syncDirectory(dir);
      if (created) return { bytes, created };
      const existing = await this.hash(to.location, to.name);
      if (existing?.sha256 !== sha256) {
        throw new MamError(
          "report.changed",
          `${this.describe(to.location, to.name)} already exists and does not hold the bytes of sha256 ${sha256}; it was left as it is`,
        );
      }
      return { bytes: existing.bytes, created };
    } catch (e) {
      if (temp !== undefined) await unlink(temp).catch(() => undefined);
      if (!created && madeFrom !== undefined) await removeEmptyDirectories(dir, madeFrom);
      throw e;
    } finally {
      await input.close();
    }
  }

  describe(location: string, name: string): string {
    const file = this.pathOf(location, name);
    if (path.isAbsolute(location)) return file;
    const inRoot = path.relative(this.#root, file).split(path.sep).map(encodeURIComponent).join("/");
    return `${FILE_STORE_SCHEME}///${inRoot}`;
  }

  /**
   * Where (location, name) lies on this machine's disk, for a tool that runs beside
   * the store and reads the file itself (a benchmark): the path that `describe`'s
   * `mam-file:///` URI stands for. Never for an answer: answers name an object by
   * `describe`. Lexical, like `describe`: it refuses a location that leaves the root
   * by its name; the link check is the one the store makes when it opens the file.
   */
  pathOf(location: string, name: string): string {
    return path.join(this.#directory(location), checkName(name));
  }

  /** The lexical directory for a location, refusing anything that leaves the root. */
  #directory(location: string): string {
    if (typeof location !== "string" || location.length === 0 || location.includes("\0")) {
      throw refuse(location, "a location is a non-empty path without NUL");
    }
    if (path.isAbsolute(location)) {
      if (!this.#allowAbsolute) throw refuse(location, "this store takes only locations relative to its root");
      return path.resolve(location);
    }
    if (location.includes("\\") || location.split("/").some((part) => part === "..")) {
      throw refuse(location, "a relative location may not contain '..' or '\\'");
    }
    const dir = path.resolve(this.#root, location);
    if (dir !== this.#root && !dir.startsWith(this.#root + path.sep)) {
      throw refuse(location, "it resolves outside the store's root");
    }
    return dir;
  }

  /**
   * The file for (location, name). A relative location is also checked after
   * following symlinks, so a link inside the root cannot lead out of it; with
   * `create`, the directories are made only once the location passed.
   */
  async #file(location: string, name: string, opts: { create?: boolean } = {}): Promise<string> {
    const dir = this.#directory(location);
    const file = path.join(dir, checkName(name));
    if (!path.isAbsolute(location)) {
      const root = await this.#resolvedRoot();
      const real = await realpathOfDeepest(dir);
      if (real !== root && !real.startsWith(root + path.sep)) {
        throw refuse(location, "it leads outside the store's root through a link");
      }
    }
    if (opts.create) await mkdir(dir, { recursive: true, mode: REPORT_DIR_MODE });
    return file;
  }

  #resolvedRoot(): Promise<string> {
    this.#realRoot ??= mkdir(this.#root, { recursive: true, mode: REPORT_DIR_MODE }).then(() => realpath(this.#root));
    return this.#realRoot;
  }
}

function checkName(name: string): string {
  if (typeof name !== "string" || name.length === 0 || name.length > 255 || name.startsWith(".") || /[/\\\0]/.test(name)) {
    throw new MamError("report.location", `${JSON.stringify(name)} is not a plain file name`);
  }
  return name;
}

function refuse(location: string, why: string): MamError {
  return new MamError("report.location", `${JSON.stringify(location)} is not a valid report location: ${why}`);
}

/** realpath of `p`, where the parts that do not exist yet are taken as written (they cannot be links). */
async function realpathOfDeepest(p: string): Promise<string> {
  let probe = p;
  const rest: string[] = [];
  for (;;) {
    try {
      return path.join(await realpath(probe), ...rest);
    } catch (e) {
      const parent = path.dirname(probe);
      if (!isAbsent(e) || parent === probe) throw e;
      rest.unshift(path.basename(probe));
      probe = parent;
    }
  }
}

/**
 * Copy `input` to a new file `temp` (0400) while hashing it; fsync it. Throws
 * `report.changed` when the bytes do not hash to `sha256`. Returns the size.
 */
async function copyHashing(
  input: FileHandle,
  temp: string,
  sha256: string,
  source: () => string,
  createTemp: (file: string, mode: number) => Promise<FileHandle>,
): Promise<number> {
  const out = await createTemp(temp, PINNED_FILE_MODE);
  const hash = createHash("sha256");
  const buffer = Buffer.allocUnsafe(CHUNK);
  let bytes = 0;
  try {
    for (;;) {
      const { bytesRead } = await input.read(buffer, 0, CHUNK, null);
      if (bytesRead === 0) break;
      const chunk = buffer.subarray(0, bytesRead);
      hash.update(chunk);
      bytes += bytesRead;
      await writeAll(out, chunk);
    }
    await out.sync();
  } finally {
    await out.close();
  }
  const digest = hash.digest("hex");
  if (digest !== sha256) {
    throw new MamError(
      "report.changed",
      `${source()} changed after it was hashed: expected sha256 ${sha256}, it now holds ${digest} (${bytes} bytes); nothing was pinned`,
    );
  }
  return bytes;
}

/** rmdir from `dir` up to `top` (the first directory mkdir made), stopping at the first that is not empty. */
async function removeEmptyDirectories(dir: string, top: string): Promise<void> {
  for (let d = dir; ; d = path.dirname(d)) {
    try {
      await rmdir(d);
    } catch {
      return;
    }
    if (d === top || path.dirname(d) === d) return;
  }
}

async function writeAll(handle: FileHandle, chunk: Uint8Array): Promise<void> {
  let offset = 0;
  while (offset < chunk.byteLength) {
    const { bytesWritten } = await handle.write(chunk, offset, chunk.byteLength - offset);
    offset += bytesWritten;
  }
}

/** Makes a rename durable: the directory entry itself must reach the disk. */
async function syncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

async function openIfPresent(file: string): Promise<FileHandle | undefined> {
  try {
    return await open(file, "r");
  } catch (e) {
    if (isAbsent(e)) return undefined;
    throw e;
  }
}

function isAbsent(e: unknown): boolean {
  const code = (e as { code?: unknown }).code;
  return code === "ENOENT" || code === "ENOTDIR";
}

/**
 * The file-system answers that say the host ran out of something (space, a quota,
 * file descriptors) rather than that the request is wrong: the port's retryable
 * `store.unavailable`, naming what ran out and never a server path. Every method
 * removes what it made before it throws, so nothing half-written is left.
 */
const EXHAUSTED: Readonly<Record<string, string>> = {
  ENOSPC: "no space is left on the report store's disk",
  EDQUOT: "the report store's disk quota is spent",
  EMFILE: "the service has too many open files",
  ENFILE: "the host has too many open files",
};

async function onExhaustion<T>(what: () => string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    const why = typeof code === "string" ? EXHAUSTED[code] : undefined;
    if (why === undefined) throw e;
    throw new MamError("store.unavailable", `${what()}: ${why}; nothing was written; retry once it is freed`, { cause: e });
  }
}
