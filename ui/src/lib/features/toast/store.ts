// The toast store: the pure logic of logic.ts plus the timer that removes a
// "reconnected" toast. The connection store feeds it every transition.
import { derived, writable, type Readable } from 'svelte/store';
import { dismiss, initialToasts, reduce, type LinkEvent, type Toast, type ToastState } from './logic';

/** How long "reconnected" stays on screen. */
export const reconnectedFor = 4000;

export interface ToastStore extends Readable<Toast | null> {
  push(ev: LinkEvent): void;
  reset(): void;
}

export function createToastStore(after: (fn: () => void, ms: number) => unknown = setTimeout): ToastStore {
  const state = writable<ToastState>(initialToasts);
  const toast = derived(state, (s) => s.toast);
  return {
    subscribe: toast.subscribe,
    push(ev: LinkEvent) {
      state.update((s) => {
        const next = reduce(s, ev);
        const t = next.toast;
        if (t && t.kind === 'reconnected' && s.toast?.kind !== 'reconnected') {
          after(() => state.update((cur) => dismiss(cur, t.id)), reconnectedFor);
        }
        return next;
      });
    },
    reset() {
      state.set(initialToasts);
    },
  };
}

/** The tab's toasts. */
export const toasts = createToastStore();
