// Display helpers shared by the views.

/** ago renders a timestamp relative to now, e.g. "3m ago"; the full time goes in a title. */
export function ago(ts: string | null | undefined, now = Date.now()): string {
  if (!ts) return '—';
  const s = Math.round((now - Date.parse(ts)) / 1000);
  if (!Number.isFinite(s)) return '—';
  if (s < 5) return 'just now';
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** time renders a timestamp in the viewer's locale. */
export function time(ts: string | null | undefined): string {
  return ts ? new Date(ts).toLocaleString() : '—';
}

export function count(n: number): string {
  return n.toLocaleString('en-US');
}
