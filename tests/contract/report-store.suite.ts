import { createHash, randomUUID } from "node:crypto";
import { tmpdir } from "node:os";
import { MamError, type ReportStore } from "@mam/core";
import { afterEach, beforeEach, describe, expect, it } from "vitest";

/**
 * The ReportStore contract: what every adapter (files, S3, core's in-memory reference) must do, observed through
 * the port alone. `make` returns a fresh, empty store for each test. Locations are
 * the service's shape, `reports/<job>/<attempt>`.
 */
/** The optional capabilities an adapter declares it has (ports.ts): each is held to its guarantees, or shown absent. */
export interface ReportStoreCapabilities {
  readonly uploadUrl?: boolean;
  readonly copy?: boolean;
  /**
   * How this adapter carries out `retire` (ports.ts), as its test file observes it:
   * - `removes` (files, memory): the object is gone at once;
   * - `marks` with a probe of the mark (S3: the `mam-retired=true` tag). The object
   *   still reads until the bucket's lifecycle rule expires it; no peer we run (s3rver)
   *   applies lifecycle rules, so the expiry itself is shown only by the template's rule
   *   (tests/packaging/template.test.ts), not here.
   */
  readonly retire?: { readonly removes: true } | { readonly removes: false; retired(location: string, name: string): Promise<boolean> };
}

