/** Configuration: parsed once from the environment; defaults as DESIGN.md states them; a bad value names its variable. */
import { backoffAfter, type Config, DEFAULT_SWEEP_POLICY, MamError, parseConfig, parseFlags } from "@mam/core";
import { describe, expect, it } from "vitest";
import { configError } from "../support/config-error.ts";

describe("parseConfig", () => {
  it("has the documented defaults on an empty environment", () => {
    const config: Config = parseConfig({});
    expect(config.flags).toEqual({
      autoComplete: false,
      engineCas: true,
      allowedBackends: ["claude", "claude-code", "codex", "grok"],
      // Several report cycles at the largest upload (256 MiB), and 10,000 events, per job.
      quotas: { jobEvents: 10_000, attemptBytes: 1024 ** 3, jobBytes: 4 * 1024 ** 3 },
      // Room kept on the data dir's disk for the service's own records (issue 17).
      diskFloorBytes: 64 * 1024 * 1024,
      leases: { uploadSeconds: 900, finalizeSeconds: 300 },
      observationSkewSeconds: 5,
      attention: { staleAfterSeconds: 1800, deadlineSeconds: 0 },
      nudgeMax: 1,
      quiescenceRules: ["watcher.pane_status"],
    });
    expect(config).toMatchObject({
      host: "127.0.0.1",
      port: 8787,
      dataDir: ".mam",
      mqttUrl: undefined,
      mqttPort: 1883,
      operatorToken: undefined,
      agentTokenTtlSeconds: 24 * 60 * 60,
      jsonBodyLimit: 1024 * 1024,
      reportBodyLimit: 10 * 1024 * 1024,
      sweep: { maxFailures: 5, backoffMs: 60_000 },
    });
    expect(parseConfig({}).sweep).toEqual(DEFAULT_SWEEP_POLICY);
  });

  it("reads the sweep's quarantine limit and backoff; the backoff doubles per failure up to 64 times the base", () => {
    const { sweep } = parseConfig({ MAM_SWEEP_MAX_FAILURES: "3", MAM_SWEEP_BACKOFF_SECONDS: "10" });
    expect(sweep).toEqual({ maxFailures: 3, backoffMs: 10_000 });
    expect([1, 2, 3, 7, 8, 50].map((n) => backoffAfter(sweep, n))).toEqual([10_000, 20_000, 40_000, 640_000, 640_000, 640_000]);
  });

  it("reads every flag and setting it is given", () => {
    const config = parseConfig({
      MAM_AUTO_COMPLETE: "1",
      MAM_ENGINE_CAS: "0",
      MAM_AUTO_COMPLETE_BACKENDS: " grok , codex ",
      MAM_PORT: "9000",
      MAM_DATA_DIR: "/var/lib/mam",
      MAM_MQTT_URL: "mqtt://broker.internal:1884",
      MAM_MQTT_USERNAME: "mam",
      MAM_MQTT_PASSWORD: "secret",
      MAM_MQTT_PORT: "11883",
      MAM_QUOTA_JOB_EVENTS: "50",
      MAM_QUOTA_ATTEMPT_BYTES: "2097152",
      MAM_QUOTA_JOB_BYTES: "4194304",
      MAM_DISK_FLOOR_BYTES: "0",
      MAM_REPORT_UPLOAD_TTL_SECONDS: "120",
      MAM_FINALIZE_LEASE_SECONDS: "30",
      MAM_OBSERVATION_SKEW_SECONDS: "30",
      MAM_STALE_AFTER_SECONDS: "600",
      MAM_DEADLINE_SECONDS: "3600",
      MAM_AUTO_COMPLETE_SOURCES: "agent.claude-code.stop",
      MAM_NUDGE_MAX: "3",
    });
    expect(config.flags).toEqual({
      autoComplete: true,
      engineCas: false,
      allowedBackends: ["grok", "codex"],
      quotas: { jobEvents: 50, attemptBytes: 2 * 1024 * 1024, jobBytes: 4 * 1024 * 1024 },
      diskFloorBytes: 0,
      leases: { uploadSeconds: 120, finalizeSeconds: 30 },
      observationSkewSeconds: 30,
      attention: { staleAfterSeconds: 600, deadlineSeconds: 3600 },
      nudgeMax: 3,
      quiescenceRules: ["agent.claude-code.stop"],
    });
    expect(config).toMatchObject({ port: 9000, dataDir: "/var/lib/mam", mqttUrl: "mqtt://broker.internal:1884", mqttPort: 11883 });
  });

  it("issue 20: MAM_AUTO_COMPLETE_SOURCES names the policy's rules; an unknown name is config.invalid naming it and the rules there are", () => {
    expect(parseConfig({ MAM_AUTO_COMPLETE_SOURCES: "watcher.pane_status, agent.claude-code.stop" }).flags.quiescenceRules).toEqual([
      "watcher.pane_status",
      "agent.claude-code.stop",
    ]);
    let error: unknown;
    try {
      parseConfig({ MAM_AUTO_COMPLETE_SOURCES: "watcher.pane_status,hermes.idle" });
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ code: "config.invalid" });
    expect(String((error as Error).message)).toContain("hermes.idle");
    expect(String((error as Error).message)).toContain("agent.claude-code.stop");
  });

  it("an empty variable means unset", () => {
    expect(parseConfig({ MAM_AUTO_COMPLETE: "", MAM_PORT: "" })).toMatchObject({ flags: { autoComplete: false }, port: 8787 });
  });

  it.each([
    ["MAM_AUTO_COMPLETE", "yes"],
    ["MAM_AUTO_COMPLETE", "true"],
    ["MAM_ENGINE_CAS", "off"],
    ["MAM_PORT", "abc"],
    ["MAM_PORT", "70000"],
    ["MAM_PORT", "80.5"],
    ["MAM_MQTT_URL", "not a url"],
    ["MAM_SWEEP_MAX_FAILURES", "0"],
    ["MAM_SWEEP_MAX_FAILURES", "101"],
    ["MAM_SWEEP_BACKOFF_SECONDS", "0"],
    ["MAM_SWEEP_BACKOFF_SECONDS", "1.5"],
  ])("%s=%s is config.invalid naming the variable", (name, value) => {
    const e = configError({ [name]: value });
    expect(e.code).toBe("config.invalid");
    expect(e.message).toContain(name);
    expect(e.issues.map((i) => i.path)).toEqual([name]);
  });

  it("issue 17: a MAM_OPERATOR_TOKEN shorter than 32 characters is config.invalid naming it, and never echoes the token", () => {
    for (const token of ["Q", "hunter2", "0123456789abcdef0123456789abcde"]) {
      const e = configError({ MAM_OPERATOR_TOKEN: token });
      expect(e.code).toBe("config.invalid");
      expect(e.issues.map((i) => i.path)).toEqual(["MAM_OPERATOR_TOKEN"]);
      expect(e.message).toContain("MAM_OPERATOR_TOKEN must be at least 32 characters");
      expect(e.message).not.toContain(token);
    }
    const token = "0123456789abcdef0123456789abcdef";
    expect(parseConfig({ MAM_OPERATOR_TOKEN: token }).operatorToken).toBe(token);
  });

  it("issue 19: MAM_FEED_POLL_MS sets how often an open feed stream polls (1 s by default), 50 ms to 60 s", () => {
    expect(parseConfig({}).feedStreams.pollMs).toBe(1000);
    expect(parseConfig({ MAM_FEED_POLL_MS: "250" }).feedStreams.pollMs).toBe(250);
    expect(configError({ MAM_FEED_POLL_MS: "10" }).message).toContain("MAM_FEED_POLL_MS must be at least 50");
  });

  it("issue 19: the configuration is read-only all the way down", () => {
    const config = parseConfig({});
    expect(Object.isFrozen(config) && Object.isFrozen(config.flags) && Object.isFrozen(config.flags.allowedBackends)).toBe(true);
  });

  it("names every bad variable at once", () => {
    const e = configError({ MAM_AUTO_COMPLETE: "yes", MAM_PORT: "abc" });
    expect(e.code).toBe("config.invalid");
    expect(e.issues.map((i) => i.path).sort()).toEqual(["MAM_AUTO_COMPLETE", "MAM_PORT"]);
    expect(e.message).toContain("MAM_AUTO_COMPLETE");
    expect(e.message).toContain("MAM_PORT");
  });
});

describe("parseFlags", () => {
  it("is the flags part of the same schema, default off", () => {
    expect(parseFlags()).toEqual(parseConfig({}).flags);
    expect(parseFlags({ MAM_AUTO_COMPLETE: "1" }).autoComplete).toBe(true);
    expect(() => parseFlags({ MAM_AUTO_COMPLETE: "yes" })).toThrow(MamError);
  });

  it("the allowlist narrows but never widens, keeps exact names only, and drops duplicates", () => {
    expect(parseFlags({ MAM_AUTO_COMPLETE_BACKENDS: "claude" }).allowedBackends).toEqual(["claude"]);
    expect(parseFlags({ MAM_AUTO_COMPLETE_BACKENDS: "claude,hermes,opencode" }).allowedBackends).toEqual(["claude"]);
    expect(parseFlags({ MAM_AUTO_COMPLETE_BACKENDS: "codexish,grok2,Claude" }).allowedBackends).toEqual([]);
    expect(parseFlags({ MAM_AUTO_COMPLETE_BACKENDS: "grok,grok" }).allowedBackends).toEqual(["grok"]);
  });
});
