// The dashboard's browser test: real Chromium (Debian's) driven by
// playwright-core against a running `fleetgraph demo`, started and checked
// by cmd/fleetgraph's TestDemo. Every request to a host other than the
// server is blocked and reported. Each step saves a screenshot in OUT_DIR
// and runs axe-core on the page.
//
// Environment: FLEETGRAPH_URL, FLEETGRAPH_TOKENS ({"admin": ..., "alice":
// ..., "bob": ...}), OUT_DIR. It asks the Go harness to change a cluster
// behind fleetgraph's back with a line "@@create <cluster> <namespace>
// <name,...>" on stdout, and waits for "@@ok" on stdin.
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const base = process.env.FLEETGRAPH_URL;
const tokens = JSON.parse(process.env.FLEETGRAPH_TOKENS);
const outDir = process.env.OUT_DIR;
mkdirSync(outDir, { recursive: true });
const serverHost = new URL(base).host;
const axeSource = readFileSync(join(here, '..', 'node_modules', 'axe-core', 'axe.min.js'), 'utf8');

const failures = [];
const blocked = [];
const pageErrors = [];
const cspViolations = [];
let shot = 0;

function fail(msg) {
  failures.push(msg);
  console.log(`FAIL: ${msg}`);
}
function check(cond, msg) {
  if (!cond) fail(msg);
  return cond;
}

// --- talking to the Go harness ---
const stdinLines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function harness(line) {
  console.log(`@@${line}`);
  const { value } = await stdinLines.next();
  if (value !== '@@ok') throw new Error(`harness answered ${value} to ${line}`);
}

// --- the API, as each user, for comparisons ---
async function api(user, query, variables = {}) {
  const res = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${tokens[user]}` },
    body: JSON.stringify({ query, variables }),
  });
  const body = await res.json();
  if (body.errors?.length) throw new Error(`${user}: ${body.errors[0].message}`);
  return body.data;
}
async function allObjects(user, filter, order = { field: 'NAME', direction: 'ASC' }) {
  const rows = [];
  let after = null;
  for (;;) {
    const d = await api(user, `query($f: ObjectFilter, $o: ObjectOrder, $a: String) {
      objects(filter: $f, orderBy: $o, first: 1000, after: $a) {
        pageInfo { hasNextPage endCursor }
        edges { node { id cluster namespace kind group name status message createdAt updatedAt labels { key value } } }
      } }`, { f: filter, o: order, a: after });
    rows.push(...d.objects.edges.map((e) => e.node));
    if (!d.objects.pageInfo.hasNextPage) return rows;
    after = d.objects.pageInfo.endCursor;
  }
}
async function demo(cluster, action) {
  const res = await fetch(`${base}/demo/api`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${tokens.admin}` },
    body: JSON.stringify({ cluster, action }),
  });
  if (!res.ok) throw new Error(`demo ${action} ${cluster}: ${res.status} ${await res.text()}`);
}

