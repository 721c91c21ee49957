import type { Config } from "@mam/core";

/**
 * What of the configuration the app reads, the same for every root
 * (`createApp({ deps, tokens, ...appOptionsOf(config), … })`): a variable the API
 * reads is its entry in core's schema, its field in `Config`, and its name here.
 */
export const APP_SETTINGS = [
  "jsonBodyLimit",
  "reportBodyLimit",
  "reportUploadLimit",
  "reportUploadTtlSeconds",
  "sweep",
  "sweepGraceSeconds",
  "sweepBudgetSeconds",
  "sweepEvaluation",
  "readTokenRatePerMinute",
] as const satisfies readonly (keyof Config)[];

/** The configuration the app reads (`APP_SETTINGS`), as `parseConfig` made it. */
export type AppSettings = Pick<Config, (typeof APP_SETTINGS)[number]>;

export function appOptionsOf(config: Config): AppSettings {
  return Object.fromEntries(APP_SETTINGS.map((k) => [k, config[k]])) as unknown as AppSettings;
}
