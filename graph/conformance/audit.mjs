// Runs the graphql-http server audits (GraphQL over HTTP spec conformance)
// against a running fleetgraph server and prints one JSON line per audit,
// then a summary line. Exits 1 if any MUST audit fails.
//
//   node audit.mjs <url> <bearer token>
import { serverAudits } from 'graphql-http';

const [url, token] = process.argv.slice(2);
if (!url || !token) {
  console.error('usage: node audit.mjs <url> <bearer token>');
  process.exit(2);
}

// Every request carries the token: fleetgraph answers 401 to anonymous
// requests, which is not what the audits are about.
const fetchFn = (input, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set('authorization', `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};

const counts = { MUST: { ok: 0, fail: 0 }, SHOULD: { ok: 0, fail: 0 }, MAY: { ok: 0, fail: 0 } };
let mustFailed = false;
for (const audit of serverAudits({ url, fetchFn })) {
  const result = await audit.fn();
  const level = audit.name.split(' ')[0];
  const line = { id: result.id, name: result.name, status: result.status };
  if (result.status !== 'ok') {
    line.reason = result.reason;
    if (result.response) {
      line.httpStatus = result.response.status;
      line.contentType = result.response.headers.get('content-type');
    }
    counts[level].fail++;
    if (level === 'MUST') mustFailed = true;
  } else {
    counts[level].ok++;
  }
  console.log(JSON.stringify(line));
}
console.log(JSON.stringify({ summary: counts }));
process.exit(mustFailed ? 1 : 0);
