// Black-box tests of `polylora serve` through the official `openai` client: completions and chat
// (streaming and not), n > 1, stop strings, logprobs, adapters selected by `model`, run-time adapter
// load / unload, exact usage, echo, token ids, and greedy parity with `polylora generate`.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  ADAPTERS, MODEL, REFERENCE_PROMPTS, offlineGreedy, request, startServer,
} from './lib/server.mjs';

const KEY = 'sk-polylora-test';
const GREEDY = { temperature: 0, ignore_eos: true };

describe('openai client', () => {
  let server;
  let client;
  let baseName;

  before(async () => {
    server = await startServer([
      '--model', MODEL,
      '--lora-modules', `attn=${ADAPTERS.attn}`,
      '--lora-modules', `experts=${ADAPTERS.experts}`,
      '--max-model-len', '256',
      '--api-key', KEY,
      '--enable-lora-runtime-updating',
      '--lora-allowed-dirs', `${MODEL}/adapters`,
    ]);
    client = new OpenAI({ baseURL: server.base, apiKey: KEY, maxRetries: 0, timeout: 60_000 });
    baseName = MODEL;
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  const ids = (choice) => choice.token_ids;

  test('/v1/models lists the base model and the adapters with parent and root', async () => {
    const list = await client.models.list();
    const byId = Object.fromEntries(list.data.map((m) => [m.id, m]));
    assert.deepEqual(Object.keys(byId).sort(), [baseName, 'attn', 'experts'].sort());
    assert.equal(byId[baseName].parent, null);
    assert.equal(byId.attn.parent, baseName);
    assert.equal(byId.attn.root, ADAPTERS.attn);
    assert.equal(byId.experts.root, ADAPTERS.experts);
  });

  test('completion, non-streaming and streaming give the same greedy text', async () => {
    const params = { model: baseName, prompt: 'Hello world', max_tokens: 12, ...GREEDY };
    const full = await client.completions.create(params);
    assert.equal(full.object, 'text_completion');
    assert.equal(full.model, baseName);
    assert.match(full.id, /^cmpl-/);
    assert.equal(full.choices.length, 1);
    assert.equal(full.choices[0].index, 0);
    assert.equal(full.choices[0].finish_reason, 'length');
    assert.equal(full.usage.completion_tokens, 12);
    assert.ok(full.choices[0].text.length > 0);

    const stream = await client.completions.create({ ...params, stream: true });
    let text = '';
    let finish = null;
    let chunks = 0;
    for await (const chunk of stream) {
      ++chunks;
      assert.equal(chunk.object, 'text_completion');
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(chunks > 1, 'streamed in several chunks');
    assert.equal(text, full.choices[0].text);
    assert.equal(finish, 'length');
  });

  test('chat, non-streaming and streaming give the same greedy content', async () => {
    const params = { model: baseName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 10, ...GREEDY };
    const full = await client.chat.completions.create(params);
    assert.equal(full.object, 'chat.completion');
    assert.match(full.id, /^chatcmpl-/);
    assert.equal(full.choices[0].message.role, 'assistant');
    assert.equal(full.choices[0].finish_reason, 'length');
    assert.equal(full.usage.completion_tokens, 10);

    const stream = await client.chat.completions.create({ ...params, stream: true });
    let content = '';
    let role = null;
    let finish = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      for (const c of chunk.choices) {
        if (c.delta.role) role = c.delta.role;
        content += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(content, full.choices[0].message.content);
    assert.equal(finish, 'length');
  });

  test('n > 1 gives n choices with distinct indexes (completions and chat, streaming too)', async () => {
    const c = await client.completions.create({
      model: baseName, prompt: 'Once', n: 3, max_tokens: 6, temperature: 1, seed: 7, ignore_eos: true, return_tokens_as_token_ids: true,
    });
    assert.deepEqual(c.choices.map((x) => x.index).sort(), [0, 1, 2]);
    assert.equal(c.usage.completion_tokens, 18);
    // Sampled (temperature 1): the choices are independent samples, not copies of one.
    assert.ok(new Set(c.choices.map((x) => x.token_ids.join(','))).size > 1, JSON.stringify(c.choices));
    const chat = await client.chat.completions.create({
      model: baseName, messages: [{ role: 'user', content: 'hi' }], n: 2, max_tokens: 5, ...GREEDY,
    });
    assert.deepEqual(chat.choices.map((x) => x.index).sort(), [0, 1]);
    assert.equal(chat.usage.completion_tokens, 10);
    // Greedy: every choice is the same sequence.
    assert.equal(chat.choices[0].message.content, chat.choices[1].message.content);

    const stream = await client.completions.create({ model: baseName, prompt: 'Once', n: 3, max_tokens: 4, ...GREEDY, stream: true });
    const texts = new Map();
    const finished = new Set();
    for await (const chunk of stream)
      for (const ch of chunk.choices) {
        texts.set(ch.index, (texts.get(ch.index) ?? '') + ch.text);
        if (ch.finish_reason) finished.add(ch.index);
      }
    assert.deepEqual([...texts.keys()].sort(), [0, 1, 2]);
    assert.deepEqual([...finished].sort(), [0, 1, 2]);
  });

  // Picks a stop string that occurs in the greedy output (ASCII, not at the start).
  function pickStop(text) {
    for (let i = 3; i + 2 <= text.length; ++i) {
      const s = text.slice(i, i + 2);
      if (/^[A-Za-z0-9_]{2}$/.test(s) && text.indexOf(s) === i) return { stop: s, at: i };
    }
    return null;
  }

  test('stop strings end the output before the stop string (finish_reason stop, stop_reason the string)', async () => {
    const params = { model: baseName, prompt: 'The quick brown fox', max_tokens: 32, ...GREEDY };
    const full = (await client.completions.create(params)).choices[0].text;
    const pick = pickStop(full);
    assert.ok(pick, `no usable stop string in ${JSON.stringify(full)}`);

    const r = await client.completions.create({ ...params, stop: [pick.stop] });
    assert.equal(r.choices[0].text, full.slice(0, pick.at));
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].stop_reason, pick.stop);

    const inc = await client.completions.create({ ...params, stop: pick.stop, include_stop_str_in_output: true });
    assert.equal(inc.choices[0].text, full.slice(0, pick.at + pick.stop.length));
    assert.equal(inc.choices[0].finish_reason, 'stop');
    assert.equal(inc.choices[0].stop_reason, pick.stop);

    // Streaming: the concatenated deltas never contain the stop string.
    const stream = await client.completions.create({ ...params, stop: [pick.stop], stream: true });
    let text = '';
    let last;
    for await (const chunk of stream) for (const c of chunk.choices) { text += c.text; if (c.finish_reason) last = c; }
    assert.equal(text, full.slice(0, pick.at));
    assert.equal(last.finish_reason, 'stop');
    assert.equal(last.stop_reason, pick.stop);

    // Chat as well.
    const chatParams = { model: baseName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 32, ...GREEDY };
    const chatFull = (await client.chat.completions.create(chatParams)).choices[0].message.content;
    const cp = pickStop(chatFull);
    assert.ok(cp, `no usable stop string in ${JSON.stringify(chatFull)}`);
    const chat = await client.chat.completions.create({ ...chatParams, stop: [cp.stop] });
    assert.equal(chat.choices[0].message.content, chatFull.slice(0, cp.at));
    assert.equal(chat.choices[0].finish_reason, 'stop');
    assert.equal(chat.choices[0].stop_reason, cp.stop);
  });

  test('completion logprobs: k alternatives per token, the chosen token included', async () => {
    const k = 3;
    // Tokens as token_id:N, so that distinct tokens with the same text (byte fragments) are distinct keys.
    const r = await client.completions.create({
      model: baseName, prompt: 'Hello', max_tokens: 6, logprobs: k, return_tokens_as_token_ids: true, ...GREEDY,
    });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 6);
    assert.equal(lp.token_logprobs.length, 6);
    assert.equal(lp.top_logprobs.length, 6);
    assert.equal(lp.text_offset.length, 6);
    assert.deepEqual(lp.tokens, r.choices[0].token_ids.map((id) => `token_id:${id}`));
    for (let i = 0; i < 6; ++i) {
      const alts = lp.top_logprobs[i];
      const n = Object.keys(alts).length;
      assert.ok(n >= k && n <= k + 1, `top_logprobs[${i}] has ${n} entries`);
      assert.ok(lp.token_logprobs[i] <= 0);
      assert.equal(alts[lp.tokens[i]], lp.token_logprobs[i]);
      // Greedy: the chosen token is the most likely one.
      assert.ok(Math.max(...Object.values(alts)) <= lp.token_logprobs[i] + 1e-6);
    }
    // As text: the tokens spell the completion.
    const t = await client.completions.create({ model: baseName, prompt: 'Hello', max_tokens: 6, logprobs: 1, ...GREEDY });
    assert.equal(t.choices[0].logprobs.tokens.join(''), t.choices[0].text);
    assert.deepEqual(t.choices[0].logprobs.token_logprobs, lp.token_logprobs);
  });

  test('chat logprobs: logprobs true with top_logprobs k', async () => {
    const k = 4;
    const r = await client.chat.completions.create({
      model: baseName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, logprobs: true, top_logprobs: k, ...GREEDY,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, 5);
    assert.equal(content.map((c) => c.token).join(''), r.choices[0].message.content);
    for (const c of content) {
      assert.equal(c.top_logprobs.length, k);
      assert.ok(c.logprob <= 0);
      assert.ok(Array.isArray(c.bytes));
      assert.ok(Math.max(...c.top_logprobs.map((t) => t.logprob)) <= c.logprob + 1e-6);
      assert.ok(c.top_logprobs.some((t) => t.token === c.token && t.logprob === c.logprob));
    }
    // Without logprobs: null.
    const plain = await client.chat.completions.create({ model: baseName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(plain.choices[0].logprobs, null);
  });

  test('the model field selects the adapter: base and adapters differ; unknown model is a 404', async () => {
    const prompt = REFERENCE_PROMPTS[1];
    const out = {};
    for (const model of [baseName, 'attn', 'experts']) {
      const r = await client.completions.create({ model, prompt, max_tokens: 16, return_tokens_as_token_ids: true, ...GREEDY });
      assert.equal(r.model, model);
      out[model] = ids(r.choices[0]).join(',');
      assert.equal(ids(r.choices[0]).length, 16);
    }
    assert.notEqual(out[baseName], out.attn);
    assert.notEqual(out[baseName], out.experts);
    assert.notEqual(out.attn, out.experts);

    await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 }), (e) => {
      assert.ok(e instanceof OpenAI.NotFoundError, String(e));
      assert.equal(e.status, 404);
      assert.match(e.message, /no-such-model/);
      return true;
    });
    await assert.rejects(
      client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
      OpenAI.NotFoundError,
    );
  });

  test('adapters load and unload at run time', async () => {
    const name = 'runtime-perexp';
    const prompt = REFERENCE_PROMPTS[1];
    await assert.rejects(client.completions.create({ model: name, prompt, max_tokens: 2 }), OpenAI.NotFoundError);

    const load = await request(`${server.base}/load_lora_adapter`, { key: KEY, body: { lora_name: name, lora_path: ADAPTERS.perexp } });
    assert.equal(load.status, 200, load.text);
    assert.match(load.text, /success/i);

    const listed = (await client.models.list()).data.find((m) => m.id === name);
    assert.ok(listed, 'the new adapter is listed');
    assert.equal(listed.parent, baseName);
    assert.equal(listed.root, ADAPTERS.perexp);

    const r = await client.completions.create({ model: name, prompt, max_tokens: 12, return_tokens_as_token_ids: true, ...GREEDY });
    assert.equal(r.model, name);
    const [offline] = await offlineGreedy([prompt], 12, { loras: { p: ADAPTERS.perexp }, adapter: 'p' });
    assert.deepEqual(ids(r.choices[0]), offline, 'a run-time adapter generates what `polylora generate` does');

    const again = await request(`${server.base}/load_lora_adapter`, { key: KEY, body: { lora_name: name, lora_path: ADAPTERS.perexp } });
    assert.equal(again.status, 400, 'loading the same name twice is refused');

    const unload = await request(`${server.base}/unload_lora_adapter`, { key: KEY, body: { lora_name: name } });
    assert.equal(unload.status, 200, unload.text);
    assert.ok(!(await client.models.list()).data.some((m) => m.id === name));
    await assert.rejects(client.completions.create({ model: name, prompt, max_tokens: 2 }), OpenAI.NotFoundError);
    const twice = await request(`${server.base}/unload_lora_adapter`, { key: KEY, body: { lora_name: name } });
    assert.equal(twice.status, 404);
  });

  test('usage counts are exact (token-id prompt, max_tokens with ignore_eos), streaming include_usage too', async () => {
    for (const prompt of REFERENCE_PROMPTS) {
      const r = await client.completions.create({ model: baseName, prompt, max_tokens: 7, ...GREEDY });
      assert.deepEqual(
        [r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens],
        [prompt.length, 7, prompt.length + 7],
      );
    }
    const prompt = REFERENCE_PROMPTS[2];
    const stream = await client.completions.create({
      model: 'attn', prompt, max_tokens: 9, ...GREEDY, stream: true, stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.prompt_tokens, prompt.length);
    assert.equal(last.usage.completion_tokens, 9);
    assert.equal(last.usage.total_tokens, prompt.length + 9);
    for (const c of chunks.slice(0, -1)) assert.ok(c.usage == null, 'only the final chunk carries usage');

    // Chat: prompt_tokens equals /tokenize of the same messages.
    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Count to three.' }];
    const tok = await request(`${server.url}/tokenize`, { body: { model: baseName, messages }, key: KEY });
    assert.equal(tok.status, 200, tok.text);
    const chat = await client.chat.completions.create({ model: baseName, messages, max_tokens: 5, ...GREEDY });
    assert.equal(chat.usage.prompt_tokens, tok.json.count);
    assert.equal(chat.usage.completion_tokens, 5);
    const chatStream = await client.chat.completions.create({
      model: baseName, messages, max_tokens: 5, ...GREEDY, stream: true, stream_options: { include_usage: true },
    });
    let usage;
    for await (const c of chatStream) if (c.usage) usage = c.usage;
    assert.equal(usage.prompt_tokens, tok.json.count);
    assert.equal(usage.completion_tokens, 5);
  });

  test('echo returns the prompt before the completion', async () => {
    const prompt = 'Hello world';
    const plain = await client.completions.create({ model: baseName, prompt, max_tokens: 5, ...GREEDY });
    const echo = await client.completions.create({ model: baseName, prompt, max_tokens: 5, echo: true, ...GREEDY });
    assert.equal(echo.choices[0].text, prompt + plain.choices[0].text);

    const ids = REFERENCE_PROMPTS[1];
    const detok = await request(`${server.url}/detokenize`, { body: { model: baseName, tokens: ids }, key: KEY });
    const echoIds = await client.completions.create({ model: baseName, prompt: ids, max_tokens: 3, echo: true, ...GREEDY });
    assert.ok(echoIds.choices[0].text.startsWith(detok.json.prompt));

    const stream = await client.completions.create({ model: baseName, prompt, max_tokens: 5, echo: true, ...GREEDY, stream: true });
    let text = '';
    for await (const c of stream) for (const ch of c.choices) text += ch.text;
    assert.equal(text, prompt + plain.choices[0].text);
  });

  test('return_tokens_as_token_ids renders tokens as token_id:N', async () => {
    const r = await client.completions.create({
      model: baseName, prompt: REFERENCE_PROMPTS[1], max_tokens: 6, logprobs: 2, return_tokens_as_token_ids: true, ...GREEDY,
    });
    const choice = r.choices[0];
    assert.equal(choice.token_ids.length, 6);
    assert.deepEqual(choice.logprobs.tokens, choice.token_ids.map((id) => `token_id:${id}`));
    for (const alts of choice.logprobs.top_logprobs)
      for (const key of Object.keys(alts)) assert.match(key, /^token_id:\d+$/);

    const chat = await client.chat.completions.create({
      model: baseName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, logprobs: true, top_logprobs: 2,
      return_tokens_as_token_ids: true, ...GREEDY,
    });
    for (const c of chat.choices[0].logprobs.content) {
      assert.match(c.token, /^token_id:\d+$/);
      for (const t of c.top_logprobs) assert.match(t.token, /^token_id:\d+$/);
    }
  });

  test('greedy output for token-id prompts equals `polylora generate` (base and adapters)', async () => {
    const maxTokens = 24;
    for (const [model, adapter] of [[baseName, null], ['attn', 'attn'], ['experts', 'experts']]) {
      const opts = adapter ? { loras: { [adapter]: ADAPTERS[adapter] }, adapter } : {};
      const offline = await offlineGreedy(REFERENCE_PROMPTS, maxTokens, opts);
      for (let i = 0; i < REFERENCE_PROMPTS.length; ++i) {
        const r = await client.completions.create({
          model, prompt: REFERENCE_PROMPTS[i], max_tokens: maxTokens, return_tokens_as_token_ids: true, ...GREEDY,
        });
        assert.deepEqual(ids(r.choices[0]), offline[i], `${model}, prompt ${i}`);
        // The returned text is the detokenized ids (/detokenize keeps special tokens; the output skips them).
        const detok = await request(`${server.url}/detokenize`, { body: { tokens: offline[i] }, key: KEY });
        assert.equal(r.choices[0].text, detok.json.prompt.replace(/<\|[a-z_]+\|>/g, ''));
      }
    }
  });
});
