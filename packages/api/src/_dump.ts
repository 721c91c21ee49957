import { createApp, createTokenService } from "./index.ts";

const app = createApp({
  deps: {} as never,
  tokens: createTokenService({ signingKey: "x".repeat(40), clock: { now: () => new Date() } }),
  log: () => {},
});
const res = await app.request("/openapi.json");
process.stdout.write(await res.text());
