// Loading adapters on first use (--lora-resolver-dir DIR, or vLLM's VLLM_PLUGINS=lora_filesystem_resolver
// with VLLM_LORA_RESOLVER_CACHE_DIR) and the adapter metrics (issue 17 items 3 and 5), black-box against
// `polylora serve` on qwen3-moe-tiny with its per-expert-r8 fixture adapter: a name found in DIR loads on
// its first request (and generates what `polylora generate` does with that adapter), is then listed by
// /v1/models with its residency; names not in DIR or with path syntax are 404s as vLLM's; a corrupt or
// symlinked adapter is a 400 naming the problem and the server keeps serving; concurrent first requests
// share one load; vllm:lora_requests_info has exactly vLLM's labels and a timestamp value; the
// polylora:adapter_* loads, evictions, resident counts and load-latency histogram.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  ADAPTERS, MODEL, REFERENCE_PROMPTS, metric, metrics, offlineGreedy, readSse, request, startServer, tempDir,
} from './lib/server.mjs';

const GREEDY = { temperature: 0, ignore_eos: true };

function assertError(r, status, type, pattern) {
  assert.equal(r.status, status, `expected ${status}, got ${r.status}: ${r.text}`);
  assert.ok(r.json && r.json.error, r.text);
  assert.equal(r.json.error.type, type, r.text);
  assert.equal(r.json.error.code, status, r.text);
  if (pattern) assert.match(r.json.error.message, pattern);
}

