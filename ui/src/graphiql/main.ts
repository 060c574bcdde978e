// GraphiQL, served at /graphiql from the embedded build: no CDN. It uses the
// dashboard's credentials for this browser tab (session storage) and never
// persists them: headers are not saved, and GraphiQL's own state (tabs,
// history) goes to session storage too, so nothing outlives the tab.
import { createElement } from 'react';
import { createRoot } from 'react-dom/client';
import { GraphiQL } from 'graphiql';
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import 'graphiql/style.css';
import { loadToken } from '../lib/features/auth/token';

const token = loadToken();
const auth: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
const wsURL = `${location.protocol === 'https:' ? 'wss:' : 'ws:'}//${location.host}/graphql`;

const fetcher = createGraphiQLFetcher({
  url: '/graphql',
  subscriptionUrl: wsURL,
  headers: auth,
  wsConnectionParams: auth,
});

// Storage is GraphiQL's interface over localStorage; this one keeps its
// state for the tab only.
const storage = {
  getItem: (key: string) => sessionStorage.getItem(`graphiql:${key}`),
  setItem: (key: string, value: string) => sessionStorage.setItem(`graphiql:${key}`, value),
  removeItem: (key: string) => sessionStorage.removeItem(`graphiql:${key}`),
  clear: () => {
    for (const k of Object.keys(sessionStorage)) if (k.startsWith('graphiql:')) sessionStorage.removeItem(k);
  },
  get length() {
    return Object.keys(sessionStorage).filter((k) => k.startsWith('graphiql:')).length;
  },
};

const defaultQuery = `# fleetgraph GraphQL API. ${token ? 'Requests carry the token you signed in with on the dashboard.' : 'Sign in on the dashboard first, or rely on your authenticating proxy.'}
{
  viewer { username groups }
  fleet { message }
  objects(first: 5, filter: { statuses: [UNHEALTHY] }) {
    totalCount
    edges { node { cluster namespace kind name status message } }
  }
}
`;

createRoot(document.getElementById('graphiql')!).render(
  createElement(GraphiQL, { fetcher, storage, defaultQuery, shouldPersistHeaders: false, isHeadersEditorEnabled: false }),
);
