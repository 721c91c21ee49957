import { createHash } from "node:crypto";
import { GetObjectCommand, HeadObjectCommand, PutObjectCommand } from "@aws-sdk/client-s3";
import { createS3Client, S3ReportStore } from "@mam/aws";
import { MamError } from "@mam/core";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type S3rverPeer, startS3rver } from "../support/aws-peers.ts";
import { countRequests, type RequestCounter } from "../support/count-requests.ts";
import { rejection } from "../support/rejection.ts";

let peer: S3rverPeer;
let counter: RequestCounter;
let store: S3ReportStore;
let n = 0;
let loc: string;

beforeAll(async () => {
  peer = await startS3rver();
  counter = countRequests(peer.client);
  store = new S3ReportStore({ client: peer.client, bucket: peer.bucket });
});
afterAll(async () => {
  await peer.close();
});
beforeEach(() => {
  loc = `reports/job-${++n}/1`;
  counter.reset();
});

const sha256 = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");
const text = (s: string): Uint8Array => new TextEncoder().encode(s);

async function* chunks(...parts: string[]): AsyncGenerator<Uint8Array> {
  for (const p of parts) yield text(p);
}

async function collect(stream: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of stream) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

describe("S3ReportStore", () => {
  it("put stores exactly the bytes, in one PutObject carrying our SHA-256 as ChecksumSHA256 and as metadata", async () => {
    const body = text("# Report\n\ndone ✓\n");
    const digest = createHash("sha256").update(body).digest();
    const sent: Record<string, string>[] = [];
    peer.client.middlewareStack.add(
      (next) => async (args) => {
        sent.push({ ...((args.request as { headers?: Record<string, string> }).headers ?? {}) });
        return next(args);
      },
      { step: "deserialize", name: "captureHeaders" },
    );
    try {
      expect(await store.put(loc, "report-final.md", body)).toEqual({ sha256: sha256(body), bytes: body.byteLength });
    } finally {
      peer.client.middlewareStack.remove("captureHeaders");
    }
    expect(counter.byCommand).toEqual({ PutObjectCommand: 1 });
    expect(sent[0]?.["x-amz-checksum-sha256"]).toBe(digest.toString("base64"));
    expect(sent[0]?.["x-amz-meta-sha256"]).toBe(digest.toString("hex"));

    const head = await peer.client.send(new HeadObjectCommand({ Bucket: peer.bucket, Key: `${loc}/report-final.md` }));
    expect(head.Metadata?.sha256).toBe(sha256(body));
    expect(head.ContentLength).toBe(body.byteLength);
    expect(Buffer.from((await store.getBytes(loc, "report-final.md")) ?? [])).toEqual(Buffer.from(body));
  });

  it("a streamed body is stored without chunk framing (the client computes no checksum of its own)", async () => {
    const put = await store.put(loc, "report-final.md.tmp", chunks("one, ", "", "two, ", "three"));
    expect(put).toEqual({ sha256: sha256(text("one, two, three")), bytes: 15 });
    const raw = await peer.client.send(new GetObjectCommand({ Bucket: peer.bucket, Key: `${loc}/report-final.md.tmp` }));
    expect(await raw.Body?.transformToString()).toBe("one, two, three");
  });

  it("hash streams the stored bytes; read streams them back; absent objects are undefined, not errors", async () => {
    const big = Buffer.alloc(3 * 1024 * 1024 + 17, 7);
    big.write("head", 0);
    await store.put(loc, "big.bin", big);
    expect(await store.hash(loc, "big.bin")).toEqual({ sha256: sha256(big), bytes: big.byteLength });
    const stream = await store.read(loc, "big.bin");
    expect(stream).toBeDefined();
    expect((await collect(stream as AsyncIterable<Uint8Array>)).equals(big)).toBe(true);

    expect(await store.hash(loc, "absent")).toBeUndefined();
    expect(await store.read(loc, "absent")).toBeUndefined();
    expect(await store.getBytes(loc, "absent")).toBeUndefined();
    expect(await store.exists(loc, "absent")).toBe(false);
    expect(await store.exists(loc, "big.bin")).toBe(true);
  });

  it("hash re-derives what is stored, not what an uploader claimed", async () => {
    // Peer limitation, stated: s3rver ignores x-amz-checksum-* (real S3 would refuse
    // this upload). Verification never relies on it: hash reads the bytes.
    const claimed = Buffer.alloc(32).toString("base64");
    await peer.client.send(
      new PutObjectCommand({
        Bucket: peer.bucket,
        Key: `${loc}/report-final.md`,
        Body: "tampered",
        ChecksumSHA256: claimed,
        Metadata: { sha256: "0".repeat(64) },
      }),
    );
    expect(await store.hash(loc, "report-final.md")).toEqual({ sha256: sha256(text("tampered")), bytes: 8 });
  });

  it("promote copies then deletes: the target has the bytes and the metadata, the source is gone", async () => {
    const body = text("final words");
    await store.put(loc, "report-final.md.tmp", body);
    counter.reset();
    await store.promote(loc, "report-final.md.tmp", "report-final.md");
    expect(counter.byCommand).toEqual({ CopyObjectCommand: 1, DeleteObjectCommand: 1 });
    expect(await store.exists(loc, "report-final.md.tmp")).toBe(false);
    expect(await store.hash(loc, "report-final.md")).toEqual({ sha256: sha256(body), bytes: body.byteLength });
    const head = await peer.client.send(new HeadObjectCommand({ Bucket: peer.bucket, Key: `${loc}/report-final.md` }));
    expect(head.Metadata?.sha256).toBe(sha256(body));
  });

  it("promote of a missing source is report.notFound and creates nothing; promote onto itself keeps the object", async () => {
    const err = await rejection(store.promote(loc, "report-final.md.tmp", "report-final.md"));
    expect((err as MamError).code).toBe("report.notFound");
    expect(await store.exists(loc, "report-final.md")).toBe(false);

    await store.put(loc, "same.md", text("x"));
    await store.promote(loc, "same.md", "same.md");
    expect(await store.exists(loc, "same.md")).toBe(true);
    expect(((await rejection(store.promote(loc, "gone.md", "gone.md"))) as MamError).code).toBe("report.notFound");
  });

  it("copyOnce reads and hashes the source, checks the target with HeadObject, then writes once: PutObject with If-None-Match: * and our ChecksumSHA256", async () => {
    const body = text("# Report\n\npinned\n");
    const digest = createHash("sha256").update(body).digest();
    await store.put(loc, "report-final.md", body);
    const sent: { command: string; headers: Record<string, string> }[] = [];
    peer.client.middlewareStack.add(
      (next, context) => async (args) => {
        sent.push({
          command: String(context.commandName),
          headers: { ...((args.request as { headers?: Record<string, string> }).headers ?? {}) },
        });
        return next(args);
      },
      { step: "deserialize", name: "captureCopyOnce" },
    );
    counter.reset();
    try {
      const pinned = { location: `${loc}/evidence`, name: digest.toString("hex") };
      expect(await store.copyOnce({ location: loc, name: "report-final.md" }, pinned, digest.toString("hex"))).toEqual({
        bytes: body.byteLength,
        created: true,
      });
    } finally {
      peer.client.middlewareStack.remove("captureCopyOnce");
    }
    expect(sent.map((r) => r.command)).toEqual(["GetObjectCommand", "HeadObjectCommand", "PutObjectCommand"]);
    const put = sent[2]?.headers ?? {};
    expect(put["if-none-match"]).toBe("*");
    expect(put["x-amz-checksum-sha256"]).toBe(digest.toString("base64"));
    expect(put["x-amz-meta-sha256"]).toBe(digest.toString("hex"));
  });

  it("copyOnce: a 412 from the conditional PUT (another writer created the key first) is created: false once the target's bytes check out, and report.changed when they do not", async () => {
    // s3rver never answers 412 (it ignores If-None-Match): the answer real S3 gives
    // is injected, after the HeadObject saw no target, as it does in a race.
    const body = text("the evidence");
    const hex = sha256(body);
    await store.put(loc, "report-final.md", body);
    const pinned = { location: `${loc}/evidence`, name: hex };
    let winner: Uint8Array = body;
    peer.client.middlewareStack.add(
      (next, context) => async (args) => {
        if (context.commandName !== "PutObjectCommand" || (args.input as { IfNoneMatch?: string }).IfNoneMatch !== "*") return next(args);
        await peer.client.send(new PutObjectCommand({ Bucket: peer.bucket, Key: `${pinned.location}/${pinned.name}`, Body: winner }));
        throw Object.assign(new Error("At least one of the pre-conditions you specified did not hold"), {
          name: "PreconditionFailed",
          $metadata: { httpStatusCode: 412 },
        });
      },
      { step: "initialize", name: "anotherWriterFirst" },
    );
    try {
      expect(await store.copyOnce({ location: loc, name: "report-final.md" }, pinned, hex)).toEqual({
        bytes: body.byteLength,
        created: false,
      });
      await store.delete(pinned.location, pinned.name);
      winner = text("not the evidence");
      const err = await rejection(store.copyOnce({ location: loc, name: "report-final.md" }, pinned, hex));
      expect((err as MamError).code).toBe("report.changed");
    } finally {
      peer.client.middlewareStack.remove("anotherWriterFirst");
    }
  });

  it("delete is one DeleteObject, and an absent key is not an error", async () => {
    await store.put(loc, "report-final.md.tmp", text("refused at its end"));
    counter.reset();
    await store.delete(loc, "report-final.md.tmp");
    await store.delete(loc, "report-final.md.tmp");
    expect(counter.byCommand).toEqual({ DeleteObjectCommand: 2 });
    expect(await store.exists(loc, "report-final.md.tmp")).toBe(false);
  });

  it("describe is the s3:// address of the object", () => {
    expect(store.describe("reports/job-1/2", "report-manifest.json")).toBe(`s3://${peer.bucket}/reports/job-1/2/report-manifest.json`);
  });

  it("refuses a location or name that is not a plain relative key with report.location, before any request", async () => {
    const badLocations = [
      "",
      "/reports/job/1",
      "../escape",
      "reports/../x",
      "reports/job/1/",
      "reports//1",
      "reports/job/..",
      "reports/./1",
      "reports/job 1/1",
      "reports/job\\1/1",
      "reports/\0/1",
      "s3://bucket/reports/job/1",
    ];
    const badNames = ["", ".", "..", "a/b.md", "../report-final.md", "x\0y", " lead"];
    const calls: (() => unknown)[] = [];
    for (const bad of badLocations) {
      calls.push(
        () => store.put(bad, "report-final.md", text("x")),
        () => store.getBytes(bad, "report-final.md"),
        () => store.read(bad, "report-final.md"),
        () => store.exists(bad, "report-final.md"),
        () => store.hash(bad, "report-final.md"),
        () => store.promote(bad, "report-final.md.tmp", "report-final.md"),
        () => store.describe(bad, "report-final.md"),
      );
    }
    for (const bad of badNames) {
      calls.push(
        () => store.put(loc, bad, text("x")),
        () => store.exists(loc, bad),
        () => store.promote(loc, bad, "report-final.md"),
        () => store.promote(loc, "report-final.md.tmp", bad),
        () => store.describe(loc, bad),
      );
    }
    for (const call of calls) {
      let err: unknown;
      try {
        await call();
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(MamError);
      expect((err as MamError).code).toBe("report.location");
    }
    expect(counter.total).toBe(0);
  });

  it("an unreachable store is a retryable store.unavailable", async () => {
    const gone = await startS3rver("gone-bucket");
    const client = createS3Client({
      endpoint: gone.endpoint,
      region: "us-east-1",
      credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" },
      maxAttempts: 1,
    });
    await gone.close();
    const lost = new S3ReportStore({ client, bucket: "gone-bucket" });
    for (const call of [() => lost.put(loc, "a.md", text("x")), () => lost.hash(loc, "a.md"), () => lost.exists(loc, "a.md")]) {
      const err = await rejection(call());
      expect((err as MamError).code).toBe("store.unavailable");
      expect((err as MamError).retryable).toBe(true);
    }
    client.destroy();
  });

  it("refuses a body over its bound without storing anything", async () => {
    const small = new S3ReportStore({ client: peer.client, bucket: peer.bucket, maxBodyBytes: 8 });
    expect((await rejection(small.put(loc, "a.md", chunks("12345", "67890")))) as MamError).toMatchObject({ code: "input.tooLarge" });
    expect(counter.total).toBe(0);
  });
});
