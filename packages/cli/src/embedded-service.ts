import { timingSafeEqual } from "node:crypto";
import { createTokenService, SCOPES, type TokenService, verifySubscriberLogin } from "@mam/api";
import { type Clock, type Config, type Deps, flushRecord, type JobRecord, type Logger, type Publisher, systemClock } from "@mam/core";
import {
  brokerOf,
  type Credentials,
  changeRelay,
  DEFAULT_DRAIN_TIMEOUT_MS,
  dataDirDeps,
  dataDirPaths,
  type EmbeddedBroker,
  JobFlushQueue,
  MqttPublisher,
  migrateDataDir,
  openDataDir,
  secureDataDir,
  startEmbeddedBroker,
} from "@mam/local";
import { ensureCredentials } from "./credentials.ts";

/** What an embedding may swap; each has the real default (`defaultServiceDeps`). */
export interface ServiceDeps {
  /** The clock of the stores, the intents and the sweep's grace (tests: tests/support/clock.ts). */
  readonly clock: Clock;
}

export const defaultServiceDeps: ServiceDeps = { clock: systemClock };

/**
 * The embedded service's parts, composed once from the configuration: the data dir
 * (private, at this code's schema version), its credentials, the token service, the
 * publisher (`servicePublisher`), and the stores behind the change relay that
 * publishes each commit right after it. `mam serve` puts the API in front of it.
 */
export interface EmbeddedService {
  /** Core's ports as the routes use them (the job store behind the change relay). */
  readonly deps: Deps;
  readonly tokens: TokenService;
  readonly credentials: Credentials;
  readonly credentialsPath: string;
  /** The broker the service publishes to. */
  readonly mqttUrl: string;
  /** Told after every commit this process makes (the relay is one listener; the feed's open streams are others). */
  onCommitted(listener: () => void): () => void;
  /** Resolves once the relay has handled every commit it saw so far. */
  relayed(): Promise<void>;
  /** Drain the relay, close the publisher, the broker and the store. */
  close(): Promise<void>;
}

export async function composeEmbeddedService(
  config: Config,
  logger: Logger,
  deps: ServiceDeps = defaultServiceDeps,
): Promise<EmbeddedService> {
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
  const tokens = withStaticOperator(
    createTokenService({
      signingKey: config.tokenSigningKey ?? credentials.signing_key,
      clock: systemClock,
      agentTtlSeconds: config.agentTokenTtlSeconds,
    }),
    config.operatorToken,
  );
  // The store before the broker: a data dir refused here leaves nothing listening (a
  // broker left up would keep the refused process from exiting).
  const store = openDataDir(paths.root, { allowAbsolute: false });
  let published: Awaited<ReturnType<typeof servicePublisher>>;
  try {
    published = await servicePublisher(config, credentials, tokens, paths.broker, paths.brokerOwners, logger);
  } catch (e) {
    store.close();
    throw e;
  }
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
  const newest = new Map<string, JobRecord>();
  const jobs = store.jobs;
  const ports = dataDirDeps(store, published.publisher, config.flags, deps.clock);
  jobs.onCommitted(
    changeRelay((record) => {
      newest.set(record.job_id, record);
      queue.push(record.job_id, async () => {
        const owed = newest.get(record.job_id);
        if (owed === undefined) return;
        newest.delete(record.job_id);
        try {
          const r = await flushRecord(ports, owed);
          relayLog(record.job_id, r.outcome, r.outcome === "failed" ? r.error.message : undefined);
        } catch (e) {
          relayLog(record.job_id, "failed", e instanceof Error ? e.message : String(e));
        }
      });
    }),
  );
  return {
    deps: ports,
    tokens,
    credentials,
    credentialsPath: paths.credentials,
    mqttUrl: published.url,
    onCommitted: (listener) => jobs.onCommitted(() => listener()),
    relayed: () => queue.idle(),
    async close() {
      await queue.drain();
      await published.close();
      store.close();
    },
  };
}

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

/**
 * The service's publisher, on the broker `brokerOf` chose. On the embedded broker it
 * publishes in the broker's own process: a publish resolves once aedes has queued
 * the message for every persistent session and delivered it to every connected one
 * (aedes acknowledges a QoS 1 publish on the wire before either). The data dir's
 * MQTT login remains for the `mam` command's connections, and MAM_MQTT_CLIENT_ID
 * stays reserved. On an external broker it publishes over MQTT as
 * MAM_MQTT_CLIENT_ID at QoS 2, whose PUBCOMP comes only once that broker took the message.
 */
async function servicePublisher(
  config: Config,
  credentials: Credentials,
  tokens: TokenService,
  sessionsDir: string,
  sessionOwnersFile: string,
  logger: Logger,
): Promise<{ publisher: Publisher; url: string; close(): Promise<void> }> {
  const broker = brokerOf(config, credentials.mqtt);
  if (broker.kind !== "embedded") {
    const publisher = new MqttPublisher({
      url: broker.url,
      clientId: config.mqttClientId,
      ...broker.login,
      publishTimeoutMs: config.publishTimeoutMs,
      onConnectionChange: (connected) =>
        connected ? logger.info("mqtt connected") : logger.warn("mqtt disconnected", { detail: "reconnecting" }),
    });
    return { publisher, url: broker.url, close: () => publisher.close() };
  }
  const embedded: EmbeddedBroker = await startEmbeddedBroker({
    port: broker.port,
    portSetting: "MAM_MQTT_PORT",
    host: "127.0.0.1",
    publisherCredentials: credentials.mqtt,
    serviceClientId: config.mqttClientId,
    maxPacketBytes: config.mqttMaxPacketBytes,
    // Persistent sessions (`clean: false`) and their QoS 1 queues outlive a restart.
    sessionsDir,
    sessionOwnersFile,
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
  const publisher = embedded.publisher({ timeoutMs: config.publishTimeoutMs });
  return {
    publisher,
    url: embedded.url,
    async close() {
      await publisher.close?.();
      await embedded.close();
    },
  };
}
