import { jsonLogger, type LogEvent, logEvent } from "@mam/core";

export type { LogEvent };

/**
 * Where JSON log lines go (the app's per-request lines too). Raw stdout, not
 * console.log: Lambda prefixes console lines with a timestamp and level, and a line
 * that is exactly one JSON document is what Logs Insights parses.
 */
export type LogSink = (line: string) => void;

export const stdoutLines: LogSink = (line) => {
  process.stdout.write(`${line}\n`);
};

/**
 * One event's line to `log`, written by core's JSON logger (its level, the event as
 * its msg, the fields). Not Powertools' Logger: core's is a few lines already in every
 * bundle, and the line it writes is one Logs Insights parses as it is.
 */
export const logEventLine = (log: LogSink, entry: LogEvent): void => logEvent(jsonLogger(log), entry);
