/**
 * How long ago (or from now) an ISO time is, in the largest whole unit: "12 s ago",
 * "in 3 min". A time that can only be past (an update, a mark) read as future means
 * the service's clock is ahead of this browser's: "just now".
 */
export function relative(iso: string | undefined, now = Date.now(), past = false): string {
  if (iso === undefined) return "";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const s = Math.round((now - t) / 1000);
  if (past && s < 0) return "just now";
  const a = Math.abs(s);
  const text =
    a < 60 ? `${a} s` : a < 3600 ? `${Math.floor(a / 60)} min` : a < 86400 ? `${Math.floor(a / 3600)} h` : `${Math.floor(a / 86400)} d`;
  return s >= 0 ? `${text} ago` : `in ${text}`;
}

/** An ISO time as the reader's local date and time (the ISO form stays in the title). */
export function localTime(iso: string | undefined): string {
  if (iso === undefined) return "";
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? iso : t.toLocaleString();
}

/** The first 12 hex digits of a digest: enough to tell two apart on a screen. */
export function shortHash(hex: string | undefined): string {
  return hex === undefined ? "" : hex.slice(0, 12);
}

export function bytes(n: number | undefined): string {
  if (n === undefined) return "";
  return n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
}

/** A row's data as "key value" pairs, in its own order. */
export function dataText(data: Record<string, string | number | boolean> | undefined): string {
  if (data === undefined) return "";
  return Object.entries(data)
    .map(([k, v]) => `${k} ${typeof v === "string" && v.length > 24 && /^[0-9a-f]+$/.test(v) ? shortHash(v) : String(v)}`)
    .join(" · ");
}
