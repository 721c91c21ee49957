import http from "node:http";
import net from "node:net";

/**
 * The load generator of bench/http.ts, in a process of its own (never the server's):
 * `connections` closed loops, each on its own keep-alive connection, sending
 * `GET url` as soon as its previous answer has been read to the end (no
 * pipelining). `warmupSeconds` of that first, not counted, then `seconds` measured.
 *
 *   node --import tsx bench/support/load.ts '<json LoadPlan>'
 *
 * Two clients (autocannon is not installed; undici's Pool is not importable from
 * Node 20 without the package):
 * - `raw` (the default): one `net` socket per connection, the request bytes built
 *   once, the answer framed by its Content-Length (both servers send one). About
 *   what autocannon does, and cheap enough that the generator is not the bottleneck.
 * - `agent`: `node:http` with a keep-alive Agent (maxSockets = connections). It
 *   spends more CPU per request than a bare Hono server does, so on two cores it
 *   caps the baseline; kept to show that.
 *
 * Prints `MAM_LOAD measuring` when the measured window opens (so the caller can
 * read the server's CPU time then), and one line `MAM_LOAD {...}` (LoadResult) at
 * the end.
 */

export interface LoadPlan {
  readonly url: string;
  readonly headers: Readonly<Record<string, string>>;
  readonly connections: number;
  readonly seconds: number;
  readonly warmupSeconds: number;
  readonly client: "raw" | "agent";
}

export interface LoadResult {
  readonly requests: number;
  /** Answers other than 200, and requests that failed outright. */
  readonly errors: number;
  readonly firstError?: string;
  readonly seconds: number;
  readonly rps: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  readonly bodyBytes: number;
  /** This process's CPU time over the measured window, as a share of one core. */
  readonly cpuShare: number;
  /** Sockets opened in all (a keep-alive run opens `connections` of them). */
  readonly socketsOpened: number;
  /** The measured window on the system's monotonic clock (microseconds), which a --cpu-prof profile is stamped with. */
  readonly windowUs: readonly [number, number];
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

/** What both clients share: the measured window's latencies and counts. */
class Tally {
  measuring = false;
  stopping = false;
  count = 0;
  errors = 0;
  bodyBytes = 0;
  socketsOpened = 0;
  firstError: string | undefined;
  #latencies = new Float64Array(1 << 20);

