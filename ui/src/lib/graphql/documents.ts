// Every GraphQL document the dashboard sends, in one place: the dashboard
// uses only the public API, and this file is what it depends on.

export const objectFields = `id cluster namespace group version kind resource name status message
  labels { key value } createdAt updatedAt stale summary`;

export const VIEWER = `query Viewer { viewer { username groups } }`;

export const CLUSTERS = `query Clusters {
  fleet { clustersTotal clustersSynced rebuilding message }
  clusters {
    name mode stale
    labels { key value }
    metadata { key value }
    connection { state since lastSeen lastError }
    sync { synced kinds kindErrors { kind error since } }
  }
}`;

export const CLUSTER_CONNECTION = `subscription ClusterConnection {
  clusterConnection { cluster state previous at message }
}`;

export const FLEET = `subscription Fleet { fleet { clustersTotal clustersSynced rebuilding message } }`;

// One request per table view: the page, and each facet counted with every
// filter but its own, so that values of one facet can be combined (OR).
export const OBJECTS = `query Objects($filter: ObjectFilter, $orderBy: ObjectOrder, $first: Int, $after: String,
    $byCluster: ObjectFilter, $byNamespace: ObjectFilter, $byKind: ObjectFilter, $byStatus: ObjectFilter) {
  objects(filter: $filter, orderBy: $orderBy, first: $first, after: $after) {
    totalCount staleClusters changesCursor
    pageInfo { hasNextPage endCursor }
    edges { cursor node { ${objectFields} } }
  }
  clusterFacets: facets(filter: $byCluster) { clusters { value count } }
  namespaceFacets: facets(filter: $byNamespace) { namespaces { value count } }
  kindFacets: facets(filter: $byKind) { kinds { value count } }
  statusFacets: facets(filter: $byStatus) { statuses { value count } }
}`;

export const EXPORT_PAGE = `query Export($filter: ObjectFilter, $orderBy: ObjectOrder, $after: String) {
  objects(filter: $filter, orderBy: $orderBy, first: 1000, after: $after) {
    pageInfo { hasNextPage endCursor }
    edges { node { cluster namespace kind group name status message createdAt updatedAt labels { key value } } }
  }
}`;

export const OBJECT_CHANGES = `subscription ObjectChanges($filter: ObjectFilter, $after: String) {
  objectChanges(filter: $filter, after: $after) { type cursor object { ${objectFields} } }
}`;

export const OBJECT_DETAIL = `query Object($cluster: String!, $kind: String!, $namespace: String, $name: String!) {
  object(cluster: $cluster, kind: $kind, namespace: $namespace, name: $name) {
    cluster kind namespace name resourceVersion fetchedAt manifest
  }
}`;

export const WHY = `query Why($cluster: String!, $kind: String!, $namespace: String, $name: String!) {
  whyVisible(cluster: $cluster, kind: $kind, namespace: $namespace, name: $name) {
    visible fleetAdminGroup summary
    grants {
      verb scope description
      binding { kind name namespace }
      role { kind name }
      subject { kind name namespace }
      rule { verbs apiGroups resources resourceNames }
    }
    problems
  }
}`;
