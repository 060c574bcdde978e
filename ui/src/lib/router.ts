// The URL is the dashboard's state: the path picks the page and the query
// string holds its filters, sort and page. navigate pushes a history entry,
// so the back button returns to the previous view; reload lands on the same
// view because every page reads its state from here.
import { writable, type Readable } from 'svelte/store';

export interface Route {
  path: string;
  search: string;
  /** history.state of the entry, for what must not be in a shared URL. */
  state: Record<string, unknown>;
}

function current(): Route {
  return { path: location.pathname, search: location.search, state: (history.state as Record<string, unknown>) ?? {} };
}

const store = writable<Route>(typeof location === 'undefined' ? { path: '/', search: '', state: {} } : current());

export const route: Readable<Route> = { subscribe: store.subscribe };

if (typeof window !== 'undefined') {
  window.addEventListener('popstate', () => store.set(current()));
}

/** navigate goes to url (path and query), pushing a history entry unless replace. */
export function navigate(url: string, opts: { replace?: boolean; state?: Record<string, unknown> } = {}): void {
  const state = opts.state ?? {};
  if (opts.replace) history.replaceState(state, '', url);
  else history.pushState(state, '', url);
  store.set(current());
}

/** link handles a click on an in-app <a href>, leaving modified clicks to the browser. */
export function link(event: MouseEvent): void {
  const a = event.currentTarget as HTMLAnchorElement;
  if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  navigate(a.getAttribute('href') ?? '/');
}
