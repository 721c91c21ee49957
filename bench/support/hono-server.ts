import { readFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Hono } from "hono";

/**
 * The baseline of bench/http.ts: one bare Hono route on @hono/node-server answering
 * `GET /v1/jobs/:id` with the JSON body mam answered for the same job (read from the
 * file named on the command line), parsed once at start. No auth, no store, no log.
 *
 *   node --import tsx bench/support/hono-server.ts <record.json>
 *
 * Prints `MAM_BASELINE listening on <url>` when it accepts connections.
 */
const record = JSON.parse(readFileSync(process.argv[2] ?? "", "utf8")) as Record<string, unknown>;
const app = new Hono().get("/v1/jobs/:id", (c) => c.json(record));
const server = serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, (info: AddressInfo) => {
  process.stdout.write(`MAM_BASELINE listening on http://127.0.0.1:${info.port}\n`);
});
process.once("SIGTERM", () => server.close(() => process.exit(0)));