// The labels of the first sample of `name` (null when there is none) and its value.
function sample(text, name) {
  for (const line of text.split('\n')) {
    const m = /^([^\s{]+)\{([^}]*)\}\s+(\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const labels = {};
    for (const [, k, v] of m[2].matchAll(/(\w+)="([^"]*)"/g)) labels[k] = v;
    return { labels, value: Number(m[3]) };
  }
  return null;
}

function setUpDir() {
  const tmp = tempDir();
  const dir = path.join(tmp.dir, 'resolver');
  const outside = path.join(tmp.dir, 'outside');
  mkdirSync(dir);
  mkdirSync(outside);
  for (const name of ['good', 'good2', 'good3']) cpSync(ADAPTERS.perexp, path.join(dir, name), { recursive: true });
  cpSync(ADAPTERS.perexp, path.join(dir, 'bad'), { recursive: true });
  writeFileSync(path.join(dir, 'bad', 'adapter_config.json'), '{"r": 8, "lora_alpha": ');
  cpSync(ADAPTERS.perexp, path.join(outside, 'adapter'), { recursive: true });
  symlinkSync(path.join(outside, 'adapter'), path.join(dir, 'link-out'));
  mkdirSync(path.join(dir, 'sub'));
  cpSync(ADAPTERS.perexp, path.join(dir, 'sub', 'good'), { recursive: true });
  return { tmp, dir };
}

describe('--lora-resolver-dir', () => {
  let server;
  let tmp;
  let dir;
  const started = Date.now() / 1000;
  const post = (p, body) => request(`${server.url}${p}`, { body });
  const models = async () => {
    const r = await request(`${server.url}/v1/models`, { method: 'GET' });
    assert.equal(r.status, 200);
    return Object.fromEntries(r.json.data.map((m) => [m.id, m]));
  };
  const complete = (model, extra = {}) => post('/v1/completions', {
    model, prompt: REFERENCE_PROMPTS[1], max_tokens: 8, return_tokens_as_token_ids: true, ...GREEDY, ...extra,
  });

  before(async () => {
    ({ tmp, dir } = setUpDir());
    server = await startServer(['--model', MODEL, '--max-model-len', '256', '--max-loras', '3', '--lora-resolver-dir', dir]);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    tmp.remove();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('a name in the directory loads on its first request, generates as the adapter does, then is listed', async () => {
    assert.deepEqual(Object.keys(await models()), [MODEL], 'nothing is listed before its first use');
    const r = await complete('good', { max_tokens: 12 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.model, 'good');
    const [offline] = await offlineGreedy([REFERENCE_PROMPTS[1]], 12, { loras: { p: ADAPTERS.perexp }, adapter: 'p' });
    assert.deepEqual(r.json.choices[0].token_ids, offline);
    const base = await complete(MODEL, { max_tokens: 12 });
    assert.notDeepEqual(base.json.choices[0].token_ids, offline, 'the adapter changes the output');
    const byId = await models();
    assert.deepEqual(Object.keys(byId).sort(), [MODEL, 'good'].sort());
    const card = byId.good;
    assert.equal(card.object, 'model');
    assert.equal(card.parent, MODEL);
    assert.equal(card.root, path.join(dir, 'good'));
    assert.ok(['gpu', 'cpu', 'disk'].includes(card.residency), JSON.stringify(card));
    assert.equal(card.residency, 'gpu', 'it just ran, and 3 slots hold it');
    assert.equal(card.permission.length, 1);
    assert.equal(card.permission[0].object, 'model_permission');
    assert.equal(byId[MODEL].parent, null);
    assert.equal(byId[MODEL].residency, undefined, 'the base model has no adapter residency');
    // Chat and streaming requests find it as well.
    const chat = await post('/v1/chat/completions', { model: 'good', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal(chat.status, 200, chat.text);
  });

  test('names that are not in the directory, or that are paths, are 404s as vLLM\'s', async () => {
    for (const name of ['missing', '../good', 'good/..', './good', 'sub/good', '/etc', '..', '.']) {
      const r = await complete(name);
      assertError(r, 404, 'NotFoundError');
      assert.equal(r.json.error.message, `The model \`${name}\` does not exist.`);
    }
    const chat = await post('/v1/chat/completions', { model: 'missing', messages: [{ role: 'user', content: 'x' }] });
    assertError(chat, 404, 'NotFoundError', /missing/);
    assert.ok(!('missing' in (await models())));
  });

  test('a corrupt or symlinked adapter is a 400 naming the problem; the server keeps serving', async () => {
    const bad = await complete('bad');
    assertError(bad, 400, 'BadRequestError', /LoRA adapter 'bad' was found but could not be loaded/);
    assert.match(bad.json.error.message, /adapter_config\.json/);
    const link = await complete('link-out');
    assertError(link, 400, 'BadRequestError', /symbolic link/);
    assert.match(link.json.error.message, /--lora-resolver-dir/);
    // Streamed: the error comes before any event, with its status.
    const s = await fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'bad', prompt: 'x', max_tokens: 2, stream: true }),
    });
    assert.equal(s.status, 400);
    assert.match(await s.text(), /could not be loaded/);
    // Everything else still works, and the broken ones are not listed.
    assert.equal((await complete(MODEL)).status, 200);
    assert.equal((await complete('good')).status, 200);
    const ids = Object.keys(await models());
    assert.ok(!ids.includes('bad') && !ids.includes('link-out'), ids.join(','));
    const text = await metrics(server.url);
    assert.ok(metric(text, 'polylora:adapter_load_failures_total') >= 3);
  });

  test('concurrent first requests for one name share one load', async () => {
    const before = await metrics(server.url);
    const loads0 = metric(before, 'polylora:adapter_loads_total', { tier: 'disk' });
    const streamed = async () => {
      const r = await fetch(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: 'good2', prompt: REFERENCE_PROMPTS[1], max_tokens: 5, stream: true, ...GREEDY }),
      });
      assert.equal(r.status, 200);
      const { events, done } = await readSse(r);
      assert.ok(done);
      return events.map((e) => e.choices[0]?.text ?? '').join('');
    };
    const plain = async () => {
      const r = await complete('good2', { max_tokens: 5 });
      assert.equal(r.status, 200, r.text);
      return r.json.choices[0].text;
    };
    const texts = await Promise.all([streamed(), plain(), streamed(), plain(), streamed(), plain()]);
    assert.equal(new Set(texts).size, 1, `greedy outputs agree: ${JSON.stringify(texts)}`);
    const after = await metrics(server.url);
    assert.equal(metric(after, 'polylora:adapter_loads_total', { tier: 'disk' }), loads0 + 1);
    // No adapter was registered at start, so every disk load was timed.
    assert.equal(metric(after, 'polylora:adapter_load_seconds_count'), loads0 + 1);
  });

  test('metrics: vllm:lora_requests_info with vLLM\'s labels, the adapter tiers and the load latency', async () => {
    // A long request of 'good' in flight: it is listed among the running adapters.
    const long = fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'good', prompt: REFERENCE_PROMPTS[0], max_tokens: 240, stream: true, ...GREEDY }),
    });
    let seenRunning = false;
    const r = await long;
    const reading = readSse(r);
    for (let i = 0; i < 200 && !seenRunning; ++i) {
      const info = sample(await metrics(server.url), 'vllm:lora_requests_info');
      if (info && info.labels.running_lora_adapters.split(',').includes('good')) seenRunning = true;
    }
    await reading;
    assert.ok(seenRunning, 'running_lora_adapters named the adapter of the running request');

    const text = await metrics(server.url);
    assert.match(text, /# TYPE vllm:lora_requests_info gauge/);
    const info = sample(text, 'vllm:lora_requests_info');
    assert.deepEqual(Object.keys(info.labels).sort(), ['max_lora', 'running_lora_adapters', 'waiting_lora_adapters']);
    assert.equal(info.labels.max_lora, '3');
    assert.equal(info.labels.running_lora_adapters, '');
    assert.equal(info.labels.waiting_lora_adapters, '');
    assert.ok(info.value >= started - 5 && info.value <= Date.now() / 1000 + 5, `a Unix timestamp: ${info.value}`);

    for (const tier of ['disk', 'host']) assert.ok(metric(text, 'polylora:adapter_loads_total', { tier }) >= 2, tier);
    for (const tier of ['gpu', 'cpu']) assert.ok(metric(text, 'polylora:adapter_evictions_total', { tier }) !== undefined, tier);
    const resident = Object.fromEntries(['gpu', 'cpu', 'disk'].map((t) => [t, metric(text, 'polylora:adapters_resident', { tier: t })]));
    const cards = Object.values(await models()).filter((m) => m.residency);
    assert.equal(resident.gpu, cards.filter((m) => m.residency === 'gpu').length, JSON.stringify(resident));
    assert.equal(resident.disk, cards.filter((m) => m.residency === 'disk').length);
    assert.equal(metric(text, 'polylora:adapters_registered'), cards.length);
    // The histogram: cumulative buckets ending in +Inf = count.
    let last = 0;
    const buckets = [...text.matchAll(/^polylora:adapter_load_seconds_bucket\{[^}]*le="([^"]+)"\} (\S+)$/gm)];
    assert.ok(buckets.length >= 2);
    for (const [, , v] of buckets) {
      assert.ok(Number(v) >= last);
      last = Number(v);
    }
    assert.equal(buckets.at(-1)[1], '+Inf');
    assert.equal(last, metric(text, 'polylora:adapter_load_seconds_count'));
    assert.ok(metric(text, 'polylora:adapter_load_seconds_sum') > 0);
  });
});

