/**
 * What the race test and its workers say to each other. Shared by `races.test.ts`
 * and `race-worker.ts` (which is bundled on its own, so this file imports nothing).
 *
 *   test                              worker (x32)
 *   ---- arm {trial, jobId} -------->  (ready) ---- armed --->
 *   (all 32 armed) Atomics.store(go, trial) + notify
 *                                      Atomics.wait wakes -> transitionJob(...)
 *   <--------------------------------- outcome {trial, ...}
 */

/** Where the worker's own connection (or client) points. */
export type RaceTarget =
  | { readonly backend: "sqlite"; readonly dbFile: string }
  | { readonly backend: "dynamodb"; readonly endpoint: string; readonly tableName: string };

export interface RaceWorkerData {
  readonly worker: number;
  readonly target: RaceTarget;
  /** Int32Array over it: slot 0 is the last trial released ("go"). */
  readonly go: SharedArrayBuffer;
}

export type ToWorker = { readonly type: "arm"; readonly trial: number; readonly jobId: string } | { readonly type: "close" };

export type FromWorker =
  | { readonly type: "ready"; readonly worker: number }
  | { readonly type: "armed"; readonly worker: number; readonly trial: number }
  | {
      readonly type: "outcome";
      readonly worker: number;
      readonly trial: number;
      /** Wall-clock ms (performance.timeOrigin + now) when the call was made and when it settled. */
      readonly startedAt: number;
      readonly settledAt: number;
      readonly result:
        | { readonly committed: true; readonly seq: number; readonly intentId: string | undefined }
        | { readonly committed: false; readonly code: string; readonly currentSeq: number | undefined; readonly message: string };
    }
  | { readonly type: "fatal"; readonly worker: number; readonly message: string };
