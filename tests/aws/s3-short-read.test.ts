/**
 * The S3 report store never hashes a body cut short: an S3 endpoint (a real HTTP
 * server of the test's; no S3 stand-in can be made to do it) that announces ten bytes,
 * sends three and closes makes `hash` refuse, retryably (`store.unavailable`), so a
 * finalize built on it pins nothing. Node's HTTP client reports the premature close
 * and the store passes it on rather than hashing what arrived.
 */
import net from "node:net";
import { createS3Client, S3ReportStore } from "@mam/aws";
import { isMamError } from "@mam/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rejection } from "../support/rejection.ts";

let server: net.Server;
let endpoint: string;

beforeAll(async () => {
  // Every GET: 200, Content-Length 10, three bytes, then the connection ends.
  server = net.createServer((socket) => {
    socket.once("data", () => {
      socket.end('HTTP/1.1 200 OK\r\nContent-Type: text/markdown\r\nContent-Length: 10\r\nETag: "x"\r\n\r\nabc');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  endpoint = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

describe("S3ReportStore.hash of a body cut short", () => {
  it("refuses, naming the object, instead of hashing the bytes that arrived", async () => {
    const client = createS3Client({
      endpoint,
      region: "us-east-1",
      credentials: { accessKeyId: "x", secretAccessKey: "x" },
      maxAttempts: 1,
    });
    try {
      const store = new S3ReportStore({ client, bucket: "reports" });
      const err = await rejection(store.hash("reports/job-1/1", "report.staged.md"));
      expect(isMamError(err), String(err)).toBe(true);
      expect((err as { code: string }).code).toBe("store.unavailable");
    } finally {
      client.destroy();
    }
  });
});
