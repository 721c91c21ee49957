import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import type { JobRecord, Status } from "./api.ts";
import { localTime, relative } from "./format.ts";

export function StatusBadge({ status }: { status: Status }) {
  return <span class={`status status-${status}`}>{status}</span>;
}

/** A running job whose candidate mark has fallen due by this browser's clock. */
export function isDue(job: JobRecord, now = Date.now()): boolean {
  return job.status === "running" && job.candidate_at !== undefined && Date.parse(job.candidate_at) <= now;
}

/** What a job carries that a person may need to act on, as short labels. */
export function marksOf(job: JobRecord, now = Date.now()): { label: string; tone: "warn" | "bad" | "info" }[] {
  const marks: { label: string; tone: "warn" | "bad" | "info" }[] = [];
  if (job.stale_since !== undefined) marks.push({ label: `stale since ${relative(job.stale_since, now, true)}`, tone: "warn" });
  if (job.overdue_since !== undefined) marks.push({ label: `overdue since ${relative(job.overdue_since, now, true)}`, tone: "bad" });
  const owed = job.pending_notification;
  if (owed?.quarantined_at !== undefined) marks.push({ label: "notification quarantined", tone: "bad" });
  else if (owed !== undefined) marks.push({ label: `notification owed (${owed.event})`, tone: "info" });
  if (isDue(job, now)) marks.push({ label: "evaluation due", tone: "info" });
  return marks;
}

export function Marks({ job }: { job: JobRecord }) {
  const marks = marksOf(job);
  if (marks.length === 0) return null;
  return (
    <span class="marks">
      {marks.map((m) => (
        <span key={m.label} class={`mark mark-${m.tone}`}>
          {m.label}
        </span>
      ))}
    </span>
  );
}

/** A time, relative; `past` for one that cannot be in the future (see `relative`). */
export function Time({ iso, past = false }: { iso: string | undefined; past?: boolean }) {
  if (iso === undefined) return null;
  return (
    <time dateTime={iso} title={`${localTime(iso)} (${iso})`}>
      {relative(iso, Date.now(), past)}
    </time>
  );
}

/**
 * An action that asks first: a button opening a modal dialog (the browser's own
 * `<dialog>`, which keeps focus inside and closes on Escape) that names what will
 * happen; "Yes" runs it, closes the dialog and hands the service's answer (or its
 * refusal) to `onAnswer`, which shows it where it outlives the button: the action may
 * no longer apply once it is done (a cancelled job cannot be cancelled).
 */
export function ConfirmAction(props: {
  label: string;
  question: string;
  run: () => Promise<string>;
  onAnswer: (answer: string) => void;
  danger?: boolean;
}) {
  const dialog = useRef<HTMLDialogElement>(null);
  const [busy, setBusy] = useState(false);
  const confirm = async () => {
    setBusy(true);
    let answer: string;
    try {
      answer = await props.run();
    } catch (e) {
      answer = `Refused: ${e instanceof Error ? e.message : String(e)}`;
    } finally {
      setBusy(false);
    }
    dialog.current?.close();
    props.onAnswer(answer);
  };
  return (
    <>
      <button type="button" class={props.danger ? "danger" : undefined} onClick={() => dialog.current?.showModal()}>
        {props.label}
      </button>
      <dialog ref={dialog} aria-label={props.label}>
        <p>{props.question}</p>
        <div class="row">
          <button type="button" class={props.danger ? "danger" : undefined} disabled={busy} onClick={confirm}>
            Yes, {props.label.toLowerCase()}
          </button>
          <button type="button" onClick={() => dialog.current?.close()} disabled={busy}>
            No
          </button>
        </div>
      </dialog>
    </>
  );
}

/** Re-renders its children every `ms` (relative times stay right). */
export function useTick(ms: number): number {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const t = setInterval(() => setTick((n) => n + 1), ms);
    return () => clearInterval(t);
  }, [ms]);
  return tick;
}

export function Section(props: { title: string; id?: string; children: ComponentChildren; level?: 2 | 3 }) {
  const H = props.level === 3 ? "h3" : "h2";
  const id = props.id ?? props.title.toLowerCase().replace(/[^a-z0-9]+/g, "-");
  return (
    <section aria-labelledby={id}>
      <H id={id}>{props.title}</H>
      {props.children}
    </section>
  );
}
