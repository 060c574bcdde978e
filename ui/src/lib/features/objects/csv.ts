// CSV export of every object matching a view: all pages, in the view's
// order, with the columns below. RFC 4180 quoting.
import type { Client } from '../../graphql/client';
import { EXPORT_PAGE } from '../../graphql/documents';
import type { Label, ObjectStatus } from '../../graphql/types';
import { toFilter, toOrder, type ObjectView } from './view';

export const csvColumns = ['cluster', 'namespace', 'kind', 'group', 'name', 'status', 'message', 'createdAt', 'updatedAt', 'labels'] as const;

export interface ExportRow {
  cluster: string;
  namespace: string | null;
  kind: string;
  group: string;
  name: string;
  status: ObjectStatus;
  message: string | null;
  createdAt: string | null;
  updatedAt: string | null;
  labels: Label[];
}

/** csvField quotes a value when it holds a comma, quote, or line break. */
export function csvField(v: string): string {
  return /[",\r\n]/.test(v) ? `"${v.replaceAll('"', '""')}"` : v;
}

/** csvLine is one row, labels as key=value joined by ';'. */
export function csvLine(r: ExportRow): string {
  const labels = r.labels.map((l) => `${l.key}=${l.value}`).join(';');
  const cells = [r.cluster, r.namespace ?? '', r.kind, r.group, r.name, r.status, r.message ?? '', r.createdAt ?? '', r.updatedAt ?? '', labels];
  return cells.map(csvField).join(',');
}

export function toCSV(rows: ExportRow[]): string {
  return [csvColumns.join(','), ...rows.map(csvLine)].join('\r\n') + '\r\n';
}

/** fetchAll reads every page of the view's filter and order, reporting progress. */
export async function fetchAll(client: Client, view: ObjectView, progress: (n: number) => void = () => {}, signal?: AbortSignal): Promise<ExportRow[]> {
  const rows: ExportRow[] = [];
  let after: string | null = null;
  for (;;) {
    const data: { objects: { pageInfo: { hasNextPage: boolean; endCursor: string | null }; edges: Array<{ node: ExportRow }> } } =
      await client.query(EXPORT_PAGE, { filter: toFilter(view), orderBy: toOrder(view), after }, signal);
    for (const e of data.objects.edges) rows.push(e.node);
    progress(rows.length);
    if (!data.objects.pageInfo.hasNextPage || !data.objects.pageInfo.endCursor) return rows;
    after = data.objects.pageInfo.endCursor;
  }
}
