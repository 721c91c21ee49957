import { createHash } from "node:crypto";
import {
  CopyObjectCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  type GetObjectCommandOutput,
  HeadObjectCommand,
  PutObjectCommand,
  PutObjectTaggingCommand,
  S3Client,
  type S3ClientConfig,
} from "@aws-sdk/client-s3";
import { getSignedUrl } from "@aws-sdk/s3-request-presigner";
import { MamError, type ReportStore, type UploadDeclared, type UploadTarget } from "@mam/core";
import { objectKey, s3Uri } from "./s3-keys.ts";
import { readSdkFailure, storeFailure } from "./sdk-errors.ts";

export interface S3ReportStoreOptions {
  /** Build it with `s3ClientConfig()` (or the same checksum settings). */
  readonly client: S3Client;
  readonly bucket: string;
  /** `put` collects the body to hash it first; refuse anything larger. Default 64 MiB. */
  readonly maxBodyBytes?: number;
}

/**
 * The client settings the store expects. Checksums are ours: `put` computes the
 * SHA-256 itself and sends it; the SDK's automatic CRC (and its aws-chunked framing of
 * stream bodies, which S3 stand-ins store verbatim) stays off unless an operation
 * requires it.
 */
export function s3ClientConfig(config: S3ClientConfig = {}): S3ClientConfig {
  return {
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
    ...config,
  };
}

/** `S3Client` built with `s3ClientConfig`; `forcePathStyle` for a local peer by endpoint. */
export function createS3Client(config: S3ClientConfig = {}): S3Client {
  return new S3Client(s3ClientConfig({ ...(config.endpoint !== undefined ? { forcePathStyle: true } : {}), ...config }));
}

const isMissing = (err: unknown): boolean => {
  const f = readSdkFailure(err);
  return f.name === "NoSuchKey" || f.name === "NotFound" || f.code === "NoSuchKey" || f.status === 404;
};

type Body = NonNullable<GetObjectCommandOutput["Body"]>;

const SHA256_HEX = /^[0-9a-f]{64}$/;

function asByteStream(body: Body): AsyncIterable<Uint8Array> {
  // On Node the SDK's body is an IncomingMessage (a Readable): async-iterable bytes.
  if (typeof (body as Partial<AsyncIterable<Uint8Array>>)[Symbol.asyncIterator] === "function") {
    return body as AsyncIterable<Uint8Array>;
  }
  const web = (body as { transformToWebStream?: () => ReadableStream<Uint8Array> }).transformToWebStream;
  if (typeof web === "function") {
    const stream = web.call(body);
    return {
      async *[Symbol.asyncIterator]() {
        const reader = stream.getReader();
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) return;
            yield value;
          }
        } finally {
          reader.releaseLock();
        }
      },
    };
  }
  throw new MamError("internal", "the S3 response body is not a stream");
}

/**
 * Reports on S3: `<location>/<name>`, e.g. `reports/<job>/<attempt>/report-final.md`.
 *
 * - `put` hashes the body in our own code first (it is bounded: an API request body),
 *   then sends one PutObject with the digest as `ChecksumSHA256` (S3 refuses bytes
 *   that do not match it) and as metadata `sha256` (hex). PutObject is atomic.
 * - `promote` is CopyObject (atomic per object: a reader sees no `to`, or all of it)
 *   then DeleteObject of `from`. If the delete fails, `to` is already complete and a
 *   retried promote copies the same bytes again.
 * - `hash` streams the stored bytes through SHA-256; it trusts neither the metadata
 *   nor S3's checksum (a multipart object's is a checksum of part checksums).
 * - `delete` is DeleteObject, which S3 answers alike whether the key existed or not.
 * - `copyOnce` reads the source (bounded, like `put`), hashes it in our own code and
 *   only if it is what the caller hashed, writes it with PutObject `If-None-Match: *`
 *   (S3 creates the key only if absent: 412 when it exists) and `ChecksumSHA256`. A
 *   HeadObject of the target comes first, for peers that ignore `If-None-Match`
 *   (s3rver): there the check and the write are two requests, and only real S3
 *   makes them one.
 *
 * - `copyOnce` of a source larger than `maxBodyBytes` (a report uploaded around the
 *   service) streams it through SHA-256 and, only if it is what the caller hashed,
 *   copies it inside S3: CopyObject with `x-amz-copy-source-if-match` (the ETag of the
 *   version hashed: a source replaced since is 412, `report.changed`) and
 *   `If-None-Match: *`. s3rver honours neither header; real S3 both.
 * - `copy` is CopyObject (a live report from its pinned copy, whatever its size).
 * - `uploadUrl` presigns one PutObject of exactly the declared bytes: the content
 *   length and `x-amz-checksum-sha256` (base64 of the declared digest) are signed
 *   headers the uploader must send as given, so S3 refuses any other length and any
 *   bytes that do not hash to the digest. s3rver ignores `x-amz-checksum-*`: there
 *   only the service's own hash at finalize protects (and it is what protects
 *   everywhere: the port promises nothing more).
 *
 * Locations and names are checked before any request; a bad one is `report.location`.
 * The IAM role needs `s3:ListBucket` on the bucket, or S3 answers a missing key with
 * 403 instead of 404.
 */
