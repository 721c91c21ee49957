/** What a command reads and writes: its environment, its output streams, and how a long one is ended. */
export interface CliIo {
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly stdout: (s: string) => void;
  readonly stderr: (s: string) => void;
  /** API mode's fetch; the global one by default (tests pass an app's `request`). */
  readonly fetch?: typeof fetch;
  /** Ends a long-running command (`mam events --follow`); SIGINT and SIGTERM when absent. */
  readonly signal?: AbortSignal;
  /** What the command reads on stdin (`mam hook`: the agent's event); process.stdin in the `mam` binary. */
  readonly stdin?: AsyncIterable<Uint8Array>;
  /**
   * When the process started, on the `performance.now()` timeline (0 in the `mam`
   * binary): `mam hook`'s deadline counts from it, start-up included. When absent, from
   * the command's own start.
   */
  readonly startedAt?: number;
}
