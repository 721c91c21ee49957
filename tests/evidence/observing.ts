/**
 * What the evidence tests share: a job ready for the gate on one seed backend with the
 * test clock, and a watcher's or an agent's observation of its latest dispatch,
 * recorded through core's `recordObservation` as the API records it.
 */
import { type Deps, type ObservedState, type Observer, parseFlags, recordObservation } from "@mam/core";
import type { SeedBackend } from "../seed/harness.ts";
import { type ReadyJob, readyJob } from "../seed/scenario.ts";
import { TestClock } from "../support/clock.ts";

export const WATCHER: Observer = { kind: "watcher", name: "herdr-1" };
export const SESSION = "6b1f0c1e-8a55-4d0e-9d3f-2a7c9e51b0aa";

/** A job on `b`, ready for the gate (claimed, opted in, dispatched, its report finalized), with auto-completion on and a test clock. */
export async function readyOn(b: SeedBackend, env: Record<string, string> = {}) {
  const clock = new TestClock("2026-11-20T10:10:00.000Z");
  const deps = b.deps(parseFlags({ MAM_AUTO_COMPLETE: "1", ...env }), { clock });
  return { b, deps, clock, job: await readyJob(deps, {}) };
}

/** `state`, seen now of `job`'s latest dispatch by `observer` (a watcher's pane status by default). */
export function see(deps: Deps, job: ReadyJob, state: ObservedState, observer: Observer = WATCHER, sourceKind = "pane_status") {
  return recordObservation(
    deps,
    job.jobId,
    {
      state,
      source_kind: sourceKind,
      attempt_id: job.attemptId,
      agent_session_uuid: SESSION,
      ...(observer.kind === "watcher" ? { pane_process_generation: 3, pane_id: "%12" } : {}),
      observed_at: deps.clock.now().toISOString(),
    },
    observer,
  );
}

/** `deps` whose store runs `first` (a real write, by another writer) just before each call of `method`. */
export function before(deps: Deps, method: keyof Deps["jobs"], first: () => Promise<void>): Deps {
  return {
    ...deps,
    jobs: new Proxy(deps.jobs, {
      get(target, prop) {
        const value = Reflect.get(target, prop, target);
        if (prop !== method || typeof value !== "function") return typeof value === "function" ? value.bind(target) : value;
        return async (...args: unknown[]) => {
          await first();
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    }),
  };
}
