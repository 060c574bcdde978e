// GraphiQL, served at /graphiql from the embedded build: no CDN. It uses the
// dashboard's credentials for this browser tab (session storage) and never
// persists them: headers are not saved, and GraphiQL's own state (tabs,
// history) goes to session storage too, so nothing outlives the tab.
import { createElement } from 'react';
import { createRoot } from 'react-dom/client';
import { GraphiQL } from 'graphiql';
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import 'graphiql/style.css';
import './a11y.css';
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

// GraphiQL 4 leaves a few accessibility gaps that axe-core reports as
// serious: CodeMirror's input textareas have no label, its scroll areas
// take no focus, and each tab (role "tab") holds two buttons. This fills
// them in as GraphiQL renders, without changing what it does.
function accessible(root: HTMLElement) {
  const label = (ta: HTMLTextAreaElement) => {
    if (ta.hasAttribute('aria-label')) return;
    const name = ta.readOnly
      ? 'Response'
      : ta.closest('.graphiql-query-editor')
        ? 'GraphQL query'
        : ta.closest('[aria-label]')?.getAttribute('aria-label') || 'Variables';
    ta.setAttribute('aria-label', name);
  };
  root.querySelectorAll<HTMLTextAreaElement>('.CodeMirror textarea').forEach(label);
  root.querySelectorAll<HTMLElement>('.CodeMirror-scroll[tabindex="-1"]').forEach((el) => el.setAttribute('tabindex', '0'));
  // The tab strip becomes a plain list of buttons; the active one is marked current.
  root.querySelectorAll('ul.graphiql-tabs[role="tablist"]').forEach((ul) => ul.removeAttribute('role'));
  root.querySelectorAll('li.graphiql-tab').forEach((li) => {
    li.removeAttribute('role');
    const active = li.getAttribute('aria-selected') === 'true';
    li.removeAttribute('aria-selected');
    li.querySelector('button')?.setAttribute('aria-current', String(active));
  });
  root.querySelectorAll('[role="tabpanel"][aria-labelledby]').forEach((p) => {
    p.removeAttribute('aria-labelledby');
    p.setAttribute('role', 'region');
    p.setAttribute('aria-label', 'GraphQL session');
  });
}

const root = document.getElementById('graphiql')!;
new MutationObserver(() => accessible(root)).observe(root, { childList: true, subtree: true, attributeFilter: ['aria-selected', 'role', 'tabindex'] });

createRoot(root).render(
  createElement(
    GraphiQL,
    { fetcher, storage, defaultQuery, shouldPersistHeaders: false, isHeadersEditorEnabled: false },
    createElement(GraphiQL.Logo, null, createElement('a', { href: '/', className: 'graphiql-logo-link' }, 'fleetgraph')),
  ),
);
