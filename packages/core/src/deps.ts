import type { Flags } from "./config.ts";
import type { MetricsSink } from "./metrics.ts";
import type { Clock, DiskSpace, Ids, JobStore, Publisher, ReportStore } from "./ports.ts";

/**
 * Everything core's services need, passed in by each composition root (the
 * Lambda handlers, `mam serve`, the CLI, tests). No module reaches for a global.
 */
export interface Deps {
  readonly jobs: JobStore;
  readonly reports: ReportStore;
  readonly publisher: Publisher;
  readonly clock: Clock;
  readonly ids: Ids;
  readonly flags: Flags;
  /**
   * The free space under the stores, for the disk floor (`flags.diskFloorBytes`) that
   * agents' writes must leave; absent (AWS: DynamoDB and S3 have no disk to starve),
   * no floor is kept.
   */
  readonly disk?: DiskSpace;
  /** What core counts (gate answers, transitions, owed intents); absent: nothing is counted. */
  readonly metrics?: MetricsSink;
}

export { type Actor, OPERATOR } from "./actor.ts";

/**
 * The deps of a use case that needs only some roles of the job store (`jobs`) and
 * some other ports: `Using<Pick<JobRecords, "get">, "clock">`. Each use case names
 * what it touches; every composition root passes the whole `Deps`.
 */
export type Using<Jobs, Others extends Exclude<keyof Deps, "jobs"> = never> = { readonly jobs: Jobs } & Pick<Deps, Others>;
