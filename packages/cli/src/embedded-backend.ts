import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import {
  type Config,
  completedAlready,
  type Deps,
  finalizeReport,
  MamError,
  OPERATOR,
  publishAgentEvent,
  REPORT_NAME,
  randomIds,
  STAGED_REPORT_NAME,
  systemClock,
  verifyManifest,
} from "@mam/core";
import { brokerOf, dataDirPaths, FileReportStore, MqttPublisher, openDataDir, readCredentials } from "@mam/local";
import type { Backend, PublishEventAnswer, VerificationAnswer } from "./backend.ts";

export interface EmbeddedOptions {
  readonly config: Config;
  /** The data dir the caller named (or ./.mam where mam serve made it); undefined when none was. */
  readonly dataDir: string | undefined;
  /** `--mqtt-url`: the broker to publish to, instead of the service's. */
  readonly mqttUrl: string | undefined;
}

/**
 * Embedded mode: core's services over the stores themselves. `publish-event` works
 * on a data dir's store (as the original system did: whoever can write the data dir
 * is trusted as an operator) and publishes to its broker itself; `finalize` and
 * `verify` work on the agent's own report tree and read no data dir. A data dir is
 * opened only when one was named and already holds a store: the CLI never creates
 * one (that is `mam serve`'s).
 */
export function embeddedBackend(opts: EmbeddedOptions): Backend {
  // The feed's store, opened on the first read and kept for the next (`mam events --follow`).
  let feed: ReturnType<typeof openDataDir> | undefined;
  return {
    mode: "embedded",

    async publishEvent(jobId, input) {
      const deps = await openStore(opts);
      try {
        const r = await publishAgentEvent(
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
          { inline: true },
        ).catch(async (refusal: unknown) => {
          // The same rule as the API's. Here the caller is the data dir's operator, not
          // an agent holding its token, so it never holds: a re-send stays refused.
          const dir = input.finalize?.reportDir;
          const shown = dir === undefined ? ({ stored: "report" } as const) : { bytes: localReport(dir) };
          const record = input.event === "completed" ? await completedAlready(deps, jobId, refusal, OPERATOR, shown) : undefined;
          if (record === undefined) throw refusal;
          return { alreadyCompleted: record } as const;
        });
        if ("alreadyCompleted" in r) return { already_completed: true as const, record: onTheWire(r.alreadyCompleted) };
        // The same answer the API builds for POST /v1/jobs/{job_id}/events.
        // This command is the one publish path of its process (no relay here): inline.
        const flush = r.flush;
        const answer: PublishEventAnswer = {
          record: onTheWire(r.record),
          ...(flush === undefined ? {} : { published: flush.outcome !== "failed" }),
          ...(r.finalized === undefined
            ? {}
            : { finalized: { manifest: onTheWire(r.finalized.manifest), manifest_sha256: r.finalized.manifestSha256 } }),
          ...(flush?.outcome === "failed" ? { publish_error: { code: flush.error.code, message: flush.error.message } } : {}),
          ...(r.warnings.length > 0 ? { warnings: [...r.warnings] } : {}),
        };
        return answer;
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
      return { manifest: onTheWire(f.manifest), manifest_sha256: f.manifestSha256 };
    },

    async verify(jobId, input) {
      if (input.reportDir === undefined) throw new MamError("input.invalid", "--report-dir is required in embedded mode");
      const v = await verifyManifest(new FileReportStore(input.reportDir), {
        location: input.reportDir,
        jobId,
        attemptId: input.attemptId,
        expectedArtifacts: input.expectedArtifacts,
      });
      // The same answer the API builds for GET .../verification (no pinned copy here: that is the service's).
      const answer: VerificationAnswer = {
        ok: v.ok,
        reason: v.reason,
        manifest: v.manifest === undefined ? null : onTheWire(v.manifest),
        ...(v.ok ? { manifest_sha256: v.manifestSha256 } : {}),
      };
      return answer;
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
    jobs: store.jobs,
    reports: store.reports,
    disk: store.disk,
    publisher,
    clock: systemClock,
    ids: randomIds,
    flags: config.flags,
    async close() {
      await publisher.close();
      store.close();
    },
  };
}

/** `resolve`d data dir the caller named, or ./.mam (MAM_DATA_DIR's default) when mam serve already made it there. */
export function namedDataDir(
  flag: string | undefined,
  env: Readonly<Record<string, string | undefined>>,
  config: Config,
): string | undefined {
  if (flag !== undefined) return resolve(flag);
  if (env.MAM_DATA_DIR !== undefined && env.MAM_DATA_DIR !== "") return resolve(config.dataDir);
  const dflt = dataDirPaths(config.dataDir);
  return existsSync(dflt.database) || existsSync(dflt.credentials) ? dflt.root : undefined;
}
