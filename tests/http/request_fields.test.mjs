// Black-box tests of issue 18 items 3 and 4: request fields with vLLM's meaning (bad_words,
// allowed_token_ids, truncate_prompt_tokens, spaces_between_special_tokens, reasoning_effort, chat echo
// with continue_final_message, request_id and X-Request-Id, stop_reason, continuous usage stats,
// vllm:prompt_tokens_total), unknown / unsupported fields refused with a 400 naming them, and the routes
// /ping, /invocations, /v1/models/{id}, /server_info, /reset_prefix_cache and CORS preflights.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { MODEL, makePrompt, metric, metrics, readSse, request, startServer } from './lib/server.mjs';

const GREEDY = { temperature: 0, ignore_eos: true };

describe('request fields and routes', () => {
  let server;
  let client;
  const post = (path, body, opts = {}) => request(`${server.url}${path}`, { body, ...opts });
  const complete = (body, opts) => post('/v1/completions', { model: MODEL, ...body }, opts);
  const chat = (body, opts) => post('/v1/chat/completions', { model: MODEL, ...body }, opts);
  const tokenize = async (prompt) => (await post('/tokenize', { prompt, add_special_tokens: false })).json.tokens;
  const detok = async (tokens) => (await post('/detokenize', { tokens })).json.prompt;

  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '512', '--enable-request-id-headers']);
    client = new OpenAI({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('unknown fields are refused with a 400 naming them, on both routes', async () => {
    let r = await complete({ prompt: [5, 6, 7], max_tokens: 2, frobnicate: 1 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /'frobnicate'/);
    r = await chat({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, vllm_xargs: { a: 1 } });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /'vllm_xargs'/);
    // A chat-only field on completions is unknown there.
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, messages: [] });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /'messages'/);
    // `user` has no effect (in vLLM too) and is accepted.
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, user: 'someone' });
    assert.equal(r.status, 200, r.text);
  });

  test('use_beam_search runs (beam_search.test.mjs checks its beams); length_penalty is a number', async () => {
    let r = await complete({ prompt: [5, 6, 7], max_tokens: 2, use_beam_search: true, n: 2 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices.length, 2);
    r = await chat({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, use_beam_search: true });
    assert.equal(r.status, 200, r.text);
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, length_penalty: [] });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /length_penalty/);
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, use_beam_search: false, length_penalty: 1.5 });
    assert.equal(r.status, 200, r.text);
  });

  test('the official client passes its fields through; unknown extra body fields are refused there too', async () => {
    const c = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, temperature: 0, user: 'u', seed: 1,
      stream_options: undefined, n: 1, presence_penalty: 0, frequency_penalty: 0, logit_bias: {}, top_p: 1,
    });
    assert.equal(c.choices.length, 1);
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: 'hi', max_tokens: 2, not_a_field: true }),
      (e) => e.status === 400 && /not_a_field/.test(e.message),
    );
  });

  test('allowed_token_ids: only those ids are sampled (greedy and random)', async () => {
    const allowed = [11, 222, 333];
    for (const extra of [GREEDY, { temperature: 1.0, seed: 7, ignore_eos: true }]) {
      const r = await complete({ prompt: makePrompt(1, 8), max_tokens: 12, allowed_token_ids: allowed, return_tokens_as_token_ids: true, ...extra });
      assert.equal(r.status, 200, r.text);
      const ids = r.json.choices[0].token_ids;
      assert.equal(ids.length, 12);
      for (const id of ids) assert.ok(allowed.includes(id), `sampled ${id}`);
    }
    const bad = await complete({ prompt: [5, 6], max_tokens: 2, allowed_token_ids: [5, 99999] });
    assert.equal(bad.status, 400, bad.text);
    assert.match(bad.json.error.message, /allowed_token_ids/);
    const empty = await complete({ prompt: [5, 6], max_tokens: 2, allowed_token_ids: [] });
    assert.equal(empty.status, 400, empty.text);
  });

  test('bad_words: a single-token word is never generated; a two-token word loses its last token after its first', async () => {
    const prompt = makePrompt(3, 10);
    const base = await complete({ prompt, max_tokens: 16, return_tokens_as_token_ids: true, ...GREEDY });
    const ids = base.json.choices[0].token_ids;
    // vLLM's tokenization of a bad word: the word (leading spaces stripped), and " " + word when that gives
    // a different first token and as many tokens.
    const variants = async (word) => {
      const w = word.replace(/^\s+/, '');
      const plain = await tokenize(w);
      const out = [plain];
      const spaced = await tokenize(` ${w}`);
      if (spaced[0] !== plain[0] && spaced.length === plain.length) out.push(spaced);
      return out;
    };
    // A generated token that is a one-token bad word by that rule.
    let banned = null;
    for (const t of ids) {
      const word = await detok([t]);
      if (!word.trim()) continue;
      const v = await variants(word);
      if (v.some((x) => x.length === 1 && x[0] === t)) {
        banned = { t, word, singles: v.filter((x) => x.length === 1).map((x) => x[0]) };
        break;
      }
    }
    assert.ok(banned, `no generated token of ${ids} is a one-token word`);
    const r = await complete({ prompt, max_tokens: 16, bad_words: [banned.word], return_tokens_as_token_ids: true, ...GREEDY });
    assert.equal(r.status, 200, r.text);
    const got = r.json.choices[0].token_ids;
    for (const s of banned.singles) assert.ok(!got.includes(s), `banned ${s} (${JSON.stringify(banned.word)}) in ${got}`);
    // The output is the greedy one up to the first banned position.
    const first = ids.indexOf(banned.t);
    assert.deepEqual(got.slice(0, first), ids.slice(0, first));

    // Two-token word: the first two generated tokens, when they tokenize back to themselves.
    const word2 = await detok(ids.slice(0, 2));
    const v2 = await variants(word2);
    const exact = v2.find((x) => x.length === 2 && x[0] === ids[0] && x[1] === ids[1]);
    if (exact && !v2.some((x) => x.length === 1)) {
      const r2 = await complete({ prompt, max_tokens: 4, bad_words: [word2], return_tokens_as_token_ids: true, ...GREEDY });
      const got2 = r2.json.choices[0].token_ids;
      assert.equal(got2[0], ids[0]);
      assert.notEqual(got2[1], ids[1]);
    }
    const bad = await complete({ prompt, max_tokens: 2, bad_words: 'x' });
    assert.equal(bad.status, 400, bad.text);
  });

  test('truncate_prompt_tokens keeps the last N prompt tokens', async () => {
    const prompt = makePrompt(5, 30);
    const r = await complete({ prompt, max_tokens: 6, truncate_prompt_tokens: 7, return_tokens_as_token_ids: true, ...GREEDY });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.prompt_tokens, 7);
    const ref = await complete({ prompt: prompt.slice(-7), max_tokens: 6, return_tokens_as_token_ids: true, ...GREEDY });
    assert.deepEqual(r.json.choices[0].token_ids, ref.json.choices[0].token_ids);
    const c = await chat({ messages: [{ role: 'user', content: 'a b c d e f g h' }], max_tokens: 2, truncate_prompt_tokens: 3, ...GREEDY });
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.usage.prompt_tokens, 3);
    const bad = await complete({ prompt, max_tokens: 2, truncate_prompt_tokens: 0 });
    assert.equal(bad.status, 400, bad.text);
  });

  test('spaces_between_special_tokens is a boolean (no effect with a fast tokenizer, as in vLLM)', async () => {
    const a = await complete({ prompt: [5, 6, 7], max_tokens: 4, spaces_between_special_tokens: false, ...GREEDY });
    const b = await complete({ prompt: [5, 6, 7], max_tokens: 4, ...GREEDY });
    assert.equal(a.status, 200, a.text);
    assert.equal(a.json.choices[0].text, b.json.choices[0].text);
    const bad = await complete({ prompt: [5, 6, 7], max_tokens: 4, spaces_between_special_tokens: 'perhaps' });
    assert.equal(bad.status, 400, bad.text);
  });

  test('reasoning_effort reaches the chat template as the variable reasoning_effort', async () => {
    const template = "{{ reasoning_effort }}|{% for m in messages %}{{ m['content'] }}{% endfor %}";
    const r = await post('/tokenize', { messages: [{ role: 'user', content: 'hello' }], chat_template: template, reasoning_effort: 'high' });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json.tokens, await tokenize('high|hello'));
    const c = await chat({ messages: [{ role: 'user', content: 'hello' }], chat_template: template, reasoning_effort: 'low', max_tokens: 2 });
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.usage.prompt_tokens, (await tokenize('low|hello')).length);
    const bad = await chat({ messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'extreme', max_tokens: 2 });
    assert.equal(bad.status, 400, bad.text);
    assert.match(bad.json.error.message, /reasoning_effort/);
  });

  test('chat echo with continue_final_message: the final assistant message opens the answer', async () => {
    const messages = [{ role: 'user', content: 'say something' }, { role: 'assistant', content: 'the red' }];
    const body = { messages, continue_final_message: true, add_generation_prompt: false, echo: true, max_tokens: 5, ...GREEDY };
    const r = await chat(body);
    assert.equal(r.status, 200, r.text);
    const plain = await chat({ ...body, echo: false });
    assert.equal(r.json.choices[0].message.content, 'the red' + plain.json.choices[0].message.content);
    // Streaming: the role, then the echoed content, then the generated text.
    const s = await fetch(`${server.base}/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: MODEL, ...body, stream: true }),
    });
    const { events, done } = await readSse(s);
    assert.ok(done);
    const deltas = events.map((e) => e.choices[0]?.delta?.content ?? '');
    assert.equal(events[0].choices[0].delta.role, 'assistant');
    assert.equal(deltas[1], 'the red');
    assert.equal(deltas.join(''), r.json.choices[0].message.content);
    // echo without a final assistant message echoes nothing (vLLM).
    const u = await chat({ messages: [{ role: 'user', content: 'x' }], echo: true, max_tokens: 3, ...GREEDY });
    const u2 = await chat({ messages: [{ role: 'user', content: 'x' }], max_tokens: 3, ...GREEDY });
    assert.equal(u.json.choices[0].message.content, u2.json.choices[0].message.content);
    // continue_final_message with add_generation_prompt: true is a contradiction.
    const both = await chat({ ...body, add_generation_prompt: true });
    assert.equal(both.status, 400, both.text);
  });

  test('return_token_ids: prompt_token_ids and token_ids as vLLM returns them, streamed and not, on both routes', async () => {
    const stream = async (path, body) => {
      const s = await fetch(`${server.base}${path}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: MODEL, ...body, stream: true }),
      });
      assert.equal(s.status, 200);
      const { events, done } = await readSse(s);
      assert.ok(done);
      return events.filter((e) => e.choices.length > 0);
    };
    // Completions: the ids per choice; checked against the logprobs' tokens written as ids.
    const prompt = [5, 6, 7, 8, 9];
    const r = await complete({ prompt, max_tokens: 6, return_token_ids: true, logprobs: 0, return_tokens_as_token_ids: true, ...GREEDY });
    assert.equal(r.status, 200, r.text);
    const c = r.json.choices[0];
    assert.deepEqual(c.prompt_token_ids, prompt);
    assert.equal(c.token_ids.length, 6);
    assert.deepEqual(c.logprobs.tokens, c.token_ids.map((id) => `token_id:${id}`));
    assert.equal(r.json.prompt_token_ids, undefined, 'completions carry them per choice');
    const plain = await complete({ prompt, max_tokens: 6, ...GREEDY });
    assert.equal(plain.json.choices[0].token_ids, undefined);
    assert.equal(plain.json.choices[0].prompt_token_ids, undefined);
    // n = 2 from a text prompt: each choice has the prompt's ids.
    const two = await complete({ prompt: 'the cat', max_tokens: 4, n: 2, temperature: 1, seed: 5, ignore_eos: true, return_token_ids: true });
    const ids = await tokenize('the cat');
    for (const ch of two.json.choices) {
      assert.deepEqual(ch.prompt_token_ids.slice(-ids.length), ids);
      assert.equal(ch.token_ids.length, 4);
    }
    // Streamed: the prompt's ids in each choice's first chunk only, the new ids in every chunk.
    let events = await stream('/completions', { prompt, max_tokens: 6, return_token_ids: true, ...GREEDY });
    assert.deepEqual(events[0].choices[0].prompt_token_ids, prompt);
    for (const e of events.slice(1)) assert.equal(e.choices[0].prompt_token_ids, undefined);
    assert.deepEqual(events.flatMap((e) => e.choices[0].token_ids), c.token_ids);
    // Chat: the prompt's ids (the rendered template's tokens) at the top, the generated ones per choice.
    const messages = [{ role: 'user', content: 'name a colour' }];
    const rendered = (await post('/tokenize', { model: MODEL, messages })).json.tokens;
    const m = await chat({ messages, max_tokens: 5, return_token_ids: true, ...GREEDY });
    assert.equal(m.status, 200, m.text);
    assert.deepEqual(m.json.prompt_token_ids, rendered);
    assert.equal(m.json.choices[0].token_ids.length, m.json.usage.completion_tokens);
    assert.equal(m.json.usage.prompt_tokens, rendered.length);
    events = await stream('/chat/completions', { messages, max_tokens: 5, return_token_ids: true, ...GREEDY });
    assert.deepEqual(events[0].prompt_token_ids, rendered, 'the role chunk carries the prompt ids');
    assert.equal(events[0].choices[0].delta.role, 'assistant');
    for (const e of events.slice(1)) assert.equal(e.prompt_token_ids, undefined);
    assert.deepEqual(events.slice(1).flatMap((e) => e.choices[0].token_ids), m.json.choices[0].token_ids);
    // Its type is checked.
    const bad = await chat({ messages, max_tokens: 2, return_token_ids: 'maybe' });
    assert.equal(bad.status, 400, bad.text);
    assert.match(bad.json.error.message, /'return_token_ids' must be a boolean/);
  });

  test('request_id and X-Request-Id name the response (the header first); the header is echoed', async () => {
    let r = await complete({ prompt: [5, 6, 7], max_tokens: 2, request_id: 'my-req-1' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.id, 'cmpl-my-req-1');
    r = await chat({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, request_id: 'my-req-2' });
    assert.equal(r.json.id, 'chatcmpl-my-req-2');
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, request_id: 'body' }, { headers: { 'X-Request-Id': 'from-header' } });
    assert.equal(r.json.id, 'cmpl-from-header');
    assert.equal(r.headers.get('x-request-id'), 'from-header');
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2 });
    assert.match(r.headers.get('x-request-id') ?? '', /^[0-9a-f]{32}$/);
    // The same request id twice at once: both are served.
    const both = await Promise.all([1, 2].map(() => complete({ prompt: [5, 6, 7], max_tokens: 8, ignore_eos: true, request_id: 'dup' })));
    for (const b of both) assert.equal(b.status, 200, b.text);
    const bad = await complete({ prompt: [5, 6, 7], max_tokens: 2, request_id: 5 });
    assert.equal(bad.status, 400, bad.text);
  });

  test('stop_reason: the stop string for a stop string, the id for a stop token', async () => {
    const prompt = makePrompt(8, 6);
    const base = await complete({ prompt, max_tokens: 8, return_tokens_as_token_ids: true, ...GREEDY });
    const ids = base.json.choices[0].token_ids;
    const r = await complete({ prompt, max_tokens: 8, stop_token_ids: [ids[2]], ...GREEDY });
    assert.equal(r.json.choices[0].finish_reason, 'stop');
    assert.equal(r.json.choices[0].stop_reason, ids[2]);
    const text = base.json.choices[0].text;
    const stop = text.trim().slice(0, 2);
    if (stop.length > 0) {
      const s = await complete({ prompt, max_tokens: 8, stop: [stop], ...GREEDY });
      assert.equal(s.json.choices[0].finish_reason, 'stop');
      assert.equal(s.json.choices[0].stop_reason, stop);
    }
    const len = await complete({ prompt, max_tokens: 3, ...GREEDY });
    assert.equal(len.json.choices[0].finish_reason, 'length');
    assert.equal(len.json.choices[0].stop_reason, null);
  });

  test('continuous_usage_stats: every chunk carries the prompt tokens and the tokens so far', async () => {
    for (const [path, body] of [
      ['/completions', { prompt: makePrompt(9, 13), max_tokens: 5, n: 2 }],
      ['/chat/completions', { messages: [{ role: 'user', content: 'hi there' }], max_tokens: 5 }],
    ]) {
      const s = await fetch(`${server.base}${path}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: MODEL, ...body, ...GREEDY, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } }),
      });
      const { events } = await readSse(s);
      const final = events.at(-1);
      assert.equal(final.choices.length, 0);
      const promptTokens = final.usage.prompt_tokens;  // one prompt (n does not multiply it)
      const last = {};
      for (const e of events.slice(0, -1)) {
        assert.ok(e.usage, `a chunk without usage: ${JSON.stringify(e)}`);
        assert.equal(e.usage.prompt_tokens, promptTokens, JSON.stringify(e));
        const i = e.choices[0].index;
        assert.ok(e.usage.completion_tokens >= (last[i] ?? 0));
        last[i] = e.usage.completion_tokens;
        assert.equal(e.usage.total_tokens, e.usage.prompt_tokens + e.usage.completion_tokens);
      }
      for (const v of Object.values(last)) assert.equal(v, 5);
    }
  });

  test('vllm:prompt_tokens_total counts every prompt token, prefix-cache hits included', async () => {
    const prompt = makePrompt(10, 40);
    await complete({ prompt, max_tokens: 1 });
    const m0 = metric(await metrics(server.url), 'vllm:prompt_tokens_total');
    const r = await complete({ prompt, max_tokens: 1 });
    assert.ok(r.json.usage.prompt_tokens_details?.cached_tokens > 0, JSON.stringify(r.json.usage));
    const m1 = metric(await metrics(server.url), 'vllm:prompt_tokens_total');
    assert.equal(m1 - m0, 40);
  });

  test('/reset_prefix_cache: the next request of a cached prompt hits nothing', async () => {
    const prompt = makePrompt(11, 40);
    await complete({ prompt, max_tokens: 1 });
    let r = await complete({ prompt, max_tokens: 1 });
    assert.ok(r.json.usage.prompt_tokens_details?.cached_tokens > 0);
    const reset = await post('/reset_prefix_cache');
    assert.equal(reset.status, 200, reset.text);
    r = await complete({ prompt, max_tokens: 1 });
    assert.equal(r.json.usage.prompt_tokens_details, null, JSON.stringify(r.json.usage));
    assert.equal((await request(`${server.url}/reset_prefix_cache`, { method: 'GET' })).status, 405);
  });

  test('/ping answers 200 to GET and POST', async () => {
    assert.equal((await request(`${server.url}/ping`, { method: 'GET' })).status, 200);
    assert.equal((await request(`${server.url}/ping`, { method: 'POST' })).status, 200);
  });

  test('/invocations routes by body shape: messages -> chat, prompt -> completions', async () => {
    const c = await post('/invocations', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.object, 'chat.completion');
    const p = await post('/invocations', { prompt: [5, 6, 7], max_tokens: 3 });
    assert.equal(p.status, 200, p.text);
    assert.equal(p.json.object, 'text_completion');
    const s = await fetch(`${server.url}/invocations`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: [5, 6], max_tokens: 2, stream: true }),
    });
    assert.equal(s.status, 200);
    assert.ok((await readSse(s)).done);
    const neither = await post('/invocations', { input: 'x' });
    assert.equal(neither.status, 400, neither.text);
  });

  test('/v1/models/{id}: the model object, or an OpenAI-style 404', async () => {
    const m = await client.models.retrieve(MODEL);
    assert.equal(m.id, MODEL);
    assert.equal(m.object, 'model');
    const r = await request(`${server.base}/models/${encodeURIComponent(MODEL)}`, { method: 'GET' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.id, MODEL);
    const missing = await request(`${server.base}/models/no-such-model`, { method: 'GET' });
    assert.equal(missing.status, 404, missing.text);
    assert.equal(missing.json.error.code, 'model_not_found');
    await assert.rejects(client.models.retrieve('no-such-model'), (e) => e.status === 404);
  });

  test('/server_info: the engine configuration as JSON', async () => {
    const r = await request(`${server.url}/server_info`, { method: 'GET' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.model_config.max_model_len, 512);
    assert.equal(r.json.model_config.vocab_size, 1024);
    assert.equal(r.json.cache_config.block_size, '16');
    assert.ok(Array.isArray(r.json.server_config.served_model_names));
  });

  test('CORS: preflight and simple responses with the default (allow all) settings', async () => {
    const pre = await fetch(`${server.base}/chat/completions`, {
      method: 'OPTIONS',
      headers: { Origin: 'http://example.com', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type, authorization' },
    });
    assert.equal(pre.status, 200);
    assert.equal(await pre.text(), 'OK');
    assert.equal(pre.headers.get('access-control-allow-origin'), '*');
    assert.equal(pre.headers.get('access-control-allow-methods'), 'DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT');
    assert.equal(pre.headers.get('access-control-allow-headers'), 'content-type, authorization');
    assert.equal(pre.headers.get('access-control-max-age'), '600');
    const simple = await request(`${server.base}/models`, { method: 'GET', headers: { Origin: 'http://example.com' } });
    assert.equal(simple.headers.get('access-control-allow-origin'), '*');
    const none = await request(`${server.base}/models`, { method: 'GET' });
    assert.equal(none.headers.get('access-control-allow-origin'), null);
  });
});

// vLLM's JSON-list forms of the flags (and a comma list).
describe('CORS with explicit origins, methods, headers and credentials', () => {
  let server;
  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '256', '--api-key', 'k',
      '--allowed-origins', '["http://good.example"]', '--allowed-methods', '["GET", "POST"]',
      '--allowed-headers', 'Authorization', '--allow-credentials']);
  });
  after(async () => { await server.stop(); });

  const preflight = (origin, method, headers) => fetch(`${server.base}/completions`, {
    method: 'OPTIONS',
    headers: { Origin: origin, 'Access-Control-Request-Method': method, ...(headers ? { 'Access-Control-Request-Headers': headers } : {}) },
  });

  test('an allowed preflight names the origin, with Vary and credentials; no API key needed', async () => {
    const r = await preflight('http://good.example', 'POST', 'Authorization, Content-Type');
    assert.equal(r.status, 200, await r.text());
    assert.equal(r.headers.get('access-control-allow-origin'), 'http://good.example');
    assert.equal(r.headers.get('vary'), 'Origin');
    assert.equal(r.headers.get('access-control-allow-credentials'), 'true');
    assert.equal(r.headers.get('access-control-allow-methods'), 'GET, POST');
    assert.equal(r.headers.get('access-control-allow-headers'), 'Accept, Accept-Language, Authorization, Content-Language, Content-Type');
  });

  test('disallowed origin, method or header: 400 naming what failed', async () => {
    let r = await preflight('http://evil.example', 'POST');
    assert.equal(r.status, 400);
    assert.equal(await r.text(), 'Disallowed CORS origin');
    assert.equal(r.headers.get('access-control-allow-origin'), null);
    r = await preflight('http://good.example', 'DELETE', 'X-Custom');
    assert.equal(r.status, 400);
    assert.equal(await r.text(), 'Disallowed CORS method, headers');
  });

  test('simple responses name an allowed origin only', async () => {
    const ok = await request(`${server.base}/models`, { method: 'GET', key: 'k', headers: { Origin: 'http://good.example' } });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get('access-control-allow-origin'), 'http://good.example');
    assert.equal(ok.headers.get('access-control-allow-credentials'), 'true');
    const evil = await request(`${server.base}/models`, { method: 'GET', key: 'k', headers: { Origin: 'http://evil.example' } });
    assert.equal(evil.headers.get('access-control-allow-origin'), null);
  });
});

describe('shutdown deadline', () => {
  test('a non-streamed request cut at the shutdown deadline gets a 503, not a 200', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '4096', '--shutdown-timeout', '0']);
    try {
      const pending = request(`${server.base}/completions`, { body: { model: MODEL, prompt: makePrompt(2, 16), max_tokens: 4000, ignore_eos: true } });
      await new Promise((r) => setTimeout(r, 300));
      server.child.kill('SIGTERM');
      let r;
      try {
        r = await pending;
      } catch {
        r = null;  // the connection may close first; then no 200 came either
      }
      if (r) {
        assert.equal(r.status, 503, r.text);
        assert.match(r.json.error.message, /shut/);
      }
    } finally {
      await server.stop();
    }
  });
});
