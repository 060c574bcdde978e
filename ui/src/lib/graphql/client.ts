// The one GraphQL client of a browser tab: queries over HTTP POST, and every
// subscription over one websocket (graphql-transport-ws). Components never
// talk to the server themselves; stores call this client.
import { createClient as createWSClient, type Client as WSClient } from 'graphql-ws';

/** An error the API answered with, carrying its extensions.code. */
export class APIError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly status = 200,
    readonly extensions: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

export interface Sink<T> {
  next(data: T): void;
  error(err: APIError): void;
  complete?(): void;
}

export interface SocketEvents {
  /** The websocket (re)connected; reconnect is false for the first time. */
  connected(reconnect: boolean): void;
  /** The websocket closed; it retries by itself. */
  closed(): void;
}

export interface Client {
  query<T>(query: string, variables?: Record<string, unknown>, signal?: AbortSignal): Promise<T>;
  subscribe<T>(query: string, variables: Record<string, unknown>, sink: Sink<T>): () => void;
  close(): void;
}

export interface ClientOptions {
  token: string;
  fetch?: typeof fetch;
  ws?: WSClient;
  events?: Partial<SocketEvents>;
  origin?: string;
}

function firstError(errors: Array<{ message: string; extensions?: Record<string, unknown> }>, status: number): APIError {
  const e = errors[0];
  const code = typeof e.extensions?.code === 'string' ? e.extensions.code : 'ERROR';
  return new APIError(e.message, code, status, e.extensions ?? {});
}

/** createClient returns the tab's client for a token ('' behind an authenticating proxy). */
export function createClient(opts: ClientOptions): Client {
  const doFetch = opts.fetch ?? fetch.bind(globalThis);
  const origin = opts.origin ?? location.origin;
  const headers: Record<string, string> = { 'Content-Type': 'application/json', Accept: 'application/graphql-response+json, application/json' };
  if (opts.token) headers.Authorization = `Bearer ${opts.token}`;
  let ws = opts.ws;
  let connectedOnce = false;
  const socket = (): WSClient => {
    if (!ws) {
      ws = createWSClient({
        url: origin.replace(/^http/, 'ws') + '/graphql',
        connectionParams: opts.token ? { Authorization: `Bearer ${opts.token}` } : {},
        lazy: true,
        keepAlive: 20_000,
        retryAttempts: Number.POSITIVE_INFINITY,
        shouldRetry: () => true,
        retryWait: async (retries) => {
          await new Promise((r) => setTimeout(r, Math.min(1000 * 2 ** retries, 10_000) * (0.5 + Math.random() / 2)));
        },
        on: {
          connected: () => {
            opts.events?.connected?.(connectedOnce);
            connectedOnce = true;
          },
          closed: () => opts.events?.closed?.(),
        },
      });
    }
    return ws;
  };

  return {
    async query<T>(query: string, variables: Record<string, unknown> = {}, signal?: AbortSignal): Promise<T> {
      let res: Response;
      try {
        res = await doFetch(origin + '/graphql', { method: 'POST', headers, body: JSON.stringify({ query, variables }), signal });
      } catch (err) {
        if ((err as Error).name === 'AbortError') throw err;
        throw new APIError(`fleetgraph is not reachable: ${(err as Error).message}`, 'NETWORK');
      }
      let body: { data?: T; errors?: Array<{ message: string; extensions?: Record<string, unknown> }> };
      try {
        body = await res.json();
      } catch {
        throw new APIError(`fleetgraph answered ${res.status} without JSON`, 'NETWORK', res.status);
      }
      if (body.errors?.length) throw firstError(body.errors, res.status);
      if (!res.ok || body.data == null) throw new APIError(`fleetgraph answered ${res.status}`, 'ERROR', res.status);
      return body.data;
    },

    subscribe<T>(query: string, variables: Record<string, unknown>, sink: Sink<T>): () => void {
      return socket().subscribe<T>(
        { query, variables },
        {
          next: (msg) => {
            if (msg.errors?.length) sink.error(firstError(msg.errors as Array<{ message: string; extensions?: Record<string, unknown> }>, 200));
            else if (msg.data) sink.next(msg.data as T);
          },
          error: (err) => {
            if (Array.isArray(err)) sink.error(firstError(err as Array<{ message: string; extensions?: Record<string, unknown> }>, 200));
            else sink.error(new APIError(String((err as Error)?.message ?? (err as CloseEvent)?.reason ?? err), 'SUBSCRIPTION'));
          },
          complete: () => sink.complete?.(),
        },
      );
    },

    close() {
      void ws?.dispose();
      ws = undefined;
    },
  };
}
