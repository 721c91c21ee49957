import type { MiddlewareHandler } from "hono";
import type { AppEnv, Services } from "./context.ts";

/**
 * Sets `c.var.services` (typed by `AppEnv`) on every request: a route is its
 * declaration and its handler, one value (routes/index.ts), and its handler reads
 * the app's ports, tokens and limits here rather than from a closure made at
 * registration. Hono's `requestId` middleware is the model.
 */
export function appServices(services: Services): MiddlewareHandler<AppEnv> {
  return async function appServices(c, next) {
    c.set("services", services);
    await next();
  };
}