export class S3ReportStore implements ReportStore {
  readonly bucket: string;
  readonly #client: S3Client;
  readonly #maxBodyBytes: number;

  constructor(opts: S3ReportStoreOptions) {
    this.#client = opts.client;
    this.bucket = opts.bucket;
    this.#maxBodyBytes = opts.maxBodyBytes ?? 64 * 1024 * 1024;
  }

  async put(location: string, name: string, body: Uint8Array | AsyncIterable<Uint8Array>): Promise<{ sha256: string; bytes: number }> {
    const key = objectKey(location, name);
    const hash = createHash("sha256");
    let bytes: Uint8Array;
    if (body instanceof Uint8Array) {
      if (body.byteLength > this.#maxBodyBytes) throw this.#tooLarge(key);
      hash.update(body);
      bytes = body;
    } else {
      const chunks: Uint8Array[] = [];
      let size = 0;
      for await (const chunk of body) {
        size += chunk.byteLength;
        if (size > this.#maxBodyBytes) throw this.#tooLarge(key);
        hash.update(chunk);
        chunks.push(chunk);
      }
      bytes = Buffer.concat(chunks, size);
    }
    const digest = hash.digest();
    const sha256 = digest.toString("hex");
    try {
      await this.#client.send(
        new PutObjectCommand({
          Bucket: this.bucket,
          Key: key,
          Body: bytes,
          ContentLength: bytes.byteLength,
          ChecksumSHA256: digest.toString("base64"),
          Metadata: { sha256 },
        }),
      );
    } catch (err) {
      throw storeFailure(err, `put ${this.describe(location, name)}`);
    }
    return { sha256, bytes: bytes.byteLength };
  }

  async getBytes(location: string, name: string): Promise<Uint8Array | undefined> {
    const key = objectKey(location, name);
    try {
      const out = await this.#client.send(new GetObjectCommand({ Bucket: this.bucket, Key: key }));
      if (out.Body === undefined) return new Uint8Array(0);
      return await out.Body.transformToByteArray();
    } catch (err) {
      if (isMissing(err)) return undefined;
      throw storeFailure(err, `get ${this.describe(location, name)}`);
    }
  }

  async read(location: string, name: string): Promise<AsyncIterable<Uint8Array> | undefined> {
    const out = await this.#get(location, name);
    if (out === undefined) return undefined;
    return out.Body === undefined ? emptyStream() : asByteStream(out.Body);
  }

  async exists(location: string, name: string): Promise<boolean> {
    const key = objectKey(location, name);
    try {
      await this.#client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: key }));
      return true;
    } catch (err) {
      if (isMissing(err)) return false;
      throw storeFailure(err, `head ${this.describe(location, name)}`);
    }
  }

  async promote(location: string, from: string, to: string): Promise<void> {
    const source = objectKey(location, from);
    const target = objectKey(location, to);
    if (source === target) {
      if (!(await this.exists(location, from))) throw this.#noSource(location, from);
      return;
    }
    try {
      await this.#client.send(
        new CopyObjectCommand({
          Bucket: this.bucket,
          Key: target,
          CopySource: `${this.bucket}/${source.split("/").map(encodeURIComponent).join("/")}`,
          MetadataDirective: "COPY",
        }),
      );
    } catch (err) {
      if (isMissing(err)) throw this.#noSource(location, from);
      throw storeFailure(err, `promote ${this.describe(location, from)} to ${to}`);
    }
    try {
      await this.#client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: source }));
    } catch (err) {
      throw storeFailure(err, `remove ${this.describe(location, from)} after promoting it`);
    }
  }

