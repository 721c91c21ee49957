/**
 * One racer: a worker thread with its own connection to the job store (its own
 * SQLite connection on the shared WAL file, or its own DynamoDB client to the shared
 * endpoint). For each trial it is armed with a job id, blocks on the shared "go"
 * word, then makes the same transition as the 31 others, from the same seq, through
 * core's engine — and reports what happened to it.
 *
 * The entry points (racer-sqlite.ts, racer-dynamodb.ts) differ only in the store
 * they open; races.test.ts bundles each with esbuild before starting the workers
 * (see there why). The test never imports these files itself.
 */
import { parentPort, workerData } from "node:worker_threads";
import { isMamError, type JobStore, OPERATOR, parseFlags, randomIds, systemClock, TransitionConflict, transitionJob } from "@mam/core";
import type { FromWorker, RaceTarget, RaceWorkerData, ToWorker } from "./protocol.ts";

export interface RacerStore {
  readonly jobs: JobStore;
  close(): Promise<void>;
}

export function runRacer(open: (target: RaceTarget) => RacerStore): void {
  const data = workerData as RaceWorkerData;
  const port = parentPort;
  if (port === null) throw new Error("a racer runs as a worker thread");
  const post = (message: FromWorker): void => port.postMessage(message);
  const go = new Int32Array(data.go);
  const store = open(data.target);
  const deps = { jobs: store.jobs, clock: systemClock, ids: randomIds, flags: parseFlags({}) };
  const wallClock = (): number => performance.timeOrigin + performance.now();

  /** Block this thread until the test releases `trial` (the shared word reaches it). */
  const waitForGo = (trial: number): void => {
    for (;;) {
      const released = Atomics.load(go, 0);
      if (released >= trial) return;
      Atomics.wait(go, 0, released, 30_000);
    }
  };

  const race = async (trial: number, jobId: string): Promise<void> => {
    post({ type: "armed", worker: data.worker, trial });
    waitForGo(trial);
    const startedAt = wallClock();
    try {
      const record = await transitionJob(deps, jobId, { action: "completed", expectedSeq: 1 }, OPERATOR);
      const result = { committed: true as const, seq: record.transition_seq, intentId: record.pending_notification?.id };
      post({ type: "outcome", worker: data.worker, trial, startedAt, settledAt: wallClock(), result });
    } catch (e) {
      const settledAt = wallClock();
      const code = isMamError(e) ? e.code : e instanceof Error ? `${e.name} (not a MamError)` : String(e);
      const currentSeq = e instanceof TransitionConflict ? e.current.transition_seq : undefined;
      const message = e instanceof Error ? e.message : String(e);
      post({ type: "outcome", worker: data.worker, trial, startedAt, settledAt, result: { committed: false, code, currentSeq, message } });
    }
  };

  port.on("message", (message: ToWorker) => {
    if (message.type === "close") {
      store.close().finally(() => port.close());
      return;
    }
    race(message.trial, message.jobId).catch((e: unknown) => post({ type: "fatal", worker: data.worker, message: String(e) }));
  });

  // A warm-up read opens the connection (an HTTP keep-alive socket to the DynamoDB peer), so
  // the first trial races over the same kind of connection as the last.
  store.jobs.get("warm-up").then(
    () => post({ type: "ready", worker: data.worker }),
    (e: unknown) => post({ type: "fatal", worker: data.worker, message: String(e) }),
  );
}
