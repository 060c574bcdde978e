// The object table's data: one page and its facets for the view in the URL,
// kept live by objectChanges. The subscription starts from the page's
// changesCursor, so no change between the load and the subscribe is missed;
// rows on the page are updated in place at once, and the page, totals and
// facets are reloaded shortly after any change (a new or deleted object can
// move rows between pages, which only the server can decide).
import { writable, type Readable } from 'svelte/store';
import type { APIError, Client } from '../../graphql/client';
import { OBJECT_CHANGES, OBJECTS } from '../../graphql/documents';
import type { ChangeEvent, Facets, ObjectRow, ObjectsAnswer } from '../../graphql/types';
import { formatView, toFilter, toOrder, type ObjectView } from './view';

export interface ObjectsState {
  /** The canonical query string this state answers. */
  query: string;
  loading: boolean;
  error: string;
  rows: ObjectRow[];
  totalCount: number;
  staleClusters: string[];
  facets: Facets | null;
  hasNextPage: boolean;
  endCursor: string | null;
  /** Live changes received for this view. */
  live: number;
}

const empty: ObjectsState = {
  query: '',
  loading: true,
  error: '',
  rows: [],
  totalCount: 0,
  staleClusters: [],
  facets: null,
  hasNextPage: false,
  endCursor: null,
  live: 0,
};

/** How long after a change the page is reloaded; changes arriving meanwhile share the reload. */
export const reloadDelay = 300;

export interface ObjectsStore extends Readable<ObjectsState> {
  /** show loads a view (from the URL); it keeps the subscription when only the page changed. */
  show(view: ObjectView): void;
  /** refresh reloads the page and restarts the subscription from it, e.g. after a reconnect. */
  refresh(): void;
  close(): void;
}

export function createObjectsStore(client: Client): ObjectsStore {
  const state = writable<ObjectsState>(empty);
  let view: ObjectView | null = null;
  let filterKey = '';
  let seq = 0;
  let inflight: AbortController | null = null;
  let unsubscribe: (() => void) | null = null;
  let reloadTimer: ReturnType<typeof setTimeout> | undefined;
  let retryTimer: ReturnType<typeof setTimeout> | undefined;

  async function load(resubscribe: boolean) {
    if (!view) return;
    const v = view;
    const my = ++seq;
    inflight?.abort();
    const ctl = new AbortController();
    inflight = ctl;
    const query = formatView(v);
    state.update((s) => ({ ...s, loading: true }));
    try {
      const data = await client.query<ObjectsAnswer>(
        OBJECTS,
        {
          filter: toFilter(v),
          orderBy: toOrder(v),
          first: v.first,
          after: v.after || null,
          byCluster: toFilter({ ...v, clusters: [] }),
          byNamespace: toFilter({ ...v, namespaces: [] }),
          byKind: toFilter({ ...v, kinds: [] }),
          byStatus: toFilter({ ...v, statuses: [] }),
        },
        ctl.signal,
      );
      if (my !== seq) return;
      const o = data.objects;
      state.update((s) => ({
        ...s,
        query,
        loading: false,
        error: '',
        rows: o.edges.map((e) => e.node),
        totalCount: o.totalCount,
        staleClusters: o.staleClusters,
        facets: {
          clusters: data.clusterFacets.clusters,
          namespaces: data.namespaceFacets.namespaces,
          kinds: data.kindFacets.kinds,
          statuses: data.statusFacets.statuses,
        },
        hasNextPage: o.pageInfo.hasNextPage,
        endCursor: o.pageInfo.endCursor,
      }));
      if (resubscribe) subscribe(v, o.changesCursor);
    } catch (err) {
      if ((err as Error).name === 'AbortError' || my !== seq) return;
      state.update((s) => ({ ...s, query, loading: false, error: (err as Error).message, rows: [], totalCount: 0, facets: null }));
    }
  }

  function subscribe(v: ObjectView, after: string) {
    unsubscribe?.();
    unsubscribe = client.subscribe<{ objectChanges: ChangeEvent }>(OBJECT_CHANGES, { filter: toFilter(v), after }, {
      next: (d) => onChange(d.objectChanges),
      error: (e: APIError) => {
        // The server ended the stream (for example it fell too far behind):
        // reload and start again from the fresh page.
        state.update((s) => ({ ...s, error: `live updates paused: ${e.message}` }));
        clearTimeout(retryTimer);
        retryTimer = setTimeout(() => void load(true), 1000);
      },
    });
  }

  function onChange(ev: ChangeEvent) {
    state.update((s) => {
      const i = s.rows.findIndex((r) => r.id === ev.object.id);
      let rows = s.rows;
      if (i >= 0 && ev.type === 'MODIFIED') {
        rows = [...rows];
        rows[i] = ev.object;
      }
      return { ...s, rows, live: s.live + 1 };
    });
    clearTimeout(reloadTimer);
    reloadTimer = setTimeout(() => void load(false), reloadDelay);
  }

  return {
    subscribe: state.subscribe,
    show(v: ObjectView) {
      const key = JSON.stringify({ ...toFilter(v) });
      const filterChanged = key !== filterKey;
      filterKey = key;
      view = v;
      if (filterChanged) {
        unsubscribe?.();
        unsubscribe = null;
      }
      void load(filterChanged);
    },
    refresh() {
      void load(true);
    },
    close() {
      seq++;
      inflight?.abort();
      unsubscribe?.();
      unsubscribe = null;
      clearTimeout(reloadTimer);
      clearTimeout(retryTimer);
      view = null;
    },
  };
}