  async hash(location: string, name: string): Promise<{ sha256: string; bytes: number } | undefined> {
    const out = await this.#get(location, name);
    if (out === undefined) return undefined;
    const hash = createHash("sha256");
    let bytes = 0;
    if (out.Body !== undefined) {
      try {
        for await (const chunk of asByteStream(out.Body)) {
          hash.update(chunk);
          bytes += chunk.byteLength;
        }
      } catch (err) {
        throw storeFailure(err, `hash ${this.describe(location, name)}`);
      }
    }
    return { sha256: hash.digest("hex"), bytes };
  }

  async delete(location: string, name: string): Promise<void> {
    const key = objectKey(location, name);
    try {
      await this.#client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: key }));
    } catch (err) {
      if (isMissing(err)) return;
      throw storeFailure(err, `delete ${this.describe(location, name)}`);
    }
  }

  async copyOnce(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
    sha256: string,
  ): Promise<{ bytes: number; created: boolean }> {
    const sourceKey = objectKey(from.location, from.name);
    const targetKey = objectKey(to.location, to.name);
    if (!SHA256_HEX.test(sha256)) throw new MamError("input.invalid", "copyOnce needs a SHA-256 digest: 64 lowercase hex digits");
    const source = await this.#get(from.location, from.name);
    if (source === undefined) {
      throw new MamError("report.notFound", `nothing to pin: ${this.describe(from.location, from.name)} does not exist`);
    }
    if ((source.ContentLength ?? 0) > this.#maxBodyBytes) return this.#copyLargeOnce(from, to, sha256, source);
    const hash = createHash("sha256");
    const chunks: Uint8Array[] = [];
    let size = 0;
    if (source.Body !== undefined) {
      try {
        for await (const chunk of asByteStream(source.Body)) {
          size += chunk.byteLength;
          if (size > this.#maxBodyBytes) throw this.#tooLarge(sourceKey);
          hash.update(chunk);
          chunks.push(chunk);
        }
      } catch (err) {
        throw storeFailure(err, `read ${this.describe(from.location, from.name)}`);
      }
    }
    const digest = hash.digest();
    if (digest.toString("hex") !== sha256) {
      throw new MamError(
        "report.changed",
        `${this.describe(from.location, from.name)} changed after it was hashed: expected sha256 ${sha256}, it now holds ${digest.toString("hex")} (${size} bytes); nothing was pinned`,
      );
    }
    if (await this.exists(to.location, to.name)) return this.#pinned(to, sha256);
    try {
      await this.#client.send(
        new PutObjectCommand({
          Bucket: this.bucket,
          Key: targetKey,
          Body: Buffer.concat(chunks, size),
          ContentLength: size,
          ChecksumSHA256: digest.toString("base64"),
          Metadata: { sha256 },
          IfNoneMatch: "*",
        }),
      );
    } catch (err) {
      const f = readSdkFailure(err);
      // 412: the key exists (another writer won); 409: a conditional write to it is in flight.
      if (f.status === 412 || f.name === "PreconditionFailed") return this.#pinned(to, sha256);
      if (f.status === 409) {
        throw new MamError("store.unavailable", `pin ${this.describe(to.location, to.name)}: another write to it is in flight; retry`, {
          cause: err,
        });
      }
      throw storeFailure(err, `pin ${this.describe(to.location, to.name)}`);
    }
    return { bytes: size, created: true };
  }

  /**
   * Tag the object `mam-retired=true` (PutObjectTagging on its current version): the
   * bucket's lifecycle rule (infra/bucket.yml) expires tagged objects and then their
   * noncurrent versions. Nothing here deletes: the functions' role is denied deleting
   * pinned evidence, and keeps that deny. Absent is not an error.
   */
  async retire(location: string, name: string): Promise<void> {
    await this.#tag(location, name, [{ ...RETIRED_TAG }], `retire ${this.describe(location, name)}`);
  }

  async #tag(location: string, name: string, tags: { Key: string; Value: string }[], what: string): Promise<void> {
    const key = objectKey(location, name);
    try {
      await this.#client.send(new PutObjectTaggingCommand({ Bucket: this.bucket, Key: key, Tagging: { TagSet: tags } }));
    } catch (err) {
      if (isMissing(err)) return;
      throw storeFailure(err, what);
    }
  }

