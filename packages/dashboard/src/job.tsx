import { useEffect, useRef, useState } from "preact/hooks";
import {
  type ChangeRow,
  can,
  fetchWithToken,
  type GateDryRun,
  type JobRecord,
  ok,
  retryWaitMs,
  type Schemas,
  type Verification,
} from "./api.ts";
import { bytes, dataText, localTime, shortHash } from "./format.ts";
import { DRY_RUN_MAX_AGE_MS, DryRuns, type Session } from "./session.ts";
import { ConfirmAction, Marks, Section, StatusBadge, Time, useTick } from "./ui.tsx";

type Dispatch = Schemas["DispatchRecord"];

/** Rows beyond this many are shown folded: runs of one kind become one line. */
const COMPACT_OVER = 40;

/** A feed row's identity across listings (a job's listing and the all-jobs stream hand out different cursors on DynamoDB). */
const rowKey = (r: ChangeRow) =>
  `${r.at}|${r.kind}|${r.intent_id ?? ""}|${JSON.stringify(r.data ?? {})}|${r.actor.token_id ?? r.actor.type}`;

/** What a notification row says happened to its intent. */
const INTENT_STATE: Partial<Record<ChangeRow["kind"], string>> = {
  "intent.published": "delivered",
  "intent.failed": "failed (to be retried)",
  "intent.superseded": "superseded",
  "intent.quarantined": "quarantined",
  "intent.released": "released",
};

