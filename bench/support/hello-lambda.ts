/**
 * The cold-start baseline of bench/bundles.ts: the smallest Hono app on
 * hono/aws-lambda, bundled with the same esbuild options as the functions.
 */
import { Hono } from "hono";
import { handle } from "hono/aws-lambda";

export const handler = handle(new Hono().get("*", (c) => c.json({ ok: true })));
