import type { Api, JobRecord, TokenInfo } from "./api.ts";
import { type GateDryRun, ok } from "./api.ts";
import type { LiveFeed } from "./feed.ts";

/** What every view of a signed-in page shares. */
export interface Session {
  readonly api: Api;
  readonly token: string;
  readonly info: TokenInfo;
  readonly feed: LiveFeed;
  readonly dryRuns: DryRuns;
  /** Says something to the person (the page's one live region). */
  readonly say: (text: string) => void;
}

/** The longest a dry run's answer is shown before it is asked again. */
export const DRY_RUN_MAX_AGE_MS = 10_000;
/** At most one dry run of a job this often, however often its record moves. */
const DRY_RUN_MIN_GAP_MS = 2_000;

/**
 * The gate's dry runs, made only for the jobs on screen and the due candidates, and
 * kept by (job, evidence_seq, transition_seq): a record that has not moved is not
 * asked again for 10 s, or until its candidate mark falls due if that is sooner (the
 * answer may change then without any write). A record that moves is asked again, but
 * at most once every 2 s per job, never once per update.
 */
export class DryRuns {
  readonly #api: Api;
  readonly #kept = new Map<string, { key: string; answer: GateDryRun; until: number }>();
  readonly #asking = new Map<string, Promise<GateDryRun>>();
  readonly #lastAsked = new Map<string, number>();
  /** How many dry runs this page asked for (the browser test reads it). */
  asked = 0;

  constructor(api: Api) {
    this.#api = api;
  }

  static keyOf(job: JobRecord): string {
    return `${job.job_id}|${job.evidence_seq}|${job.transition_seq}`;
  }

  /** The kept answer for this record, if still good. */
  peek(job: JobRecord, now = Date.now()): GateDryRun | undefined {
    const kept = this.#kept.get(job.job_id);
    return kept !== undefined && kept.key === DryRuns.keyOf(job) && now < kept.until ? kept.answer : undefined;
  }

  /** The answer for this record: the kept one, or one asked now (or soon, if the job was asked about within 2 s). */
  async get(job: JobRecord): Promise<GateDryRun> {
    const kept = this.peek(job);
    if (kept !== undefined) return kept;
    const asking = this.#asking.get(job.job_id);
    if (asking !== undefined) return asking;
    const ask = (async () => {
      const gap = (this.#lastAsked.get(job.job_id) ?? 0) + DRY_RUN_MIN_GAP_MS - Date.now();
      if (gap > 0) await new Promise((r) => setTimeout(r, gap));
      this.#lastAsked.set(job.job_id, Date.now());
      this.asked += 1;
      const answer = await ok(this.#api.GET("/v1/jobs/{job_id}/gate", { params: { path: { job_id: job.job_id } } }));
      const due = job.candidate_at === undefined ? Number.POSITIVE_INFINITY : Date.parse(job.candidate_at);
      const now = Date.now();
      this.#kept.set(job.job_id, {
        key: DryRuns.keyOf(job),
        answer,
        until: Math.min(now + DRY_RUN_MAX_AGE_MS, due > now ? due : Number.POSITIVE_INFINITY),
      });
      return answer;
    })();
    this.#asking.set(job.job_id, ask);
    try {
      return await ask;
    } finally {
      this.#asking.delete(job.job_id);
    }
  }
}
