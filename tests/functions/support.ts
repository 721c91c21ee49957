/**
 * What the Lambda handler tests share: the real local peers the functions talk to
 * (a DynamoDB peer: dynalite, or DynamoDB Local with MAM_DYNAMODB_PEER; s3rver; an
 * MQTT broker behind the IoT stand-in), the environment the
 * composition root reads to reach them, recorded Lambda events from
 * fixtures/lambda/, and an SSM stand-in for the signing key.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { createJobTable, DynamoJobStore } from "@mam/aws";
import type { JobStore } from "@mam/core";
import { type EmbeddedBroker, startEmbeddedBroker } from "@mam/local";
import type { Context } from "aws-lambda";
import {
  DYNAMO_GAPS,
  DYNAMODB_PEER,
  type DynamoPeer,
  type IotStandIn,
  type S3rverPeer,
  startDynamoPeer,
  startIotStandIn,
  startS3rver,
} from "../support/aws-peers.ts";

const ROOT = join(import.meta.dirname, "..", "..");

/** s3rver's own keys; the DynamoDB peers and the IoT stand-in accept any signature. */
export const CREDENTIALS = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" } as const;
/** Whether the DynamoDB peer runs TransactWriteItems (dynalite does not): the functions' `transactions` override. */
export const TRANSACTIONS = !DYNAMO_GAPS[DYNAMODB_PEER].noTransactions;
export const REGION = "us-east-1";
export const SIGNING_KEY = "test-signing-key-0123456789abcdef-0123456789";

/** A recorded Lambda event (a fresh copy each time: tests edit them). */
export function lambdaFixture<T>(name: string): T {
  return JSON.parse(readFileSync(join(ROOT, "fixtures", "lambda", name), "utf8")) as T;
}

export interface Peers {
  readonly dynamo: DynamoPeer;
  readonly s3: S3rverPeer;
  readonly broker: EmbeddedBroker;
  readonly iot: IotStandIn;
  /** Topics the broker refuses a publish to (so the stand-in answers 403 for them). */
  readonly refusedTopics: Set<string>;
  /** A fresh job table; its name. */
  newTable(): Promise<string>;
  /** A job store on that table (to seed and inspect). */
  store(table: string): JobStore;
  /** The environment the composition root reads, aimed at these peers. */
  env(table: string, extra?: Record<string, string>): Record<string, string>;
  close(): Promise<void>;
}

export async function startPeers(): Promise<Peers> {
  const refusedTopics = new Set<string>();
  // IoT Core's own right to publish under mam/: the stand-in connects with these.
  const service = { username: "mam-iot-stand-in", password: randomBytes(16).toString("hex") };
  const dynamo = await startDynamoPeer();
  const s3 = await startS3rver(`mam-reports-${randomUUID().slice(0, 8)}`);
  const broker = await startEmbeddedBroker({
    port: 0,
    publisherCredentials: service,
    refusePublish: (topic) => refusedTopics.has(topic),
  });
  const iot = await startIotStandIn(broker.url, { ...service, brokerTimeoutMs: 2000 });
  return {
    dynamo,
    s3,
    broker,
    iot,
    refusedTopics,
    async newTable() {
      const table = `mam-test-${randomUUID().slice(0, 8)}`;
      await createJobTable(dynamo.client, table);
      return table;
    },
    store(table) {
      return new DynamoJobStore({ client: dynamo.client, tableName: table, transactions: TRANSACTIONS });
    },
    env(table, extra = {}) {
      return {
        AWS_REGION: REGION,
        MAM_TABLE_NAME: table,
        MAM_BUCKET_NAME: s3.bucket,
        MAM_IOT_ENDPOINT: iot.endpoint,
        MAM_DYNAMODB_ENDPOINT: dynamo.endpoint,
        MAM_S3_ENDPOINT: s3.endpoint,
        MAM_PUBLISH_TIMEOUT_MS: "5000",
        ...extra,
      };
    },
    async close() {
      await iot.close();
      await broker.close();
      await s3.close();
      await dynamo.close();
    },
  };
}

/** Collects the JSON lines a handler logs. */
export function memoryLog(): { readonly lines: string[]; readonly entries: () => Record<string, unknown>[]; sink: (line: string) => void } {
  const lines: string[] = [];
  return {
    lines,
    entries: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>),
    sink: (line) => {
      lines.push(line);
    },
  };
}

export interface SsmStandIn {
  readonly endpoint: string;
  /** Each GetParameter request's JSON body, in order. */
  readonly requests: readonly Record<string, unknown>[];
  /** Answer the next request with this error type (400) instead of the value. */
  failNext(errorType: string): void;
  close(): Promise<void>;
}

/**
 * SSM's GetParameter over its JSON protocol (`X-Amz-Target: AmazonSSM.GetParameter`),
 * as @aws-sdk/client-ssm sends it. One SecureString parameter; no SigV4 check.
 */
export async function startSsmStandIn(name: string, value: string): Promise<SsmStandIn> {
  const requests: Record<string, unknown>[] = [];
  let failure: string | undefined;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const target = req.headers["x-amz-target"];
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, unknown>;
      const reply = (status: number, payload: unknown): void => {
        res.writeHead(status, { "content-type": "application/x-amz-json-1.1" });
        res.end(JSON.stringify(payload));
      };
      if (target !== "AmazonSSM.GetParameter") return reply(400, { __type: "UnknownOperationException", message: String(target) });
      requests.push(body);
      if (failure !== undefined) {
        const type = failure;
        failure = undefined;
        return reply(400, { __type: type, message: `${type} (stand-in)` });
      }
      if (body.Name !== name) return reply(400, { __type: "ParameterNotFound", message: `no parameter ${String(body.Name)}` });
      reply(200, {
        Parameter: {
          Name: name,
          Type: "SecureString",
          Value: body.WithDecryption === true ? value : "AQICAHh-encrypted-blob",
          Version: 1,
          ARN: `arn:aws:ssm:${REGION}:123456789012:parameter${name}`,
          DataType: "text",
        },
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}`,
    requests,
    failNext(errorType) {
      failure = errorType;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/** The context object Lambda passes a Node handler (aws-lambda's `Context`). */
export function lambdaContext(functionName: string): Context {
  const deadline = Date.now() + 30_000;
  return {
    callbackWaitsForEmptyEventLoop: true,
    functionName,
    functionVersion: "$LATEST",
    invokedFunctionArn: `arn:aws:lambda:${REGION}:123456789012:function:${functionName}`,
    memoryLimitInMB: "1024",
    awsRequestId: randomUUID(),
    logGroupName: `/aws/lambda/${functionName}`,
    logStreamName: "2025/01/15/[$LATEST]0123456789abcdef0123456789abcdef",
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
    done: () => undefined,
    fail: () => undefined,
    succeed: () => undefined,
  };
}
