// Browser timings of the dashboard on the 1M-object fleet served by
// bigfleet: first render of the object table after sign-in, and the time
// from a filter change (a facet click) to the rendered table, measured in
// the page from the click to the frame after the table shows the new view.
// Each facet is clicked on, then off again; the table it times must show
// the count the facet showed before the click (on) or the total it showed
// before (off), or the run fails. Prints one line: "ui: first_render_ms=...
// filter_p50_ms=... filter_p95_ms=...". make bench-ui runs it through
// bigfleet -runs, which prints the medians of several runs.
import { chromium } from 'playwright-core';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const base = process.env.FLEETGRAPH_URL;
const token = process.env.FLEETGRAPH_TOKEN;
const rounds = Number(process.env.ROUNDS || 20);

const browser = await chromium.launch({
  executablePath: join(here, 'chromium.sh'),
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  await page.goto(`${base}/`);
  await page.evaluate((t) => sessionStorage.setItem('fleetgraph.token', t), token);
  const t0 = Date.now();
  await page.goto(`${base}/objects`);
  await page.locator('table[data-view="/objects"]').waitFor({ timeout: 60_000 });
  const firstRender = Date.now() - t0;

  const facets = [['status', 'UNHEALTHY'], ['status', 'PROGRESSING'], ['kind', 'Pod'], ['cluster', 'cluster-007']];
  const samples = [];
  let unfiltered = 0;
  for (let r = 0; r < rounds; r++) {
    for (const [facet, value] of facets) {
      for (let on = 0; on < 2; on++) {
        const res = await page.evaluate(async ([facet, value]) => {
          const num = (el) => Number((el?.textContent ?? '').replace(/[^0-9]/g, ''));
          const table = document.querySelector('table[data-testid="objects"]');
          const before = table.dataset.view;
          const label = [...document.querySelectorAll(`[data-facet="${facet}"] label`)].find((l) => l.querySelector('.value')?.textContent === value);
          if (!label) throw new Error(`no ${facet} facet ${value}`);
          const input = label.querySelector('input');
          const expect = input.checked ? null : num(label.querySelector('.count'));
          const totalBefore = num(document.querySelector('[data-testid="total"]'));
          const t = performance.now();
          input.click();
          await new Promise((resolve) => {
            const check = () => {
              const v = table.dataset.view;
              if (v && v !== before) requestAnimationFrame(() => resolve());
              else requestAnimationFrame(check);
            };
            check();
          });
          return { ms: performance.now() - t, expect, totalBefore, total: num(document.querySelector('[data-testid="total"]')) };
        }, [facet, value]);
        // On: the facet's count. Off: the total before it was turned on.
        const want = on === 0 ? res.expect : unfiltered;
        if (on === 0) unfiltered = res.totalBefore;
        if (want === null || res.total !== want || res.total === 0) {
          throw new Error(`${facet} ${value} ${on === 0 ? 'on' : 'off'}: the table shows ${res.total} objects, want ${want}`);
        }
        samples.push(res.ms);
      }
    }
  }
  samples.sort((a, b) => a - b);
  const q = (p) => samples[Math.min(samples.length - 1, Math.floor(p * samples.length))];
  console.log(`ui: first_render_ms=${firstRender} filter_p50_ms=${q(0.5).toFixed(0)} filter_p95_ms=${q(0.95).toFixed(0)} filter_max_ms=${samples[samples.length - 1].toFixed(0)} samples=${samples.length}`);
} finally {
  await browser.close();
}
