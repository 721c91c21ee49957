import { randomBytes } from "node:crypto";
import { chmod, open } from "node:fs/promises";
import { createTokenService, SCOPES } from "@mam/api";
import { systemClock } from "@mam/core";
import { type Credentials, dataDirPaths, readCredentials } from "@mam/local";

/**
 * The data dir's credentials bootstrap, for every root that runs the service on it
 * (`mam serve`, `npm run offline`): `credentials.json` written once (mode 0600,
 * synced, never over an existing file), with a fresh signing key, an operator token
 * with every scope and the service's MQTT login; what is there is kept.
 */
export async function ensureCredentials(dir: string): Promise<{ credentials: Credentials; created: boolean }> {
  const existing = await readCredentials(dir);
  if (existing) return { credentials: existing, created: false };
  const signingKey = randomBytes(32).toString("base64url");
  const tokens = createTokenService({ signingKey, clock: systemClock });
  const credentials: Credentials = {
    operator_token: tokens.mintOperator(SCOPES),
    signing_key: signingKey,
    mqtt: { username: "mam-service", password: randomBytes(24).toString("base64url") },
  };
  const path = dataDirPaths(dir).credentials;
  const fh = await open(path, "wx", 0o600);
  try {
    await fh.writeFile(`${JSON.stringify(credentials, null, 2)}\n`);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await chmod(path, 0o600);
  return { credentials, created: true };
}
