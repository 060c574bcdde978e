import { get } from 'svelte/store';
import { describe, expect, it } from 'vitest';
import { initialToasts, reduce, serverLink, type LinkEvent, type ToastState } from './logic';
import { createToastStore } from './store';

const ev = (cluster: string, state: LinkEvent['state'], at = '2026-01-01T00:00:00Z'): LinkEvent => ({ cluster, state, at });

function run(events: LinkEvent[]): ToastState {
  return events.reduce(reduce, initialToasts);
}

describe('toast logic (docs/design.md: one toast per outage)', () => {
  it('one outage in, one toast out, however many events repeat it', () => {
    const s = run([ev('east', 'DISCONNECTED'), ev('east', 'CONNECTING'), ev('east', 'DISCONNECTED'), ev('east', 'CONNECTING')]);
    expect(s.toast?.kind).toBe('outage');
    expect(s.toast?.id).toBe(1);
    expect(s.toast?.down).toEqual(['east']);
    expect(s.toast?.message).toContain('east is unreachable');
  });

  it('clusters lost together share one toast that names them all', () => {
    const s = run([ev('east', 'DISCONNECTED'), ev('west', 'DISCONNECTED'), ev('edge', 'DISCONNECTED')]);
    expect(s.toast?.id).toBe(1);
    expect(s.toast?.message).toContain('east, west and edge are unreachable');
  });

  it('stays an outage until every lost cluster is back, then says reconnected', () => {
    let s = run([ev('east', 'DISCONNECTED'), ev('west', 'DISCONNECTED'), ev('east', 'CONNECTED')]);
    expect(s.toast?.kind).toBe('outage');
    expect(s.toast?.down).toEqual(['west']);
    s = reduce(s, ev('west', 'DEGRADED'));
    expect(s.toast?.kind).toBe('reconnected');
    expect(s.toast?.id).toBe(1);
    expect(s.toast?.message).toContain('Reconnected to east and west');
  });

  it('ignores clusters that connect for the first time or were never lost', () => {
    const s = run([ev('east', 'CONNECTING'), ev('east', 'CONNECTED'), ev('west', 'DEGRADED')]);
    expect(s.toast).toBeNull();
  });

  it('a new outage after a reconnect is a new toast', () => {
    const s = run([ev('east', 'DISCONNECTED'), ev('east', 'CONNECTED'), ev('west', 'DISCONNECTED')]);
    expect(s.toast?.id).toBe(2);
    expect(s.toast?.kind).toBe('outage');
    expect(s.toast?.lost).toEqual(['west']);
  });

  it('covers the dashboard losing the server itself', () => {
    const s = run([ev(serverLink, 'DISCONNECTED')]);
    expect(s.toast?.message).toContain('the fleetgraph server is unreachable');
  });
});

describe('toast store', () => {
  it('removes "reconnected" after its timer, never an outage', () => {
    const timers: Array<() => void> = [];
    const store = createToastStore((fn) => timers.push(fn));
    store.push(ev('east', 'DISCONNECTED'));
    expect(timers).toHaveLength(0);
    store.push(ev('east', 'CONNECTED'));
    expect(get(store)?.kind).toBe('reconnected');
    expect(timers).toHaveLength(1);
    timers[0]();
    expect(get(store)).toBeNull();
  });

  it('a late timer does not remove the toast of a newer outage', () => {
    const timers: Array<() => void> = [];
    const store = createToastStore((fn) => timers.push(fn));
    store.push(ev('east', 'DISCONNECTED'));
    store.push(ev('east', 'CONNECTED'));
    store.push(ev('east', 'DISCONNECTED'));
    timers[0]();
    expect(get(store)?.kind).toBe('outage');
    expect(get(store)?.id).toBe(2);
  });
});
