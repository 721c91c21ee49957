import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, type ChangeRow, fetchWithToken, type JobRecord, ok, retryWaitMs, STATUSES, type Status } from "./api.ts";
import { DryRuns, type Session } from "./session.ts";
import { isDue, Marks, marksOf, Section, StatusBadge, Time, useTick } from "./ui.tsx";

/** The store's listings for the jobs that need a person, and what each is called on screen. */
const ATTENTION = [
  { key: "stale", query: { stale: "true" }, label: "stale" },
  { key: "overdue", query: { overdue: "true" }, label: "overdue" },
  { key: "quarantined", query: { owed: "quarantined" }, label: "notification quarantined" },
  { key: "due", query: { candidate: "due" }, label: "evaluation due" },
] as const;
type AttentionKey = (typeof ATTENTION)[number]["key"];

const PAGE = 50;
/** Records to read again after feed rows: gathered for this long, then read once each. */
const REFRESH_GATHER_MS = 250;
/** A job's record is read again for evidence rows at most this often. */
const EVIDENCE_READ_GAP_MS = 5_000;
/** The counts are read again at most this often. */
const COUNTS_GAP_MS = 2_000;

interface Counts {
  readonly counts: Record<Status, number>;
  readonly consistency: "exact" | "eventual";
}

/** Whether a record belongs in a listing filtered by status and mark. */
function matches(job: JobRecord, status: Status | "", mark: AttentionKey | "", now: number): boolean {
  if (status !== "" && job.status !== status) return false;
  switch (mark) {
    case "":
      return true;
    case "stale":
      return job.stale_since !== undefined;
    case "overdue":
      return job.overdue_since !== undefined;
    case "quarantined":
      return job.pending_notification?.quarantined_at !== undefined;
    case "due":
      return isDue(job, now);
    default:
      return mark satisfies never;
  }
}

const needsAPerson = (job: JobRecord, now: number) => marksOf(job, now).some((m) => m.tone !== "info" || m.label === "evaluation due");

