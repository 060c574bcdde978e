// The object table's view state and its round trip through the URL. Pure
// functions, so that parse(format(v)) == v can be tested without a browser.
import { objectStatuses, type ObjectStatus } from '../../graphql/types';

export const orderFields = ['NAME', 'NAMESPACE', 'CLUSTER', 'KIND', 'STATUS', 'CREATED_AT', 'UPDATED_AT'] as const;
export type OrderField = (typeof orderFields)[number];
export type Direction = 'ASC' | 'DESC';

export const pageSizes = [25, 50, 100, 250] as const;
export const defaultPageSize = 50;

export interface ObjectView {
  clusters: string[];
  namespaces: string[];
  kinds: string[];
  statuses: ObjectStatus[];
  name: string;
  labels: string;
  sort: OrderField;
  dir: Direction;
  first: number;
  /** The cursor the page starts after; '' for the first page. */
  after: string;
  /** 1-based page number, for display; the cursor is what selects the page. */
  page: number;
}

export const emptyView: ObjectView = {
  clusters: [],
  namespaces: [],
  kinds: [],
  statuses: [],
  name: '',
  labels: '',
  sort: 'NAME',
  dir: 'ASC',
  first: defaultPageSize,
  after: '',
  page: 1,
};

function list(p: URLSearchParams, key: string): string[] {
  return [...new Set(p.getAll(key).filter((v) => v !== ''))].sort();
}

/** parseView reads a view from a query string; unknown or invalid values fall back to defaults. */
export function parseView(search: string): ObjectView {
  const p = new URLSearchParams(search);
  const sort = (p.get('sort') ?? '').toUpperCase();
  const dir = (p.get('dir') ?? '').toUpperCase();
  const first = Number(p.get('first'));
  const page = Number(p.get('page'));
  const after = p.get('after') ?? '';
  return {
    clusters: list(p, 'cluster'),
    namespaces: list(p, 'namespace'),
    kinds: list(p, 'kind'),
    statuses: list(p, 'status')
      .map((s) => s.toUpperCase())
      .filter((s): s is ObjectStatus => (objectStatuses as string[]).includes(s)),
    name: p.get('name') ?? '',
    labels: p.get('labels') ?? '',
    sort: (orderFields as readonly string[]).includes(sort) ? (sort as OrderField) : 'NAME',
    dir: dir === 'DESC' ? 'DESC' : 'ASC',
    first: (pageSizes as readonly number[]).includes(first) ? first : defaultPageSize,
    after,
    page: after && Number.isInteger(page) && page > 1 ? page : 1,
  };
}

/** formatView writes a view as a canonical query string (defaults left out), with a leading '?' unless empty. */
export function formatView(v: ObjectView): string {
  const p = new URLSearchParams();
  for (const c of [...v.clusters].sort()) p.append('cluster', c);
  for (const n of [...v.namespaces].sort()) p.append('namespace', n);
  for (const k of [...v.kinds].sort()) p.append('kind', k);
  for (const s of [...v.statuses].sort()) p.append('status', s);
  if (v.name) p.set('name', v.name);
  if (v.labels) p.set('labels', v.labels);
  if (v.sort !== 'NAME') p.set('sort', v.sort);
  if (v.dir !== 'ASC') p.set('dir', v.dir);
  if (v.first !== defaultPageSize) p.set('first', String(v.first));
  if (v.after) {
    p.set('after', v.after);
    p.set('page', String(v.page));
  }
  const s = p.toString();
  return s ? `?${s}` : '';
}

/** withFilter changes part of a view and goes back to the first page, as any filter or sort change must. */
export function withFilter(v: ObjectView, change: Partial<ObjectView>): ObjectView {
  return { ...v, ...change, after: '', page: 1 };
}

/** toggle adds value to a list, or removes it when present. */
export function toggle<T>(values: T[], value: T): T[] {
  return values.includes(value) ? values.filter((x) => x !== value) : [...values, value];
}

/** The API's ObjectFilter for a view; null fields are left out. */
export function toFilter(v: ObjectView): Record<string, unknown> {
  const f: Record<string, unknown> = {};
  if (v.clusters.length) f.clusters = v.clusters;
  if (v.namespaces.length) f.namespaces = v.namespaces;
  if (v.kinds.length) f.kinds = v.kinds;
  if (v.statuses.length) f.statuses = v.statuses;
  if (v.name) f.nameContains = v.name;
  if (v.labels) f.labelSelector = v.labels;
  return f;
}

/** The API's ObjectOrder for a view. */
export function toOrder(v: ObjectView): { field: OrderField; direction: Direction } {
  return { field: v.sort, direction: v.dir };
}
