/** core's Logger port as `jsonLogger` writes it: one JSON document a line, a closed set of levels, the least level kept. */
import { jsonLogger, LOG_LEVELS, type LogLevel, logEvent, logLevelRank } from "@mam/core";
import { describe, expect, it } from "vitest";

describe("jsonLogger", () => {
  it("writes one JSON document a line, level and msg first, the fields after", () => {
    const lines: string[] = [];
    jsonLogger((l) => lines.push(l)).warn("mqtt broker error", { detail: "boom", n: 2 });
    expect(lines).toEqual(['{"level":"warn","msg":"mqtt broker error","detail":"boom","n":2}']);
  });

  it("a field named level or msg cannot change the line's own", () => {
    const lines: string[] = [];
    jsonLogger((l) => lines.push(l)).info("sweep", { level: "error", msg: "forged", owed: 1 });
    expect(JSON.parse(lines[0] ?? "")).toEqual({ level: "info", msg: "sweep", owed: 1 });
  });

  it("keeps the lines at or above its least level (info by default), in rank order", () => {
    const ranks = LOG_LEVELS.map(logLevelRank);
    expect([...ranks].sort((a, b) => a - b)).toEqual(ranks);
    for (const least of LOG_LEVELS) {
      const written: LogLevel[] = [];
      const logger = jsonLogger((l) => written.push(JSON.parse(l).level), { least });
      for (const level of LOG_LEVELS) logger.log(level, "m");
      expect(written).toEqual(LOG_LEVELS.filter((l) => logLevelRank(l) >= logLevelRank(least)));
    }
    const defaults: string[] = [];
    jsonLogger((l) => defaults.push(l)).debug("hidden");
    expect(defaults).toEqual([]);
  });

  it("logEvent writes an event's line at the event's own level, its name as the msg and kept as event", () => {
    const lines: string[] = [];
    logEvent(
      jsonLogger((l) => lines.push(l)),
      { level: "warn", event: "notification_quarantined", job_id: "j", failures: 3 },
    );
    expect(lines).toEqual([
      '{"level":"warn","msg":"notification_quarantined","event":"notification_quarantined","job_id":"j","failures":3}',
    ]);
  });
});
