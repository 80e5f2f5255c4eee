// Raw-HTTP error cases of `polylora serve`: every error is a JSON body {error: {message, type, param,
// code}} with the right status; authentication; run-time adapter loading refusals (paths outside
// --lora-allowed-dirs, '..', symbolic links, missing dirs, malformed adapters) leave /v1/models as it was.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ADAPTERS, MODEL, request, startServer, tempDir } from './lib/server.mjs';

const KEY = 'sk-errors';

function assertError(r, status, messagePattern) {
  assert.equal(r.status, status, `expected ${status}, got ${r.status}: ${r.text}`);
  assert.match(r.headers.get('content-type') ?? '', /application\/json/);
  assert.ok(r.json && typeof r.json.error === 'object', `error body: ${r.text}`);
  const e = r.json.error;
  assert.deepEqual(Object.keys(e).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  assert.equal(e.code, status);
  if (messagePattern) assert.match(e.message, messagePattern);
}

describe('errors (runtime adapter updating enabled, API key)', () => {
  let server;
  let tmp;
  let allowed;
  let outside;
  const post = (p, body, key = KEY) => request(`${server.url}${p}`, { body, key });
  const get = (p, key = KEY) => request(`${server.url}${p}`, { method: 'GET', key });
  const modelIds = async () => {
    const r = await get('/v1/models');
    assert.equal(r.status, 200);
    return r.json.data.map((m) => m.id).sort();
  };

  before(async () => {
    tmp = tempDir();
    allowed = path.join(tmp.dir, 'allowed');
    outside = path.join(tmp.dir, 'outside');
    mkdirSync(allowed);
    mkdirSync(outside);
    cpSync(ADAPTERS.perexp, path.join(allowed, 'good'), { recursive: true });
    cpSync(ADAPTERS.perexp, path.join(outside, 'adapter'), { recursive: true });
    symlinkSync(path.join(outside, 'adapter'), path.join(allowed, 'link-out'));
    cpSync(ADAPTERS.attn, path.join(allowed, 'rank16'), { recursive: true });  // rank 16 > --max-lora-rank 8
    cpSync(ADAPTERS.perexp, path.join(allowed, 'bad-config'), { recursive: true });
    writeFileSync(path.join(allowed, 'bad-config', 'adapter_config.json'), '{"r": 8, "lora_alpha": ');
    mkdirSync(path.join(allowed, 'no-config'));
    server = await startServer([
      '--model', MODEL,
      '--lora-modules', `e8=${ADAPTERS.experts}`,
      '--max-model-len', '64',
      '--max-lora-rank', '8',
      '--api-key', KEY,
      '--enable-lora-runtime-updating',
      '--lora-allowed-dirs', allowed,
    ]);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    tmp.remove();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('malformed JSON is a 400 with an error body', async () => {
    for (const p of ['/v1/completions', '/v1/chat/completions', '/v1/load_lora_adapter', '/tokenize']) {
      assertError(await post(p, '{"prompt": "hi", '), 400, /JSON/);
    }
    assertError(await post('/v1/completions', '[1, 2]'), 400, /object/);
  });

  test('wrong field types and out-of-range values are 400s naming the field', async () => {
    const cases = [
      [{ temperature: 'hot' }, /temperature/],
      [{ temperature: -1 }, /temperature/],
      [{ max_tokens: -1 }, /max_tokens/],
      [{ max_tokens: 'many' }, /max_tokens/],
      [{ top_p: 2 }, /top_p/],
      [{ top_k: -5 }, /top_k/],
      [{ n: 0 }, /\bn\b/],
      [{ n: 1.5 }, /\bn\b/],
      [{ logprobs: 99 }, /logprobs/],
      [{ stream: 'sometimes' }, /stream/],
      [{ stop: 5 }, /stop/],
      [{ presence_penalty: 3 }, /presence_penalty/],
      [{ seed: 'x' }, /seed/],
      [{ logit_bias: { abc: 1 } }, /logit_bias/],
    ];
    for (const [fields, pattern] of cases) {
      const r = await post('/v1/completions', { prompt: 'hello', max_tokens: 2, ...fields });
      assertError(r, 400, pattern);
    }
    assertError(await post('/v1/completions', { max_tokens: 2 }), 400, /prompt/);
    assertError(await post('/v1/completions', { prompt: 42 }), 400, /prompt/);
    assertError(await post('/v1/chat/completions', { messages: [] }), 400, /messages/);
    assertError(await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], logprobs: 3 }), 400, /logprobs/);
    assertError(
      await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], logprobs: true, top_logprobs: 50 }),
      400, /Requested sample logprobs of 50, which is greater than max allowed: 20/,
    );
  });

  test('a prompt longer than --max-model-len is a 400', async () => {
    const ids = Array.from({ length: 100 }, (_, i) => 10 + i);
    assertError(await post('/v1/completions', { prompt: ids, max_tokens: 1 }), 400, /maximum context length is 64/);
    assertError(await post('/v1/completions', { prompt: 'word '.repeat(200), max_tokens: 1 }), 400, /maximum context length/);
    assertError(
      await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'word '.repeat(200) }] }),
      400, /maximum context length/,
    );
    // Fits alone, but not with max_tokens.
    assertError(await post('/v1/completions', { prompt: ids.slice(0, 40), max_tokens: 40 }), 400, /max_tokens/);
    // Just fits: served.
    const ok = await post('/v1/completions', { prompt: ids.slice(0, 40), max_tokens: 24, ignore_eos: true });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.json.usage.completion_tokens, 24);
  });

  test('missing or wrong API key is a 401 on /v1 routes; /health stays open', async () => {
    assertError(await post('/v1/completions', { prompt: 'hi', max_tokens: 1 }, null), 401);
    assertError(await post('/v1/completions', { prompt: 'hi', max_tokens: 1 }, 'sk-wrong'), 401);
    assertError(await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }, null), 401);
    assertError(await get('/v1/models', null), 401);
    assertError(await post('/v1/load_lora_adapter', { lora_name: 'x', lora_path: path.join(allowed, 'good') }, null), 401);
    const basic = await request(`${server.url}/v1/models`, { method: 'GET', headers: { Authorization: KEY } });
    assertError(basic, 401);
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);
    const good = await post('/v1/completions', { prompt: 'hi', max_tokens: 1 });
    assert.equal(good.status, 200, good.text);
  });

  test('an unknown model is a 404', async () => {
    assertError(await post('/v1/completions', { model: 'nope', prompt: 'hi', max_tokens: 1 }), 404, /nope/);
    assertError(await post('/v1/chat/completions', { model: 'nope', messages: [{ role: 'user', content: 'hi' }] }), 404, /nope/);
    assertError(await get('/v1/no-such-route'), 404);
  });

  test('load_lora_adapter refuses unsafe or broken adapters with a 400 and leaves /v1/models unchanged', async () => {
    const before = await modelIds();
    assert.deepEqual(before, [MODEL, 'e8'].sort());
    const cases = [
      ['outside', ADAPTERS.perexp, /outside the directories allowed/],
      ['dotdot', path.join(allowed, '..', 'outside', 'adapter'), /outside the directories allowed/],
      ['dotdot-inside', `${allowed}/good/../../outside/adapter`, /outside the directories allowed/],
      ['symlink', path.join(allowed, 'link-out'), /symbolic link|outside the directories allowed/],
      ['no-config', path.join(allowed, 'no-config'), /adapter_config\.json/],
      ['bad-config', path.join(allowed, 'bad-config'), /adapter_config\.json|JSON|parse/i],
      ['rank16', path.join(allowed, 'rank16'), /rank/],
      ['relative', 'good', /outside the directories allowed/],
    ];
    for (const [name, lora_path, pattern] of cases) {
      const r = await post('/v1/load_lora_adapter', { lora_name: name, lora_path });
      assertError(r, 400, pattern);
      assert.deepEqual(await modelIds(), before, `after ${name}`);
    }
    // A path with no adapter inside the allowed directory: 404, as vLLM's "No adapter found".
    assertError(await post('/v1/load_lora_adapter', { lora_name: 'missing', lora_path: path.join(allowed, 'does-not-exist') }),
      404, /No adapter found.*does-not-exist/);
    assertError(await post('/v1/load_lora_adapter', { lora_path: path.join(allowed, 'good') }), 400, /lora_name/);
    assertError(await post('/v1/load_lora_adapter', { lora_name: 'x' }), 400, /lora_path/);
    assertError(await post('/v1/load_lora_adapter', { lora_name: 'e8', lora_path: path.join(allowed, 'good') }), 400, /already/);
    assertError(await post('/v1/load_lora_adapter', { lora_name: MODEL, lora_path: path.join(allowed, 'good') }), 400, /base model/);
    assert.deepEqual(await modelIds(), before);

    // The control: a valid adapter inside the allowed directory loads, and unloads.
    const ok = await post('/v1/load_lora_adapter', { lora_name: 'good', lora_path: path.join(allowed, 'good') });
    assert.equal(ok.status, 200, ok.text);
    assert.deepEqual(await modelIds(), [...before, 'good'].sort());
    const gen = await post('/v1/completions', { model: 'good', prompt: [5, 6, 7], max_tokens: 2 });
    assert.equal(gen.status, 200, gen.text);
    assert.equal((await post('/v1/unload_lora_adapter', { lora_name: 'good' })).status, 200);
    assert.deepEqual(await modelIds(), before);
  });

  test('unloading an unknown adapter is a 404', async () => {
    assertError(await post('/v1/unload_lora_adapter', { lora_name: 'never-loaded' }), 404, /never-loaded/);
    assertError(await post('/v1/unload_lora_adapter', {}), 400, /lora_name/);
  });
});

describe('errors (runtime adapter updating not enabled)', () => {
  let server;
  before(async () => {
    server = await startServer(['--model', MODEL, '--lora-modules', `e8=${ADAPTERS.experts}`, '--lora-allowed-dirs', MODEL]);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('load and unload endpoints are 404s, and nothing changes', async () => {
    const load = await request(`${server.url}/v1/load_lora_adapter`, { body: { lora_name: 'p', lora_path: ADAPTERS.perexp } });
    assertError(load, 404, /runtime/);
    const unload = await request(`${server.url}/v1/unload_lora_adapter`, { body: { lora_name: 'e8' } });
    assertError(unload, 404, /runtime/);
    const models = await request(`${server.url}/v1/models`, { method: 'GET' });
    assert.deepEqual(models.json.data.map((m) => m.id).sort(), [MODEL, 'e8'].sort());
    // No key configured: /v1 routes are open.
    const gen = await request(`${server.url}/v1/completions`, { body: { model: 'e8', prompt: 'hi', max_tokens: 2 } });
    assert.equal(gen.status, 200, gen.text);
  });
});
