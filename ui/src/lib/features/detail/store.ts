// An object's detail: the live manifest through object(...), fetched from
// its cluster as the viewer, and the answer to "why can I see this?".
import { writable, type Readable } from 'svelte/store';
import { APIError, type Client } from '../../graphql/client';
import { OBJECT_DETAIL, WHY } from '../../graphql/documents';

export interface ObjectRef {
  cluster: string;
  kind: string;
  namespace: string | null;
  name: string;
}

export interface Grant {
  verb: string;
  scope: string;
  description: string;
  binding: { kind: string; name: string; namespace: string | null };
  role: { kind: string; name: string };
  subject: { kind: string; name: string; namespace: string | null };
  rule: { verbs: string[]; apiGroups: string[]; resources: string[]; resourceNames: string[] };
}

export interface Why {
  visible: boolean;
  fleetAdminGroup: string | null;
  summary: string;
  grants: Grant[];
  problems: string[];
}

export interface Detail {
  cluster: string;
  kind: string;
  namespace: string | null;
  name: string;
  resourceVersion: string;
  fetchedAt: string;
  manifest: unknown;
}

export interface DetailState {
  loading: boolean;
  detail: Detail | null;
  /** FORBIDDEN, CLUSTER_UNAVAILABLE, NOT_FOUND or another code, with its message. */
  error: { code: string; message: string } | null;
  why: Why | null;
  whyError: string;
}

export function refFromSearch(search: string): ObjectRef | null {
  const p = new URLSearchParams(search);
  const cluster = p.get('cluster'), kind = p.get('kind'), name = p.get('name');
  if (!cluster || !kind || !name) return null;
  return { cluster, kind, name, namespace: p.get('namespace') || null };
}

export function searchFromRef(r: ObjectRef): string {
  const p = new URLSearchParams({ cluster: r.cluster, kind: r.kind });
  if (r.namespace) p.set('namespace', r.namespace);
  p.set('name', r.name);
  return `?${p.toString()}`;
}

/** loadDetail fetches the object and why the viewer sees it; a null ref (a bad URL) loads nothing. */
export function loadDetail(client: Client, ref: ObjectRef | null): Readable<DetailState> {
  const s = writable<DetailState>({ loading: ref !== null, detail: null, error: null, why: null, whyError: '' });
  if (!ref) return { subscribe: s.subscribe };
  client
    .query<{ object: Detail | null }>(OBJECT_DETAIL, { ...ref })
    .then((d) =>
      s.update((x) => ({
        ...x,
        loading: false,
        detail: d.object,
        error: d.object ? null : { code: 'NOT_FOUND', message: `${ref.kind} ${ref.name} does not exist in cluster ${ref.cluster} (any more).` },
      })),
    )
    .catch((e: Error) => s.update((x) => ({ ...x, loading: false, error: { code: e instanceof APIError ? e.code : 'ERROR', message: e.message } })));
  client
    .query<{ whyVisible: Why }>(WHY, { ...ref })
    .then((d) => s.update((x) => ({ ...x, why: d.whyVisible })))
    .catch((e: Error) => s.update((x) => ({ ...x, whyError: e.message })));
  return { subscribe: s.subscribe };
}
