/** API Gateway (HTTP API, payload 2.0) -> the Hono app, built once per container on the first request. */
import { createHttpHandler } from "./compose.ts";

export const handler = createHttpHandler(process.env);