// --- the browser ---
const browser = await chromium.launch({
  executablePath: join(here, 'chromium.sh'),
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-default-apps', '--disable-extensions'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, acceptDownloads: true });
await context.route('**/*', (route) => {
  const url = new URL(route.request().url());
  if (url.host !== serverHost && url.protocol !== 'data:' && url.protocol !== 'blob:') {
    blocked.push(url.href);
    return route.abort('blockedbyclient');
  }
  return route.continue();
});
const page = await context.newPage();
page.on('pageerror', (e) => pageErrors.push(e.message));
page.on('console', (m) => {
  if (/Content Security Policy/i.test(m.text())) cspViolations.push(m.text());
});
page.on('websocket', (ws) => {
  if (new URL(ws.url()).host !== serverHost) blocked.push(ws.url());
});

async function step(name) {
  shot++;
  const file = join(outDir, `${String(shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  // Evaluated through the DevTools protocol, which the page's CSP (no
  // inline scripts) does not govern, unlike an injected <script>.
  await page.evaluate(axeSource);
  const result = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' ')) }));
  });
  for (const v of result) {
    if (v.impact === 'serious' || v.impact === 'critical') fail(`axe (${name}): ${v.impact} ${v.id}: ${v.help} at ${v.nodes.join('; ')}`);
  }
  console.log(`@@step ${name} (${result.length} minor axe findings)`);
}

// table waits until the object table shows the view (path and query).
async function table(view) {
  await page.locator(`table[data-view="${view}"]`).waitFor({ timeout: 20_000 });
  return page.locator('table[data-testid="objects"] tbody tr').evaluateAll((trs) => trs.map((tr) => tr.dataset.id));
}
function currentView() {
  const u = new URL(page.url());
  return u.pathname + u.search;
}
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

try {
  // 1. Log in as alice.
  const t0 = Date.now();
  await page.goto(`${base}/`);
  await page.getByLabel('Bearer token').waitFor();
  const firstRender = Date.now() - t0;
  await step('login');
  await page.getByLabel('Bearer token').fill(tokens.alice);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByTestId('viewer').getByText('alice').waitFor();
  await page.locator('[data-testid="clusters"] tbody tr[data-cluster]').first().waitFor();
  const shownClusters = await page.locator('[data-testid="clusters"] tbody tr[data-cluster]').evaluateAll((trs) => trs.map((tr) => tr.dataset.cluster));
  const apiClusters = (await api('alice', '{ clusters { name } }')).clusters.map((c) => c.name);
  check(same(shownClusters, apiClusters), `alice's fleet page shows ${shownClusters}, the API ${apiClusters}`);
  const sessionToken = await page.evaluate(() => [sessionStorage.getItem('fleetgraph.token'), localStorage.length]);
  check(sessionToken[0] === tokens.alice && sessionToken[1] === 0, `token storage: session ${sessionToken[0] ? 'set' : 'unset'}, local storage has ${sessionToken[1]} keys`);
  await step('fleet');
  await page.evaluate(() => {
    window.__sameDocument = true;
  });

  // 2. Exactly the objects the API shows alice, none of bob's. Churn pods
  // come and go, so both sides leave them out.
  const steady = '?labels=app%21%3Dchurn&first=250';
  await page.getByRole('link', { name: 'Objects', exact: true }).click();
  await table('/objects');
  await page.goto(`${base}/objects${steady}`);
  const aliceIds = await table(`/objects${steady}`);
  const apiAlice = await allObjects('alice', { labelSelector: 'app!=churn' });
  check(aliceIds.length > 0 && same([...aliceIds].sort(), apiAlice.map((o) => o.id).sort()), `alice's table has ${aliceIds.length} objects, the API ${apiAlice.length}`);
  const total = Number((await page.getByTestId('total').textContent()).replaceAll(',', ''));
  check(total === apiAlice.length, `alice's total says ${total}, the API ${apiAlice.length}`);
  const bobOnly = (await allObjects('bob', {})).filter((o) => !apiAlice.some((a) => a.id === o.id));
  check(bobOnly.length > 0, 'bob sees objects alice does not (the demo grants them)');
  check(!bobOnly.some((o) => aliceIds.includes(o.id)), "alice's table shows one of bob's objects");
  await step('objects-alice');

  // 3. Filter, facet, sort, page, reload, back.
  await page.goto(`${base}/objects`);
  await table('/objects');
  await page.locator('[data-facet="status"] label', { hasText: 'UNHEALTHY' }).locator('input').click();
  let ids = await table('/objects?status=UNHEALTHY');
  // Churn flips pods between healthy and not, so the rows are checked as
  // shown rather than against a later answer of the API.
  const statuses = await page.locator('table[data-testid="objects"] tbody tr td:first-child').allTextContents();
  check(ids.length > 0 && statuses.every((s) => s.trim() === 'UNHEALTHY'), `the UNHEALTHY facet shows ${statuses}`);
  await page.locator('[data-facet="cluster"] label', { hasText: 'west' }).locator('input').click();
  ids = await table('/objects?cluster=west&status=UNHEALTHY');
  check(ids.every((id) => id.startsWith('west/')), 'the west facet shows rows of other clusters');
  await page.getByLabel('Name contains').fill('pod');
  await page.getByRole('button', { name: 'Apply' }).click();
  ids = await table('/objects?cluster=west&status=UNHEALTHY&name=pod');
  await step('filtered');
  await page.getByRole('button', { name: 'Namespace' }).click();
  await table('/objects?cluster=west&status=UNHEALTHY&name=pod&sort=NAMESPACE');
  await page.getByRole('button', { name: 'Namespace' }).click();
  ids = await table('/objects?cluster=west&status=UNHEALTHY&name=pod&sort=NAMESPACE&dir=DESC');
  const namespaces = await page.locator('table[data-testid="objects"] tbody tr td:nth-child(4)').allTextContents();
  check(ids.length > 1 && namespaces.every((ns, i) => i === 0 || namespaces[i - 1] >= ns), `namespaces not in descending order: ${namespaces}`);
  check((await page.locator('th[aria-sort="descending"]').textContent()).includes('Namespace'), 'aria-sort does not mark the sorted column');
  await step('sorted');

  const paged = '/objects?labels=app%21%3Dchurn&first=25';
  await page.goto(`${base}${paged}`);
  const page1 = await table(paged);
  await page.getByRole('button', { name: 'Next page' }).click();
  await page.waitForURL(/after=/);
  const page2View = currentView();
  const page2 = await table(page2View);
  const byName = (await allObjects('alice', { labelSelector: 'app!=churn' })).map((o) => o.id);
  check(same(page1, byName.slice(0, 25)), "page 1 is not the API's first page of 25");
  check(same(page2, byName.slice(25, 50)), "page 2 is not the API's second page of 25");
  check(page2View.includes('page=2'), `page 2's URL is ${page2View}`);
  await step('page-2');
  await page.reload();
  const reloaded = await table(page2View);
  check(currentView() === page2View && same(reloaded, page2), 'reload did not land on the same page');
  await page.goBack();
  check(same(await table(paged), page1), 'back did not return to page 1');
  await page.goForward();
  await table(page2View);
  await page.getByRole('button', { name: 'Previous page' }).click();
  check(same(await table(paged), page1), 'Previous page did not return to page 1');

  // 4. CSV export equals the API.
  await page.goto(`${base}/objects?cluster=east&labels=app%21%3Dchurn`);
  await table('/objects?cluster=east&labels=app%21%3Dchurn');
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: 'Export CSV' }).click()]);
  const csvPath = join(outDir, 'export.csv');
  await download.saveAs(csvPath);
  const csvRows = parseCSV(readFileSync(csvPath, 'utf8'));
  const header = csvRows.shift();
  const want = await allObjects('alice', { clusters: ['east'], labelSelector: 'app!=churn' });
  check(header.join(',') === 'cluster,namespace,kind,group,name,status,message,createdAt,updatedAt,labels', `CSV header ${header}`);
  const key = (r) => [r.cluster, r.namespace ?? '', r.kind, r.group, r.name].join('/');
  const csvKeys = csvRows.map((r) => [r[0], r[1], r[2], r[3], r[4]].join('/'));
  check(csvRows.length === want.length && same(csvKeys, want.map(key)), `CSV has ${csvRows.length} rows, the API ${want.length}, or another order`);
  const labelsOf = (o) => o.labels.map((l) => `${l.key}=${l.value}`).join(';');
  check(csvRows.every((r, i) => !want[i] || (r[7] === (want[i].createdAt ?? '') && r[9] === labelsOf(want[i]))), 'CSV cells differ from the API');
  await step('exported');

  // 5. Detail and "why can I see this?".
  const first = page.locator('table[data-testid="objects"] tbody tr').first();
  const name = await first.locator('td').nth(1).textContent();
  await first.getByRole('link', { name: `Why can I see ${name.trim()}?` }).click();
  await page.getByTestId('why-summary').waitFor();
  check((await page.getByTestId('why-summary').textContent()).includes('alice-reads-team-a'), 'why does not name the binding alice-reads-team-a');
  check((await page.getByTestId('why').textContent()).includes('namespace-reader'), 'why does not name the role namespace-reader');
  await page.getByTestId('manifest').locator('pre').waitFor();
  check((await page.getByTestId('manifest').textContent()).includes(`name: ${name.trim()}`), 'the manifest does not show the object');
  await step('detail-why');
  // An object of a cluster alice sees nothing in: FORBIDDEN, and why says so.
  await page.goto(`${base}/object?cluster=north&kind=Pod&namespace=team-a-0&name=pod-1`);
  await page.getByTestId('why-summary').waitFor();
  await page.locator('[data-testid="manifest"] [data-code]').waitFor();
  check((await page.locator('[data-testid="manifest"] [data-code]').getAttribute('data-code')) === 'FORBIDDEN', 'north pod: not FORBIDDEN');
  check((await page.getByTestId('why-summary').textContent()).includes('cannot see'), 'north pod: why does not say alice cannot see it');
  await step('detail-forbidden');

  // 6. Outage: stop west and cut east together; one toast names both, and
  // survives navigation; objects created in east meanwhile appear after
  // the reconnect without a reload.
  await page.goto(`${base}/objects?cluster=east&name=outage`);
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await table('/objects?cluster=east&name=outage');
  await demo('west', 'stop');
  await demo('east', 'cut');
  await page.locator('.toast[data-kind="outage"]').waitFor({ timeout: 60_000 });
  await page.waitForFunction(() => document.querySelector('.toast')?.textContent.includes('east') && document.querySelector('.toast')?.textContent.includes('west'), null, { timeout: 90_000 });
  const toastId = await page.locator('.toast').getAttribute('data-toast-id');
  check((await page.locator('.toast').count()) === 1, 'more than one toast for one outage');
  await harness(`create east team-a-0 outage-1,outage-2`);
  await step('outage');
  await page.getByRole('link', { name: 'Fleet' }).click();
  await page.locator('[data-testid="clusters"] tr[data-cluster="west"] [data-testid="state"]', { hasText: 'DISCONNECTED' }).waitFor({ timeout: 30_000 });
  check((await page.locator('.toast').count()) === 1 && (await page.locator('.toast').getAttribute('data-toast-id')) === toastId, 'the toast did not survive navigation');
  await step('outage-fleet');
  await page.goBack();
  await table('/objects?cluster=east&name=outage');
  check((await page.locator('.toast').count()) === 1 && (await page.locator('.toast').getAttribute('data-toast-id')) === toastId, 'the toast did not survive going back');
  check((await page.getByTestId('stale-clusters').textContent()).includes('east'), 'east is not marked stale');
  await demo('west', 'start');
  await demo('east', 'heal');
  await page.locator(`.toast[data-kind="reconnected"][data-toast-id="${toastId}"]`).waitFor({ timeout: 120_000 });
  await step('reconnected');
  await page.locator('.toast').waitFor({ state: 'detached', timeout: 30_000 });
  await page.locator('table[data-testid="objects"] tbody tr[data-id="east//Pod/team-a-0/outage-2"]').waitFor({ timeout: 60_000 });
  await page.locator('table[data-testid="objects"] tbody tr[data-id="east//Pod/team-a-0/outage-1"]').waitFor({ timeout: 60_000 });
  check(await page.evaluate(() => window.__sameDocument === true), 'the page reloaded');
  await step('after-outage');

  // 7. GraphiQL runs a query with the dashboard's credentials.
  await page.goto(`${base}/graphiql`);
  // The button is there before the editors: GraphiQL loads CodeMirror
  // lazily and runs nothing until its query and response editors exist.
  await page.locator('.graphiql-query-editor .CodeMirror').waitFor();
  await page.locator('.graphiql-response .CodeMirror').waitFor();
  await page.locator('.graphiql-execute-button').click();
  await page.locator('.graphiql-response').getByText('"username": "alice"').waitFor({ timeout: 30_000 });
  check(await page.evaluate(() => !Object.keys(localStorage).some((k) => localStorage.getItem(k).includes('Bearer'))), 'GraphiQL stored the token in local storage');
  await step('graphiql');

  console.log(`@@timing first_render_ms=${firstRender}`);
} catch (e) {
  fail(`${e.message}`);
  await page.screenshot({ path: join(outDir, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
check(blocked.length === 0, `requests to other hosts: ${blocked.join(', ')}`);
check(pageErrors.length === 0, `page errors: ${pageErrors.join(' | ')}`);
check(cspViolations.length === 0, `CSP violations: ${cspViolations.join(' | ')}`);
writeFileSync(join(outDir, 'result.json'), JSON.stringify({ failures, blocked, pageErrors }, null, 2));
console.log(failures.length ? `${failures.length} failures` : 'browser test passed');
process.exit(failures.length ? 1 : 0);

// parseCSV reads RFC 4180 CSV.
function parseCSV(text) {
  const rows = [];
  let row = [], field = '', quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ',') { row.push(field); field = ''; }
    else if (c === '\r') { /* part of \r\n */ }
    else if (c === '\n') { row.push(field); rows.push(row); row = []; field = ''; }
    else field += c;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows;
}
