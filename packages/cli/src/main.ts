import { runCli } from "./cli.ts";

process.exitCode = await runCli(process.argv.slice(2), {
  env: process.env,
  stdout: (s) => process.stdout.write(s),
  stderr: (s) => process.stderr.write(s),
  stdin: process.stdin,
  // performance.now() counts from the process's start: `mam hook`'s 2 s include loading the command.
  startedAt: 0,
});