describe('VLLM_PLUGINS=lora_filesystem_resolver with VLLM_LORA_RESOLVER_CACHE_DIR', () => {
  let server;
  let tmp;
  let dir;
  const complete = (model) => request(`${server.url}/v1/completions`, {
    body: { model, prompt: REFERENCE_PROMPTS[1], max_tokens: 4, ...GREEDY },
  });
  const residency = async () => {
    const r = await request(`${server.url}/v1/models`, { method: 'GET' });
    return Object.fromEntries(r.json.data.filter((m) => m.residency).map((m) => [m.id, m.residency]));
  };

  before(async () => {
    ({ tmp, dir } = setUpDir());
    server = await startServer(['--model', MODEL, '--max-loras', '1', '--max-cpu-loras', '1'], {
      env: { VLLM_PLUGINS: 'lora_filesystem_resolver', VLLM_LORA_RESOLVER_CACHE_DIR: dir },
    });
  });
  after(async () => {
    const { code, signal } = await server.stop();
    tmp.remove();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('the environment enables the resolver; with one slot and one host copy, older adapters go to disk', async () => {
    assert.equal((await complete('missing')).status, 404);
    assert.equal((await complete('good')).status, 200);
    assert.deepEqual(await residency(), { good: 'gpu' });
    assert.equal((await complete('good2')).status, 200);
    assert.deepEqual(await residency(), { good: 'disk', good2: 'gpu' });
    assert.equal((await complete('good')).status, 200, 'read again from disk');
    assert.deepEqual(await residency(), { good: 'gpu', good2: 'disk' });
    const text = await metrics(server.url);
    assert.equal(metric(text, 'polylora:adapter_loads_total', { tier: 'disk' }), 3);
    assert.equal(metric(text, 'polylora:adapter_loads_total', { tier: 'host' }), 3);
    assert.equal(metric(text, 'polylora:adapter_evictions_total', { tier: 'cpu' }), 2);
    assert.equal(metric(text, 'polylora:adapter_evictions_total', { tier: 'gpu' }), 2);
    assert.equal(metric(text, 'polylora:adapters_resident', { tier: 'gpu' }), 1);
    assert.equal(metric(text, 'polylora:adapters_resident', { tier: 'cpu' }), 1);
    assert.equal(metric(text, 'polylora:adapters_resident', { tier: 'disk' }), 1);
    assert.equal(sample(text, 'vllm:lora_requests_info').labels.max_lora, '1');
  });

  test('VLLM_PLUGINS naming other plugins leaves the resolver off', async () => {
    const other = await startServer(['--model', MODEL], {
      env: { VLLM_PLUGINS: 'some_other_plugin', VLLM_LORA_RESOLVER_CACHE_DIR: dir },
    });
    try {
      const r = await request(`${other.url}/v1/completions`, { body: { model: 'good', prompt: 'x', max_tokens: 2 } });
      assert.equal(r.status, 404, r.text);
    } finally {
      await other.stop();
    }
  });
});
