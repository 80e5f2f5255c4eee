// Concurrency: 64 concurrent streaming requests over the adapters and the base model give exactly what
// each gets alone; a client that disconnects mid-stream frees its sequence and KV blocks; 1,000
// concurrent streaming connections all complete.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ADAPTERS, MODEL, makePrompt, metric, metrics, readSse, sleep, startServer } from './lib/server.mjs';

// Streams a completion with raw fetch; returns { ids, text, finish, done, usage }.
async function streamCompletion(url, body, { signal } = {}) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const { events, done } = await readSse(r);
  const out = { ids: [], text: '', finish: null, done, usage: null, errors: [] };
  for (const ev of events) {
    if (ev.error) out.errors.push(ev.error);
    if (ev.usage) out.usage = ev.usage;
    for (const c of ev.choices ?? []) {
      out.text += c.text;
      if (c.logprobs) for (const t of c.logprobs.tokens) out.ids.push(Number(t.replace('token_id:', '')));
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}

describe('concurrency', () => {
  let server;
  before(async () => {
    server = await startServer([
      '--model', MODEL,
      '--lora-modules', `attn=${ADAPTERS.attn}`,
      '--lora-modules', `experts=${ADAPTERS.experts}`,
      '--lora-modules', `perexp=${ADAPTERS.perexp}`,
      '--max-model-len', '2048',
      '--max-connections', '1100',
    ]);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('64 concurrent streaming requests give exactly the outputs each gets alone', async () => {
    const models = [MODEL, 'attn', 'experts', 'perexp'];
    const requests = Array.from({ length: 64 }, (_, i) => ({
      model: models[i % models.length],
      prompt: makePrompt(i, 3 + ((i * 7) % 40)),
      max_tokens: 8 + (i % 9),
      temperature: 0,
      ignore_eos: true,
      logprobs: 0,
      return_tokens_as_token_ids: true,
      stream_options: { include_usage: true },
    }));
    const alone = [];
    for (const body of requests) alone.push(await streamCompletion(server.url, body));
    for (let i = 0; i < requests.length; ++i) {
      assert.equal(alone[i].ids.length, requests[i].max_tokens, `request ${i} alone`);
      assert.equal(alone[i].finish, 'length');
      assert.ok(alone[i].done);
    }
    const together = await Promise.all(requests.map((body) => streamCompletion(server.url, body)));
    for (let i = 0; i < requests.length; ++i) {
      assert.deepEqual(together[i].errors, []);
      assert.ok(together[i].done, `request ${i}: [DONE]`);
      assert.deepEqual(together[i].ids, alone[i].ids, `request ${i} (${requests[i].model}) token ids`);
      assert.equal(together[i].text, alone[i].text, `request ${i} text`);
      assert.equal(together[i].usage.prompt_tokens, requests[i].prompt.length, `request ${i} usage`);
      assert.equal(together[i].usage.completion_tokens, requests[i].max_tokens, `request ${i} usage`);
    }
    // The adapters really are in play: the same prompt differs between base and an adapter.
    const base = await streamCompletion(server.url, { ...requests[0], model: MODEL });
    const adapted = await streamCompletion(server.url, { ...requests[0], model: 'experts' });
    assert.notDeepEqual(base.ids, adapted.ids);
  });

  test('a client that disconnects mid-stream frees its request and KV cache', async () => {
    const idle = await metrics(server.url);
    const abortsBefore = metric(idle, 'vllm:request_success_total', { finished_reason: 'abort' }) ?? 0;
    assert.equal(metric(idle, 'vllm:kv_cache_usage_perc'), 0);

    const controller = new AbortController();
    const r = await fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: makePrompt(99, 32), max_tokens: 2000, ignore_eos: true, stream: true }),
      signal: controller.signal,
    });
    assert.equal(r.status, 200);
    // Read a few chunks, keeping the connection open (no cancel()).
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let received = '';
    while ((received.match(/^data: /gm) ?? []).length < 3) {
      const { value, done } = await reader.read();
      assert.ok(!done, 'the stream ended early');
      received += decoder.decode(value, { stream: true });
    }
    const busy = await metrics(server.url);
    assert.equal(metric(busy, 'vllm:num_requests_running'), 1, 'the request is running while streamed');
    assert.ok(metric(busy, 'vllm:kv_cache_usage_perc') > 0);
    controller.abort();
    await reader.read().catch(() => null);

    const deadline = Date.now() + 15_000;
    let m;
    for (;;) {
      m = await metrics(server.url);
      if (metric(m, 'vllm:num_requests_running') === 0 && metric(m, 'vllm:kv_cache_usage_perc') === 0) break;
      assert.ok(Date.now() < deadline, `not freed after the disconnect:\n${m}`);
      await sleep(100);
    }
    assert.equal(metric(m, 'vllm:num_requests_waiting'), 0);
    assert.equal(metric(m, 'vllm:request_success_total', { finished_reason: 'abort' }), abortsBefore + 1,
      'the request was aborted, not finished');
    assert.ok(metric(m, 'vllm:generation_tokens_total') - metric(idle, 'vllm:generation_tokens_total') < 2000);
  });

  test('1,000 concurrent streaming connections all complete with [DONE]', async () => {
    const N = 1000;
    const results = await Promise.allSettled(
      Array.from({ length: N }, (_, i) => streamCompletion(server.url, {
        prompt: makePrompt(1000 + i, 4 + (i % 5)),
        max_tokens: 4,
        ignore_eos: true,
        temperature: 0,
        stream_options: { include_usage: true },
      })),
    );
    const failures = results.filter((r) => r.status === 'rejected').map((r) => String(r.reason?.cause ?? r.reason));
    assert.deepEqual(failures.slice(0, 5), [], `${failures.length} of ${N} failed`);
    for (const { value } of results) {
      assert.ok(value.done);
      assert.deepEqual(value.errors, []);
      assert.equal(value.finish, 'length');
      assert.equal(value.usage.completion_tokens, 4);
    }
    const m = await metrics(server.url);
    assert.equal(metric(m, 'vllm:num_requests_running'), 0);
    assert.equal(metric(m, 'vllm:num_requests_waiting'), 0);
  });
});
