import type { DeserializeMiddleware, InitializeMiddleware, MiddlewareStack } from "@smithy/types";

/**
 * A live count of the requests an SDK client sends, so a test (or a bench) can
 * state the cost of an operation: "a transition is exactly one request".
 *
 * Counted in the SDK's `deserialize` step, which runs once per HTTP attempt (inside
 * the retry loop), so an SDK retry counts as the extra request it is. `calls` keeps
 * the input of every command sent (once per `send`, before retries), for asserting
 * what was asked, e.g. that a sweep queried an index and never scanned the table.
 */
export interface RequestCounter {
  readonly total: number;
  /** Requests by command name, e.g. `{ UpdateItemCommand: 1 }`. */
  readonly byCommand: Readonly<Record<string, number>>;
  /** Each command sent, in order, with its input (as the low-level client saw it). */
  readonly calls: readonly { readonly command: string; readonly input: Readonly<Record<string, unknown>> }[];
  reset(): void;
}

/** Any SDK v3 client (DynamoDB, S3, IoT data plane, or a document client). */
export interface MiddlewareHost<I extends object, O extends object> {
  readonly middlewareStack: MiddlewareStack<I, O>;
}

let counterSeq = 0;

export function countRequests<I extends object, O extends object>(client: MiddlewareHost<I, O>): RequestCounter {
  let total = 0;
  let byCommand: Record<string, number> = {};
  let calls: { command: string; input: Record<string, unknown> }[] = [];
  const id = ++counterSeq;

  const record: InitializeMiddleware<I, O> = (next, context) => async (args) => {
    calls.push({ command: context.commandName ?? "unknown", input: { ...(args.input as Record<string, unknown>) } });
    return next(args);
  };
  const count: DeserializeMiddleware<I, O> = (next, context) => async (args) => {
    const name = context.commandName ?? "unknown";
    total += 1;
    byCommand[name] = (byCommand[name] ?? 0) + 1;
    return next(args);
  };
  client.middlewareStack.add(record, { step: "initialize", name: `mamRecordCalls${id}` });
  client.middlewareStack.add(count, { step: "deserialize", name: `mamCountRequests${id}` });

  return {
    get total() {
      return total;
    },
    get byCommand() {
      return byCommand;
    },
    get calls() {
      return calls;
    },
    reset() {
      total = 0;
      byCommand = {};
      calls = [];
    },
  };
}
