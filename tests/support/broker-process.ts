/**
 * An external MQTT broker in a process of its own, for the tests that kill it: the
 * same hardened aedes broker `mam serve` embeds (packages/local's
 * startEmbeddedBroker), keeping its sessions on disk with the same persistence
 * library, on a port and in a directory the test chooses, so a restart after a
 * SIGKILL comes back on the same port with the same sessions. The service logs in
 * with the credentials given; a subscriber logs in with a read token (with a name)
 * signed with `signingKey` to keep a persistent session; anyone may subscribe clean.
 *
 * Imported, this file is the helper (`startBrokerProcess`); run as a script, it is
 * the broker (configured through the environment below).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createTokenService, verifySubscriberLogin } from "@mam/api";
import { systemClock } from "@mam/core";

export interface BrokerProcessOptions {
  readonly port: number;
  readonly sessionsDir: string;
  readonly credentials: { readonly username: string; readonly password: string };
  /** The key subscribers' tokens are signed with (`brokerSubscriberToken`). */
  readonly signingKey: string;
}

/** A read token with a name, for a persistent session on a broker process started with `signingKey`. */
export function brokerSubscriberToken(signingKey: string, name: string): string {
  return createTokenService({ signingKey, clock: systemClock }).mintOperator(["read"], { name });
}

export interface BrokerProcess {
  readonly child: ChildProcess;
  /** `mqtt://127.0.0.1:<port>`. */
  readonly url: string;
  /** SIGTERM (or `signal`), and the exit code (null when killed by a signal). */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

const SELF = fileURLToPath(import.meta.url);
const ROOT = new URL("../..", import.meta.url).pathname;

/** Start the broker process and resolve once it says it listens. */
export async function startBrokerProcess(o: BrokerProcessOptions): Promise<BrokerProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", SELF], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "",
      MAM_TEST_BROKER_PORT: String(o.port),
      MAM_TEST_BROKER_DIR: o.sessionsDir,
      MAM_TEST_BROKER_USERNAME: o.credentials.username,
      MAM_TEST_BROKER_PASSWORD: o.credentials.password,
      MAM_TEST_BROKER_SIGNING_KEY: o.signingKey,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stderr?.on("data", (d) => {
    err += String(d);
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the broker process did not start: ${err}`)), 20_000);
    child.stdout?.on("data", (d) => {
      out += String(d);
      const found = /listening (mqtt:\/\/\S+)/.exec(out)?.[1];
      if (found !== undefined) {
        clearTimeout(timer);
        resolve(found);
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`the broker process exited with ${code}: ${err}`));
    });
  });
  return {
    child,
    url,
    async stop(signal = "SIGTERM") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}

async function main(): Promise<void> {
  const { startEmbeddedBroker } = await import("@mam/local");
  const env = process.env;
  const tokens = createTokenService({ signingKey: String(env.MAM_TEST_BROKER_SIGNING_KEY), clock: systemClock });
  const broker = await startEmbeddedBroker({
    verifySubscriber: (token) => verifySubscriberLogin(tokens, token),
    port: Number(env.MAM_TEST_BROKER_PORT),
    sessionsDir: String(env.MAM_TEST_BROKER_DIR),
    publisherCredentials: { username: String(env.MAM_TEST_BROKER_USERNAME), password: String(env.MAM_TEST_BROKER_PASSWORD) },
  });
  process.stdout.write(`listening ${broker.url}\n`);
  const stop = () => void broker.close().then(() => process.exit(0));
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
}

if (process.argv[1] !== undefined && pathToFileURL(process.argv[1]).href === import.meta.url) {
  main().catch((e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  });
}
