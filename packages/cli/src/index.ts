export type { Backend, FinalizeAnswer, PublishEventAnswer, VerificationAnswer } from "./backend.ts";
export { runCli } from "./cli.ts";
export { ensureCredentials } from "./credentials.ts";
export type { ServiceDeps } from "./embedded-service.ts";
export { EXIT_CODES } from "./exit-codes.ts";
export type { CliIo } from "./io.ts";
export { type RunningService, startService } from "./serve.ts";
