import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import {
  answerPublishEvent,
  answerVerification,
  type Config,
  type Deps,
  finalizedAnswer,
  finalizeReport,
  MamError,
  OPERATOR,
  REPORT_NAME,
  recordDispatch,
  STAGED_REPORT_NAME,
  systemClock,
  verificationAnswer,
  verifyManifest,
} from "@mam/core";
import { brokerOf, dataDirDeps, dataDirPaths, FileReportStore, MqttPublisher, openDataDir, readCredentials } from "@mam/local";
import type { Backend, VerificationAnswer } from "./backend.ts";

export interface EmbeddedOptions {
  readonly config: Config;
  /** The data dir the caller named (or ./.mam where mam serve made it); undefined when none was. */
  readonly dataDir: string | undefined;
  /** `--mqtt-url`: the broker to publish to, instead of the service's. */
  readonly mqttUrl: string | undefined;
}

/**
 * Embedded mode: core's services over the stores themselves, answered by the same
 * functions of core's that the API's routes answer with. `publish-event` works on a
 * data dir's store (as the original system did: whoever can write the data dir is
 * trusted as an operator) and publishes to its broker itself; `verify` reads the
 * store's copy of the attempt (and the pinned one) as the service does; `finalize`
 * works on the agent's own report tree and reads no data dir. A data dir is opened
 * only when one was named and already holds a store: the CLI never creates one
 * (that is `mam serve`'s).
 */
export function embeddedBackend(opts: EmbeddedOptions): Backend {
  // The feed's store, opened on the first read and kept for the next (`mam events --follow`).
  let feed: ReturnType<typeof openDataDir> | undefined;
  return {
    mode: "embedded",

    async publishEvent(jobId, input) {
      const deps = await openStore(opts);
      try {
        const dir = input.finalize?.reportDir;
        // This command is the one publish path of its process (no relay here): inline.
        // The caller is the data dir's operator, not an agent holding its token, so a
        // re-sent completion is never answered as done here: it stays refused.
        const answer = await answerPublishEvent(
          deps,
          jobId,
          {
            event: input.event,
            attemptId: input.attemptId,
            ...(input.finalize === undefined
              ? {}
              : {
                  finalize: {
                    location: input.finalize.reportDir,
                    attemptId: input.finalize.attemptId,
                    sideEffects: input.finalize.sideEffects,
                  },
                }),
          },
          OPERATOR,
          { inline: true, resent: dir === undefined ? { stored: "report" } : { bytes: localReport(dir) } },
        );
        return onTheWire(answer);
      } finally {
        await deps.close();
      }
    },

    async dispatch(jobId, request) {
      const deps = await openStore(opts);
      try {
        const { createTokenService } = await import("@mam/api");
        const signingKey = opts.config.tokenSigningKey ?? (await readCredentials(existingStore(opts).root))?.signing_key;
        if (signingKey === undefined) {
          throw new MamError(
            "input.invalid",
            "no signing key for the agent's token: run mam serve once on this data dir, or set MAM_TOKEN_SIGNING_KEY",
          );
        }
        const dispatch = await recordDispatch(deps, jobId, request, OPERATOR);
        const minted = createTokenService({ signingKey, clock: systemClock, agentTtlSeconds: opts.config.agentTokenTtlSeconds }).mintAgent(
          jobId,
          dispatch.attempt_id,
        );
        return onTheWire({ dispatch, agent_token: minted.token, expires_at: minted.expiresAt });
      } finally {
        await deps.close();
      }
    },

    async finalize(jobId, input) {
      const f = await finalizeReport(new FileReportStore(input.reportDir), systemClock, {
        location: input.reportDir,
        jobId,
        attemptId: input.attemptId,
        sideEffects: input.sideEffects,
      });
      return onTheWire(finalizedAnswer(f));
    },

    async verify(jobId, input) {
      // The store as the service opens it (relative locations only), read: the service's own verification.
      const store = openDataDir(existingStore(opts).root, { allowAbsolute: false });
      try {
        return onTheWire(await answerVerification(store, jobId, input.attemptId, input.expectedArtifacts));
      } finally {
        store.close();
      }
    },

    async listChanges(query) {
      feed ??= openDataDir(existingStore(opts).root);
      const page = await feed.jobs.listChanges({ limit: query.limit, ...(query.after === undefined ? {} : { after: query.after }) });
      return onTheWire({ items: [...page.items], cursor: page.cursor });
    },

    async close() {
      feed?.close();
      feed = undefined;
    },
  };
}

/**
 * `mam verify --report-dir`: a report tree verified where it lies (the agent's own, as
 * the original system did), reading no data dir and calling no service. There is no
 * job record here: no completion to compare with, no pinned copy, and only the
 * artifacts asked about.
 */
export async function verifyReportDir(
  jobId: string,
  input: { readonly reportDir: string; readonly attemptId: number | undefined; readonly expectedArtifacts: readonly string[] },
): Promise<VerificationAnswer> {
  const v = await verifyManifest(new FileReportStore(input.reportDir), {
    location: input.reportDir,
    jobId,
    attemptId: input.attemptId,
    expectedArtifacts: input.expectedArtifacts,
  });
  return onTheWire(verificationAnswer(v));
}

/** The agent's report where it lies (the staged `.tmp`, else `report-final.md`), read only if it is asked for. */
async function* localReport(dir: string): AsyncGenerator<Uint8Array> {
  const staged = join(dir, STAGED_REPORT_NAME);
  yield await readFile(existsSync(staged) ? staged : join(dir, REPORT_NAME));
}

/** The data dir named, when it holds a store; refused, creating nothing, otherwise. */
function existingStore(opts: EmbeddedOptions): ReturnType<typeof dataDirPaths> {
  if (opts.dataDir === undefined) {
    throw new MamError(
      "input.invalid",
      "no data dir: give --data-dir DIR (or MAM_DATA_DIR) to work on a store directly, or --api URL (or MAM_API_URL) to call the service",
    );
  }
  const paths = dataDirPaths(opts.dataDir);
  if (!existsSync(paths.database)) {
    throw new MamError(
      "input.invalid",
      `${paths.root} holds no mam store (no mam.db); the CLI never creates one: mam serve does (MAM_DATA_DIR=${paths.root} npm start)`,
    );
  }
  return paths;
}

/** A value as JSON carries it: a key whose value is `undefined` is not there. */
type Wire<T> = T extends readonly (infer U)[]
  ? Wire<U>[]
  : T extends object
    ? { -readonly [K in keyof T]: Wire<Exclude<T[K], undefined>> }
    : T;

/**
 * Core's value as the API sends it (JSON drops `undefined`), typed so that the
 * compiler checks core's shape against the wire type the answer is built as.
 */
function onTheWire<T>(value: T): Wire<T> {
  return JSON.parse(JSON.stringify(value)) as Wire<T>;
}

/** The data dir's stores and the broker the service publishes to; refused, creating nothing, when there is no store. */
async function openStore(opts: EmbeddedOptions): Promise<Deps & { close(): Promise<void> }> {
  const { config } = opts;
  const paths = existingStore(opts);
  const creds = await readCredentials(paths.root);
  // Never the service's client id: a second connection with it would close the service's own.
  const broker = brokerOf(config, creds?.mqtt, opts.mqttUrl);
  const store = openDataDir(paths.root);
  const publisher = new MqttPublisher({ url: broker.url, publishTimeoutMs: config.publishTimeoutMs, ...broker.login });
  return {
    ...dataDirDeps(store, publisher, config.flags),
    async close() {
      await publisher.close();
      store.close();
    },
  };
}
