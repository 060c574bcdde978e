// The bearer token lives in session storage, for this tab only: never in
// local storage, where it would outlive the tab and reach every other one.
const key = 'fleetgraph.token';

export function loadToken(): string {
  try {
    return sessionStorage.getItem(key) ?? '';
  } catch {
    return '';
  }
}

export function saveToken(token: string): void {
  if (token) sessionStorage.setItem(key, token);
  else sessionStorage.removeItem(key);
}
