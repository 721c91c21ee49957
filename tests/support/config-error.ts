import { isMamError, type MamError, parseConfig } from "@mam/core";

/** The MamError `parseConfig` refuses `env` with; fails the test if it accepts it. */
export function configError(env: Record<string, string>): MamError {
  try {
    parseConfig(env);
  } catch (e) {
    if (isMamError(e)) return e;
    throw e;
  }
  throw new Error(`parseConfig accepted ${JSON.stringify(env)}`);
}
