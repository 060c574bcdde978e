// Cluster connection state for every view of the tab, from ONE
// clusterConnection subscription (docs/design.md: no poll per view). It
// feeds the fleet overview, the toasts, the stale marks of the object table,
// and `refreshes`, which data views watch to reload after a reconnect
// without a page reload (docs/design.md).
import { derived, get, writable, type Readable } from 'svelte/store';
import type { Client } from '../../graphql/client';
import { CLUSTER_CONNECTION, CLUSTERS, FLEET } from '../../graphql/documents';
import type { Cluster, ConnectionEvent, FleetStatus } from '../../graphql/types';
import { serverLink } from '../toast/logic';
import { toasts, type ToastStore } from '../toast/store';

export interface ConnectionStore {
  clusters: Readable<Cluster[]>;
  fleet: Readable<FleetStatus | null>;
  /** Counts reconnects (of a cluster, or of the tab's websocket); data views reload when it changes. */
  refreshes: Readable<number>;
  error: Readable<string>;
  /** Called by the client's socket events. */
  socketConnected(reconnect: boolean): void;
  socketClosed(): void;
  attach(client: Client): () => void;
}

const back = (s: string) => s === 'CONNECTED' || s === 'DEGRADED';

export function createConnectionStore(toastStore: ToastStore = toasts): ConnectionStore {
  const byName = writable<Map<string, Cluster>>(new Map());
  const fleet = writable<FleetStatus | null>(null);
  const refreshes = writable(0);
  const error = writable('');
  let client: Client | null = null;
  let reloadTimer: ReturnType<typeof setTimeout> | undefined;
  let socketDown = false;

  async function load() {
    if (!client) return;
    try {
      const data = await client.query<{ fleet: FleetStatus; clusters: Cluster[] }>(CLUSTERS);
      byName.set(new Map(data.clusters.map((c) => [c.name, c])));
      fleet.set(data.fleet);
      error.set('');
      for (const c of data.clusters) {
        if (c.connection.state === 'DISCONNECTED') toastStore.push({ cluster: c.name, state: 'DISCONNECTED', at: c.connection.since });
      }
    } catch (err) {
      error.set((err as Error).message);
    }
  }

  // Reload the cluster rows (sync, kind errors, last seen) once after a
  // burst of events: the event itself carries only the state.
  function reloadSoon() {
    clearTimeout(reloadTimer);
    reloadTimer = setTimeout(load, 250);
  }

  function apply(ev: ConnectionEvent) {
    // Any return to CONNECTED or DEGRADED from another state means rows
    // may have changed without this tab seeing them live.
    let cameBack = false;
    byName.update((m) => {
      const c = m.get(ev.cluster);
      const before = c?.connection.state ?? ev.previous;
      cameBack = back(ev.state) && before != null && !back(before);
      if (!c) return m;
      const next: Cluster = {
        ...c,
        stale: !back(ev.state),
        connection: { ...c.connection, state: ev.state, since: ev.at, lastError: ev.message ?? c.connection.lastError },
      };
      m = new Map(m);
      m.set(ev.cluster, next);
      return m;
    });
    toastStore.push({ cluster: ev.cluster, state: ev.state, at: ev.at });
    if (cameBack) refreshes.update((n) => n + 1);
    reloadSoon();
  }

  return {
    clusters: derived(byName, (m) => [...m.values()].sort((a, b) => a.name.localeCompare(b.name))),
    fleet: { subscribe: fleet.subscribe },
    refreshes: { subscribe: refreshes.subscribe },
    error: { subscribe: error.subscribe },
    socketConnected(reconnect: boolean) {
      if (socketDown) toastStore.push({ cluster: serverLink, state: 'CONNECTED', at: new Date().toISOString() });
      socketDown = false;
      if (reconnect) {
        // Events may have been missed while the socket was down.
        void load();
        refreshes.update((n) => n + 1);
      }
    },
    socketClosed() {
      if (!socketDown && client) {
        socketDown = true;
        toastStore.push({ cluster: serverLink, state: 'DISCONNECTED', at: new Date().toISOString() });
      }
    },
    attach(c: Client) {
      client = c;
      void load();
      const stopConn = c.subscribe<{ clusterConnection: ConnectionEvent }>(CLUSTER_CONNECTION, {}, {
        next: (d) => apply(d.clusterConnection),
        error: (e) => error.set(e.message),
      });
      const stopFleet = c.subscribe<{ fleet: FleetStatus }>(FLEET, {}, {
        next: (d) => fleet.set(d.fleet),
        error: (e) => error.set(e.message),
      });
      return () => {
        stopConn();
        stopFleet();
        clearTimeout(reloadTimer);
        client = null;
        byName.set(new Map());
        fleet.set(null);
        toastStore.reset();
      };
    },
  };
}

/** The tab's connection store. */
export const connection = createConnectionStore();

/** staleSince returns when a cluster stopped being live, or null if it is live. */
export function staleSince(clusters: Cluster[], name: string): string | null {
  const c = clusters.find((x) => x.name === name);
  return c && c.stale ? c.connection.since : null;
}

export { get };
