import type { CliIo } from "@mam/cli";

/** A `mam` invocation's streams, captured: what it printed on stdout and on stderr. */
export function captureIo(env: CliIo["env"] = {}): CliIo & { readonly out: string[]; readonly err: string[] } {
  const out: string[] = [];
  const err: string[] = [];
  return { env, stdout: (s) => out.push(s), stderr: (s) => err.push(s), out, err };
}

/** `mam publish-event` reporting attempt 1 `completed`, finalizing the report at `reportPath` first. */
export function publishCompletedArgs(jobId: string, reportPath: string, sideEffect: string): string[] {
  return [
    "publish-event",
    "--job",
    jobId,
    "--event",
    "completed",
    "--attempt",
    "1",
    "--finalize-report",
    reportPath,
    "--side-effect",
    sideEffect,
  ];
}
