// Demo controls: shown only when the server runs `fleetgraph demo` and the
// viewer is a fleet admin. The server decides both: /demo/api answers 404
// outside demo mode and 403 to anyone but a fleet admin.
import { writable, type Readable } from 'svelte/store';
import { loadToken } from '../auth/token';

export const demoActions = ['stop', 'start', 'freeze', 'thaw', 'cut', 'heal'] as const;
export type DemoAction = (typeof demoActions)[number];

export interface DemoState {
  available: boolean;
  clusters: Array<{ name: string; mode: string; state: string }>;
  message: string;
}

const state = writable<DemoState>({ available: false, clusters: [], message: '' });
export const demo: Readable<DemoState> = { subscribe: state.subscribe };

function headers(): Record<string, string> {
  const t = loadToken();
  return t ? { Authorization: `Bearer ${t}`, 'Content-Type': 'application/json' } : { 'Content-Type': 'application/json' };
}

export async function loadDemo(): Promise<void> {
  try {
    const res = await fetch('/demo/api', { headers: headers() });
    if (!res.ok) {
      state.set({ available: false, clusters: [], message: '' });
      return;
    }
    const body = await res.json();
    state.update((s) => ({ ...s, available: true, clusters: body.clusters ?? [] }));
  } catch {
    state.set({ available: false, clusters: [], message: '' });
  }
}

export async function runDemoAction(cluster: string, action: DemoAction): Promise<void> {
  state.update((s) => ({ ...s, message: `${action} ${cluster}…` }));
  try {
    const res = await fetch('/demo/api', { method: 'POST', headers: headers(), body: JSON.stringify({ cluster, action }) });
    const body = await res.json().catch(() => ({}));
    state.update((s) => ({ ...s, message: res.ok ? `${action} ${cluster}: done` : `${action} ${cluster}: ${body.error ?? res.status}` }));
    await loadDemo();
  } catch (e) {
    state.update((s) => ({ ...s, message: `${action} ${cluster}: ${(e as Error).message}` }));
  }
}
