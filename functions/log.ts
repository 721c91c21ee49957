/**
 * Where JSON log lines go (the app's per-request lines too). Raw stdout, not
 * console.log: Lambda prefixes console lines with a timestamp and level, and a line
 * that is exactly one JSON document is what Logs Insights parses.
 */
export type LogSink = (line: string) => void;

export const stdoutLines: LogSink = (line) => {
  process.stdout.write(`${line}\n`);
};
