import * as z from "zod";
import { allowedBackends } from "./allowlist.ts";
import { MamError } from "./errors.ts";
import type { SweepPolicy } from "./notifier.ts";

const bit = (name: string, dflt: "0" | "1") =>
  z
    .enum(["0", "1"], { message: `${name} must be 0 or 1` })
    .default(dflt)
    .transform((v) => v === "1");

const int = (name: string, dflt: number, min: number, max: number) =>
  z.coerce
    .number({ message: `${name} must be a number` })
    .int(`${name} must be an integer`)
    .min(min, `${name} must be at least ${min}`)
    .max(max, `${name} must be at most ${max}`)
    .default(dflt);

const list = z
  .string()
  .transform((s) =>
    s
      .split(",")
      .map((x) => x.trim())
      .filter((x) => x !== ""),
  )
  .optional();

/**
 * Every environment variable mam reads, parsed once at start-up into a typed
 * config that is passed in; nothing reads `process.env` deeper in. Any value this
 * schema does not accept is a start-up error naming the variable.
 */
export const EnvSchema = z.object({
  MAM_AUTO_COMPLETE: bit("MAM_AUTO_COMPLETE", "0"),
  MAM_AUTO_COMPLETE_BACKENDS: list,
  MAM_ENGINE_CAS: bit("MAM_ENGINE_CAS", "1"),
  MAM_HOST: z.string().min(1).default("127.0.0.1"),
  MAM_PORT: int("MAM_PORT", 8787, 0, 65535),
  MAM_DATA_DIR: z.string().min(1).default(".mam"),
  MAM_MQTT_URL: z.string().url("MAM_MQTT_URL must be a URL such as mqtt://127.0.0.1:1883").optional(),
  MAM_MQTT_PORT: int("MAM_MQTT_PORT", 1883, 0, 65535),
  MAM_OPERATOR_TOKEN: z.string().min(1).optional(),
  MAM_TOKEN_SIGNING_KEY: z.string().min(32, "MAM_TOKEN_SIGNING_KEY must be at least 32 characters").optional(),
  MAM_TOKEN_SIGNING_KEY_PARAMETER: z.string().min(1).optional(),
  MAM_AGENT_TOKEN_TTL_SECONDS: int("MAM_AGENT_TOKEN_TTL_SECONDS", 86_400, 60, 30 * 86_400),
  MAM_JSON_BODY_LIMIT: int("MAM_JSON_BODY_LIMIT", 1024 * 1024, 1024, 64 * 1024 * 1024),
  MAM_REPORT_BODY_LIMIT: int("MAM_REPORT_BODY_LIMIT", 10 * 1024 * 1024, 1024, 1024 * 1024 * 1024),
  MAM_SWEEP_INTERVAL_SECONDS: int("MAM_SWEEP_INTERVAL_SECONDS", 30, 1, 86_400),
  MAM_SWEEP_MAX_FAILURES: int("MAM_SWEEP_MAX_FAILURES", 5, 1, 100),
  MAM_SWEEP_BACKOFF_SECONDS: int("MAM_SWEEP_BACKOFF_SECONDS", 60, 1, 86_400),
  MAM_PUBLISH_TIMEOUT_MS: int("MAM_PUBLISH_TIMEOUT_MS", 5000, 100, 120_000),
  MAM_TABLE_NAME: z.string().min(3).optional(),
  MAM_BUCKET_NAME: z.string().min(3).optional(),
  MAM_IOT_ENDPOINT: z.string().min(1).optional(),
  MAM_DYNAMODB_ENDPOINT: z.string().url().optional(),
  MAM_S3_ENDPOINT: z.string().url().optional(),
  AWS_REGION: z.string().min(1).optional(),
  MAM_API_URL: z.string().url("MAM_API_URL must be a URL such as http://127.0.0.1:8787").optional(),
  MAM_TOKEN: z.string().min(1).optional(),
});