export function reportStoreContract(
  name: string,
  make: () => Promise<{ store: ReportStore; close(): Promise<void> }>,
  capabilities: ReportStoreCapabilities = {},
): void {
  describe(`ReportStore contract: ${name}`, () => {
    let store: ReportStore;
    let close: () => Promise<void>;
    let location: string;

    beforeEach(async () => {
      const made = await make();
      store = made.store;
      close = () => made.close();
      location = `reports/job-${randomUUID().slice(0, 8)}/1`;
    });
    afterEach(async () => {
      await close();
    });

    it("put returns, and hash then re-derives, the sha256 and size of exactly the bytes given", async () => {
      const body = new TextEncoder().encode("# Report\n\nAll done. ✓\n");
      const put = await store.put(location, "report-final.md", body);
      const expected = { sha256: sha256(body), bytes: body.byteLength };
      expect(put).toEqual(expected);
      expect(await store.hash(location, "report-final.md")).toEqual(expected);
      expect(Buffer.from((await store.getBytes(location, "report-final.md")) ?? [])).toEqual(Buffer.from(body));
      expect(await store.exists(location, "report-final.md")).toBe(true);
    });

    it("put takes an AsyncIterable body, and read streams the same bytes back", async () => {
      const chunks = ["part one, ", "", "part two, ", "part three"].map((s) => new TextEncoder().encode(s));
      const whole = Buffer.concat(chunks);
      const put = await store.put(location, "report-final.md.tmp", iterate(chunks));
      expect(put).toEqual({ sha256: sha256(whole), bytes: whole.byteLength });
      expect(await store.hash(location, "report-final.md.tmp")).toEqual(put);
      const stream = await store.read(location, "report-final.md.tmp");
      expect(stream).toBeDefined();
      expect(await collect(stream as AsyncIterable<Uint8Array>)).toEqual(whole);
    });

    it("promote moves the object to its new name and the source is gone", async () => {
      const body = new TextEncoder().encode("final words");
      await store.put(location, "report-final.md.tmp", body);
      await store.promote(location, "report-final.md.tmp", "report-final.md");
      expect(await store.exists(location, "report-final.md.tmp")).toBe(false);
      expect(await store.getBytes(location, "report-final.md.tmp")).toBeUndefined();
      expect(await store.hash(location, "report-final.md")).toEqual({ sha256: sha256(body), bytes: body.byteLength });
    });

    it("promote replaces an existing target", async () => {
      await store.put(location, "report-final.md", new TextEncoder().encode("old"));
      await store.put(location, "report-final.md.tmp", new TextEncoder().encode("new"));
      await store.promote(location, "report-final.md.tmp", "report-final.md");
      expect(Buffer.from((await store.getBytes(location, "report-final.md")) ?? []).toString()).toBe("new");
      expect(await store.exists(location, "report-final.md.tmp")).toBe(false);
    });

    it("promote of a missing source fails with report.notFound and creates nothing", async () => {
      await expectMamError(store.promote(location, "report-final.md.tmp", "report-final.md"), "report.notFound");
      expect(await store.exists(location, "report-final.md")).toBe(false);
    });

    it("hash, getBytes and read of an absent object return undefined; exists is false", async () => {
      expect(await store.hash(location, "report-manifest.json")).toBeUndefined();
      expect(await store.getBytes(location, "report-manifest.json")).toBeUndefined();
      expect(await store.read(location, "report-manifest.json")).toBeUndefined();
      expect(await store.exists(location, "report-manifest.json")).toBe(false);
    });

    it("put replaces atomically: while a put is in flight readers see the old object (or none), never a part, and no partial object is visible", async () => {
      const oldBody = Buffer.alloc(256 * 1024, "a");
      await store.put(location, "report-manifest.json", oldBody);

      const gate = deferred();
      const firstChunkSent = deferred();
      const newBody = async function* (): AsyncGenerator<Uint8Array> {
        yield Buffer.alloc(128 * 1024, "b");
        firstChunkSent.resolve();
        await gate.promise;
        yield Buffer.alloc(128 * 1024, "b");
      };
      const replacing = store.put(location, "report-manifest.json", newBody());
      const fresh = store.put(location, "brand-new.json", newBodyFor(gate.promise));
      await firstChunkSent.promise;

      // Mid-put: the old object whole, and the new name not there at all.
      expect(sha256((await store.getBytes(location, "report-manifest.json")) ?? new Uint8Array())).toBe(sha256(oldBody));
      expect(await store.hash(location, "report-manifest.json")).toEqual({ sha256: sha256(oldBody), bytes: oldBody.byteLength });
      expect(await store.exists(location, "brand-new.json")).toBe(false);
      expect(await store.getBytes(location, "brand-new.json")).toBeUndefined();

      gate.resolve();
      const newBytes = Buffer.alloc(256 * 1024, "b");
      expect(await replacing).toEqual({ sha256: sha256(newBytes), bytes: newBytes.byteLength });
      await fresh;
      expect(sha256((await store.getBytes(location, "report-manifest.json")) ?? new Uint8Array())).toBe(sha256(newBytes));
      expect(await store.exists(location, "brand-new.json")).toBe(true);
    });

    it("a put whose body fails midway leaves the old object as it was, and no new one", async () => {
      const oldBody = new TextEncoder().encode("the old manifest");
      await store.put(location, "report-manifest.json", oldBody);
      const failing = async function* (): AsyncGenerator<Uint8Array> {
        yield new TextEncoder().encode("half of a new");
        throw new Error("the client went away");
      };
      await expect(store.put(location, "report-manifest.json", failing())).rejects.toThrow("the client went away");
      await expect(store.put(location, "never.json", failing())).rejects.toThrow("the client went away");
      expect(await store.hash(location, "report-manifest.json")).toEqual({ sha256: sha256(oldBody), bytes: oldBody.byteLength });
      expect(await store.exists(location, "never.json")).toBe(false);
    });

    it("describe names an object of the store's own tree by a URI in the store's namespace (s3://, mam-file://, mam-memory://), never a server path", () => {
      const address = store.describe(location, "report-final.md");
      expect(address).toMatch(/^(s3|mam-file|mam-memory):\/\/[^/]*\//);
      expect(address.endsWith(`/${location}/report-final.md`), address).toBe(true);
      expect(address).not.toContain(tmpdir());
    });

    it("delete removes an object; deleting it again, or one that never was, is not an error", async () => {
      await store.put(location, "report-final.md.tmp", new TextEncoder().encode("refused at its end"));
      await store.put(location, "report-final.md", new TextEncoder().encode("kept"));
      await store.delete(location, "report-final.md.tmp");
      expect(await store.exists(location, "report-final.md.tmp")).toBe(false);
      expect(await store.getBytes(location, "report-final.md.tmp")).toBeUndefined();
      await store.delete(location, "report-final.md.tmp");
      await store.delete(`reports/job-${randomUUID().slice(0, 8)}/9`, "never.md");
      expect(Buffer.from((await store.getBytes(location, "report-final.md")) ?? []).toString()).toBe("kept");
    });

    describe("copyOnce (write-once, content-addressed evidence)", () => {
      const report = { name: "report-final.md" };
      const body = new TextEncoder().encode("# Report\n\nthe bytes the gate verified\n");
      const digest = sha256(body);
      const pinned = () => ({ location: `${location}/evidence`, name: digest });

      /** Whether the store has retired an object, as this adapter shows it. */
      const retired = async (at: { location: string; name: string }): Promise<boolean> => {
        const how = capabilities.retire ?? { removes: true };
        return how.removes ? !(await store.exists(at.location, at.name)) : how.retired(at.location, at.name);
      };

      it("retire: the object is retired (removed, or marked for the store's expiry) and nothing else is; again, or of an absent name, is no error", async () => {
        await store.put(location, report.name, body);
        const other = new TextEncoder().encode("another finalize's bytes, still referenced");
        await store.put(location, "other.md", other);
        await store.copyOnce({ location, ...report }, pinned(), digest);
        await store.copyOnce({ location, name: "other.md" }, { location: `${location}/evidence`, name: sha256(other) }, sha256(other));
        expect(await retired(pinned())).toBe(false);
        await store.retire(pinned().location, pinned().name);
        expect(await retired(pinned())).toBe(true);
        if (capabilities.retire?.removes === false) {
          // Marked, not removed: it reads as before until the lifecycle rule expires it.
          expect(await store.hash(pinned().location, pinned().name)).toEqual({ sha256: digest, bytes: body.byteLength });
        }
        await store.retire(pinned().location, pinned().name);
        await store.retire(`${location}/evidence`, "f".repeat(64));
        expect(await retired({ location: `${location}/evidence`, name: sha256(other) })).toBe(false);
        expect(await store.hash(`${location}/evidence`, sha256(other))).toEqual({ sha256: sha256(other), bytes: other.byteLength });
        expect(Buffer.from((await store.getBytes(location, report.name)) ?? [])).toEqual(Buffer.from(body));
      });

      it("copyOnce onto a retired copy pins it again: it holds exactly its bytes and is no longer retired", async () => {
        await store.put(location, report.name, body);
        const from = { location, ...report };
        await store.copyOnce(from, pinned(), digest);
        await store.retire(pinned().location, pinned().name);
        const again = await store.copyOnce(from, pinned(), digest);
        // Files: it was removed, so it is created again; S3: it still existed, and its mark is cleared.
        expect(again).toEqual({ bytes: body.byteLength, created: capabilities.retire?.removes !== false });
        expect(await retired(pinned())).toBe(false);
        expect(await store.hash(pinned().location, pinned().name)).toEqual({ sha256: digest, bytes: body.byteLength });
      });

      it("creates the target with exactly the source's bytes, then a second call leaves it and answers created: false", async () => {
        await store.put(location, report.name, body);
        const from = { location, ...report };
        expect(await store.copyOnce(from, pinned(), digest)).toEqual({ bytes: body.byteLength, created: true });
        expect(await store.hash(pinned().location, pinned().name)).toEqual({ sha256: digest, bytes: body.byteLength });
        expect(await store.copyOnce(from, pinned(), digest)).toEqual({ bytes: body.byteLength, created: false });
        expect(Buffer.from((await store.getBytes(pinned().location, pinned().name)) ?? [])).toEqual(Buffer.from(body));
        // The source is copied, not moved.
        expect(await store.hash(location, report.name)).toEqual({ sha256: digest, bytes: body.byteLength });
      });

      it("never replaces an existing target: another source with other bytes is refused (report.changed) and the target keeps its bytes", async () => {
        await store.put(location, report.name, body);
        await store.copyOnce({ location, ...report }, pinned(), digest);
        const other = new TextEncoder().encode("a different report");
        await store.put(location, "other.md", other);
        // The other source hashes to what the caller says, but the target is not those bytes.
        await expectMamError(store.copyOnce({ location, name: "other.md" }, pinned(), sha256(other)), "report.changed");
        expect(await store.hash(pinned().location, pinned().name)).toEqual({ sha256: digest, bytes: body.byteLength });
        // Another source holding the same bytes finds the target already there.
        await store.put(location, "same.md", body);
        expect(await store.copyOnce({ location, name: "same.md" }, pinned(), digest)).toEqual({ bytes: body.byteLength, created: false });
        expect(await store.hash(pinned().location, pinned().name)).toEqual({ sha256: digest, bytes: body.byteLength });
      });

      it("a source that changed after the caller hashed it is refused with report.changed, and nothing is written", async () => {
        await store.put(location, report.name, body);
        await store.put(location, report.name, new TextEncoder().encode("rewritten after it was hashed"));
        await expectMamError(store.copyOnce({ location, ...report }, pinned(), digest), "report.changed");
        expect(await store.exists(pinned().location, pinned().name)).toBe(false);
        expect(await store.read(pinned().location, pinned().name)).toBeUndefined();
      });

      it("an absent source is refused with report.notFound, and nothing is written", async () => {
        await expectMamError(store.copyOnce({ location, ...report }, pinned(), digest), "report.notFound");
        expect(await store.exists(pinned().location, pinned().name)).toBe(false);
      });

      it("refuses a target location that would escape the store, before reading anything", async () => {
        await store.put(location, report.name, body);
        await expectMamError(
          store.copyOnce({ location, ...report }, { location: "reports/../../escape", name: digest }, digest),
          "report.location",
        );
        await expectMamError(store.copyOnce({ location, ...report }, { location, name: "../escape" }, digest), "report.location");
      });
    });

    it("relative locations with '..', and names that are not plain, are refused with report.location before anything is written", async () => {
      const badLocations = ["../escape", "reports/../../escape", "reports/job/1/../../../../etc", "reports/job/..", "reports/\0/1"];
      for (const bad of badLocations) {
        const body = untouchedBody();
        await expectMamError(store.put(bad, "report-final.md", body), "report.location");
        expect(body.pulled).toBe(false);
        await expectMamError(store.getBytes(bad, "report-final.md"), "report.location");
        await expectMamError(store.hash(bad, "report-final.md"), "report.location");
        await expectMamError(store.promote(bad, "report-final.md.tmp", "report-final.md"), "report.location");
        await expectMamError(store.delete(bad, "report-final.md"), "report.location");
      }
      for (const badName of ["../report-final.md", "a/b.md", "..", "", "x\0y"]) {
        const body = untouchedBody();
        await expectMamError(store.put(location, badName, body), "report.location");
        expect(body.pulled).toBe(false);
        await expectMamError(store.exists(location, badName), "report.location");
      }
      await expectMamError(store.promote(location, "report-final.md.tmp", "../../report-final.md"), "report.location");
    });

    it("a 32 MiB object streamed in chunks hashes correctly", async () => {
      const chunkSize = 256 * 1024;
      const chunks = 128;
      const expected = createHash("sha256");
      const body = async function* (): AsyncGenerator<Uint8Array> {
        for (let i = 0; i < chunks; i++) {
          const chunk = Buffer.alloc(chunkSize, i % 251);
          chunk.writeUInt32BE(i, 0);
          expected.update(chunk);
          yield chunk;
        }
      };
      const put = await store.put(location, "big.bin", body());
      const digest = expected.digest("hex");
      expect(put).toEqual({ sha256: digest, bytes: 32 * 1024 * 1024 });
      expect(await store.hash(location, "big.bin")).toEqual({ sha256: digest, bytes: 32 * 1024 * 1024 });
    }, 60_000);

    if (capabilities.copy) {
      it("copy replaces the target with the source's bytes, inside the store, and leaves the source", async () => {
        await store.put(location, "report-final.md", new TextEncoder().encode("old live report"));
        const pinned = new TextEncoder().encode("the pinned bytes");
        await store.put(`${location}/evidence`, sha256(pinned), pinned);
        await store.copy?.({ location: `${location}/evidence`, name: sha256(pinned) }, { location, name: "report-final.md" });
        expect(await store.hash(location, "report-final.md")).toEqual({ sha256: sha256(pinned), bytes: pinned.byteLength });
        expect(await store.hash(`${location}/evidence`, sha256(pinned))).toEqual({ sha256: sha256(pinned), bytes: pinned.byteLength });
        await expectMamError(
          store.copy?.({ location, name: "report-final.md.absent" }, { location, name: "report-final.md" }) ?? Promise.resolve(),
          "report.notFound",
        );
        expect(await store.hash(location, "report-final.md")).toEqual({ sha256: sha256(pinned), bytes: pinned.byteLength });
      });
    } else {
      it("has no copy: core reads the pinned copy and puts it", () => {
        expect(store.copy).toBeUndefined();
      });
    }

    if (capabilities.uploadUrl) {
      it("uploadUrl: one PUT of the declared bytes with the headers given lands at the name, good for the time asked", async () => {
        const body = new TextEncoder().encode("# A report sent around the service\n");
        const before = Date.now();
        const target = await store.uploadUrl?.(location, "report-final.md.tmp", {
          sha256: sha256(body),
          bytes: body.byteLength,
          expiresInSeconds: 600,
        });
        expect(target?.method).toBe("PUT");
        expect(target?.expiresAt.getTime()).toBeGreaterThanOrEqual(before + 600_000);
        expect(target?.expiresAt.getTime()).toBeLessThanOrEqual(Date.now() + 600_000);
        expect(await store.exists(location, "report-final.md.tmp")).toBe(false); // issuing writes nothing
        // fetch sets Content-Length from the body (a header a caller may not set).
        const { "content-length": length, ...headers } = target?.headers ?? {};
        expect(length).toBe(String(body.byteLength));
        const res = await fetch(target?.url ?? "", { method: "PUT", headers, body });
        await res.arrayBuffer();
        expect(res.status).toBe(200);
        expect(await store.hash(location, "report-final.md.tmp")).toEqual({ sha256: sha256(body), bytes: body.byteLength });
      });

      it("uploadUrl refuses a location or name that would escape the store (report.location) and a digest that is not one", async () => {
        const declared = { sha256: "a".repeat(64), bytes: 1, expiresInSeconds: 60 };
        await expectMamError(store.uploadUrl?.("../elsewhere", "report-final.md.tmp", declared) ?? Promise.resolve(), "report.location");
        await expectMamError(store.uploadUrl?.(location, "../report-final.md", declared) ?? Promise.resolve(), "report.location");
        await expectMamError(
          store.uploadUrl?.(location, "report-final.md.tmp", { ...declared, sha256: "nope" }) ?? Promise.resolve(),
          "input.invalid",
        );
      });
    } else {
      it("has no uploadUrl: uploads come through the service's own report route", () => {
        expect(store.uploadUrl).toBeUndefined();
      });
    }
  });
}

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

async function* iterate(chunks: readonly Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const c of chunks) yield c;
}

async function* newBodyFor(gate: Promise<void>): AsyncGenerator<Uint8Array> {
  yield new TextEncoder().encode("{");
  await gate;
  yield new TextEncoder().encode("}");
}

/** A body that records whether anyone began to read it. */
function untouchedBody(): AsyncIterable<Uint8Array> & { pulled: boolean } {
  const body = {
    pulled: false,
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      body.pulled = true;
      return iterate([new TextEncoder().encode("must not be stored")])[Symbol.asyncIterator]();
    },
  };
  return body;
}

async function collect(stream: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of stream) parts.push(Buffer.from(chunk));
  return Buffer.concat(parts);
}

function deferred(): { promise: Promise<void>; resolve(): void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

async function expectMamError(p: Promise<unknown>, code: MamError["code"]): Promise<void> {
  let err: unknown;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  expect(err, `expected ${code}`).toBeInstanceOf(MamError);
  expect((err as MamError).code).toBe(code);
}