export function ListView({
  session,
  statusFilter,
  markFilter,
}: {
  session: Session;
  statusFilter: Status | "";
  markFilter: AttentionKey | "";
}) {
  const { api } = session;
  const [order, setOrder] = useState<string[]>([]);
  const [jobs, setJobs] = useState<ReadonlyMap<string, JobRecord>>(new Map());
  const [attention, setAttention] = useState<ReadonlyMap<string, JobRecord>>(new Map());
  const [next, setNext] = useState<string | undefined>(undefined);
  const [counts, setCounts] = useState<Counts | undefined | null>(undefined);
  const [agent, setAgent] = useState("");
  const [loading, setLoading] = useState(true);
  const [error, setError] = useState<string | undefined>(undefined);
  useTick(15_000);

  const query = useMemo(() => {
    if (markFilter !== "") return ATTENTION.find((a) => a.key === markFilter)?.query ?? {};
    return statusFilter === "" ? {} : { status: statusFilter };
  }, [statusFilter, markFilter]);

  const loadCounts = useCallback(async () => {
    try {
      const r = await fetchWithToken(session.token, "v1/job-counts");
      setCounts((await r.json()) as Counts);
    } catch (e) {
      // A service without counts (404) shows none; anything else (a 429, a restart) is said,
      // and the counts last read stay: the service does count, it did not answer this time.
      if (e instanceof ApiError && e.status === 404) setCounts(null);
      else session.say(`Counts: ${e instanceof Error ? e.message : String(e)}`);
    }
  }, [session]);

  const loadAttention = useCallback(async () => {
    const found = new Map<string, JobRecord>();
    const pages = await Promise.all(
      ATTENTION.map((a) => ok(api.GET("/v1/jobs", { params: { query: { ...a.query, limit: PAGE } } })).catch(() => undefined)),
    );
    for (const page of pages) for (const job of page?.items ?? []) found.set(job.job_id, job);
    // The service's word on what is due (its clock), whatever this browser's clock says.
    const dueIndex = ATTENTION.findIndex((a) => a.key === "due");
    serverDue.current = new Map((pages[dueIndex]?.items ?? []).map((j) => [j.job_id, j.candidate_at ?? ""]));
    setAttention(found);
  }, [api]);
  /** Due candidates by the service's own listing (`candidate=due`), with the mark it read: still due while the record carries that mark. */
  const serverDue = useRef<ReadonlyMap<string, string>>(new Map());

  /** Records the live updates read while the first page was being read (see below). */
  const readDuringLoad = useRef<Map<string, JobRecord> | undefined>(undefined);

  // The first page of the listing, the counts and the attention listings, whenever the filter changes.
  useEffect(() => {
    let gone = false;
    setLoading(true);
    setError(undefined);
    const during = new Map<string, JobRecord>();
    readDuringLoad.current = during;
    (async () => {
      try {
        const page = await ok(api.GET("/v1/jobs", { params: { query: { ...query, limit: PAGE } } }));
        if (gone) return;
        // A job that moved (or registered) while the page was being read may be missing from
        // it, or older there: the record the live update read wins, placed as it belongs.
        const at = Date.now();
        const listed = new Map(page.items.map((j) => [j.job_id, j]));
        const newer = [...during.values()].filter((r) => {
          const l = listed.get(r.job_id);
          return l === undefined || l.updated_at < r.updated_at;
        });
        for (const r of newer) {
          if (matches(r, statusFilter, markFilter, at)) listed.set(r.job_id, r);
          else listed.delete(r.job_id);
        }
        const first = newer
          .filter((r) => listed.get(r.job_id) === r)
          .sort((a, b) => b.updated_at.localeCompare(a.updated_at))
          .map((r) => r.job_id);
        setOrder([...first, ...page.items.map((j) => j.job_id).filter((id) => listed.has(id) && !first.includes(id))]);
        setJobs(listed);
        setNext(page.next_cursor ?? undefined);
      } catch (e) {
        if (!gone) setError(e instanceof Error ? e.message : String(e));
      } finally {
        if (readDuringLoad.current === during) readDuringLoad.current = undefined;
        if (!gone) setLoading(false);
      }
    })();
    void loadCounts();
    void loadAttention();
    return () => {
      gone = true;
    };
  }, [api, query, loadCounts, loadAttention]);

  // Live: a feed row names a job; its record is read again and put where it now
  // belongs (a job whose update time moved goes first, as the listing orders it; one
  // that no longer matches the filter leaves). Reads are gathered (250 ms) and each job
  // is read at most once every 5 s for evidence rows (observations, reports,
  // notifications), at once for a registration or a transition: twenty busy agents
  // cost a read token a few requests a second, well under its rate. Counts follow
  // status changes, at most every 2 s.
  const latest = useRef({ statusFilter, markFilter });
  latest.current = { statusFilter, markFilter };
  const jobsNow = useRef(jobs);
  jobsNow.current = jobs;
  useEffect(() => {
    const waiting = new Map<string, number>();
    const lastRead = new Map<string, number>();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let countsDue = false;
    let lastCounts = 0;
    let stopped = false;
    const schedule = () => {
      if (timer !== undefined || stopped) return;
      const next = Math.min(...waiting.values(), countsDue ? lastCounts + COUNTS_GAP_MS : Number.POSITIVE_INFINITY);
      if (next === Number.POSITIVE_INFINITY) return;
      timer = setTimeout(flush, Math.max(REFRESH_GATHER_MS, next - Date.now()));
    };
    const flush = async () => {
      timer = undefined;
      const now = Date.now();
      const ids = [...waiting].filter(([, due]) => due <= now).map(([id]) => id);
      for (const id of ids) {
        waiting.delete(id);
        lastRead.set(id, now);
      }
      if (countsDue && now - lastCounts >= COUNTS_GAP_MS) {
        countsDue = false;
        lastCounts = now;
        void loadCounts();
      }
      schedule();
      if (ids.length === 0) return;
      // A read refused for now (429, a restart, a 5xx) is tried again after the service's
      // Retry-After (else 2 s), never dropped: the row that moved the job may be its last.
      const again = (id: string, e: unknown) => {
        const wait = retryWaitMs(e);
        if (wait === undefined) return;
        waiting.set(id, Math.min(waiting.get(id) ?? Number.POSITIVE_INFINITY, Date.now() + wait));
        schedule();
      };
      const fresh = (
        await Promise.all(
          ids.map((id) =>
            ok(api.GET("/v1/jobs/{job_id}", { params: { path: { job_id: id } } })).catch((e: unknown) => {
              again(id, e);
              return undefined;
            }),
          ),
        )
      ).filter((r): r is JobRecord => r !== undefined);
      if (stopped) return;
      for (const r of fresh) readDuringLoad.current?.set(r.job_id, r);
      const at = Date.now();
      const { statusFilter: s, markFilter: m } = latest.current;
      const before = jobsNow.current;
      const moved = fresh
        .filter((r) => matches(r, s, m, at) && before.get(r.job_id)?.updated_at !== r.updated_at)
        .sort((a, b) => b.updated_at.localeCompare(a.updated_at))
        .map((r) => r.job_id);
      const leaving = new Set(fresh.filter((r) => !matches(r, s, m, at)).map((r) => r.job_id));
      setJobs((old) => {
        const copy = new Map(old);
        for (const r of fresh) if (copy.has(r.job_id) || matches(r, s, m, at)) copy.set(r.job_id, r);
        return copy;
      });
      setOrder((old) => [...moved, ...old.filter((id) => !leaving.has(id) && !moved.includes(id))]);
      setAttention((old) => {
        const copy = new Map(old);
        for (const r of fresh) {
          if (needsAPerson(r, at)) copy.set(r.job_id, r);
          else copy.delete(r.job_id);
        }
        return copy;
      });
    };
    const off = session.feed.onRow((row: ChangeRow) => {
      const now = Date.now();
      const changesStatus = row.kind === "job.registered" || row.kind === "job.transitioned";
      if (changesStatus) countsDue = true;
      const due = changesStatus ? now : Math.max(now, (lastRead.get(row.job_id) ?? 0) + EVIDENCE_READ_GAP_MS);
      waiting.set(row.job_id, Math.min(waiting.get(row.job_id) ?? Number.POSITIVE_INFINITY, due));
      if (timer !== undefined && changesStatus) {
        clearTimeout(timer);
        timer = undefined;
      }
      schedule();
    });
    return () => {
      stopped = true;
      off();
      if (timer !== undefined) clearTimeout(timer);
    };
  }, [api, session, loadCounts]);

  const more = async () => {
    if (next === undefined) return;
    try {
      const page = await ok(api.GET("/v1/jobs", { params: { query: { ...query, limit: PAGE, cursor: next } } }));
      // A job already shown (it moved up since the first page was read) is not shown twice.
      setJobs((old) => {
        const copy = new Map(old);
        for (const j of page.items) if (!copy.has(j.job_id)) copy.set(j.job_id, j);
        return copy;
      });
      setOrder((old) => [...old, ...page.items.map((j) => j.job_id).filter((id) => !old.includes(id))]);
      setNext(page.next_cursor ?? undefined);
    } catch (e) {
      session.say(`Older jobs: ${e instanceof Error ? e.message : String(e)}`);
    }
  };

  const now = Date.now();
  // The attention listings, and any loaded job that needs a person by now: an evaluation
  // falls due with no write (so no feed row), and a held candidate stays unwritten.
  const candidates = new Map(attention);
  for (const j of jobs.values()) {
    const known = candidates.get(j.job_id);
    if (known === undefined || known.updated_at < j.updated_at) candidates.set(j.job_id, j);
  }
  const needy = [...candidates.values()].filter(
    (j) =>
      needsAPerson(j, now) ||
      (j.status === "running" && j.candidate_at !== undefined && serverDue.current.get(j.job_id) === j.candidate_at),
  );
  const shown = order
    .map((id) => jobs.get(id))
    .filter((j): j is JobRecord => j !== undefined)
    .filter((j) => agent === "" || j.agent.toLowerCase().includes(agent.toLowerCase()));
  const setHash = (s: Status | "", m: AttentionKey | "") => {
    const params = new URLSearchParams();
    if (s !== "") params.set("status", s);
    if (m !== "") params.set("mark", m);
    location.hash = `#/${params.size > 0 ? `?${params}` : ""}`;
  };

  return (
    <>
      <Section title="Jobs by status" id="counts-title">
        {counts === null ? (
          <p class="muted">This service does not count jobs by status.</p>
        ) : (
          <ul class="counts" aria-describedby="counts-note">
            {STATUSES.map((s) => (
              <li key={s}>
                <a href={`#/?status=${s}`} aria-current={statusFilter === s && markFilter === "" ? "true" : undefined} class="count">
                  <StatusBadge status={s} /> <strong data-count={s}>{counts?.counts[s] ?? "…"}</strong>
                </a>
              </li>
            ))}
          </ul>
        )}
        {counts?.consistency === "eventual" ? (
          <p id="counts-note" class="muted">
            Counts on AWS are kept by the feed writer: eventually consistent, a few seconds behind the jobs.
          </p>
        ) : null}
      </Section>

      <Section title="Needs a person" id="attention-title">
        {needy.length === 0 ? (
          <p class="muted" id="attention-empty">
            Nothing stale, overdue, quarantined or due.
          </p>
        ) : (
          <ul class="attention" aria-labelledby="attention-title">
            {needy.map((j) => (
              <li key={j.job_id}>
                <a href={`#/jobs/${encodeURIComponent(j.job_id)}`}>{j.job_id}</a> <StatusBadge status={j.status} /> <Marks job={j} />
                <DueReason session={session} job={j} />
              </li>
            ))}
          </ul>
        )}
      </Section>

      <Section title="Jobs" id="jobs-title">
        <form class="filters" onSubmit={(e) => e.preventDefault()}>
          <label>
            Status{" "}
            <select value={statusFilter} onChange={(e) => setHash(e.currentTarget.value as Status | "", "")} disabled={markFilter !== ""}>
              <option value="">all</option>
              {STATUSES.map((s) => (
                <option key={s} value={s}>
                  {s}
                </option>
              ))}
            </select>
          </label>
          <label>
            Needing attention{" "}
            <select value={markFilter} onChange={(e) => setHash("", e.currentTarget.value as AttentionKey | "")}>
              <option value="">any job</option>
              {ATTENTION.map((a) => (
                <option key={a.key} value={a.key}>
                  {a.label}
                </option>
              ))}
            </select>
          </label>
          <label>
            Agent (in the loaded pages){" "}
            <input type="search" value={agent} onInput={(e) => setAgent(e.currentTarget.value)} placeholder="e.g. claude-code" />
          </label>
        </form>
        {error !== undefined ? (
          <p class="error" role="alert">
            {error}
          </p>
        ) : null}
        <div class="table-wrap">
          <table aria-labelledby="jobs-title" aria-busy={loading ? "true" : "false"}>
            <thead>
              <tr>
                <th scope="col">Job</th>
                <th scope="col">Agent</th>
                <th scope="col">Status</th>
                <th scope="col">Needs</th>
                <th scope="col">Updated</th>
                <th scope="col">Seq</th>
              </tr>
            </thead>
            <tbody id="job-rows">
              {shown.map((j) => (
                <tr key={j.job_id} data-job={j.job_id}>
                  <td data-label="Job">
                    <a href={`#/jobs/${encodeURIComponent(j.job_id)}`}>{j.job_id}</a>
                  </td>
                  <td data-label="Agent">{j.agent}</td>
                  <td data-label="Status">
                    <StatusBadge status={j.status} />
                  </td>
                  <td data-label="Needs">
                    <Marks job={j} />
                  </td>
                  <td data-label="Updated">
                    <Time iso={j.updated_at} past />
                  </td>
                  <td data-label="Seq">{j.transition_seq}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
        {!loading && shown.length === 0 ? <p class="muted">No jobs here.</p> : null}
        {next !== undefined ? (
          <button type="button" onClick={more}>
            Load older jobs
          </button>
        ) : null}
      </Section>
    </>
  );
}

/** For a due candidate: the gate's dry-run answer (kept, see DryRuns). */
function DueReason({ session, job }: { session: Session; job: JobRecord }) {
  const due = isDue(job);
  const [reason, setReason] = useState<string | undefined>(undefined);
  const key = DryRuns.keyOf(job);
  useEffect(() => {
    if (!due) return;
    let gone = false;
    session.dryRuns
      .get(job)
      .then((a) => !gone && setReason(`${a.would_commit ? "would complete" : "held"}: ${a.reason}`))
      .catch(() => undefined);
    return () => {
      gone = true;
    };
  }, [key, due]);
  return due && reason !== undefined ? <span class="why">now: {reason}</span> : null;
}
