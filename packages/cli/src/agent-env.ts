import { chmod, open } from "node:fs/promises";

/**
 * What an agent needs to report to mam, handed over by `mam dispatch` (issue 21):
 * where the service is, its token (bound to one job and attempt), the job, the
 * attempt and the session id mam generated for it. Given as a file only its owner
 * can read (0600) or as JSON on stdout, never on a command line: another process
 * can read a command line (`ps`, /proc/<pid>/cmdline), not a 0600 file.
 */
export interface AgentEnvironment {
  readonly MAM_API_URL: string;
  readonly MAM_TOKEN: string;
  readonly MAM_JOB: string;
  readonly MAM_ATTEMPT: string;
  readonly MAM_SESSION: string;
}

/** The file's text: one `export NAME='value'` per line, so `. FILE` in a shell sets them. */
export function envFileText(env: AgentEnvironment): string {
  const quote = (v: string) => `'${v.replaceAll("'", `'\\''`)}'`;
  return `${Object.entries(env)
    .map(([k, v]) => `export ${k}=${quote(v)}`)
    .join("\n")}\n`;
}

/** Write the file 0600 (made so, or made so again if it was there with another mode) before any byte of the token is in it. */
export async function writeEnvFile(path: string, env: AgentEnvironment): Promise<void> {
  const file = await open(path, "w", 0o600);
  try {
    await file.chmod(0o600);
    await file.writeFile(envFileText(env));
  } finally {
    await file.close();
  }
  await chmod(path, 0o600);
}

/**
 * How to start each agent with it: Claude Code takes the session id mam generated
 * (`--session-id`), so its hooks name the dispatch's session; Codex names its own
 * thread, bound to the attempt by its first event.
 */
export function launchLines(envPath: string | undefined): { readonly "claude-code": string; readonly codex: string } {
  const source = envPath === undefined ? "" : `. ${shellWord(envPath)} && `;
  return { "claude-code": `${source}claude --session-id "$MAM_SESSION"`, codex: `${source}codex` };
}

function shellWord(s: string): string {
  return /^[A-Za-z0-9_./-]+$/.test(s) ? s : `'${s.replaceAll("'", `'\\''`)}'`;
}
