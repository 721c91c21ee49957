/**
 * A counting HTTP proxy in front of an AWS JSON-protocol peer (DynamoDB Local): every
 * request is forwarded as it came and counted by its `X-Amz-Target` operation, so a
 * function composed with the proxy as its endpoint shows what it really sent.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface CountingProxy {
  readonly endpoint: string;
  /** Requests by operation (`TransactWriteItems`, `PutItem`, ...), since the start or the last `reset`. */
  counts(): Readonly<Record<string, number>>;
  reset(): void;
  close(): Promise<void>;
}

export async function startCountingProxy(target: string): Promise<CountingProxy> {
  const to = new URL(target);
  let counts: Record<string, number> = {};
  const server = http.createServer((req, res) => {
    const op =
      String(req.headers["x-amz-target"] ?? "unknown")
        .split(".")
        .pop() ?? "unknown";
    counts[op] = (counts[op] ?? 0) + 1;
    const upstream = http.request(
      { host: to.hostname, port: to.port, method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.once("error", (err) => {
      res.writeHead(502, { "content-type": "text/plain" });
      res.end(`counting proxy: ${err.message}`);
    });
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}`,
    counts: () => ({ ...counts }),
    reset: () => {
      counts = {};
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
