import { createServer, type Server } from "node:http";
import { createAdaptorServer } from "@hono/node-server";
import { appOptionsOf, createApp, StreamSlots } from "@mam/api";
import { type Config, type Deps, isMamError, jsonLogger, logEvent, parseConfig, sweepPass } from "@mam/core";
import { connectionCap, listenOn, softOpenFileLimit } from "@mam/local";
import { composeEmbeddedService, defaultServiceDeps, type ServiceDeps } from "./embedded-service.ts";
import { EXIT_CODES } from "./exit-codes.ts";
import type { CliIo } from "./io.ts";

/** The longest a request's log line waits in memory before it is written. */
const LOG_FLUSH_MS = 10;

export interface RunningService {
  readonly url: string;
  readonly mqttUrl: string;
  readonly credentialsPath: string;
  readonly operatorToken: string;
  /**
   * The service's ports as its routes use them (the job store behind the change
   * relay): for embedding the service in-process, as bench/notify and the
   * publish-count test do, through the same service functions the API calls.
   */
  readonly deps: Deps;
  /** Feed streams open now. */
  openStreams(): number;
  /** The most HTTP connections the server holds at once (`server.maxConnections`). */
  readonly maxConnections: number;
  /** Resolves once the change relay has handled every commit it saw so far (each flush done: sent and settled, or failed). */
  relayed(): Promise<void>;
  /** Stop accepting, drain the relay, close everything. Nothing owed is lost: intents are durable. */
  stop(): Promise<void>;
}

/**
 * The composition root of `mam serve`: the embedded service (`composeEmbeddedService`:
 * SQLite and files under the data dir, the embedded MQTT broker or MAM_MQTT_URL's, the
 * change relay), the API in front of it, and a sweep timer for whatever the relay missed.
 */
export async function startService(
  config: Config,
  log: (line: string) => void = (l) => process.stdout.write(`${l}\n`),
  overrides: Partial<ServiceDeps> = {},
): Promise<RunningService> {
  const logger = jsonLogger(log);
  const service = await composeEmbeddedService(config, logger, { ...defaultServiceDeps, ...overrides });
  const { deps } = service;

  // Open feed streams wake on this process's commits (the relay sees each one) and end
  // at once when the service stops; another process's commits are found by their poll.
  const shutdown = new AbortController();
  const slots = new StreamSlots();
  const app = createApp({
    deps,
    tokens: service.tokens,
    ...appOptionsOf(config),
    log,
    // One publish path per process: the relay publishes every commit, so a request
    // that commits does not publish too (it answers without `published`).
    publishInline: false,
    feed: { ...config.feedStreams, slots, onCommitted: service.onCommitted, shutdown: shutdown.signal },
  });

  const sweep = async (graceMs: number) => {
    try {
      const {
        notifications: r,
        candidates: e,
        attention: a,
      } = await sweepPass(deps, {
        policy: config.sweep,
        graceMs,
        budgetMs: config.sweepBudgetSeconds * 1000,
        evaluation: config.sweepEvaluation,
        log: (entry) => logEvent(logger, entry),
      });
      if (r.owed > 0 || e.due > 0 || a.stale > 0 || a.overdue > 0 || a.failed > 0) {
        const counts = { owed: r.owed, sent: r.sent, failed: r.failed, quarantined: r.quarantined, not_tried: r.not_tried };
        const evaluated = { due: e.due, completed: e.completed, held: e.held, kept: e.kept, failed: e.failed, not_tried: e.not_tried };
        const { results: _looks, ...looked } = a;
        logger.info("sweep", { ...counts, candidates: evaluated, attention: looked });
      }
    } catch (e) {
      logger.warn("sweep failed", { detail: isMamError(e) ? e.message : String(e) });
    }
  };
  // The first sweep runs now: the embedded broker resolved above only once it had
  // loaded its persistent sessions from disk, so what is owed is queued for every
  // `clean: false` subscriber, the ones still away included, and reaches them when
  // they return (clean-session subscribers catch up from the feed). On an external
  // broker the sweep's publish connects after that broker accepts connections, which
  // it does once its own sessions are loaded. Then one sweep an interval.
  //
  // The start-up sweep takes every intent owed, however fresh: it reads the owed
  // index before the API listens, so nothing it finds was committed through this
  // process's relay — what was owed at the restart goes out now, not one interval
  // later. Every later sweep leaves fresh intents to the relay for the grace
  // period (MAM_SWEEP_GRACE_SECONDS), so the two never race.
  let sweeping: Promise<void> = sweep(0);
  const timer = setInterval(() => {
    sweeping = sweeping.then(() => sweep(config.sweepGraceSeconds * 1000));
  }, config.sweepIntervalSeconds * 1000);

  // Everything above is closed again when the API's port cannot be bound (taken:
  // config.invalid naming MAM_PORT), so the refusal ends the process.
  const closeBehindApi = async () => {
    clearInterval(timer);
    shutdown.abort();
    await sweeping;
    await service.close();
  };
  const { server, maxConnections } = httpServer(config, app.fetch);
  let apiPort: number;
  try {
    apiPort = (await listenOn(server, { port: config.port, host: config.host, setting: "MAM_PORT" })).port;
  } catch (e) {
    await closeBehindApi();
    throw e;
  }

  let stopping: Promise<void> | undefined;
  return {
    url: `http://${config.host}:${apiPort}`,
    mqttUrl: service.mqttUrl,
    credentialsPath: service.credentialsPath,
    operatorToken: config.operatorToken ?? service.credentials.operator_token,
    deps,
    openStreams: () => slots.open,
    maxConnections,
    relayed: () => service.relayed(),
    stop() {
      // Streams end at once (the shutdown signal); requests in flight get the grace
      // period, then every connection still open is closed, a reader that never
      // reads included: the stop never waits on a socket's peer.
      //
      //   stop ── shutdown.abort ── server.close, idle sockets closed ──(grace)── closeAllConnections
      stopping ??= (async () => {
        clearInterval(timer);
        shutdown.abort();
        const closed = new Promise<void>((r) => server.close(() => r()));
        server.closeIdleConnections();
        let grace: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([
          closed,
          new Promise<void>((r) => {
            grace = setTimeout(r, config.stopGraceSeconds * 1000);
          }),
        ]);
        clearTimeout(grace);
        server.closeAllConnections();
        await closed;
        await closeBehindApi();
      })();
      return stopping;
    },
  };
}

