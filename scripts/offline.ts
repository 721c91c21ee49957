/**
 * `npm run offline`: the AWS shape of mam on one machine, no account.
 *
 *   curl ──> serverless-offline (osls) ──> the packaged http function (.build/http)
 *                                              │ DynamoDB Local (AWS's own, with a stream)
 *                                              │ s3rver
 *   the table's stream ──> our stream poller ──> the stream function (invoked through
 *                                              serverless-offline's Lambda API)
 *   our timer, at the schedule's rate ───────> the sweep function (likewise)
 *   both publish through the IoT Core stand-in ──> an embedded MQTT broker (any client may subscribe)
 *
 * The functions run with serverless.yml's environment; scripts/offline/serverless-plugin.cjs
 * puts the local table and bucket names in place of the CloudFormation references and
 * names the signing key directly (MAM_TOKEN_SIGNING_KEY) instead of its SSM parameter.
 * The key and the operator token are those of `<data dir>/credentials.json`, the file
 * `mam serve` writes (made here, in the same form, if absent), so the README's session
 * and `mam token create --data-dir` work on both shapes.
 *
 * Settings (environment): MAM_OFFLINE_PORT (API, 3000), MAM_OFFLINE_LAMBDA_PORT
 * (serverless-offline's Lambda API, 3002), MAM_OFFLINE_MQTT_PORT (1883; each port is
 * checked free before anything starts, and a taken one names its variable), MAM_DATA_DIR
 * (.mam), MAM_AUTO_COMPLETE (0). DynamoDB Local keeps its tables in memory and s3rver
 * its objects in a temporary folder: each run starts empty. Ctrl-C or SIGTERM stops
 * every piece; the exit code is 0 when every piece stopped cleanly.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { cp, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { CreateBucketCommand } from "@aws-sdk/client-s3";
import { SendMessageCommand, SQSClient } from "@aws-sdk/client-sqs";
import { createTokenService, verifySubscriberLogin } from "@mam/api";
import { createJobTable, createS3Client } from "@mam/aws";
import { ensureCredentials } from "@mam/cli";
import { systemClock } from "@mam/core";
import { dataDirPaths, ensurePortsFree, secureDataDir, startEmbeddedBroker } from "@mam/local";
import type { DynamoDBBatchResponse, DynamoDBStreamEvent } from "aws-lambda";
import { build } from "esbuild";
import { LAMBDA_ENTRIES, lambdaBuildOptions } from "./lambda-bundle.mjs";
import { REPO_ROOT, scheduleRateMsOf, streamMappingOf } from "./offline/serverless-yml.ts";
import { startDynamoDbLocal } from "./peers/dynamodb-local.ts";
import { startIotStandIn } from "./peers/iot-stand-in.ts";
import { loadS3rver } from "./peers/s3rver.ts";
import { startSqsStandIn } from "./peers/sqs-stand-in.ts";
import { startStreamPoller } from "./peers/stream-poller.ts";

const require = createRequire(import.meta.url);
const REGION = "us-east-1";
const STAGE = "offline";
/** s3rver's own keys; DynamoDB Local and the IoT stand-in accept any. */
const LOCAL_CREDENTIALS = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" };
const TABLE = `mam-${STAGE}-jobs`;
const BUCKET = `mam-${STAGE}-reports`;

const say = (line: string): void => void process.stderr.write(`offline: ${line}\n`);

function port(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0 || n > 65_535)
    throw new Error(`${name} must be a port number (0 to 65535), got ${JSON.stringify(raw)}`);
  return n;
}

/**
 * The functions bundled as `npm run package` bundles them (scripts/lambda-bundle.mjs),
 * with the docs page's assets. A bundle is kept when it is newer than every input its
 * metafile lists (our sources and the dependencies' files alike) and than the build
 * options: a second run starts without bundling again. Returns the functions that were bundled.
 */
async function bundleFunctions(): Promise<string[]> {
  const outRoot = path.join(REPO_ROOT, ".build");
  const stale = async (name: string): Promise<boolean> => {
    try {
      const meta = JSON.parse(await readFile(path.join(outRoot, `${name}.meta.json`), "utf8")) as { inputs: Record<string, unknown> };
      const built = (await stat(path.join(outRoot, name, `${name}.mjs`))).mtimeMs;
      // The build options count as an input too.
      const files = [...Object.keys(meta.inputs), "scripts/lambda-bundle.mjs"];
      const inputs = await Promise.all(files.map((input) => stat(path.join(REPO_ROOT, input))));
      return inputs.some((s) => s.mtimeMs > built);
    } catch {
      return true; // no bundle, no metafile, or an input gone
    }
  };
  const names = Object.keys(LAMBDA_ENTRIES) as (keyof typeof LAMBDA_ENTRIES)[];
  const rebuild = (await Promise.all(names.map(async (name) => ((await stale(name)) ? name : undefined)))).filter((n) => n !== undefined);
  await Promise.all(
    rebuild.map(async (name) => {
      await rm(path.join(outRoot, name), { recursive: true, force: true });
      const result = await build(lambdaBuildOptions(REPO_ROOT, name, LAMBDA_ENTRIES[name], path.join(outRoot, name)));
      await writeFile(path.join(outRoot, `${name}.meta.json`), JSON.stringify(result.metafile));
    }),
  );
  const swagger = path.dirname(require.resolve("swagger-ui-dist/package.json"));
  await cp(swagger, path.join(outRoot, "http", "node_modules", "swagger-ui-dist"), { recursive: true });
  return rebuild;
}

