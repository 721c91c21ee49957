import { randomUUID } from "node:crypto";
import { open, rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

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

/**
 * Write the file 0600 as a new file, then put it at `path`: created exclusively (0600
 * before any byte of the token is in it) beside `path` and renamed over it. What was
 * at `path` is never written to: a file another process already holds open (when it
 * was 0644, say) keeps its old bytes, and a symlink planted there is replaced, not
 * followed.
 */
export async function writeEnvFile(path: string, env: AgentEnvironment): Promise<void> {
  const fresh = join(dirname(path), `.${basename(path)}.${randomUUID()}.tmp`);
  const file = await open(fresh, "wx", 0o600);
  try {
    try {
      await file.chmod(0o600);
      await file.writeFile(envFileText(env));
      await file.sync();
    } finally {
      await file.close();
    }
    await rename(fresh, path);
  } catch (e) {
    await rm(fresh, { force: true });
    throw e;
  }
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