export function JobView({ session, jobId }: { session: Session; jobId: string }) {
  const { api } = session;
  const [job, setJob] = useState<JobRecord | undefined>(undefined);
  const [rows, setRows] = useState<ChangeRow[]>([]);
  const [missing, setMissing] = useState<string | undefined>(undefined);
  const [dryRun, setDryRun] = useState<GateDryRun | undefined>(undefined);
  const [dryRunError, setDryRunError] = useState<string | undefined>(undefined);
  const [dispatches, setDispatches] = useState<ReadonlyMap<number, Dispatch>>(new Map());
  const heading = useRef<HTMLHeadingElement>(null);
  useTick(15_000);

  const shown = useRef(false);
  const retry = useRef<ReturnType<typeof setTimeout> | undefined>(undefined);
  useEffect(() => () => clearTimeout(retry.current), []);
  const readJob = async () => {
    try {
      setJob(await ok(api.GET("/v1/jobs/{job_id}", { params: { path: { job_id: jobId } } })));
      shown.current = true;
    } catch (e) {
      const why = e instanceof Error ? e.message : String(e);
      // Once the job is on screen, a read that fails (a 429, a restart) is said, the page
      // stays, and the read is tried again after the service's Retry-After (else 2 s): the
      // row that moved the job may be its last. Only a job never read is replaced by the error.
      if (!shown.current) {
        setMissing(why);
        return;
      }
      session.say(`${jobId} could not be read again: ${why}`);
      const wait = retryWaitMs(e);
      if (wait === undefined) return;
      clearTimeout(retry.current);
      retry.current = setTimeout(() => void readJob(), wait);
    }
  };

  // The record and every row of the job's feed (paged), once; then live rows.
  useEffect(() => {
    let gone = false;
    setJob(undefined);
    setRows([]);
    setMissing(undefined);
    setDryRun(undefined);
    const seen = new Set<string>();
    const add = (more: readonly ChangeRow[]) => {
      const fresh = more.filter((r) => !seen.has(rowKey(r)));
      for (const r of fresh) seen.add(rowKey(r));
      // Oldest first: a live row that came while the history was being read goes after it
      // (a stable sort by time keeps the feed's order among rows of one instant).
      if (fresh.length > 0 && !gone) setRows((old) => [...old, ...fresh].sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0)));
    };
    let timer: ReturnType<typeof setTimeout> | undefined;
    const off = session.feed.onRow((row) => {
      if (row.job_id !== jobId) return;
      add([row]);
      timer ??= setTimeout(() => {
        timer = undefined;
        if (!gone) void readJob();
      }, 250);
    });
    void readJob();
    (async () => {
      let after: string | undefined;
      for (let pages = 0; pages < 50 && !gone; pages += 1) {
        const page = await ok(
          api.GET("/v1/events", { params: { query: { job_id: jobId, limit: 1000, ...(after === undefined ? {} : { after }) } } }),
        ).catch(() => undefined);
        if (page === undefined) return;
        add(page.items);
        after = page.cursor;
        if (page.items.length < 1000) return;
      }
    })();
    heading.current?.focus();
    return () => {
      gone = true;
      off();
      if (timer !== undefined) clearTimeout(timer);
    };
  }, [jobId]);

  // The dry run "now", for a job that is not terminal: kept by its sequences (DryRuns).
  const key = job === undefined ? "" : DryRuns.keyOf(job);
  useEffect(() => {
    if (job === undefined || !(job.status === "running" || job.status === "pending")) return;
    let gone = false;
    const ask = () =>
      session.dryRuns
        .get(job)
        .then((a) => {
          if (gone) return;
          setDryRun(a);
          setDryRunError(undefined);
        })
        .catch((e) => !gone && setDryRunError(e instanceof Error ? e.message : String(e)));
    void ask();
    // the kept answer lasts at most DRY_RUN_MAX_AGE_MS while the job is on screen
    const again = setInterval(ask, DRY_RUN_MAX_AGE_MS);
    return () => {
      gone = true;
      clearInterval(again);
    };
  }, [key]);

  // Each attempt's dispatch, once.
  const latestAttempt = job?.latest_attempt ?? 0;
  useEffect(() => {
    for (let n = 1; n <= latestAttempt; n += 1) {
      if (dispatches.has(n)) continue;
      ok(api.GET("/v1/jobs/{job_id}/dispatches/{attempt}", { params: { path: { job_id: jobId, attempt: String(n) } } }))
        .then((d) => setDispatches((old) => new Map(old).set(n, d)))
        .catch(() => undefined);
    }
  }, [latestAttempt, jobId]);

  if (missing !== undefined)
    return (
      <section>
        <h2 tabIndex={-1} ref={heading}>
          {jobId}
        </h2>
        <p class="error" role="alert">
          {missing}
        </p>
        <a href="#/">Back to the jobs</a>
      </section>
    );
  if (job === undefined)
    return (
      <h2 tabIndex={-1} ref={heading} aria-busy="true">
        {jobId}
      </h2>
    );

  return (
    <article aria-labelledby="job-title">
      <p>
        <a href="#/">← All jobs</a>
      </p>
      <h2 id="job-title" tabIndex={-1} ref={heading}>
        {job.job_id} <StatusBadge status={job.status} />
      </h2>
      <Marks job={job} />
      <WhyNot job={job} dryRun={dryRun} error={dryRunError} />
      <Actions session={session} job={job} onDone={readJob} />
      <Record job={job} />
      <Attempts session={session} job={job} dispatches={dispatches} rows={rows} />
      <Notifications job={job} rows={rows} />
      <Timeline rows={rows} />
      <EventLog session={session} job={job} rows={rows} />
    </article>
  );
}

