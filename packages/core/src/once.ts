/**
 * A build that runs once and is shared by every caller; a failure is not remembered,
 * so the next call builds again (a cold start whose SSM read was throttled, a
 * publisher whose SDK failed to load: the container does not stay broken).
 */
export function once<T>(build: () => Promise<T>): () => Promise<T> {
  let pending: Promise<T> | undefined;
  return () => {
    pending ??= build().catch((err: unknown) => {
      pending = undefined;
      throw err;
    });
    return pending;
  };
}
