// Subscribes to objectChanges with the graphql-ws client (protocol
// graphql-transport-ws) and prints each event's data as one JSON line,
// after a first line {"ready":true} once the connection is acknowledged.
// Exits 0 after <count> events, 1 on any error or after 30 s.
//
//   node subscribe.mjs <ws url> <bearer token> <count>
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';

const [url, token, countArg] = process.argv.slice(2);
const count = Number(countArg);
if (!url || !token || !(count > 0)) {
  console.error('usage: node subscribe.mjs <ws url> <bearer token> <count>');
  process.exit(2);
}

const timer = setTimeout(() => {
  console.error('timed out waiting for events');
  process.exit(1);
}, 30_000);

const client = createClient({
  url,
  webSocketImpl: WebSocket,
  connectionParams: { Authorization: `Bearer ${token}` },
  retryAttempts: 0,
  on: { connected: () => console.log(JSON.stringify({ ready: true })) },
});

let received = 0;
const dispose = client.subscribe(
  { query: 'subscription { objectChanges { type cursor object { id name status } } }' },
  {
    next: (result) => {
      if (result.errors) {
        console.error(JSON.stringify(result.errors));
        process.exit(1);
      }
      console.log(JSON.stringify(result.data));
      if (++received === count) {
        clearTimeout(timer);
        dispose();
        client.dispose().then(() => process.exit(0));
      }
    },
    error: (err) => {
      console.error('subscription error:', err instanceof Error ? err.message : JSON.stringify(err));
      process.exit(1);
    },
    complete: () => {},
  },
);