/** Why the job is not completing, first: the gate's dry run now, or how the job ended. */
function WhyNot({ job, dryRun, error }: { job: JobRecord; dryRun: GateDryRun | undefined; error: string | undefined }) {
  let body: preact.ComponentChildren;
  if (job.status === "completed") {
    const ev = job.completed_evidence;
    body = (
      <p>
        Completed {job.completed_by === "auto_complete" ? "by the gate, on evidence" : "by an explicit report"}{" "}
        <Time iso={job.updated_at} past />
        {ev !== undefined
          ? `: attempt ${ev.attempt_id}, report ${shortHash(ev.report_sha256)}, manifest ${shortHash(ev.manifest_sha256)}${ev.rule === undefined ? "" : `, rule ${ev.rule}`}${
              ev.quiescence === "agent-attested" ? " (quiescence agent-attested: only the agent's own sources said it stopped)" : ""
            }`
          : "."}
      </p>
    );
  } else if (job.status === "error" || job.status === "cancelled") {
    body = (
      <p>
        Ended {job.status} <Time iso={job.updated_at} past />. A terminal job takes no further change; retrying registers a new job.
      </p>
    );
  } else if (error !== undefined) {
    body = (
      <p class="error" role="alert">
        The gate's dry run could not be read: {error}
      </p>
    );
  } else if (dryRun === undefined) {
    body = <p aria-busy="true">Asking the gate…</p>;
  } else {
    body = (
      <>
        <p class={dryRun.would_commit ? "verdict ok" : "verdict held"} id="why-reason">
          <span class="now">now</span> {dryRun.would_commit ? "Would complete: " : "Not completing: "}
          {dryRun.reason}
        </p>
        <p class="muted">
          The gate's dry run at <Time iso={dryRun.evaluated_at} past /> (it writes nothing; a hold is never in the feed, so this is the
          current one).
        </p>
        {dryRun.scenario !== undefined ? (
          <details>
            <summary>The scenario it built</summary>
            <pre class="json">{JSON.stringify(dryRun.scenario, null, 2)}</pre>
          </details>
        ) : null}
      </>
    );
  }
  const problems: string[] = [];
  if (job.pending_notification?.last_error !== undefined)
    problems.push(`Last notification failure: ${job.pending_notification.last_error.code}: ${job.pending_notification.last_error.message}`);
  if (job.observations?.overflow !== undefined)
    problems.push(`Evidence overflowed: ${job.observations.overflow.source} passed its ${job.observations.overflow.bound} bound`);
  if (job.observations?.ended !== undefined)
    problems.push(`The agent's session ended (${job.observations.ended.cause}): record a new dispatch to go on`);
  return (
    <Section title={job.status === "pending" || job.status === "running" ? "Why it is not completing" : "How it ended"} id="why-title">
      {body}
      {problems.map((p) => (
        <p key={p} class="error">
          {p}
        </p>
      ))}
    </Section>
  );
}

/** The operator's actions the token's scopes allow, each confirmed first. */
function Actions({ session, job, onDone }: { session: Session; job: JobRecord; onDone: () => Promise<void> }) {
  const { api, info } = session;
  const live = job.status === "pending" || job.status === "running";
  const owed = job.pending_notification;
  const path = { params: { path: { job_id: job.job_id } } };
  const [answer, setAnswer] = useState<string | undefined>(undefined);
  // An answer belongs to the job it was given for.
  useEffect(() => setAnswer(undefined), [job.job_id]);
  // Focus goes to the answer: the button it came from may be gone (a cancelled job offers no cancel),
  // and a keyboard user would otherwise start again from the top of the page.
  const answerRef = useRef<HTMLParagraphElement>(null);
  useEffect(() => {
    if (answer !== undefined) answerRef.current?.focus();
  }, [answer]);
  const actions: preact.ComponentChildren[] = [];
  if (can(info, "write") && live)
    actions.push(
      <ConfirmAction
        onAnswer={setAnswer}
        key="cancel"
        label="Cancel job"
        danger
        question={`Cancel ${job.job_id}? It ends as cancelled and takes no further change.`}
        run={async () => {
          const r = await ok(
            api.POST("/v1/jobs/{job_id}/transitions", { ...path, body: { action: "cancel", expected_seq: job.transition_seq } }),
          );
          await onDone();
          return `Cancelled: the job is now ${r.status} (transition ${r.transition_seq}).`;
        }}
      />,
    );
  if (can(info, "gate") && job.status === "running")
    actions.push(
      <ConfirmAction
        onAnswer={setAnswer}
        key="evaluate"
        label="Re-evaluate"
        question={`Ask the gate to evaluate ${job.job_id} now on what mam recorded? It completes the job only if every check passes.`}
        run={async () => {
          const r = await ok(api.POST("/v1/jobs/{job_id}/evaluations", { ...path, body: {} }));
          await onDone();
          return r.committed ? `Completed: ${r.reason}` : `Held: ${r.reason}`;
        }}
      />,
    );
  if (can(info, "ops") && owed !== undefined)
    actions.push(
      <ConfirmAction
        onAnswer={setAnswer}
        key="send"
        label="Send notification now"
        question={`Send ${job.job_id}'s owed "${owed.event}" notification (intent ${owed.id}) now?`}
        run={async () => {
          const r = await ok(api.POST("/v1/jobs/{job_id}/notification-sends", path));
          await onDone();
          if (r.outcome === "sent")
            return `Sent intent ${r.intent_id}${r.settled ? " and settled it" : "; it stays owed (a newer intent took its place)"}.`;
          if (r.outcome === "failed") return `The send failed: ${r.error?.message ?? "unknown"}; the intent stays owed.`;
          return "Nothing was owed any more.";
        }}
      />,
    );
  if (can(info, "ops") && owed?.quarantined_at !== undefined)
    actions.push(
      <ConfirmAction
        onAnswer={setAnswer}
        key="release"
        label="Release from quarantine"
        question={`Release intent ${owed.id} from quarantine, so the next sweep tries it again?`}
        run={async () => {
          const r = await ok(api.POST("/v1/jobs/{job_id}/notification-release", { ...path, body: { intent_id: owed.id } }));
          await onDone();
          return r.reason;
        }}
      />,
    );
  if (actions.length === 0 && answer === undefined) return null;
  return (
    <Section title="Actions" id="actions-title">
      <div class="row actions">{actions}</div>
      <p class="answer" id="action-answer" role="status" tabIndex={-1} ref={answerRef}>
        {answer}
      </p>
    </Section>
  );
}

