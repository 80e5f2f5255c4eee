// /tokenize, /detokenize, /version and /metrics (vLLM metric names, per-adapter counters, prefix caching).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ADAPTERS, MODEL, makePrompt, metric, metrics, request, startServer } from './lib/server.mjs';

describe('tokenize, version, metrics', () => {
  let server;
  before(async () => {
    server = await startServer(['--model', MODEL, '--lora-modules', `attn=${ADAPTERS.attn}`, '--max-model-len', '512']);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });
  const post = (p, body) => request(`${server.url}${p}`, { body });

  test('/tokenize and /detokenize round trip', async () => {
    for (const text of ['Hello world', 'The quick brown fox jumps over the lazy dog.', 'a  b\n\tc 123 ünï']) {
      const t = await post('/tokenize', { prompt: text, add_special_tokens: false });
      assert.equal(t.status, 200, t.text);
      assert.ok(Array.isArray(t.json.tokens) && t.json.tokens.length > 0);
      assert.equal(t.json.count, t.json.tokens.length);
      assert.equal(t.json.max_model_len, 512);
      for (const id of t.json.tokens) assert.ok(Number.isInteger(id) && id >= 0 && id < 1024);
      const d = await post('/detokenize', { tokens: t.json.tokens });
      assert.equal(d.status, 200, d.text);
      assert.equal(d.json.prompt, text);
    }
    const strs = await post('/tokenize', { prompt: 'Hello world', return_token_strs: true });
    assert.equal(strs.json.token_strs.length, strs.json.count);
    // The count matches the completion's prompt_tokens for the same text.
    const c = await post('/v1/completions', { prompt: 'Hello world', max_tokens: 1 });
    assert.equal(c.json.usage.prompt_tokens, strs.json.count);
    // Bad input.
    assert.equal((await post('/detokenize', { tokens: [1, 'x'] })).status, 400);
    assert.equal((await post('/detokenize', { tokens: [100000] })).status, 400);
    assert.equal((await post('/tokenize', {})).status, 400);
  });

  test('/version', async () => {
    const r = await request(`${server.url}/version`, { method: 'GET' });
    assert.equal(r.status, 200);
    assert.equal(typeof r.json.version, 'string');
    assert.match(r.json.version, /\d+\.\d+/);
  });

  test('/metrics has the vLLM metrics and per-adapter counters', async () => {
    const r = await post('/v1/completions', { model: 'attn', prompt: [5, 6, 7, 8], max_tokens: 3, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    const m = await metrics(server.url);
    for (const name of [
      'vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
      'vllm:prefix_cache_queries_total', 'vllm:prefix_cache_hits_total', 'vllm:num_preemptions_total',
      'vllm:time_to_first_token_seconds_bucket', 'vllm:inter_token_latency_seconds_bucket',
      'vllm:e2e_request_latency_seconds_bucket', 'vllm:prompt_tokens_total', 'vllm:generation_tokens_total',
    ]) {
      assert.notEqual(metric(m, name), undefined, `${name} missing`);
      assert.ok(Number.isFinite(metric(m, name)), name);
    }
    assert.equal(metric(m, 'vllm:num_requests_running'), 0);
    assert.equal(metric(m, 'vllm:num_requests_waiting'), 0);
    assert.equal(metric(m, 'vllm:kv_cache_usage_perc'), 0);
    assert.ok(metric(m, 'vllm:time_to_first_token_seconds_bucket', { le: '+Inf' }) >= 1);
    assert.equal(metric(m, 'polylora:adapter_requests_total', { adapter: 'attn' }), 1);
    assert.ok(metric(m, 'vllm:prompt_tokens_total') >= 4);
    assert.ok(metric(m, 'vllm:generation_tokens_total') >= 3);

    // The counters move by what a request did.
    await post('/v1/completions', { model: 'attn', prompt: [9, 10, 11], max_tokens: 5, ignore_eos: true });
    const m2 = await metrics(server.url);
    assert.equal(metric(m2, 'polylora:adapter_requests_total', { adapter: 'attn' }), 2);
    assert.equal(metric(m2, 'vllm:prompt_tokens_total'), metric(m, 'vllm:prompt_tokens_total') + 3);
    assert.equal(metric(m2, 'vllm:generation_tokens_total'), metric(m, 'vllm:generation_tokens_total') + 5);
    assert.equal(
      metric(m2, 'vllm:e2e_request_latency_seconds_bucket', { le: '+Inf' }),
      metric(m, 'vllm:e2e_request_latency_seconds_bucket', { le: '+Inf' }) + 1,
    );
  });

  test('prefix cache hits increase when the same long prompt is sent twice', async () => {
    const prompt = makePrompt(4242, 200);
    const m0 = await metrics(server.url);
    const first = await post('/v1/completions', { prompt, max_tokens: 2 });
    assert.equal(first.status, 200, first.text);
    const m1 = await metrics(server.url);
    const second = await post('/v1/completions', { prompt, max_tokens: 2 });
    const m2 = await metrics(server.url);
    const hits = (m) => metric(m, 'vllm:prefix_cache_hits_total');
    const queries = (m) => metric(m, 'vllm:prefix_cache_queries_total');
    assert.ok(queries(m1) - queries(m0) >= 200, 'the first request queried the cache');
    assert.ok(queries(m2) - queries(m1) >= 200, 'the second request queried the cache');
    // Whole blocks of 16 tokens are reused (the last prompt token is always computed).
    assert.ok(hits(m2) - hits(m1) >= 192, `hits grew by ${hits(m2) - hits(m1)}`);
    assert.ok(second.json.usage.prompt_tokens_details?.cached_tokens >= 192, second.text);
  });
});