export interface Flags {
  readonly autoComplete: boolean;
  readonly engineCas: boolean;
  /** The evidence-backed allowlist, narrowed by MAM_AUTO_COMPLETE_BACKENDS. */
  readonly allowedBackends: readonly string[];
}

export interface Config {
  readonly flags: Flags;
  readonly host: string;
  readonly port: number;
  readonly dataDir: string;
  readonly mqttUrl: string | undefined;
  readonly mqttPort: number;
  readonly operatorToken: string | undefined;
  readonly tokenSigningKey: string | undefined;
  readonly tokenSigningKeyParameter: string | undefined;
  readonly agentTokenTtlSeconds: number;
  readonly jsonBodyLimit: number;
  readonly reportBodyLimit: number;
  readonly sweepIntervalSeconds: number;
  /** When an owed intent that keeps failing is retried, and when it is quarantined. */
  readonly sweep: SweepPolicy;
  readonly publishTimeoutMs: number;
  /** CLI API mode. */
  readonly apiUrl: string | undefined;
  readonly token: string | undefined;
  readonly aws: {
    readonly tableName: string | undefined;
    readonly bucketName: string | undefined;
    readonly iotEndpoint: string | undefined;
    readonly dynamodbEndpoint: string | undefined;
    readonly s3Endpoint: string | undefined;
    readonly region: string | undefined;
  };
}

/** Parse the environment once. Throws `config.invalid` naming every bad variable. */
export function parseConfig(env: Readonly<Record<string, string | undefined>>): Config {
  // An empty variable means unset, as a shell user expects of `MAM_X= cmd`.
  const cleaned = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ""));
  const r = EnvSchema.safeParse(cleaned);
  if (!r.success) {
    const issues = r.error.issues.map((i) => ({ path: String(i.path[0] ?? "(env)"), message: i.message }));
    throw new MamError("config.invalid", `invalid configuration: ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`, {
      issues,
    });
  }
  const e = r.data;
  return {
    flags: {
      autoComplete: e.MAM_AUTO_COMPLETE,
      engineCas: e.MAM_ENGINE_CAS,
      allowedBackends: allowedBackends(e.MAM_AUTO_COMPLETE_BACKENDS),
    },
    host: e.MAM_HOST,
    port: e.MAM_PORT,
    dataDir: e.MAM_DATA_DIR,
    mqttUrl: e.MAM_MQTT_URL,
    mqttPort: e.MAM_MQTT_PORT,
    operatorToken: e.MAM_OPERATOR_TOKEN,
    tokenSigningKey: e.MAM_TOKEN_SIGNING_KEY,
    tokenSigningKeyParameter: e.MAM_TOKEN_SIGNING_KEY_PARAMETER,
    agentTokenTtlSeconds: e.MAM_AGENT_TOKEN_TTL_SECONDS,
    jsonBodyLimit: e.MAM_JSON_BODY_LIMIT,
    reportBodyLimit: e.MAM_REPORT_BODY_LIMIT,
    sweepIntervalSeconds: e.MAM_SWEEP_INTERVAL_SECONDS,
    sweep: { maxFailures: e.MAM_SWEEP_MAX_FAILURES, backoffMs: e.MAM_SWEEP_BACKOFF_SECONDS * 1000 },
    publishTimeoutMs: e.MAM_PUBLISH_TIMEOUT_MS,
    apiUrl: e.MAM_API_URL,
    token: e.MAM_TOKEN,
    aws: {
      tableName: e.MAM_TABLE_NAME,
      bucketName: e.MAM_BUCKET_NAME,
      iotEndpoint: e.MAM_IOT_ENDPOINT,
      dynamodbEndpoint: e.MAM_DYNAMODB_ENDPOINT,
      s3Endpoint: e.MAM_S3_ENDPOINT,
      region: e.AWS_REGION,
    },
  };
}

/** Flags for tests and embedders, from the same schema. */
export function parseFlags(env: Readonly<Record<string, string | undefined>> = {}): Flags {
  return parseConfig(env).flags;
}
