// vLLM behaviours a user meets on day one (session 45's audit against vLLM 0.10/0.11): request fields
// (model "" and every served name answering as the first, max_tokens null, echo with max_tokens 0,
// text_offset in characters, stream_options defaults, top_logprobs 0, null fields), /tokenize and
// /detokenize checking the model, several --api-key values and the Bearer scheme in any case, the
// generation config's max_new_tokens as a cap and its EOS ids under --generation-config vllm, and the
// limits that used to stall the queue (no chunked prefill under a small token budget, a prompt larger than
// the KV cache, a sequence that fills the whole cache).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { copyFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { BIN, MODEL, readSse, request, startServer, tempDir } from './lib/server.mjs';

const PROMPT = [77, 570, 220, 1000, 42];

describe('request fields as vLLM reads them', () => {
  let server;
  const post = (p, body, opts = {}) => request(`${server.url}${p}`, { body, ...opts });
  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '128', '--served-model-name', 'main', 'alias',
      '--api-key', 'k1', 'k2']);
  });
  after(async () => server && server.stop());

  test('several --api-key values each open /v1; the Bearer scheme in any case; a wrong key is a 401', async () => {
    const body = { model: 'main', prompt: PROMPT, max_tokens: 1 };
    assert.equal((await post('/v1/completions', body, { key: 'k1' })).status, 200);
    assert.equal((await post('/v1/completions', body, { key: 'k2' })).status, 200);
    assert.equal((await post('/v1/completions', body, { headers: { Authorization: 'bearer k2' } })).status, 200);
    assert.equal((await post('/v1/completions', body, { key: 'k3' })).status, 401);
    assert.equal((await post('/v1/completions', body)).status, 401);
    assert.equal((await post('/v1/completions', body, { headers: { Authorization: 'Basic k1' } })).status, 401);
  });

  test('model "" is the served model; every served name answers as the first (vLLM\'s model_name())', async () => {
    for (const model of ['', 'alias', 'main']) {
      const r = await post('/v1/completions', { model, prompt: PROMPT, max_tokens: 1 }, { key: 'k1' });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.model, 'main');
    }
    const r = await post('/v1/completions', { model: 'nope', prompt: PROMPT, max_tokens: 1 }, { key: 'k1' });
    assert.equal(r.status, 404);
  });

  test('/tokenize and /detokenize: an unknown model is a 404, the served names and none are fine', async () => {
    let r = await post('/tokenize', { model: 'nope', prompt: 'hi' }, { key: 'k1' });
    assert.equal(r.status, 404, r.text);
    r = await post('/detokenize', { model: 'nope', tokens: [5, 6] }, { key: 'k1' });
    assert.equal(r.status, 404, r.text);
    for (const model of [undefined, 'alias']) {
      r = await post('/tokenize', { model, prompt: 'hi' }, { key: 'k1' });
      assert.equal(r.status, 200, r.text);
      r = await post('/detokenize', { model, tokens: r.json.tokens }, { key: 'k1' });
      assert.equal(r.json.prompt, 'hi');
    }
  });

  test('max_tokens null on completions runs to the context (16 only when absent)', async () => {
    let r = await post('/v1/completions', { prompt: PROMPT, max_tokens: null, ignore_eos: true }, { key: 'k1' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.completion_tokens, 128 - PROMPT.length);
    assert.equal(r.json.choices[0].finish_reason, 'length');
    r = await post('/v1/completions', { prompt: PROMPT, ignore_eos: true }, { key: 'k1' });
    assert.equal(r.json.usage.completion_tokens, 16);
  });

  test('echo with max_tokens 0 returns the prompt alone, with its logprobs (streamed too)', async () => {
    const prompt = 'The quick brown fox';
    const r = await post('/v1/completions', { prompt, max_tokens: 0, echo: true, logprobs: 1 }, { key: 'k1' });
    assert.equal(r.status, 200, r.text);
    const ids = (await post('/tokenize', { prompt }, { key: 'k1' })).json.tokens;
    const c = r.json.choices[0];
    assert.equal(c.text, prompt);
    assert.equal(c.logprobs.tokens.length, ids.length);
    assert.equal(c.logprobs.token_logprobs[0], null);
    assert.ok(c.logprobs.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0));
    assert.equal(c.finish_reason, 'length');
    const s = await fetch(`${server.url}/v1/completions`, { method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: 'Bearer k1' },
      body: JSON.stringify({ prompt, max_tokens: 0, echo: true, stream: true }) });
    const { events, done } = await readSse(s);
    assert.ok(done);
    assert.equal(events.map((e) => e.choices[0]?.text ?? '').join(''), prompt);
    // max_tokens 0 without echo stays an error.
    assert.equal((await post('/v1/completions', { prompt, max_tokens: 0 }, { key: 'k1' })).status, 400);
  });

  test('text_offset counts characters, as vLLM\'s len() of each token\'s text', async () => {
    const r = await post('/v1/completions', { prompt: 'café au lait, naïve résumé', max_tokens: 2, echo: true,
      logprobs: 0, temperature: 0 }, { key: 'k1' });
    assert.equal(r.status, 200, r.text);
    const { tokens, text_offset: off } = r.json.choices[0].logprobs;
    assert.equal(off[0], 0);
    for (let i = 1; i < tokens.length; i++) assert.equal(off[i] - off[i - 1], Array.from(tokens[i - 1]).length, `token ${i}`);
    // Some token holds a character of more than one byte, where bytes and characters differ.
    assert.ok(tokens.some((t) => Buffer.byteLength(t) > Array.from(t).length), JSON.stringify(tokens));
  });

  test('stream_options as vLLM\'s: include_usage defaults to true; continuous stats need it', async () => {
    const stream = async (stream_options) => {
      const s = await fetch(`${server.url}/v1/completions`, { method: 'POST',
        headers: { 'Content-Type': 'application/json', Authorization: 'Bearer k1' },
        body: JSON.stringify({ prompt: PROMPT, max_tokens: 3, ignore_eos: true, stream: true, stream_options }) });
      const { events } = await readSse(s);
      return { final: events.filter((e) => e.choices.length === 0 && e.usage).length,
        perChunk: events.filter((e) => e.choices.length > 0 && e.usage).length,
        chunks: events.filter((e) => e.choices.length > 0) };
    };
    assert.deepEqual((await stream({})).final, 1);
    let r = await stream({ continuous_usage_stats: true });
    assert.equal(r.final, 1);
    assert.equal(r.perChunk, r.chunks.length);
    r = await stream({ include_usage: false, continuous_usage_stats: true });
    assert.equal(r.final + r.perChunk, 0);
    r = await stream(undefined);
    assert.equal(r.final + r.perChunk, 0);
    // Every completion chunk carries stop_reason (null until the last).
    assert.ok(r.chunks.every((e) => 'stop_reason' in e.choices[0]));
  });

  test('chat top_logprobs 0 without logprobs is accepted; above 0 it needs logprobs', async () => {
    const messages = [{ role: 'user', content: 'hi' }];
    let r = await post('/v1/chat/completions', { messages, max_tokens: 1, top_logprobs: 0 }, { key: 'k1' });
    assert.equal(r.status, 200, r.text);
    r = await post('/v1/chat/completions', { messages, max_tokens: 1, top_logprobs: 2 }, { key: 'k1' });
    assert.equal(r.status, 400, r.text);
  });

  test('numbers and booleans sent as strings are read as pydantic\'s lax mode reads them', async () => {
    const lax = await post('/v1/completions', { prompt: PROMPT, max_tokens: '3', temperature: '0', ignore_eos: 'true',
      echo: 0, stream: 'false' }, { key: 'k1' });
    assert.equal(lax.status, 200, lax.text);
    const strict = await post('/v1/completions', { prompt: PROMPT, max_tokens: 3, temperature: 0, ignore_eos: true },
      { key: 'k1' });
    assert.equal(lax.json.choices[0].text, strict.json.choices[0].text);
    assert.equal(lax.json.usage.completion_tokens, 3);
    for (const [field, value] of [['max_tokens', 'three'], ['temperature', '0.5x'], ['ignore_eos', 'maybe'], ['max_tokens', '2.5']]) {
      const bad = await post('/v1/completions', { prompt: PROMPT, [field]: value }, { key: 'k1' });
      assert.equal(bad.status, 400, `${field}: ${bad.text}`);
      assert.match(bad.json.error.message, new RegExp(`'${field}'`));
    }
  });

  test('a null field is unset whatever its name; a set unknown field is still a 400 naming it', async () => {
    let r = await post('/v1/completions', { prompt: PROMPT, max_tokens: 1, vllm_xargs: null, functions: null }, { key: 'k1' });
    assert.equal(r.status, 200, r.text);
    r = await post('/v1/completions', { prompt: PROMPT, max_tokens: 1, frobnicate: 0 }, { key: 'k1' });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /'frobnicate'/);
  });
});

