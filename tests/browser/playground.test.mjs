// tests/browser/playground.test.mjs: the playground page (web/, served by `polylora serve` at /) in
// headless Chromium against the real server on the qwen3-moe-tiny fixture and its three adapters.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { ADAPTERS, MODEL, metric, metrics, startServer } from '../http/lib/server.mjs';
import { WEB_ROOT, launch } from './lib/browser.mjs';

const LORAS = ['attn=' + ADAPTERS.attn, 'experts=' + ADAPTERS.experts, 'perexp=' + ADAPTERS.perexp];
const MAX_MODEL_LEN = 64;

async function openPage(browser, url, requests) {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('request', (r) => requests.push(r.url()));
  page.on('pageerror', (e) => requests.push(`pageerror: ${e.message}`));
  await page.goto(url + '/');
  return page;
}

async function setSampling(page, { temperature, maxTokens }) {
  await page.locator('#temperature').fill(String(temperature));
  await page.locator('#max-tokens').fill(String(maxTokens));
}

describe('playground', () => {
  let server;
  let browser;
  let page;
  const requests = [];

  before(async () => {
    server = await startServer(['--model', MODEL, '--lora-modules', ...LORAS, '--max-model-len', String(MAX_MODEL_LEN),
      '--web-root', WEB_ROOT]);
    browser = await launch();
    page = await openPage(browser, server.url, requests);
  });
  after(async () => {
    await browser?.close();
    await server?.stop();
  });

  test('the page lists every served adapter (and the base model)', async () => {
    const served = (await (await fetch(`${server.base}/models`)).json()).data.map((m) => m.id);
    assert.equal(served.length, 4);
    const chatOptions = page.locator('#chat-model option');
    await assert.doesNotReject(chatOptions.first().waitFor({ state: 'attached' }));
    const values = await chatOptions.evaluateAll((os) => os.map((o) => o.value));
    assert.deepEqual([...values].sort(), [...served].sort());
    for (const name of ['attn', 'experts', 'perexp'])
      assert.equal(await page.locator(`#chat-model option[value="${name}"]`).textContent(), name);
    assert.match(await page.locator(`#chat-model option[value="${MODEL}"]`).textContent(), /base model/);
    // Side-by-side pickers get the same list; the key field stays hidden without --api-key.
    await page.locator('#tab-compare').click();
    const pickers = page.locator('#compare-pickers select');
    assert.equal(await pickers.count(), 2);
    const pickerValues = await pickers.first().locator('option').evaluateAll((os) => os.map((o) => o.value));
    assert.deepEqual([...pickerValues].sort(), [...served].sort());
    assert.equal(await page.locator('#key-form').isVisible(), false);
    await page.locator('#tab-chat').click();
  });

  test('a chat with one adapter streams an answer', async () => {
    await page.locator('#chat-model').selectOption('experts');
    await setSampling(page, { temperature: 0, maxTokens: 32 });
    // Record every change of the answer's text, to see it grow piece by piece.
    await page.evaluate(() => {
      window.__growth = [];
      new MutationObserver(() => {
        const body = document.querySelector('#chat-log .message.assistant:last-child .body');
        if (body) window.__growth.push(body.textContent.length);
      }).observe(document.getElementById('chat-log'), { childList: true, subtree: true, characterData: true });
    });
    const sse = page.waitForResponse((r) => r.url().endsWith('/v1/chat/completions'));
    await page.locator('#chat-input').fill('Tell me a story about a cat.');
    await page.locator('#chat-send').click();
    const response = await sse;
    assert.equal(response.status(), 200);
    assert.match(response.headers()['content-type'], /text\/event-stream/);
    const answer = page.locator('#chat-log .message.assistant').last();
    await answer.locator('.stats', { hasText: 'tok/s' }).waitFor();
    const text = await answer.locator('.body').textContent();
    assert.ok(text.length > 0, 'the answer is empty');
    assert.equal(await answer.getAttribute('data-model'), 'experts');
    const stats = await answer.locator('.stats').textContent();
    assert.match(stats, /TTFT \d+ ms · [\d.]+ tok\/s · 32 tokens · length/);
    // The stream arrived as many events, and the page showed the text growing before it ended.
    const events = (await response.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
    assert.ok(events.length >= 32, `only ${events.length} SSE events`);
    const growth = await page.evaluate(() => window.__growth.filter((n) => n > 0));
    const partial = new Set(growth.filter((n) => n < text.length));
    assert.ok(partial.size >= 1, `the text never showed partially: ${JSON.stringify(growth)} (final ${text.length})`);
    // Finished: the composer is ready again, the user's message is in the log.
    assert.equal(await page.locator('#chat-send').isEnabled(), true);
    assert.equal(await page.locator('#chat-stop').isEnabled(), false);
    assert.equal(await page.locator('#chat-log .message.user').last().textContent(), 'Tell me a story about a cat.');
  });

  test('side by side: two adapters answer one prompt in two columns, differently', async () => {
    await page.locator('#tab-compare').click();
    await setSampling(page, { temperature: 0, maxTokens: 16 });
    const pickers = page.locator('#compare-pickers select');
    await pickers.nth(0).selectOption('attn');
    await pickers.nth(1).selectOption('perexp');
    await page.locator('#compare-input').fill('Tell me a story about a cat.');
    await page.locator('#compare-send').click();
    const columns = page.locator('#compare-columns .column');
    assert.equal(await columns.count(), 2);
    for (let i = 0; i < 2; ++i) await columns.nth(i).locator('.stats', { hasText: 'tok/s' }).waitFor();
    assert.deepEqual(await columns.evaluateAll((cs) => cs.map((c) => c.dataset.model)), ['attn', 'perexp']);
    const answers = await columns.locator('.output').allTextContents();
    assert.ok(answers.every((a) => a.length > 0), JSON.stringify(answers));
    assert.notEqual(answers[0], answers[1]);
    for (const s of await columns.locator('.stats').allTextContents()) assert.match(s, /TTFT \d+ ms · [\d.]+ tok\/s/);
    // Up to four columns, the base model among them, run concurrently.
    await page.locator('#compare-add').click();
    await page.locator('#compare-add').click();
    assert.equal(await pickers.count(), 4);
    assert.equal(await page.locator('#compare-add').isEnabled(), false);
    await pickers.nth(2).selectOption(MODEL);
    await pickers.nth(3).selectOption('experts');
    await page.locator('#compare-send').click();
    assert.equal(await columns.count(), 4);
    for (let i = 0; i < 4; ++i) await columns.nth(i).locator('.stats', { hasText: 'tok/s' }).waitFor();
    const four = await columns.locator('.output').allTextContents();
    assert.equal(four[0], answers[0]);
    assert.equal(four[1], answers[1]);
    assert.equal(new Set(four).size, 4, JSON.stringify(four));
  });

  test("a server error (prompt longer than --max-model-len) appears on the page", async () => {
    await page.locator('#tab-chat').click();
    await page.locator('#chat-input').fill('the cat sat on the mat and '.repeat(40));
    await page.locator('#chat-send').click();
    const error = page.locator('#chat-log .message.assistant.failed .error-text').last();
    await error.waitFor();
    const message = await error.textContent();
    assert.match(message, /^400/);
    assert.match(message, new RegExp(`maximum context length is ${MAX_MODEL_LEN} tokens`));
    assert.equal(await page.locator('#chat-send').isEnabled(), true);
    // In side-by-side mode each column shows its own error.
    await page.locator('#tab-compare').click();
    await page.locator('#compare-input').fill('the cat sat on the mat and '.repeat(40));
    await page.locator('#compare-send').click();
    const errors = page.locator('#compare-columns .column.failed .error-text');
    await errors.nth(3).waitFor();
    for (const m of await errors.allTextContents()) assert.match(m, /maximum context length is 64 tokens/);
  });

  test('the metrics panel shows the live figures from /metrics', async () => {
    // The panel polls every second: it soon shows what /metrics says now (nothing is running any more).
    const text = await metrics(server.url);
    const requestsOf = (adapter) => metric(text, 'polylora:adapter_requests_total', { adapter });
    assert.ok(requestsOf('experts') >= 2, text);  // the chat and the four-column run
    await page.waitForFunction(
      (want) => [...document.querySelectorAll('#m-adapters tr')].some(
        (tr) => tr.cells[0]?.textContent === 'experts' && tr.cells[1]?.textContent === String(want)),
      requestsOf('experts'));
    for (const adapter of ['attn', 'perexp', 'base']) {
      const row = page.locator('#m-adapters tr', { has: page.locator('td', { hasText: new RegExp(`^${adapter}$`) }) });
      assert.equal(await row.locator('td.num').textContent(), String(requestsOf(adapter)), adapter);
    }
    await page.waitForFunction(() => ['m-running', 'm-waiting'].every((id) => document.getElementById(id).textContent === '0'));
    assert.match(await page.locator('#m-kv').textContent(), /^\d+\.\d %$/);
    assert.equal(await page.locator('#metrics-error').isVisible(), false);
  });

  test('nothing was fetched from anywhere but the server, and the page raised no errors', () => {
    const foreign = requests.filter((u) => !u.startsWith(server.url + '/') && !u.startsWith('data:'));
    assert.deepEqual(foreign, []);
    assert.ok(requests.some((u) => /\/assets\/.*\.js$/.test(u)));
  });
});

describe('playground with --api-key', () => {
  let server;
  let browser;

  before(async () => {
    server = await startServer(['--model', MODEL, '--lora-modules', LORAS[1], '--api-key', 'sesame', '--web-root',
      WEB_ROOT]);
    browser = await launch();
  });
  after(async () => {
    await browser?.close();
    await server?.stop();
  });

  test('the page loads without a key, asks for it, and works once it is given', async () => {
    const page = await openPage(browser, server.url, []);
    await page.locator('#key-form').waitFor();
    assert.match(await page.locator('#banner').textContent(), /^401.*API key/);
    await page.locator('#api-key').fill('wrong');
    await page.locator('#key-form button').click();
    await page.locator('#banner', { hasText: '401' }).waitFor();
    await page.locator('#api-key').fill('sesame');
    await page.locator('#key-form button').click();
    await page.locator('#chat-model option[value="experts"]').waitFor({ state: 'attached' });
    assert.equal(await page.locator('#key-form').isVisible(), false);
    assert.equal(await page.locator('#banner').isVisible(), false);
    await setSampling(page, { temperature: 0, maxTokens: 8 });
    await page.locator('#chat-model').selectOption('experts');
    await page.locator('#chat-input').fill('Hello');
    await page.locator('#chat-send').click();
    await page.locator('#chat-log .message.assistant .stats', { hasText: '8 tokens' }).waitFor();
  });
});

describe('without a built playground', () => {
  test('/ says how to build it; the API still works', async () => {
    const server = await startServer(['--model', MODEL, '--web-root', '/nonexistent-polylora-web']);
    try {
      const res = await fetch(server.url + '/');
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type'), /text\/html/);
      assert.match(await res.text(), /npm ci &amp;&amp; npm run build/);
      assert.equal((await fetch(server.url + '/assets/index.js')).status, 404);
      assert.equal((await fetch(server.base + '/models')).status, 200);
    } finally {
      await server.stop();
    }
  });
});

describe('playground with the built-in demo model', () => {
  test('side by side, two demo adapters give their own, different answers', async (t) => {
    if (!existsSync(new URL('../../models/demo/config.json', import.meta.url))) {
      t.skip('models/demo is not present');
      return;
    }
    const server = await startServer(['--web-root', WEB_ROOT]);  // no --model: the demo model and its adapters
    const browser = await launch();
    try {
      const page = await openPage(browser, server.url, []);
      await page.locator('#tab-compare').click();
      await setSampling(page, { temperature: 0, maxTokens: 32 });
      const pickers = page.locator('#compare-pickers select');
      await pickers.nth(0).selectOption('reverse');
      await pickers.nth(1).selectOption('upper');
      await page.locator('#compare-input').fill('the red fox sees 3 owls');
      await page.locator('#compare-send').click();
      const columns = page.locator('#compare-columns .column');
      for (let i = 0; i < 2; ++i) await columns.nth(i).locator('.stats', { hasText: 'tok/s' }).waitFor();
      const answers = (await columns.locator('.output').allTextContents()).map((a) => a.trim());
      assert.deepEqual(answers, ['owls 3 sees fox red the', 'THE RED FOX SEES 3 OWLS']);
    } finally {
      await browser.close();
      await server.stop();
    }
  });
});
