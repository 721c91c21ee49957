import { timingSafeEqual } from "node:crypto";
import { createServer, type Server } from "node:http";
import { createAdaptorServer } from "@hono/node-server";
import { appOptionsOf, createApp, createTokenService, SCOPES, StreamSlots, type TokenService, verifySubscriberLogin } from "@mam/api";
import {
  type Clock,
  type Config,
  type Deps,
  flushRecord,
  isMamError,
  type JobRecord,
  jsonLogger,
  logEvent,
  MamError,
  type Publisher,
  parseConfig,
  randomIds,
  recoverNotifications,
  systemClock,
} from "@mam/core";
import {
  changeRelay,
  connectionCap,
  DEFAULT_DRAIN_TIMEOUT_MS,
  dataDirPaths,
  type EmbeddedBroker,
  JobFlushQueue,
  listenOn,
  MqttPublisher,
  migrateDataDir,
  openDataDir,
  secureDataDir,
  softOpenFileLimit,
  startEmbeddedBroker,
} from "@mam/local";
import { ensureCredentials } from "./credentials.ts";
import { EXIT_CODES } from "./exit-codes.ts";
import type { CliIo } from "./io.ts";

/** The longest a request's log line waits in memory before it is written. */
const LOG_FLUSH_MS = 10;

/** MAM_OPERATOR_TOKEN, when set, is accepted as an operator token with every scope. */
function withStaticOperator(tokens: TokenService, staticToken: string | undefined): TokenService {
  if (staticToken === undefined) return tokens;
  const expected = Buffer.from(staticToken);
  return {
    ...tokens,
    verify(token) {
      const given = Buffer.from(token);
      if (given.length === expected.length && timingSafeEqual(given, expected)) {
        return { kind: "operator", tokenId: "MAM_OPERATOR_TOKEN", scopes: SCOPES };
      }
      return tokens.verify(token);
    },
  };
}

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

/** What an in-process embedding may swap; each has the real default. */
export interface ServiceOverrides {
  /** The clock of the stores, the intents and the sweep's grace (tests: tests/support/clock.ts). */
  readonly clock?: Clock;
}

/**
 * The composition root of `mam serve`: the API over SQLite and files under the
 * data dir, an embedded MQTT broker (or MAM_MQTT_URL), the change relay that
 * publishes each committed intent right after its commit, and a sweep timer for
 * whatever the relay missed.
 */
