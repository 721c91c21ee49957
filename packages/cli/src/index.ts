export { type CliIo, runCli } from "./cli.ts";
export { type RunningService, startService } from "./serve.ts";
