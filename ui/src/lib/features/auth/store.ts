// The session: the tab's GraphQL client and the viewer the server says we
// are. With a token (pasted at login, kept in session storage) or, behind an
// authenticating proxy, with no token and no login at all.
import { writable, type Readable } from 'svelte/store';
import { APIError, createClient, type Client } from '../../graphql/client';
import { VIEWER } from '../../graphql/documents';
import type { Viewer } from '../../graphql/types';
import { connection } from '../connection/store';
import { loadToken, saveToken } from './token';

export interface Session {
  client: Client;
  viewer: Viewer;
  /** 'proxy' when an authenticating proxy vouches for the viewer. */
  mode: 'token' | 'proxy';
}

const store = writable<Session | null>(null);
const status = writable<'starting' | 'login' | 'ready'>('starting');
const loginError = writable('');

export const session: Readable<Session | null> = { subscribe: store.subscribe };
export const sessionStatus: Readable<'starting' | 'login' | 'ready'> = { subscribe: status.subscribe };
export const authError: Readable<string> = { subscribe: loginError.subscribe };

let detach: (() => void) | null = null;

async function open(token: string): Promise<Session> {
  const client = createClient({
    token,
    events: {
      connected: (reconnect) => connection.socketConnected(reconnect),
      closed: () => connection.socketClosed(),
    },
  });
  try {
    const { viewer } = await client.query<{ viewer: Viewer }>(VIEWER);
    return { client, viewer, mode: token ? 'token' : 'proxy' };
  } catch (err) {
    client.close();
    throw err;
  }
}

function activate(s: Session) {
  detach?.();
  store.set(s);
  status.set('ready');
  detach = connection.attach(s.client);
}

/** start signs in with the tab's saved token, or without one behind a proxy; otherwise it asks for a token. */
export async function start(): Promise<void> {
  const saved = loadToken();
  try {
    activate(await open(saved));
  } catch (err) {
    if (saved && !(err instanceof APIError && err.code === 'UNAUTHENTICATED')) {
      loginError.set((err as Error).message);
    }
    if (saved) saveToken('');
    status.set('login');
  }
}

/** login checks a pasted token with the server and keeps it for the tab. */
export async function login(token: string): Promise<boolean> {
  token = token.trim().replace(/^Bearer\s+/i, '');
  if (!token) {
    loginError.set('Paste a token first.');
    return false;
  }
  try {
    const s = await open(token);
    saveToken(token);
    loginError.set('');
    activate(s);
    return true;
  } catch (err) {
    loginError.set(err instanceof APIError && err.code === 'UNAUTHENTICATED' ? 'That token was not accepted.' : (err as Error).message);
    return false;
  }
}

/** logout forgets the token and closes the tab's connections. */
export function logout(): void {
  saveToken('');
  detach?.();
  detach = null;
  store.update((s) => {
    s?.client.close();
    return null;
  });
  status.set('login');
}