/**
 * The API's HTTP server, with Node's own bounds on a connection: a socket that sends
 * no complete request head within headersTimeout (checked every
 * connectionsCheckingInterval) is closed with 408, one idle between requests after
 * keepAliveTimeout; a request body slower than requestTimeout is cut. Past
 * maxConnections a new connection is closed as it is accepted, so a flood of sockets
 * never takes the descriptors a report write needs.
 */
function httpServer(config: Config, fetch: (request: Request) => Response | Promise<Response>): { server: Server; maxConnections: number } {
  const server = createAdaptorServer({
    fetch,
    hostname: config.host,
    createServer,
    serverOptions: {
      headersTimeout: config.http.headersTimeoutMs,
      requestTimeout: config.http.requestTimeoutMs,
      keepAliveTimeout: config.http.keepAliveTimeoutMs,
      // Node checks the two timeouts above on this interval (30 s by default): a tenth
      // of the headers timeout closes an idle socket within about 1.1 times it.
      connectionsCheckingInterval: Math.max(50, Math.floor(config.http.headersTimeoutMs / 10)),
    },
  }) as Server;
  const maxConnections = connectionCap(config.http.maxConnections, config.http.fdReserve, softOpenFileLimit());
  server.maxConnections = maxConnections;
  return { server, maxConnections };
}

export async function serveCommand(argv: readonly string[], io: CliIo): Promise<number> {
  if (argv.includes("--help") || argv.includes("-h")) {
    io.stdout(`mam serve — the API on the embedded default (what npm start runs)

Usage: mam serve

Serves the HTTP API on MAM_HOST:MAM_PORT (127.0.0.1:8787) over SQLite and files
under MAM_DATA_DIR (./.mam), with an embedded MQTT broker on MAM_MQTT_PORT (1883)
unless MAM_MQTT_URL names one. The operator token is written to
<data dir>/credentials.json (mode 0600) on first start. The data dir is made 0700
at start, and what it holds private (files 0600, directories 0700); a data dir of
another user, or one that cannot be made 0700, is refused with exit 1. Stops
cleanly on SIGINT or SIGTERM. Every variable: docs/configuration.md.
`);
    return 0;
  }
  if (argv.length > 0) {
    io.stderr(`mam serve: takes no arguments (configure it with environment variables; see --help), got ${argv.join(" ")}\n`);
    return 1;
  }
  // Lines are written in batches, at most LOG_FLUSH_MS after the first of them, and
  // at once on stop or exit: under load a write per request, and even one per
  // event-loop turn, was a measurable share of a request's cost (bench/http.ts).
  let pending: string[] = [];
  const flushLog = () => {
    if (pending.length === 0) return;
    const lines = pending;
    pending = [];
    io.stdout(`${lines.join("\n")}\n`);
  };
  const log = (line: string) => {
    if (pending.push(line) === 1) setTimeout(flushLog, LOG_FLUSH_MS);
  };
  process.on("exit", flushLog);
  let service: RunningService;
  try {
    service = await startService(parseConfig(io.env), log);
  } catch (e) {
    process.off("exit", flushLog);
    flushLog();
    io.stderr(`mam serve: ${e instanceof Error ? e.message : String(e)}\n`);
    return isMamError(e) ? EXIT_CODES[e.code] : 1;
  }
  io.stderr(`mam serving on ${service.url}\n`);
  io.stderr(`  MQTT broker: ${service.mqttUrl} (subscribe to mam/events or mam/jobs/<job_id>/events)\n`);
  io.stderr(`  operator token: in ${service.credentialsPath} (operator_token)\n`);
  await new Promise<void>((resolveStop) => {
    const onSignal = (sig: string) => {
      io.stderr(`mam serve: ${sig}, stopping\n`);
      service.stop().then(resolveStop, resolveStop);
    };
    process.once("SIGINT", () => onSignal("SIGINT"));
    process.once("SIGTERM", () => onSignal("SIGTERM"));
  });
  process.off("exit", flushLog);
  flushLog();
  io.stderr("mam serve: stopped; nothing owed was lost (owed notifications stay in the store for the next sweep)\n");
  return 0;
}