function Record({ job }: { job: JobRecord }) {
  const fields: [string, preact.ComponentChildren][] = [
    ["Prompt", <pre class="prompt">{job.prompt}</pre>],
    ["Agent", job.agent],
    ["Role", job.role],
    ["Auto-complete", job.auto_complete ? "on" : "off"],
    ["Iteration", job.iteration],
    ["Transition seq", job.transition_seq],
    ["Evidence seq", job.evidence_seq],
    ["Created", <Time iso={job.created_at} past />],
    ["Updated", <Time iso={job.updated_at} past />],
  ];
  if (job.activity_at !== undefined) fields.push(["Last activity", <Time iso={job.activity_at} past />]);
  if (job.deadline_at !== undefined) fields.push(["Deadline", <Time iso={job.deadline_at} />]);
  if (job.candidate_at !== undefined) fields.push(["Evaluation due", <Time iso={job.candidate_at} />]);
  if (job.expected_artifacts.length > 0) fields.push(["Expected artifacts", job.expected_artifacts.join(", ")]);
  if (job.progress !== undefined) fields.push(["Progress", <pre class="json">{JSON.stringify(job.progress, null, 2)}</pre>]);
  return (
    <Section title="Record" id="record-title">
      <dl class="record">
        {fields.map(([k, v]) => (
          <div key={k}>
            <dt>{k}</dt>
            <dd>{v}</dd>
          </div>
        ))}
      </dl>
    </Section>
  );
}

/** Each attempt: its dispatch, its observations (from the record), its report and whether it verifies. */
function Attempts(props: { session: Session; job: JobRecord; dispatches: ReadonlyMap<number, Dispatch>; rows: readonly ChangeRow[] }) {
  const { job } = props;
  const n = job.latest_attempt ?? 0;
  if (n === 0)
    return (
      <Section title="Attempts" id="attempts-title">
        <p class="muted">No dispatch recorded yet.</p>
      </Section>
    );
  const attempts = Array.from({ length: n }, (_, i) => n - i);
  return (
    <Section title="Attempts" id="attempts-title">
      {attempts.map((a) => (
        <Attempt key={a} {...props} attempt={a} />
      ))}
    </Section>
  );
}