describe('generation config and cache limits', () => {
  let tmp;
  let capped;
  let vllmMode;
  let small;
  before(async () => {
    // A copy of the model whose generation_config.json caps max_new_tokens at 4 and makes the greedy
    // first token of PROMPT an EOS id.
    tmp = tempDir();
    const dir = path.join(tmp.dir, 'model');
    execFileSync('mkdir', ['-p', dir]);
    for (const f of readdirSync(MODEL)) if (f !== 'adapters') copyFileSync(path.join(MODEL, f), path.join(dir, f));
    const probe = await startServer(['--model', MODEL]);
    const first = (await request(`${probe.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 1, temperature: 0,
      return_token_ids: true } })).json.choices[0].token_ids[0];
    await probe.stop();
    writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ max_new_tokens: 4, eos_token_id: [first] }));
    [capped, vllmMode, small] = await Promise.all([
      startServer(['--model', dir]),
      startServer(['--model', dir, '--generation-config', 'vllm']),
      startServer(['--model', MODEL, '--num-kv-blocks', '10', '--block-size', '16']),
    ]);
  });
  after(async () => {
    await Promise.all([capped, vllmMode, small].map((s) => s && s.stop()));
    tmp && tmp.remove();
  });

  const cmpl = (s, body) => request(`${s.url}/v1/completions`, { body: { prompt: PROMPT, temperature: 0, ...body } });

  test('max_new_tokens caps every request; under --generation-config vllm it does not, but the file\'s EOS ids stop', async () => {
    let r = await cmpl(capped, { max_tokens: 50, ignore_eos: true });
    assert.equal(r.json.usage.completion_tokens, 4);
    r = await cmpl(vllmMode, { max_tokens: 50, ignore_eos: true });
    assert.equal(r.json.usage.completion_tokens, 50);
    r = await cmpl(vllmMode, { max_tokens: 50 });
    assert.equal(r.json.usage.completion_tokens, 1, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'stop');
  });

  test('a prompt the whole KV cache cannot hold is a 400; a sequence ends by length where the cache is full', async () => {
    let r = await cmpl(small, { prompt: Array.from({ length: 200 }, (_, i) => 5 + i), max_tokens: 2 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /does not fit in the KV cache/);
    r = await cmpl(small, { prompt: Array.from({ length: 100 }, (_, i) => 5 + i), max_tokens: 1000, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.completion_tokens, 160 - 100);
    assert.equal(r.json.choices[0].finish_reason, 'length');
    r = await cmpl(small, { max_tokens: 2 });  // the server still serves
    assert.equal(r.status, 200, r.text);
  });

  test('no chunked prefill with --max-num-batched-tokens below --max-model-len does not start (vLLM\'s check)', async () => {
    const out = await new Promise((resolve) => {
      execFile(BIN, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--no-enable-chunked-prefill',
        '--max-num-batched-tokens', '512', '--max-model-len', '1024'], { timeout: 30_000 },
      (err, stdout, stderr) => resolve({ code: err ? err.code : 0, text: stdout + stderr }));
    });
    assert.notEqual(out.code, 0);
    assert.match(out.text, /max_num_batched_tokens \(512\) is smaller than max_model_len \(1024\)/);
  });
});
