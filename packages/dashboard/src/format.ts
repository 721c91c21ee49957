/** How long ago (or from now) an ISO time is, in the largest whole unit: "12 s ago", "in 3 min". */
export function relative(iso: string | undefined, now = Date.now()): string {
  if (iso === undefined) return "";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const s = Math.round((now - t) / 1000);
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