  record(ms: number, ok: boolean, bytes: number, error?: string): void {
    if (!ok) this.firstError ??= error;
    if (!this.measuring) return;
    if (!ok) this.errors++;
    if (this.count === this.#latencies.length) {
      const grown = new Float64Array(this.#latencies.length * 2);
      grown.set(this.#latencies);
      this.#latencies = grown;
    }
    this.#latencies[this.count++] = ms;
    this.bodyBytes += bytes;
  }

  sorted(): Float64Array {
    return this.#latencies.slice(0, this.count).sort();
  }
}

/** One closed loop per connection over `node:http`'s keep-alive Agent. */
function agentLoops(plan: LoadPlan, tally: Tally): { loops: Promise<void>[]; close(): void } {
  const agent = new http.Agent({ keepAlive: true, maxSockets: plan.connections });
  const target = new URL(plan.url);
  const once = () =>
    new Promise<void>((resolve) => {
      const started = performance.now();
      const req = http.request(
        {
          agent,
          host: target.hostname,
          port: target.port,
          path: `${target.pathname}${target.search}`,
          method: "GET",
          headers: plan.headers,
        },
        (res) => {
          let bytes = 0;
          res.on("data", (chunk: Buffer) => {
            bytes += chunk.length;
          });
          res.on("end", () => {
            tally.record(performance.now() - started, res.statusCode === 200, bytes, `HTTP ${res.statusCode}`);
            resolve();
          });
        },
      );
      req.on("socket", (socket) => {
        if (!(socket as { __benchSeen?: true }).__benchSeen) {
          (socket as { __benchSeen?: true }).__benchSeen = true;
          tally.socketsOpened++;
        }
      });
      req.on("error", (err) => {
        tally.record(performance.now() - started, false, 0, err.message);
        resolve();
      });
      req.end();
    });
  const loop = async () => {
    while (!tally.stopping) await once();
  };
  return { loops: Array.from({ length: plan.connections }, loop), close: () => agent.destroy() };
}

const HEADER_END = Buffer.from("\r\n\r\n");

/**
 * One closed loop per raw keep-alive socket: write the prebuilt request, read until
 * the head and Content-Length bytes of body are in, record, write the next.
 */
function rawLoops(plan: LoadPlan, tally: Tally): { loops: Promise<void>[]; close(): void } {
  const target = new URL(plan.url);
  const port = Number(target.port || 80);
  const head = [
    `GET ${target.pathname}${target.search} HTTP/1.1`,
    `host: ${target.host}`,
    ...Object.entries(plan.headers).map(([k, v]) => `${k}: ${v}`),
    "connection: keep-alive",
    "",
    "",
  ].join("\r\n");
  const request = Buffer.from(head, "latin1");
  const sockets: net.Socket[] = [];

  const loop = () =>
    new Promise<void>((resolve) => {
      const socket = net.connect({ host: target.hostname, port, noDelay: true });
      sockets.push(socket);
      tally.socketsOpened++;
      let buffered: Buffer = Buffer.alloc(0);
      let started = 0;
      const send = () => {
        if (tally.stopping) {
          socket.end();
          resolve();
          return;
        }
        started = performance.now();
        socket.write(request);
      };
      socket.on("connect", send);
      socket.on("data", (chunk: Buffer) => {
        buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
        for (;;) {
          const end = buffered.indexOf(HEADER_END);
          if (end < 0) return;
          const headText = buffered.toString("latin1", 0, end);
          const length = /\r\ncontent-length:\s*(\d+)/i.exec(headText)?.[1];
          if (length === undefined) {
            tally.record(performance.now() - started, false, 0, "an answer without Content-Length (this client frames by it)");
            tally.stopping = true;
            socket.destroy();
            resolve();
            return;
          }
          const total = end + HEADER_END.length + Number(length);
          if (buffered.length < total) return;
          const status = Number(headText.slice(9, 12));
          tally.record(performance.now() - started, status === 200, Number(length), `HTTP ${status}`);
          buffered = buffered.subarray(total);
          send();
        }
      });
      socket.on("error", (err) => {
        tally.record(performance.now() - started, false, 0, err.message);
        resolve();
      });
      socket.on("close", () => {
        if (!tally.stopping) tally.record(performance.now() - started, false, 0, "the server closed a keep-alive connection");
        resolve();
      });
    });
  return {
    loops: Array.from({ length: plan.connections }, loop),
    close: () => {
      for (const s of sockets) s.destroy();
    },
  };
}

async function run(plan: LoadPlan): Promise<LoadResult> {
  const tally = new Tally();
  const { loops, close } = plan.client === "agent" ? agentLoops(plan, tally) : rawLoops(plan, tally);

  await new Promise((r) => setTimeout(r, plan.warmupSeconds * 1000));
  process.stdout.write("MAM_LOAD measuring\n");
  tally.measuring = true;
  const opened = Number(process.hrtime.bigint() / 1000n);
  const cpuBefore = process.cpuUsage();
  const started = performance.now();
  await new Promise((r) => setTimeout(r, plan.seconds * 1000));
  tally.measuring = false;
  const closed = Number(process.hrtime.bigint() / 1000n);
  const seconds = (performance.now() - started) / 1000;
  const cpu = process.cpuUsage(cpuBefore);
  tally.stopping = true;
  await Promise.all(loops);
  close();

  const sorted = tally.sorted();
  return {
    requests: tally.count,
    errors: tally.errors,
    ...(tally.firstError === undefined || tally.errors === 0 ? {} : { firstError: tally.firstError }),
    seconds,
    rps: tally.count / seconds,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    maxMs: tally.count > 0 ? sorted[tally.count - 1]! : Number.NaN,
    bodyBytes: tally.bodyBytes,
    cpuShare: (cpu.user + cpu.system) / 1e6 / seconds,
    socketsOpened: tally.socketsOpened,
    windowUs: [opened, closed],
  };
}

const plan = JSON.parse(process.argv[2] ?? "") as LoadPlan;
const result = await run(plan);
process.stdout.write(`MAM_LOAD ${JSON.stringify(result)}\n`);