/** s3rver's types are not shipped; this is the part we use. */
/** serverless-offline under osls; resolves once it printed that its server is ready. */
function startServerlessOffline(
  args: readonly string[],
  env: NodeJS.ProcessEnv,
): Promise<{ child: ChildProcess; exited: Promise<number> }> {
  const cli = path.join(path.dirname(require.resolve("osls/package.json")), "bin", "serverless.js");
  // Its own process group: a Ctrl-C reaches us only, and we stop it after the poller that invokes it.
  const child = spawn(process.execPath, [cli, "offline", "start", ...args], {
    cwd: REPO_ROOT,
    env,
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  const exited = new Promise<number>((resolve) => child.once("exit", (code, signal) => resolve(code ?? (signal === null ? 1 : 0))));
  return new Promise((resolve, reject) => {
    let out = "";
    const onData = (chunk: Buffer): void => {
      const text = chunk.toString("utf8");
      process.stderr.write(text.replace(/^(?=.)/gm, "serverless-offline: "));
      out += text;
      if (/Server ready:/.test(out)) {
        resolve({ child, exited });
        out = "";
      }
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    child.once("error", reject);
    void exited.then((code) => reject(new Error(`serverless-offline exited (code ${code}) before it was ready`)));
  });
}

/** serverless-offline's Lambda Invoke API (RequestResponse); an unhandled function error is thrown, as Lambda reports it. */
function lambdaInvoker(lambdaPort: number) {
  return async <T>(functionName: string, event: unknown): Promise<T> => {
    const res = await fetch(`http://127.0.0.1:${lambdaPort}/2015-03-31/functions/${functionName}/invocations`, {
      method: "POST",
      body: JSON.stringify(event),
    });
    const text = await res.text();
    if (res.status !== 200 || res.headers.get("x-amz-function-error") !== null) {
      throw new Error(`${functionName} failed (${res.status}): ${text.slice(0, 500)}`);
    }
    return (text === "" ? undefined : JSON.parse(text)) as T;
  };
}

/**
 * The three ports this run binds, each checked free before anything starts: a taken
 * one is one line naming its variable (exit 1), not a failure after DynamoDB Local's
 * Java start in serverless-offline's words. Bad values are refused the same way.
 */
async function portsOrExit(): Promise<{ apiPort: number; lambdaPort: number; mqttPort: number }> {
  try {
    const apiPort = port("MAM_OFFLINE_PORT", 3000);
    const lambdaPort = port("MAM_OFFLINE_LAMBDA_PORT", 3002);
    const mqttPort = port("MAM_OFFLINE_MQTT_PORT", 1883);
    // serverless-offline binds the API and its Lambda API on custom.serverless-offline.host.
    await ensurePortsFree([
      { port: apiPort, host: "127.0.0.1", setting: "MAM_OFFLINE_PORT" },
      { port: lambdaPort, host: "127.0.0.1", setting: "MAM_OFFLINE_LAMBDA_PORT" },
      { port: mqttPort, host: "127.0.0.1", setting: "MAM_OFFLINE_MQTT_PORT" },
    ]);
    return { apiPort, lambdaPort, mqttPort };
  } catch (err) {
    say(err instanceof Error ? err.message : String(err));
    process.exit(1);
  }
}

async function main(): Promise<void> {
  const started = performance.now();
  const { apiPort, lambdaPort, mqttPort } = await portsOrExit();
  const dataDir = path.resolve(process.env.MAM_DATA_DIR ?? ".mam");
  const autoComplete = process.env.MAM_AUTO_COMPLETE ?? "0";
  const mapping = streamMappingOf("streamPublisher");
  const feedMapping = streamMappingOf("feedWriter");
  const sweepEveryMs = scheduleRateMsOf("recoverySweep");

  const stops: (() => Promise<unknown>)[] = [];
  let stopping: Promise<number> | undefined;
  const stop = (): Promise<number> => {
    stopping ??= (async () => {
      let code = 0;
      for (const s of stops.splice(0).reverse()) {
        try {
          const r = await s();
          if (typeof r === "number" && r !== 0) code = r;
        } catch (err) {
          say(`a piece did not stop cleanly: ${err instanceof Error ? err.message : String(err)}`);
          code = 1;
        }
      }
      return code;
    })();
    return stopping;
  };
  // Kept on (not `once`): a Ctrl-C reaches us twice, from the terminal and forwarded by npm,
  // and a second signal without a handler would kill us before the pieces are stopped.
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopping !== undefined) return;
    say(`${signal}: stopping`);
    void stop().then((code) => {
      say(code === 0 ? "stopped" : `stopped, not cleanly (exit code ${code})`);
      process.exit(code);
    });
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);

  try {
    secureDataDir(dataDir);
    const file = dataDirPaths(dataDir).credentials;
    const { credentials } = await ensureCredentials(dataDir);
    const subscriberTokens = createTokenService({ signingKey: credentials.signing_key, clock: systemClock });
    const [ddb, broker, bundled, s3dir] = await Promise.all([
      startDynamoDbLocal(),
      startEmbeddedBroker({
        port: mqttPort,
        portSetting: "MAM_OFFLINE_MQTT_PORT",
        publisherCredentials: credentials.mqtt,
        // Subscribers log in as on mam serve's broker: a read token with a name, signed with the offline key.
        verifySubscriber: (token) => verifySubscriberLogin(subscriberTokens, token),
      }),
      bundleFunctions(),
      mkdtemp(path.join(tmpdir(), "mam-offline-s3-")),
    ]);
    stops.push(() => ddb.close());
    stops.push(() => broker.close());
    stops.push(() => rm(s3dir, { recursive: true, force: true }));
    const S3rver = loadS3rver();
    const s3rver = new S3rver({ port: 0, address: "127.0.0.1", silent: true, directory: s3dir, configureBuckets: [] });
    const s3port = (await s3rver.run()).port;
    stops.push(() => s3rver.close());
    const s3endpoint = `http://127.0.0.1:${s3port}`;
    const s3 = createS3Client({ endpoint: s3endpoint, region: REGION, forcePathStyle: true, credentials: LOCAL_CREDENTIALS });
    await Promise.all([createJobTable(ddb.client, TABLE), s3.send(new CreateBucketCommand({ Bucket: BUCKET }))]);
    s3.destroy();
    // IoT Core's right to publish under mam/ is the service's broker login.
    const standIn = await startIotStandIn(broker.url, credentials.mqtt);
    stops.push(() => standIn.close());
    // The feed writer's on-failure queue, which the sweep redrives.
    const sqs = await startSqsStandIn();
    stops.push(() => sqs.close());
    const feedFailureQueueUrl = sqs.queueUrl(`mam-${STAGE}-feed-failures`);

    const peersReady = performance.now();
    const functionEnv = {
      MAM_TABLE_NAME: TABLE,
      MAM_BUCKET_NAME: BUCKET,
      MAM_DYNAMODB_ENDPOINT: ddb.endpoint,
      MAM_S3_ENDPOINT: s3endpoint,
      MAM_TOKEN_SIGNING_KEY: credentials.signing_key,
      MAM_FEED_FAILURE_QUEUE_URL: feedFailureQueueUrl,
      MAM_SQS_ENDPOINT: sqs.endpoint,
    };
    const offline = await startServerlessOffline(
      [
        "--stage",
        STAGE,
        "--region",
        REGION,
        "--httpPort",
        String(apiPort),
        "--lambdaPort",
        String(lambdaPort),
        "--param",
        `iotEndpoint=${standIn.endpoint}`,
        "--param",
        `autoComplete=${autoComplete}`,
      ],
      {
        ...process.env,
        MAM_OFFLINE_FUNCTION_ENV: JSON.stringify(functionEnv),
        AWS_ACCESS_KEY_ID: LOCAL_CREDENTIALS.accessKeyId,
        AWS_SECRET_ACCESS_KEY: LOCAL_CREDENTIALS.secretAccessKey,
        AWS_REGION: REGION,
        SLS_TELEMETRY_DISABLED: "1",
        SLS_TRACKING_DISABLED: "1",
        SLS_NOTIFICATIONS_MODE: "off",
        SLS_DEPRECATION_DISABLE: "*",
        SLS_INTERACTIVE_SETUP_DISABLE: "1",
      },
    );
    stops.push(async () => {
      if (offline.child.exitCode === null) offline.child.kill("SIGINT");
      const code = await offline.exited;
      return code === 130 ? 0 : code;
    });

    const offlineReady = performance.now();
    const invoke = lambdaInvoker(lambdaPort);
    const poller = await startStreamPoller({
      streams: ddb.streams,
      dynamodb: ddb.client,
      tableName: TABLE,
      region: REGION,
      mapping,
      functionArn: `arn:aws:lambda:${REGION}:000000000000:function:mam-${STAGE}-streamPublisher`,
      handler: (event: DynamoDBStreamEvent) => invoke<DynamoDBBatchResponse | undefined>(`mam-${STAGE}-streamPublisher`, event),
      onFailure: (m) => say(`stream batch sent to the on-failure destination: ${JSON.stringify(m.DDBStreamBatchInfo)}`),
      onError: (err) => say(`reading the stream failed: ${err instanceof Error ? err.message : String(err)}`),
    });
    stops.push(() => poller.close());
    // The feed writer, on a mapping of its own; what it gives up on goes to its queue, as Lambda sends it.
    const sqsClient = new SQSClient({ endpoint: sqs.endpoint, region: REGION, credentials: LOCAL_CREDENTIALS });
    const feedPoller = await startStreamPoller({
      streams: ddb.streams,
      dynamodb: ddb.client,
      tableName: TABLE,
      region: REGION,
      mapping: feedMapping,
      functionArn: `arn:aws:lambda:${REGION}:000000000000:function:mam-${STAGE}-feedWriter`,
      handler: (event: DynamoDBStreamEvent) => invoke<DynamoDBBatchResponse | undefined>(`mam-${STAGE}-feedWriter`, event),
      onFailure: async (m) => {
        say(`feed range sent to the feed's on-failure queue (the sweep redrives it): ${JSON.stringify(m.DDBStreamBatchInfo)}`);
        await sqsClient.send(new SendMessageCommand({ QueueUrl: feedFailureQueueUrl, MessageBody: JSON.stringify(m) }));
      },
      onError: (err) => say(`reading the stream (feed writer) failed: ${err instanceof Error ? err.message : String(err)}`),
    });
    stops.push(async () => {
      await feedPoller.close();
      sqsClient.destroy();
    });

    // EventBridge's rate(...): every period from the start; a sweep still running when the next is due is not doubled.
    let sweeping: Promise<void> | undefined;
    const sweep = (): void => {
      if (sweeping !== undefined) return;
      const event = {
        version: "0",
        id: randomUUID(),
        "detail-type": "Scheduled Event",
        source: "aws.events",
        account: "000000000000",
        time: new Date().toISOString(),
        region: REGION,
        resources: [`arn:aws:events:${REGION}:000000000000:rule/mam-${STAGE}-recoverySweep`],
        detail: {},
      };
      sweeping = invoke<unknown>(`mam-${STAGE}-recoverySweep`, event)
        .then((counts) => say(`recovery sweep: ${JSON.stringify(counts)}`))
        .catch((err: unknown) => say(`recovery sweep failed: ${err instanceof Error ? err.message : String(err)}`))
        .finally(() => {
          sweeping = undefined;
        });
    };
    const timer = setInterval(sweep, sweepEveryMs);
    stops.push(async () => {
      clearInterval(timer);
      await sweeping;
    });

    const seconds = (from: number, to: number): string => ((to - from) / 1000).toFixed(1);
    const ready = `${seconds(started, performance.now())} s (peers and bundles ${seconds(started, peersReady)} s, serverless-offline ${seconds(peersReady, offlineReady)} s)`;
    process.stdout.write(
      [
        `mam (the AWS shape, offline) is up in ${ready}:`,
        `  API:       http://127.0.0.1:${apiPort}`,
        `  MQTT:      ${broker.url}   (npx mqtt sub -t 'mam/jobs/+/events' -h 127.0.0.1 -p ${broker.port} -V 4)`,
        `  token:     ${file} (operator_token)`,
        `  DynamoDB Local ${ddb.endpoint} (table ${TABLE}), s3rver ${s3endpoint} (bucket ${BUCKET}), IoT stand-in ${standIn.endpoint}`,
        `  functions: ${bundled.length === 0 ? "bundles in .build/ up to date" : `bundled ${bundled.join(", ")} into .build/`}`,
        `  stream pollers: publisher batch ${mapping.batchSize}, retries ${mapping.maximumRetryAttempts}; feed writer batch ${feedMapping.batchSize}, retries ${feedMapping.maximumRetryAttempts}; sweep every ${sweepEveryMs / 1000} s`,
        "",
      ].join("\n"),
    );
    // serverless-offline ending on its own ends the rest.
    void offline.exited.then(() => {
      if (stopping === undefined) {
        say("serverless-offline exited: stopping");
        void stop().then(() => process.exit(1));
      }
    });
  } catch (err) {
    say(`could not start: ${err instanceof Error ? err.message : String(err)}`);
    await stop();
    process.exit(1);
  }
}

await main();
