import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdir } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";
import type { Readable } from "node:stream";

const require = createRequire(import.meta.url);

/** s3rver ships no types; this is the part of it we use. */
export interface S3rverInstance {
  run(): Promise<{ port: number; address?: string }>;
  close(): Promise<void>;
}
export type S3rverClass = new (options: {
  port: number;
  address: string;
  silent: boolean;
  directory: string;
  configureBuckets: { name: string; configs: string[] }[];
}) => S3rverInstance;

interface FilesystemStore {
  getResourcePath(bucket: string, key: string, kind: string): string;
  putMetadata(bucket: string, key: string, metadata: unknown, md5: string): Promise<void>;
  putObject(object: { bucket: string; key: string; metadata: unknown; content: Buffer | Readable }): Promise<{ size: number; md5: string }>;
}

let patched = false;

/**
 * s3rver, with one of its bugs mended: its filesystem store answers a PUT once the
 * body has passed its MD5 transform, not once the file is written (lib/stores/
 * filesystem.js, `putObject`: it resolves on the transform's `finish`, or at once for a
 * buffer, while the write stream is still writing), so a GET right after a PUT can
 * read a short or empty object. Seen in CI: a finalize over s3rver named the digest of
 * zero bytes. Real S3 is read-after-write consistent; this `putObject` does what
 * s3rver's does, and resolves only once the file is closed (docs/adapters.md, the
 * peers' gaps).
 */
export function loadS3rver(): S3rverClass {
  const S3rver = require("s3rver") as S3rverClass;
  if (!patched) {
    const Store = require("s3rver/lib/stores/filesystem.js") as { prototype: FilesystemStore };
    Store.prototype.putObject = async function putObject(this: FilesystemStore, object) {
      const objectPath = this.getResourcePath(object.bucket, object.key, "object");
      await mkdir(path.dirname(objectPath), { recursive: true });
      const md5 = createHash("md5");
      let size = 0;
      await new Promise<void>((resolve, reject) => {
        const file = createWriteStream(objectPath);
        file.on("error", reject).on("close", () => resolve());
        if (Buffer.isBuffer(object.content)) {
          md5.update(object.content);
          size = object.content.length;
          file.end(object.content);
          return;
        }
        object.content.on("error", reject);
        object.content.on("data", (chunk: Buffer) => {
          md5.update(chunk);
          size += chunk.length;
        });
        object.content.pipe(file);
      });
      const digest = md5.digest("hex");
      await this.putMetadata(object.bucket, object.key, object.metadata, digest);
      return { size, md5: digest };
    };
    patched = true;
  }
  return S3rver;
}
