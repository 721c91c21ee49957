/**
 * The Logger port: a closed set of levels, one JSON document a line (what Logs
 * Insights and `jq` read). A root gives it where its lines go (`jsonLogger(write)`);
 * the line's `level` and `msg` are the logger's, never a field's.
 */
export const LOG_LEVELS = ["debug", "info", "warn", "error"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** What a log line carries besides its level and message: JSON values. */
export type LogFields = Readonly<Record<string, unknown>>;

export interface Logger {
  log(level: LogLevel, msg: string, fields?: LogFields): void;
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
}

/**
 * A line named by what happened (`event`, snake_case: what Logs Insights queries and
 * metric filters match on), as a library hands it to its root: the sweep, the feed's
 * redrive, the functions. `logEvent` writes it with the event as its `msg` too.
 */
export type LogEvent = LogFields & { readonly level: LogLevel; readonly event: string };

/** Write `entry` through `logger`: its level, its event as the line's msg, and every field (the event kept). */
export function logEvent(logger: Logger, entry: LogEvent): void {
  logger.log(entry.level, entry.event, entry);
}

/** A level's rank: a logger writes the lines at or above its least level. */
export function logLevelRank(level: LogLevel): number {
  switch (level) {
    case "debug":
      return 10;
    case "info":
      return 20;
    case "warn":
      return 30;
    case "error":
      return 40;
    default:
      return level satisfies never;
  }
}

/** A logger writing each line at or above `least` (info by default) as one JSON document to `write`. */
export function jsonLogger(write: (line: string) => void, options: { readonly least?: LogLevel } = {}): Logger {
  const least = logLevelRank(options.least ?? "info");
  const log = (level: LogLevel, msg: string, fields: LogFields = {}): void => {
    if (logLevelRank(level) < least) return;
    // A loop, not rest and spread: the relay writes a line per publish.
    const line: Record<string, unknown> = { level, msg };
    for (const key in fields) if (key !== "level" && key !== "msg") line[key] = fields[key];
    write(JSON.stringify(line));
  };
  return {
    log,
    debug: (msg, fields) => log("debug", msg, fields),
    info: (msg, fields) => log("info", msg, fields),
    warn: (msg, fields) => log("warn", msg, fields),
    error: (msg, fields) => log("error", msg, fields),
  };
}