function Attempt({
  session,
  job,
  dispatches,
  rows,
  attempt,
}: {
  session: Session;
  job: JobRecord;
  dispatches: ReadonlyMap<number, Dispatch>;
  rows: readonly ChangeRow[];
  attempt: number;
}) {
  const d = dispatches.get(attempt);
  const reportRows = rows.filter((r) => (r.kind === "report.staged" || r.kind === "report.finalized") && r.data?.attempt_id === attempt);
  const finalized = job.finalized_report?.attempt_id === attempt ? job.finalized_report : undefined;
  const staged = [...reportRows].reverse().find((r) => r.kind === "report.staged");
  const observations = job.observations?.attempt_id === attempt ? job.observations.entries : [];
  const pinned = job.completed_evidence?.attempt_id === attempt ? job.completed_evidence : undefined;
  const [verification, setVerification] = useState<Verification | undefined>(undefined);
  const [text, setText] = useState<string | undefined>(undefined);
  const [textNote, setTextNote] = useState<string | undefined>(undefined);
  const has = finalized !== undefined || staged !== undefined;
  const fingerprint = `${finalized?.manifest_sha256 ?? ""}|${job.status}`;
  useEffect(() => {
    if (finalized === undefined) return;
    ok(
      session.api.GET("/v1/jobs/{job_id}/attempts/{attempt}/verification", {
        params: { path: { job_id: job.job_id, attempt: String(attempt) } },
      }),
    )
      .then(setVerification)
      .catch((e) => setVerification({ ok: false, reason: e instanceof Error ? e.message : String(e), manifest: null }));
  }, [fingerprint]);
  const read = async () => {
    try {
      const r = await fetchWithToken(session.token, `v1/jobs/${encodeURIComponent(job.job_id)}/attempts/${attempt}/report`);
      setText(await r.text());
      const which = r.headers.get("x-mam-report");
      setTextNote(which === null ? undefined : `The ${which} report, as text:`);
    } catch (e) {
      setText(undefined);
      setTextNote(`The report could not be read: ${e instanceof Error ? e.message : String(e)}`);
    }
  };
  return (
    <section class="attempt" aria-labelledby={`attempt-${attempt}`}>
      <h3 id={`attempt-${attempt}`}>
        Attempt {attempt}
        {attempt === job.latest_attempt ? " (latest)" : ""}
      </h3>
      {d !== undefined ? (
        <p>
          Dispatched <Time iso={d.recorded_at} past /> · session <code>{d.agent_session_uuid}</code> · generation{" "}
          {d.pane_process_generation}
          {d.pane_id !== undefined ? ` · pane ${d.pane_id}` : ""}
          {d.deadline_at !== undefined ? (
            <>
              {" "}
              · deadline <Time iso={d.deadline_at} />
            </>
          ) : null}
        </p>
      ) : null}
      {observations.length > 0 ? (
        <ul class="observations" aria-label={`Observations of attempt ${attempt}`}>
          {observations.map((o) => (
            <li key={o.seq}>
              <span class={`state state-${o.state}`}>{o.state}</span> {o.source} ({o.source_kind}
              {o.hook !== undefined ? ` ${o.hook.event}` : ""}) <Time iso={o.received_at} past />
              {o.sightings > 1 ? (
                <>
                  {" "}
                  · seen {o.sightings} times, last <Time iso={o.last_seen_received_at} past />
                </>
              ) : null}
            </li>
          ))}
        </ul>
      ) : null}
      {has ? (
        <div class="report">
          <p>
            Report:{" "}
            {finalized !== undefined
              ? `finalized ${localTime(finalized.finalized_at)}, sha256 ${shortHash(finalized.report_sha256)}`
              : `staged, not finalized (sha256 ${shortHash(String(staged?.data?.sha256 ?? ""))})`}
            {staged?.data?.bytes !== undefined ? `, ${bytes(Number(staged.data.bytes))}` : ""}
          </p>
          {verification !== undefined ? (
            <p class={verification.ok ? "ok" : "error"}>
              {verification.ok ? "Verifies" : "Does not verify"}: {verification.reason}
              {verification.pinned !== undefined
                ? ` · pinned copy ${verification.pinned.ok ? "verifies" : "does not verify"}: ${verification.pinned.reason}`
                : ""}
            </p>
          ) : null}
          {pinned !== undefined ? (
            <p class="muted">
              The completion pinned report {shortHash(pinned.report_sha256)} and manifest {shortHash(pinned.manifest_sha256)}.
            </p>
          ) : null}
          <button type="button" onClick={read}>
            Read the report
          </button>
          {textNote !== undefined ? <p class="muted">{textNote}</p> : null}
          {text !== undefined ? (
            <section class="report-text" aria-label={`Report of attempt ${attempt}`}>
              <pre>{text}</pre>
            </section>
          ) : null}
        </div>
      ) : (
        <p class="muted">No report yet.</p>
      )}
    </section>
  );
}

