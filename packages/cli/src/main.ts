import { runCli } from "./cli.ts";

// An agent's hook exits 0 whatever became of its reader: the agent gone before the
// nudge was written (EPIPE) is no failure of the hook, and never a stack trace.
if (process.argv[2] === "hook") for (const stream of [process.stdout, process.stderr]) stream.on("error", () => undefined);

process.exitCode = await runCli(process.argv.slice(2), {
  env: process.env,
  stdout: (s) => process.stdout.write(s),
  stderr: (s) => process.stderr.write(s),
  stdin: process.stdin,
  // performance.now() counts from the process's start: `mam hook`'s 2 s include loading the command.
  startedAt: 0,
});