export async function startService(
  config: Config,
  log: (line: string) => void = (l) => process.stdout.write(`${l}\n`),
  overrides: ServiceOverrides = {},
): Promise<RunningService> {
  const logger = jsonLogger(log);
  const clock = overrides.clock ?? systemClock;
  const paths = dataDirPaths(config.dataDir);
  // 0700 before anything is kept in it (refused when it cannot be), and whatever an
  // older version left readable by others tightened: prompts and reports are private.
  const { tightened, walked } = secureDataDir(paths.root);
  if (tightened > 0) logger.info("data dir made private", { tightened, walked });
  // The job database at this code's schema version before anything listens: a newer
  // one is refused here (store.version, exit 1), an older one upgraded step by step.
  const migrated = migrateDataDir(paths.root);
  if (migrated.applied.length > 0) {
    logger.info("job database upgraded", { from: migrated.from, to: migrated.to, steps: migrated.applied });
  }
  const { credentials } = await ensureCredentials(paths.root);

  // The service's publisher. On the embedded broker it publishes in the broker's own
  // process: a publish resolves once aedes has queued the message for every
  // persistent session and delivered it to every connected one (aedes acknowledges
  // a QoS 1 publish on the wire before either). The data dir's MQTT login remains
  // for the `mam` command's connections, and MAM_MQTT_CLIENT_ID stays reserved. On
  // an external broker (MAM_MQTT_URL; parseConfig requires MAM_MQTT_USERNAME and
  // MAM_MQTT_PASSWORD with it) it publishes over MQTT as MAM_MQTT_CLIENT_ID at
  // QoS 2, whose PUBCOMP comes only once that broker took the message.
  const tokens = withStaticOperator(
    createTokenService({
      signingKey: config.tokenSigningKey ?? credentials.signing_key,
      clock: systemClock,
      agentTtlSeconds: config.agentTokenTtlSeconds,
    }),
    config.operatorToken,
  );
  let broker: EmbeddedBroker | undefined;
  let publisher: Publisher;
  let mqttUrl: string;
  if (config.mqttUrl === undefined) {
    broker = await startEmbeddedBroker({
      port: config.mqttPort,
      portSetting: "MAM_MQTT_PORT",
      host: "127.0.0.1",
      publisherCredentials: credentials.mqtt,
      serviceClientId: config.mqttClientId,
      maxPacketBytes: config.mqttMaxPacketBytes,
      // Persistent sessions (`clean: false`) and their QoS 1 queues outlive a restart.
      sessionsDir: paths.broker,
      sessionOwnersFile: paths.brokerOwners,
      // A subscriber logs in with an operator token as its password, verified as the API verifies it.
      verifySubscriber: (token) => verifySubscriberLogin(tokens, token),
      maxSessionsPerName: config.mqttSessions.maxPerName,
      maxSessions: config.mqttSessions.max,
      maxQueuedBytesPerSession: config.mqttSessions.maxQueuedBytes,
      maxInflightInbound: config.mqttSessions.maxInflightInbound,
      // Writes never wait for a subscriber to read; one that falls this far behind is dropped.
      maxOutgoingBytes: config.mqttSessions.maxOutgoingBytes,
      onConnectRefused: (clientId, code, reason) =>
        logger.info("mqtt connect refused", { client_id: clientId, connack: code, detail: reason }),
      // A subscriber that stops reading is dropped well before a publish would time out.
      drainTimeoutMs: Math.min(DEFAULT_DRAIN_TIMEOUT_MS, Math.floor(config.publishTimeoutMs / 2)),
      onError: (error) => logger.warn("mqtt broker error", { detail: error.message }),
      onSessionQueueFull: (clientId) =>
        logger.warn("mqtt session queue full", {
          client_id: clientId,
          detail: "new messages are not queued for it until it reconnects and drains; it can catch up from the feed",
        }),
    });
    publisher = broker.publisher({ timeoutMs: config.publishTimeoutMs });
    mqttUrl = broker.url;
  } else {
    if (config.mqttUsername === undefined || config.mqttPassword === undefined) {
      throw new MamError("config.invalid", "MAM_MQTT_USERNAME and MAM_MQTT_PASSWORD are required with MAM_MQTT_URL");
    }
    mqttUrl = config.mqttUrl;
    publisher = new MqttPublisher({
      url: mqttUrl,
      clientId: config.mqttClientId,
      username: config.mqttUsername,
      password: config.mqttPassword,
      publishTimeoutMs: config.publishTimeoutMs,
      onConnectionChange: (connected) =>
        connected ? logger.info("mqtt connected") : logger.warn("mqtt disconnected", { detail: "reconnecting" }),
    });
  }
  const store = openDataDir(paths.root, { allowAbsolute: false });
  const queue = new JobFlushQueue();
  const relayLog = (jobId: string, outcome: string, detail?: string) =>
    logger.log(outcome === "failed" ? "warn" : "info", "relay", { job_id: jobId, outcome, ...(detail ? { detail } : {}) });
  // The relay's deps publish through the same stores; its own settles are bookkeeping and owe nothing.
  //
  // Each flush sends the newest record this process committed for its job, as the
  // commit returned it (no read): a job's flushes run one at a time, and when several
  // commits of a job queued up behind one, the first flush to run sends the newest
  // and the rest find nothing left to send (the older intents were superseded).
  // An intent committed meanwhile by another process (the `mam` command) stays owed
  // for the sweep: the settle is conditional on the exact intent sent.
  //
  //   commit a1 ─ commit a2 ─┐   flush: takes a2, sends it, settles a2   flush: nothing left
  let deps: Deps;
  const newest = new Map<string, JobRecord>();
  const jobs = store.jobs;
  jobs.onCommitted(
    changeRelay((record) => {
      newest.set(record.job_id, record);
      queue.push(record.job_id, async () => {
        const owed = newest.get(record.job_id);
        if (owed === undefined) return;
        newest.delete(record.job_id);
        try {
          const r = await flushRecord(deps, owed);
          relayLog(record.job_id, r.outcome, r.outcome === "failed" ? r.error.message : undefined);
        } catch (e) {
          relayLog(record.job_id, "failed", e instanceof Error ? e.message : String(e));
        }
      });
    }),
  );
  deps = { jobs, reports: store.reports, disk: store.disk, publisher, clock, ids: randomIds, flags: config.flags };

  // Open feed streams wake on this process's commits (the relay sees each one) and end
  // at once when the service stops; another process's commits are found by their poll.
  const shutdown = new AbortController();
  const slots = new StreamSlots();
  const app = createApp({
    deps,
    tokens,
    ...appOptionsOf(config),
    log,
    // One publish path per process: the relay publishes every commit, so a request
    // that commits does not publish too (it answers without `published`).
    publishInline: false,
    feed: { ...config.feedStreams, slots, onCommitted: (listener) => jobs.onCommitted(() => listener()), shutdown: shutdown.signal },
  });

  const sweep = async (graceMs: number) => {
    try {
      const r = await recoverNotifications(deps, {
        policy: config.sweep,
        graceMs,
        budgetMs: config.sweepBudgetSeconds * 1000,
        log: (entry) => logEvent(logger, entry),
      });
      if (r.owed > 0) {
        const counts = { owed: r.owed, sent: r.sent, failed: r.failed, quarantined: r.quarantined, not_tried: r.not_tried };
        logger.info("sweep", counts);
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
    await queue.drain();
    await sweeping;
    await publisher.close?.();
    await broker?.close();
    store.close();
  };
  // Node's own bounds on a connection: a socket that sends no complete request head
  // within headersTimeout (checked every connectionsCheckingInterval) is closed with
  // 408, one idle between requests after keepAliveTimeout; a request body slower than
  // requestTimeout is cut. Past maxConnections a new connection is closed as it is
  // accepted, so a flood of sockets never takes the descriptors a report write needs.
  const server = createAdaptorServer({
    fetch: app.fetch,
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
  let apiPort: number;
  try {
    apiPort = (await listenOn(server, { port: config.port, host: config.host, setting: "MAM_PORT" })).port;
  } catch (e) {
    await closeBehindApi();
    throw e;
  }
  const url = `http://${config.host}:${apiPort}`;

  let stopping: Promise<void> | undefined;
  return {
    url,
    mqttUrl,
    credentialsPath: paths.credentials,
    operatorToken: config.operatorToken ?? credentials.operator_token,
    deps,
    openStreams: () => slots.open,
    maxConnections,
    relayed: () => queue.idle(),
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