/** The owed intent (from the record) and what happened to every earlier one (from the feed). */
function Notifications({ job, rows }: { job: JobRecord; rows: readonly ChangeRow[] }) {
  const owed = job.pending_notification;
  const settled = rows.filter((r) => INTENT_STATE[r.kind] !== undefined);
  return (
    <Section title="Notifications" id="notifications-title">
      {owed !== undefined ? (
        <p class={owed.quarantined_at !== undefined ? "error" : undefined} id="owed">
          {owed.quarantined_at !== undefined ? "Quarantined" : "Owed"}: "{owed.event}" intent <code>{owed.id}</code> (seq {owed.seq}), since{" "}
          <Time iso={owed.created_at} past />
          {owed.failures !== undefined ? `, ${owed.failures} failed tries` : ""}
          {owed.retry_at !== undefined ? (
            <>
              , next try <Time iso={owed.retry_at} />
            </>
          ) : null}
        </p>
      ) : (
        <p class="muted">Nothing owed.</p>
      )}
      {settled.length > 0 ? (
        <ul class="intents">
          {settled.map((r) => (
            <li key={rowKey(r)}>
              <code>{r.intent_id}</code> {INTENT_STATE[r.kind]} <Time iso={r.at} past />
            </li>
          ))}
        </ul>
      ) : null}
    </Section>
  );
}

/** Every row of the job's feed, oldest first; long histories folded into runs of one kind. */
function Timeline({ rows }: { rows: readonly ChangeRow[] }) {
  const [all, setAll] = useState(false);
  const compact = !all && rows.length > COMPACT_OVER;
  const runs: { row: ChangeRow; count: number; last: ChangeRow }[] = [];
  for (const row of rows) {
    const prev = runs.at(-1);
    if (
      compact &&
      prev !== undefined &&
      prev.row.kind === row.kind &&
      INTENT_STATE[row.kind] === undefined &&
      row.kind !== "job.transitioned"
    ) {
      prev.count += 1;
      prev.last = row;
    } else runs.push({ row, count: 1, last: row });
  }
  return (
    <Section title="Timeline" id="timeline-title">
      {rows.length > COMPACT_OVER ? (
        <button type="button" aria-pressed={all ? "true" : "false"} onClick={() => setAll(!all)}>
          {all ? "Fold repeated rows" : `Show all ${rows.length} rows`}
        </button>
      ) : null}
      <ol class="timeline" aria-labelledby="timeline-title">
        {runs.map(({ row, count, last }) => (
          <li key={rowKey(row)} data-kind={row.kind}>
            <Time iso={row.at} past /> <strong>{row.kind}</strong>
            {count > 1 ? ` ×${count} (to ${localTime(last.at)})` : ""} <span class="actor">by {row.actor.type}</span>{" "}
            <span class="data">{dataText(count > 1 ? last.data : row.data)}</span>
            {row.intent_id !== undefined ? (
              <>
                {" "}
                · intent <code>{row.intent_id}</code>
                {INTENT_STATE[row.kind] !== undefined ? ` ${INTENT_STATE[row.kind]}` : ""}
              </>
            ) : null}
          </li>
        ))}
      </ol>
    </Section>
  );
}

type EventLogEntry = Schemas["EventLogEntry"];

/** What writes the event log: a notification's publish, delivered or failed (core's notifier); nothing else does. */
const LOGGED = new Set<ChangeRow["kind"]>(["intent.published", "intent.failed"]);

/**
 * The job's event log (what was published for it, with its data), newest page first;
 * read again when the feed shows a publish or a failed one, never once per observation
 * (a busy job's page read it again on every evidence row).
 */
function EventLog({ session, job, rows }: { session: Session; job: JobRecord; rows: readonly ChangeRow[] }) {
  const [entries, setEntries] = useState<readonly EventLogEntry[] | undefined>(undefined);
  const moved = `${job.job_id}|${rows.filter((r) => LOGGED.has(r.kind)).length}`;
  useEffect(() => {
    let gone = false;
    ok(session.api.GET("/v1/jobs/{job_id}/events", { params: { path: { job_id: job.job_id } } }))
      .then((log) => !gone && setEntries(log.items))
      .catch(() => undefined);
    return () => {
      gone = true;
    };
  }, [moved, session]);
  if (entries === undefined || entries.length === 0) return null;
  return (
    <Section title="Event log" id="event-log-title">
      <ol class="events">
        {entries.map((e) => (
          <li key={e.id}>
            <Time iso={e.at} past /> <strong>{e.event}</strong>
            {e.data !== undefined ? <pre class="json">{JSON.stringify(e.data, null, 2)}</pre> : null}
          </li>
        ))}
      </ol>
    </Section>
  );
}