  describe(location: string, name: string): string {
    return s3Uri(this.bucket, location, name);
  }

  async copy(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
  ): Promise<void> {
    const source = objectKey(from.location, from.name);
    const target = objectKey(to.location, to.name);
    if (source === target) {
      if (!(await this.exists(from.location, from.name))) throw this.#noSource(from.location, from.name);
      return;
    }
    try {
      await this.#client.send(
        new CopyObjectCommand({ Bucket: this.bucket, Key: target, CopySource: this.#copySource(source), MetadataDirective: "COPY" }),
      );
    } catch (err) {
      if (isMissing(err)) throw this.#noSource(from.location, from.name);
      throw storeFailure(err, `copy ${this.describe(from.location, from.name)} to ${this.describe(to.location, to.name)}`);
    }
  }

  async uploadUrl(location: string, name: string, declared: UploadDeclared): Promise<UploadTarget> {
    const key = objectKey(location, name);
    if (!SHA256_HEX.test(declared.sha256)) throw new MamError("input.invalid", "an upload needs a SHA-256 digest: 64 lowercase hex digits");
    const checksum = Buffer.from(declared.sha256, "hex").toString("base64");
    const expiresAt = new Date(Date.now() + declared.expiresInSeconds * 1000);
    const url = await getSignedUrl(
      this.#client,
      new PutObjectCommand({
        Bucket: this.bucket,
        Key: key,
        ContentLength: declared.bytes,
        ChecksumSHA256: checksum,
        Metadata: { sha256: declared.sha256 },
      }),
      {
        expiresIn: declared.expiresInSeconds,
        // Signed as headers (not hoisted into the query), so the uploader must send them as given.
        signableHeaders: new Set(["content-length", "x-amz-checksum-sha256", "x-amz-meta-sha256"]),
        unhoistableHeaders: new Set(["x-amz-checksum-sha256", "x-amz-meta-sha256"]),
      },
    );
    return {
      url,
      method: "PUT",
      headers: { "content-length": String(declared.bytes), "x-amz-checksum-sha256": checksum, "x-amz-meta-sha256": declared.sha256 },
      expiresAt,
    };
  }

  /**
   * A presigned GET of the whole object, answered as an attachment (a browser saves it,
   * never renders it) and as UTF-8 text; undefined when the object is absent.
   */
  async downloadUrl(location: string, name: string, expiresInSeconds: number): Promise<{ url: string; expiresAt: Date } | undefined> {
    const key = objectKey(location, name);
    if (!(await this.exists(location, name))) return undefined;
    const expiresAt = new Date(Date.now() + expiresInSeconds * 1000);
    const url = await getSignedUrl(
      this.#client,
      new GetObjectCommand({
        Bucket: this.bucket,
        Key: key,
        ResponseContentDisposition: `attachment; filename="${name}"`,
        ResponseContentType: "text/plain; charset=utf-8",
      }),
      { expiresIn: expiresInSeconds },
    );
    return { url, expiresAt };
  }

  /** `copyOnce` of a source too large to hold: hashed as it streams, then copied inside S3 if it is still the version hashed. */
  async #copyLargeOnce(
    from: { readonly location: string; readonly name: string },
    to: { readonly location: string; readonly name: string },
    sha256: string,
    source: GetObjectCommandOutput,
  ): Promise<{ bytes: number; created: boolean }> {
    const hash = createHash("sha256");
    let size = 0;
    if (source.Body !== undefined) {
      try {
        for await (const chunk of asByteStream(source.Body)) {
          size += chunk.byteLength;
          hash.update(chunk);
        }
      } catch (err) {
        throw storeFailure(err, `read ${this.describe(from.location, from.name)}`);
      }
    }
    const digest = hash.digest("hex");
    if (digest !== sha256) throw this.#changed(from, sha256, digest, size);
    if (await this.exists(to.location, to.name)) return this.#pinned(to, sha256);
    try {
      await this.#client.send(
        new CopyObjectCommand({
          Bucket: this.bucket,
          Key: objectKey(to.location, to.name),
          CopySource: this.#copySource(objectKey(from.location, from.name)),
          ...(source.ETag === undefined ? {} : { CopySourceIfMatch: source.ETag }),
          IfNoneMatch: "*",
          MetadataDirective: "REPLACE",
          Metadata: { sha256 },
        }),
      );
    } catch (err) {
      const f = readSdkFailure(err);
      if (f.status === 412 || f.name === "PreconditionFailed") {
        // The target appeared (another pin won), or the source is no longer the version hashed.
        if (await this.exists(to.location, to.name)) return this.#pinned(to, sha256);
        throw new MamError("report.changed", `${this.describe(from.location, from.name)} changed after it was hashed; nothing was pinned`, {
          cause: err,
        });
      }
      if (f.status === 409) {
        throw new MamError("store.unavailable", `pin ${this.describe(to.location, to.name)}: another write to it is in flight; retry`, {
          cause: err,
        });
      }
      throw storeFailure(err, `pin ${this.describe(to.location, to.name)}`);
    }
    return { bytes: size, created: true };
  }

  #copySource(key: string): string {
    return `${this.bucket}/${key.split("/").map(encodeURIComponent).join("/")}`;
  }

  #changed(from: { readonly location: string; readonly name: string }, sha256: string, now: string, size: number): MamError {
    return new MamError(
      "report.changed",
      `${this.describe(from.location, from.name)} changed after it was hashed: expected sha256 ${sha256}, it now holds ${now} (${size} bytes); nothing was pinned`,
    );
  }

  /** The target exists: it is the evidence if its own bytes hash to `sha256`, and is left as it is either way. */
  async #pinned(to: { readonly location: string; readonly name: string }, sha256: string): Promise<{ bytes: number; created: false }> {
    const existing = await this.hash(to.location, to.name);
    if (existing === undefined) {
      throw new MamError("store.unavailable", `pin ${this.describe(to.location, to.name)}: it existed, then was gone; retry`);
    }
    if (existing.sha256 !== sha256) {
      throw new MamError(
        "report.changed",
        `${this.describe(to.location, to.name)} already exists and does not hold the bytes of sha256 ${sha256}; it was left as it is`,
      );
    }
    // Pinned again: whatever retired it before (the same bytes, finalized again) no longer holds.
    await this.#tag(to.location, to.name, [], `pin ${this.describe(to.location, to.name)}`);
    return { bytes: existing.bytes, created: false };
  }

  async #get(location: string, name: string): Promise<GetObjectCommandOutput | undefined> {
    const key = objectKey(location, name);
    try {
      return await this.#client.send(new GetObjectCommand({ Bucket: this.bucket, Key: key }));
    } catch (err) {
      if (isMissing(err)) return undefined;
      throw storeFailure(err, `get ${this.describe(location, name)}`);
    }
  }

  #noSource(location: string, name: string): MamError {
    return new MamError("report.notFound", `nothing to promote: ${this.describe(location, name)} does not exist`);
  }

  #tooLarge(key: string): MamError {
    return new MamError("input.tooLarge", `the body for s3://${this.bucket}/${key} is over ${this.#maxBodyBytes} bytes`);
  }
}

/** The tag a retired object carries, and the lifecycle rule's filter in infra/bucket.yml. */
export const RETIRED_TAG = { Key: "mam-retired", Value: "true" } as const;

async function* emptyStream(): AsyncIterable<Uint8Array> {}
