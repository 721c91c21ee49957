import { connect, type Socket } from "node:net";
import type { HerdrErrorBody, HerdrRequest, HerdrSubscription } from "./protocol.ts";

/** herdr answered a request with `{id, error: {code, message}}`. */
export class HerdrError extends Error {
  readonly code: string;
  constructor(method: string, body: HerdrErrorBody) {
    super(`herdr refused ${method}: ${body.code}: ${body.message}`);
    this.name = "HerdrError";
    this.code = body.code;
  }
}

/** The socket could not be reached, ended early, or answered something that is not herdr's protocol. */
export class HerdrConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "HerdrConnectionError";
  }
}

/** How long a connection may take to give its first answer line. */
const ANSWER_TIMEOUT_MS = 5_000;
/** A line longer than this is not herdr's (a pane list of hundreds of panes is far below it). */
const MAX_LINE_BYTES = 16 * 1024 * 1024;

/**
 * A client of herdr's socket: newline-delimited JSON, one request per connection
 * (herdr reads one request line per connection). Each request carries an id of
 * the client's (`mam-<n>`), and an answer naming another id is refused.
 */
export class HerdrSocket {
  readonly #path: string;
  #next = 0;

  constructor(path: string) {
    this.#path = path;
  }

  get path(): string {
    return this.#path;
  }

  /** One request, one answer: its `result`, or a HerdrError with herdr's code. */
  async request(method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    const conn = await this.#open();
    try {
      const id = this.#id();
      conn.send({ id, method, params });
      return answerOf(method, id, await conn.nextLine(ANSWER_TIMEOUT_MS));
    } finally {
      conn.close();
    }
  }

  /**
   * Open a subscription: resolves once herdr acknowledged it (`subscription_started`);
   * each later line goes to `onLine`; `ended` resolves when the connection ends, for
   * any reason (herdr stopped, the socket dropped, `close()`).
   */
  async subscribe(subscriptions: readonly HerdrSubscription[], onLine: (line: unknown) => void): Promise<HerdrSubscriptionHandle> {
    const conn = await this.#open();
    try {
      const id = this.#id();
      conn.send({ id, method: "events.subscribe", params: { subscriptions } });
      const ack = answerOf("events.subscribe", id, await conn.nextLine(ANSWER_TIMEOUT_MS));
      if (ack.type !== "subscription_started") {
        throw new HerdrConnectionError(`herdr acknowledged events.subscribe with ${JSON.stringify(ack.type)}, not subscription_started`);
      }
    } catch (e) {
      conn.close();
      throw e;
    }
    conn.onLine(onLine);
    return { ended: conn.ended, close: () => conn.close() };
  }

  #id(): string {
    this.#next += 1;
    return `mam-${this.#next}`;
  }

  #open(): Promise<LineConnection> {
    return new Promise((resolve, reject) => {
      const socket = connect(this.#path);
      const onError = (e: Error) => {
        socket.destroy();
        reject(new HerdrConnectionError(`herdr's socket ${this.#path} could not be reached: ${e.message}`, { cause: e }));
      };
      socket.once("error", onError);
      socket.once("connect", () => {
        socket.off("error", onError);
        resolve(new LineConnection(socket));
      });
    });
  }
}

export interface HerdrSubscriptionHandle {
  readonly ended: Promise<void>;
  close(): void;
}

function answerOf(method: string, id: string, line: unknown): Record<string, unknown> {
  if (line === null || typeof line !== "object" || Array.isArray(line)) {
    throw new HerdrConnectionError(`herdr answered ${method} with a line that is not a JSON object`);
  }
  const answer = line as Record<string, unknown>;
  const error = answer.error as HerdrErrorBody | undefined;
  // herdr answers a line it could not parse with an empty id.
  if (error !== undefined && typeof error === "object" && error !== null && (answer.id === id || answer.id === "")) {
    throw new HerdrError(method, { code: String(error.code), message: String(error.message) });
  }
  if (answer.id !== id) throw new HerdrConnectionError(`herdr answered ${method} (id ${id}) with id ${JSON.stringify(answer.id)}`);
  const result = answer.result;
  if (result === null || typeof result !== "object" || Array.isArray(result)) {
    throw new HerdrConnectionError(`herdr answered ${method} with neither a result nor an error`);
  }
  return result as Record<string, unknown>;
}

/** A socket read as JSON lines: the first by `nextLine`, the rest pushed to one listener. */
class LineConnection {
  readonly #socket: Socket;
  readonly ended: Promise<void>;
  #buffer = "";
  #lines: unknown[] = [];
  #waiting: ((line: unknown) => void) | undefined;
  #listener: ((line: unknown) => void) | undefined;
  #done = false;
  #failure: Error | undefined;

  constructor(socket: Socket) {
    this.#socket = socket;
    socket.setEncoding("utf8");
    this.ended = new Promise((resolve) => {
      socket.on("close", () => {
        this.#done = true;
        this.#wake();
        resolve();
      });
    });
    socket.on("error", (e) => {
      this.#failure ??= e;
    });
    socket.on("data", (chunk: string) => this.#read(chunk));
  }

  send(request: HerdrRequest): void {
    this.#socket.write(`${JSON.stringify(request)}\n`);
  }

  nextLine(timeoutMs: number): Promise<unknown> {
    if (this.#lines.length > 0) return Promise.resolve(this.#lines.shift());
    if (this.#done) return Promise.reject(this.#endedEarly());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting = undefined;
        reject(new HerdrConnectionError(`herdr did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiting = (line) => {
        clearTimeout(timer);
        this.#waiting = undefined;
        if (line === ENDED) reject(this.#endedEarly());
        else resolve(line);
      };
    });
  }

  onLine(listener: (line: unknown) => void): void {
    this.#listener = listener;
    for (const line of this.#lines.splice(0)) listener(line);
  }

  close(): void {
    this.#socket.destroy();
  }

  #endedEarly(): HerdrConnectionError {
    const why = this.#failure === undefined ? "" : `: ${this.#failure.message}`;
    return new HerdrConnectionError(`herdr closed the connection before answering${why}`);
  }

  #wake(): void {
    this.#waiting?.(ENDED);
  }

  #read(chunk: string): void {
    this.#buffer += chunk;
    if (this.#buffer.length > MAX_LINE_BYTES) {
      this.#failure = new HerdrConnectionError(`herdr sent a line longer than ${MAX_LINE_BYTES} bytes`);
      this.#socket.destroy();
      return;
    }
    let nl = this.#buffer.indexOf("\n");
    while (nl >= 0) {
      const text = this.#buffer.slice(0, nl).trim();
      this.#buffer = this.#buffer.slice(nl + 1);
      if (text !== "") this.#deliver(text);
      nl = this.#buffer.indexOf("\n");
    }
  }

  #deliver(text: string): void {
    let line: unknown;
    try {
      line = JSON.parse(text);
    } catch {
      this.#failure = new HerdrConnectionError("herdr sent a line that is not JSON");
      this.#socket.destroy();
      return;
    }
    if (this.#waiting !== undefined) this.#waiting(line);
    else if (this.#listener !== undefined) this.#listener(line);
    else this.#lines.push(line);
  }
}

const ENDED = Symbol("ended");
