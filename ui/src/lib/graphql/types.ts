// Types of the API's answers, as the documents select them.
export type ConnectionState = 'CONNECTING' | 'CONNECTED' | 'DEGRADED' | 'DISCONNECTED';
export type ObjectStatus = 'HEALTHY' | 'PROGRESSING' | 'UNHEALTHY' | 'TERMINATING' | 'UNKNOWN';
export const objectStatuses: ObjectStatus[] = ['HEALTHY', 'PROGRESSING', 'UNHEALTHY', 'TERMINATING', 'UNKNOWN'];

export interface Label { key: string; value: string }
export interface Viewer { username: string; groups: string[] }

export interface FleetStatus { clustersTotal: number; clustersSynced: number; rebuilding: boolean; message: string }

export interface Cluster {
  name: string;
  mode: 'PULL' | 'PUSH';
  stale: boolean;
  labels: Label[];
  metadata: Label[];
  connection: { state: ConnectionState; since: string; lastSeen: string | null; lastError: string | null };
  sync: { synced: boolean; kinds: number; kindErrors: Array<{ kind: string; error: string; since: string }> };
}

export interface ConnectionEvent {
  cluster: string;
  state: ConnectionState;
  previous: ConnectionState | null;
  at: string;
  message: string | null;
}

export interface ObjectRow {
  id: string;
  cluster: string;
  namespace: string | null;
  group: string;
  version: string;
  kind: string;
  resource: string;
  name: string;
  status: ObjectStatus;
  message: string | null;
  labels: Label[];
  createdAt: string | null;
  updatedAt: string | null;
  stale: boolean;
  summary: Record<string, unknown> | null;
}

export interface FacetCount { value: string; count: number }
export interface Facets {
  statuses: FacetCount[];
  kinds: FacetCount[];
  clusters: FacetCount[];
  namespaces: FacetCount[];
}

export interface ObjectsAnswer {
  objects: {
    totalCount: number;
    staleClusters: string[];
    changesCursor: string;
    pageInfo: { hasNextPage: boolean; endCursor: string | null };
    edges: Array<{ cursor: string; node: ObjectRow }>;
  };
  clusterFacets: { clusters: FacetCount[] };
  namespaceFacets: { namespaces: FacetCount[] };
  kindFacets: { kinds: FacetCount[] };
  statusFacets: { statuses: FacetCount[] };
}

export interface ChangeEvent { type: 'ADDED' | 'MODIFIED' | 'DELETED'; cursor: string; object: ObjectRow }

/** The kind term the API accepts for a row: `Pod` or `Kustomization.kustomize.toolkit.fluxcd.io`. */
export function kindTerm(row: { kind: string; group: string }): string {
  return row.group ? `${row.kind}.${row.group}` : row.kind;
}
