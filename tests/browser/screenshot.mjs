// tests/browser/screenshot.mjs: the README's picture of the playground. Starts `polylora serve` on the
// built-in model (models/demo when present, else the qwen3-moe-tiny fixture) with all its adapters, sends
// one prompt side by side to up to three adapters, and saves the page.
//   node tests/browser/screenshot.mjs [OUT.png] (default docs/playground.png; PROMPT=... to change the prompt)
import path from 'node:path';
import { REPO, metric, metrics, startServer } from '../http/lib/server.mjs';
import { WEB_ROOT, launch } from './lib/browser.mjs';

const out = path.resolve(process.argv[2] ?? path.join(REPO, 'docs/playground.png'));
const prompt = process.env.PROMPT ?? 'the red fox sees 3 owls'; // in the demo model's domain (lowercase words, digits)
const maxTokens = Number(process.env.MAX_TOKENS ?? 64);

const server = await startServer(['--web-root', WEB_ROOT]);
const browser = await launch();
try {
  const models = (await (await fetch(`${server.base}/models`)).json()).data;
  const adapters = models.filter((m) => m.parent !== null).map((m) => m.id).slice(0, 3);
  if (adapters.length < 2) throw new Error(`the built-in model has ${adapters.length} adapters; need two`);
  const page = await browser.newPage({ viewport: { width: 1440, height: 620 }, deviceScaleFactor: 1 });
  await page.goto(server.url + '/');
  await page.locator('#tab-compare').click();
  await page.locator('#compare-pickers select option').first().waitFor({ state: 'attached' });
  while ((await page.locator('#compare-pickers select').count()) < adapters.length) await page.locator('#compare-add').click();
  for (const [i, a] of adapters.entries()) await page.locator('#compare-pickers select').nth(i).selectOption(a);
  await page.locator('#temperature').fill('0');
  await page.locator('#max-tokens').fill(String(maxTokens));
  await page.locator('#compare-input').fill(prompt);
  await page.locator('#compare-send').click();
  for (let i = 0; i < adapters.length; ++i)
    await page.locator('#compare-columns .column').nth(i).locator('.stats', { hasText: 'tok/s' }).waitFor({ timeout: 300_000 });
  // Let the metrics panel catch up with the requests just made.
  const want = metric(await metrics(server.url), 'polylora:adapter_requests_total', { adapter: adapters[0] });
  await page.waitForFunction(
    ([name, n]) => [...document.querySelectorAll('#m-adapters tr')].some(
      (tr) => tr.cells[0]?.textContent === name && tr.cells[1]?.textContent === String(n)),
    [adapters[0], want]);
  await page.locator('#compare-input').blur();
  await page.screenshot({ path: out, fullPage: true });
  console.log(`screenshot: ${out} (${models.find((m) => m.parent === null).id}: ${adapters.join(', ')})`);
} finally {
  await browser.close();
  await server.stop();
}
