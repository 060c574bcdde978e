// Toast logic (docs/design.md: one toast per outage), as a pure function: connection events in, toasts
// out. One outage gives exactly one toast, which stays until every cluster
// lost in it is back; clusters lost while it is up join it instead of
// stacking a second toast. When the outage ends the same toast turns into
// "reconnected"; the store removes it a few seconds later.
import type { ConnectionState } from '../../graphql/types';

/** The name events use for the dashboard's own link to the fleetgraph server. */
export const serverLink = 'the fleetgraph server';

export interface Toast {
  /** One id per outage: it stays the same while the toast changes. */
  id: number;
  kind: 'outage' | 'reconnected';
  /** The clusters (or serverLink) lost in this outage, in the order they were lost. */
  lost: string[];
  /** Of those, the ones still lost. */
  down: string[];
  since: string;
  message: string;
}

export interface ToastState {
  toast: Toast | null;
  nextId: number;
}

export const initialToasts: ToastState = { toast: null, nextId: 1 };

export interface LinkEvent {
  cluster: string;
  state: ConnectionState;
  at: string;
}

const isLost = (s: ConnectionState) => s === 'DISCONNECTED';
const isBack = (s: ConnectionState) => s === 'CONNECTED' || s === 'DEGRADED';

function names(list: string[]): string {
  if (list.length <= 1) return list.join('');
  return `${list.slice(0, -1).join(', ')} and ${list[list.length - 1]}`;
}

function describe(t: Omit<Toast, 'message'>): string {
  if (t.kind === 'reconnected') {
    return `Reconnected to ${names(t.lost)}. Views are up to date.`;
  }
  const verb = t.down.length === 1 ? 'is' : 'are';
  return `Connection lost: ${names(t.down)} ${verb} unreachable. Showing last-known data; reconnecting…`;
}

function make(t: Omit<Toast, 'message'>): Toast {
  return { ...t, message: describe(t) };
}

/** reduce applies one connection event. */
export function reduce(s: ToastState, ev: LinkEvent): ToastState {
  const t = s.toast;
  const outage = t?.kind === 'outage' ? t : null;
  if (isLost(ev.state)) {
    if (outage) {
      if (outage.down.includes(ev.cluster)) return s;
      const lost = outage.lost.includes(ev.cluster) ? outage.lost : [...outage.lost, ev.cluster];
      return { ...s, toast: make({ ...outage, lost, down: [...outage.down, ev.cluster] }) };
    }
    // A new outage: its own toast, replacing a "reconnected" one still shown.
    return {
      toast: make({ id: s.nextId, kind: 'outage', lost: [ev.cluster], down: [ev.cluster], since: ev.at }),
      nextId: s.nextId + 1,
    };
  }
  if (isBack(ev.state) && outage && outage.down.includes(ev.cluster)) {
    const down = outage.down.filter((c) => c !== ev.cluster);
    if (down.length > 0) return { ...s, toast: make({ ...outage, down }) };
    return { ...s, toast: make({ ...outage, kind: 'reconnected', down }) };
  }
  return s;
}

/** dismiss removes the toast with this id if it is a "reconnected" one; an outage toast never goes by itself. */
export function dismiss(s: ToastState, id: number): ToastState {
  if (s.toast?.id === id && s.toast.kind === 'reconnected') return { ...s, toast: null };
  return s;
}
