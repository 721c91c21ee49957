/**
 * A small stand-in for Amazon SQS, as `@aws-sdk/client-sqs` speaks to it (the AWS JSON
 * 1.0 protocol: `POST /`, `X-Amz-Target: AmazonSQS.<Operation>`), holding queues in
 * memory: the feed writer's on-failure queue in the engine tier and `npm run offline`,
 * where our stream poller sends what Lambda would send, and the sweep's redrive reads it
 * with the real SDK. No npm package serves SQS's API; this is the part mam uses:
 * SendMessage, ReceiveMessage (with the visibility timeout), DeleteMessage,
 * GetQueueAttributes (`ApproximateNumberOfMessages`, what the alarm counts) and
 * GetQueueUrl. It checks no SigV4 signature, keeps nothing across a restart, and
 * imitates neither long polling nor FIFO queues nor SQS's at-least-once delivery of a
 * message twice.
 */
import { createHash, randomUUID } from "node:crypto";
import http from "node:http";
import { closeServer, listen } from "./iot-stand-in.ts";

export interface SqsStandIn {
  /** What `MAM_SQS_ENDPOINT` is set to. */
  readonly endpoint: string;
  /** The queue's URL (created on first use). */
  queueUrl(name: string): string;
  /** Messages in the queue, visible or not. */
  depth(name: string): number;
  close(): Promise<void>;
}

interface Message {
  readonly id: string;
  readonly body: string;
  receipt: string | undefined;
  visibleAt: number;
  receives: number;
}

const ACCOUNT = "000000000000";

export async function startSqsStandIn(opts: { readonly now?: () => number } = {}): Promise<SqsStandIn> {
  const now = opts.now ?? Date.now;
  const queues = new Map<string, Message[]>();
  const queueOf = (name: string): Message[] => {
    let q = queues.get(name);
    if (q === undefined) {
      q = [];
      queues.set(name, q);
    }
    return q;
  };
  let endpoint = "";
  const nameOfUrl = (url: unknown): string | undefined => {
    if (typeof url !== "string") return undefined;
    const m = /\/([0-9]{12})\/([A-Za-z0-9_-]{1,80})$/.exec(url);
    return m?.[2];
  };

  const operations: Record<string, (input: Record<string, unknown>) => unknown> = {
    GetQueueUrl: (input) => ({ QueueUrl: `${endpoint}/${ACCOUNT}/${String(input.QueueName)}` }),
    SendMessage: (input) => {
      const name = nameOfUrl(input.QueueUrl);
      if (name === undefined) throw fault(400, "InvalidAddress", "QueueUrl is not a queue's URL");
      const body = String(input.MessageBody ?? "");
      const message: Message = { id: randomUUID(), body, receipt: undefined, visibleAt: 0, receives: 0 };
      queueOf(name).push(message);
      return { MessageId: message.id, MD5OfMessageBody: createHash("md5").update(body).digest("hex") };
    },
    ReceiveMessage: (input) => {
      const name = nameOfUrl(input.QueueUrl);
      if (name === undefined) throw fault(400, "InvalidAddress", "QueueUrl is not a queue's URL");
      const max = Math.min(10, Math.max(1, Number(input.MaxNumberOfMessages ?? 1)));
      const visibility = Number(input.VisibilityTimeout ?? 30);
      const t = now();
      const taken = queueOf(name)
        .filter((m) => m.visibleAt <= t)
        .slice(0, max);
      for (const m of taken) {
        m.receipt = randomUUID();
        m.visibleAt = t + visibility * 1000;
        m.receives += 1;
      }
      return {
        Messages: taken.map((m) => ({
          MessageId: m.id,
          ReceiptHandle: m.receipt,
          Body: m.body,
          MD5OfBody: createHash("md5").update(m.body).digest("hex"),
        })),
      };
    },
    DeleteMessage: (input) => {
      const name = nameOfUrl(input.QueueUrl);
      if (name === undefined) throw fault(400, "InvalidAddress", "QueueUrl is not a queue's URL");
      const q = queueOf(name);
      const i = q.findIndex((m) => m.receipt !== undefined && m.receipt === input.ReceiptHandle);
      if (i < 0) throw fault(400, "ReceiptHandleIsInvalid", "no message has this receipt handle");
      q.splice(i, 1);
      return {};
    },
    GetQueueAttributes: (input) => {
      const name = nameOfUrl(input.QueueUrl);
      if (name === undefined) throw fault(400, "InvalidAddress", "QueueUrl is not a queue's URL");
      const t = now();
      const q = queueOf(name);
      return {
        Attributes: {
          ApproximateNumberOfMessages: String(q.filter((m) => m.visibleAt <= t).length),
          ApproximateNumberOfMessagesNotVisible: String(q.filter((m) => m.visibleAt > t).length),
        },
      };
    },
  };

  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const target = String(req.headers["x-amz-target"] ?? "");
      const op = operations[target.replace(/^AmazonSQS\./, "")];
      const answer = (status: number, body: unknown, error?: string): void => {
        res.writeHead(status, {
          "content-type": "application/x-amz-json-1.0",
          ...(error === undefined ? {} : { "x-amzn-query-error": `AWS.SimpleQueueService.${error};Sender` }),
        });
        res.end(JSON.stringify(body));
      };
      if (req.method !== "POST" || op === undefined) {
        answer(
          400,
          { __type: "com.amazonaws.sqs#InvalidAction", message: `not an operation this stand-in serves: ${target}` },
          "InvalidAction",
        );
        return;
      }
      try {
        answer(200, op(JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, unknown>));
      } catch (err) {
        const f = err as Partial<Fault>;
        if (f.code === undefined) throw err;
        answer(f.status ?? 400, { __type: `com.amazonaws.sqs#${f.code}`, message: f.message }, f.code);
      }
    });
  });
  const port = await listen(server);
  endpoint = `http://127.0.0.1:${port}`;
  return {
    endpoint,
    queueUrl: (name) => `${endpoint}/${ACCOUNT}/${name}`,
    depth: (name) => queueOf(name).length,
    close: () => closeServer(server),
  };
}

interface Fault {
  readonly status: number;
  readonly code: string;
  readonly message: string;
}

function fault(status: number, code: string, message: string): Fault {
  return { status, code, message };
}
