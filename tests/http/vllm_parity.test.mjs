// vLLM behaviours found by session 49's audit of streaming, chat request fields, /v1/responses and
// /v1/models against vLLM's source (serving_chat.py, serving_completion.py, protocol.py,
// serving_responses.py, serving_models.py), each checked through the HTTP API with values that show the
// difference: streamed echo in one chunk per choice, echo + return_token_ids without the prompt text,
// the usage chunk without null fields, include_reasoning, `reasoning` beside `reasoning_content`, an empty
// final delta as {}, vLLM's tool_choice rules and messages, transformers' continue_final_message match,
// top_logprobs needing logprobs, the Responses object's effective values, ids, 404 and logprobs, and the
// model cards' owned_by / parent / max_model_len.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { ADAPTERS, MODEL, REPO, readSse, request, startServer } from './lib/server.mjs';

const TEMPLATE = path.join(REPO, 'tests/data/chat_templates/qwen2.5-instruct.jinja');
const GREEDY = { temperature: 0, ignore_eos: true };
const TOOLS = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
// A template that opens <think> in the generation prompt: the qwen3 parser reads the answer as reasoning
// until </think>.
const THINK_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

describe('vLLM parity (session 49 audit)', () => {
  let server;
  const post = (route, body) => request(`${server.base}/${route}`, { body: { model: MODEL, ...body } });
  const stream = async (route, body) => {
    const r = await fetch(`${server.base}/${route}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: MODEL, stream: true, ...body }),
    });
    assert.equal(r.status, 200);
    return readSse(r);
  };

  before(async () => {
    server = await startServer([
      '--model', MODEL, '--max-model-len', '512', '--chat-template', TEMPLATE,
      '--enable-auto-tool-choice', '--tool-call-parser', 'hermes', '--reasoning-parser', 'qwen3',
      '--lora-modules', JSON.stringify({ name: 'attn', path: ADAPTERS.attn, base_model_name: 'my-base' }),
      '--lora-modules', `experts=${ADAPTERS.experts}`,
    ]);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('streamed completions with echo: the prompt rides each choice\'s first chunk (with logprobs), the rest follows', async () => {
    const prompt = 'The quick brown fox';
    const whole = await post('completions', { prompt, max_tokens: 4, echo: true, logprobs: 1, n: 2, ...GREEDY });
    assert.equal(whole.status, 200, whole.text);
    const { events, done } = await stream('completions', { prompt, max_tokens: 4, echo: true, logprobs: 1, n: 2, ...GREEDY });
    assert.ok(done);
    for (const index of [0, 1]) {
      const chunks = events.filter((e) => e.choices[0]?.index === index).map((e) => e.choices[0]);
      assert.ok(chunks[0].text.startsWith(prompt) && chunks[0].text.length > prompt.length, JSON.stringify(chunks[0]));
      assert.equal(chunks[0].finish_reason, null);
      assert.equal(chunks.map((c) => c.text).join(''), whole.json.choices[index].text);
      const tokens = chunks.flatMap((c) => c.logprobs?.tokens ?? []);
      assert.deepEqual(tokens, whole.json.choices[index].logprobs.tokens);
      const offsets = chunks.flatMap((c) => c.logprobs?.text_offset ?? []);
      assert.deepEqual(offsets, whole.json.choices[index].logprobs.text_offset);
    }
    // max_tokens 0: one chunk, the prompt with finish_reason "length".
    const only = await stream('completions', { prompt, max_tokens: 0, echo: true });
    const texts = only.events.filter((e) => e.choices.length);
    assert.equal(texts.length, 1, JSON.stringify(only.events));
    assert.equal(texts[0].choices[0].text, prompt);
    assert.equal(texts[0].choices[0].finish_reason, 'length');
  });

  test('echo with return_token_ids leaves the prompt text out (the ids carry it), streamed or not', async () => {
    const prompt = 'hello there';
    const r = await post('completions', { prompt, max_tokens: 3, echo: true, return_token_ids: true, ...GREEDY });
    const plain = await post('completions', { prompt, max_tokens: 3, ...GREEDY });
    assert.equal(r.json.choices[0].text, plain.json.choices[0].text);
    assert.ok(r.json.choices[0].prompt_token_ids.length > 0);
    const s = await stream('completions', { prompt, max_tokens: 3, echo: true, return_token_ids: true, ...GREEDY });
    assert.equal(s.events.map((e) => e.choices[0]?.text ?? '').join(''), plain.json.choices[0].text);
  });

  test('streamed chat, n = 2 with echo: every role chunk first, then the echoed content of each choice', async () => {
    const messages = [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Well,' }];
    const { events } = await stream('chat/completions', {
      messages, n: 2, max_tokens: 2, echo: true, add_generation_prompt: false, continue_final_message: true, ...GREEDY,
    });
    const first = events.slice(0, 4).map((e) => [e.choices[0].index, e.choices[0].delta]);
    assert.deepEqual(first, [
      [0, { role: 'assistant', content: '' }], [1, { role: 'assistant', content: '' }],
      [0, { content: 'Well,' }], [1, { content: 'Well,' }],
    ]);
  });

  test('the usage chunk of a stream has no null fields (vLLM: exclude_none)', async () => {
    const { events } = await stream('completions', { prompt: 'usage please', max_tokens: 2, stream_options: { include_usage: true } });
    const u = events.at(-1);
    assert.deepEqual(u.choices, []);
    assert.equal(u.usage.completion_tokens, 2);
    assert.ok(!('prompt_tokens_details' in u.usage), JSON.stringify(u.usage));
    // The non-streamed body keeps it (null when nothing was cached), as vLLM's.
    const whole = await post('completions', { prompt: 'usage please, again', max_tokens: 2 });
    assert.ok('prompt_tokens_details' in whole.json.usage);
  });

  test('reasoning: under `reasoning` and `reasoning_content`; include_reasoning false leaves it out', async () => {
    const body = { messages: [{ role: 'user', content: 'think' }], chat_template: THINK_TEMPLATE, max_tokens: 6, ...GREEDY };
    const on = await post('chat/completions', body);
    assert.equal(on.status, 200, on.text);
    const m = on.json.choices[0].message;
    assert.equal(typeof m.reasoning, 'string', JSON.stringify(m));
    assert.ok(m.reasoning.length > 0);
    assert.equal(m.reasoning_content, m.reasoning);
    const off = await post('chat/completions', { ...body, include_reasoning: false });
    assert.equal(off.json.choices[0].message.reasoning, null);
    assert.equal(off.json.choices[0].message.reasoning_content, null);
    assert.equal(off.json.choices[0].message.content, m.content);
    // Streamed: every reasoning delta under both names; none with include_reasoning false.
    const s = await stream('chat/completions', body);
    const deltas = s.events.map((e) => e.choices[0]?.delta).filter((d) => d && d.reasoning !== undefined);
    assert.ok(deltas.length > 0);
    for (const d of deltas) assert.equal(d.reasoning_content, d.reasoning);
    assert.equal(deltas.map((d) => d.reasoning).join(''), m.reasoning);
    const s2 = await stream('chat/completions', { ...body, include_reasoning: false });
    assert.ok(s2.events.every((e) => !e.choices[0]?.delta?.reasoning && !e.choices[0]?.delta?.reasoning_content));
    // What reasoning was left out leaves no content-free chunk with a made-up content: deltas are {} then
    // (vLLM's DeltaMessage()), never {"content": ""} after the role chunk.
    const afterRole = s2.events.filter((e) => e.choices.length).slice(1).map((e) => e.choices[0].delta);
    assert.ok(afterRole.every((d) => d.content !== ''), JSON.stringify(afterRole));
  });

  test('tool_choice as vLLM checks it: tools must be set, "required" over [] is "none", type defaults to function', async () => {
    const chat = (extra) => post('chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, ...extra });
    for (const tool_choice of ['auto', 'required', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await chat({ tool_choice });
      assert.equal(r.status, 400, JSON.stringify(tool_choice));
      assert.equal(r.json.error.message, 'When using `tool_choice`, `tools` must be set.');
    }
    const miss = await chat({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } });
    assert.equal(miss.status, 400);
    assert.equal(miss.json.error.message, 'The tool specified in `tool_choice` does not match any of the specified `tools`');
    const none = await chat({ tools: [], tool_choice: 'required' });
    assert.equal(none.status, 200, none.text);
    assert.deepEqual(none.json.choices[0].message.tool_calls, []);
    // (short strings and no extra keys keep the random fixture model's arguments within the token budget)
    const fn = { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 4 } },
      required: ['city'], additionalProperties: false } };
    const untyped = await chat({ tools: [{ function: fn }], tool_choice: { function: { name: 'get_weather' } },
      max_tokens: 150, seed: 1 });
    assert.equal(untyped.status, 200, untyped.text);
    assert.equal(untyped.json.choices[0].message.tool_calls[0]?.function.name, 'get_weather', untyped.text);
    // Not a JSON type error escaping as a 500: a clear 400.
    const typed = await chat({ tools: [{ type: 5, function: { name: 'f' } }] });
    assert.equal(typed.status, 400, typed.text);
    assert.match(typed.json.error.message, /'tools': each tool must be/);
  });

  test('continue_final_message finds a content the template trimmed (transformers\' rule); both flags true is vLLM\'s error', async () => {
    const template = "{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}\n{% endfor %}";
    const body = { messages: [{ role: 'user', content: 'Q' }, { role: 'assistant', content: 'The answer is \n' }],
      chat_template: template, continue_final_message: true, add_generation_prompt: false, max_tokens: 1 };
    const r = await post('chat/completions', body);
    assert.equal(r.status, 200, r.text);
    const tok = await request(`${server.url}/tokenize`, { body: { model: MODEL, prompt: '[user] Q\n[assistant] The answer is', add_special_tokens: false } });
    assert.equal(r.json.usage.prompt_tokens, tok.json.count);
    const both = await post('chat/completions', { ...body, add_generation_prompt: true });
    assert.equal(both.status, 400);
    assert.equal(both.json.error.message, 'Cannot set both `continue_final_message` and `add_generation_prompt` to True.');
  });

  test('top_logprobs needs logprobs true; modalities text and prediction are accepted', async () => {
    const base = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 };
    for (const extra of [{ top_logprobs: 2 }, { logprobs: false, top_logprobs: 2 }]) {
      const r = await post('chat/completions', { ...base, ...extra });
      assert.equal(r.status, 400, JSON.stringify(extra));
      assert.equal(r.json.error.message, 'when using `top_logprobs`, `logprobs` must be set to true.');
    }
    const ok = await post('chat/completions', { ...base, modalities: ['text'], prediction: { type: 'content', content: 'x' } });
    assert.equal(ok.status, 200, ok.text);
    const audio = await post('chat/completions', { ...base, modalities: ['text', 'audio'] });
    assert.equal(audio.status, 400);
    assert.match(audio.json.error.message, /modalities.*text only/);
  });

  test('/v1/models: owned_by vllm; an adapter\'s parent is its base_model_name, its max_model_len null', async () => {
    const r = await request(`${server.base}/models`, { method: 'GET' });
    const byId = Object.fromEntries(r.json.data.map((m) => [m.id, m]));
    assert.equal(byId[MODEL].owned_by, 'vllm');
    assert.equal(byId[MODEL].max_model_len, 512);
    assert.equal(byId.attn.parent, 'my-base');
    assert.equal(byId.experts.parent, MODEL);
    assert.equal(byId.attn.max_model_len, null);
    assert.equal(byId.attn.owned_by, 'vllm');
  });

  test('/v1/responses: the values sampling used, a body request_id as the id, and vLLM\'s fields', async () => {
    const r = await post('responses', { input: 'Say something.', request_id: 'my-response-1' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.id, 'my-response-1');
    assert.equal(r.json.temperature, 1);  // the default, not null
    assert.equal(r.json.top_p, 1);
    assert.equal(r.json.max_output_tokens, 512 - r.json.usage.input_tokens);  // the room the context left
    assert.equal(r.json.service_tier, 'auto');
    assert.equal(r.json.top_logprobs, 0);
    assert.equal(r.json.usage.output_tokens_details.tool_output_tokens, 0);
    // max_output_tokens beyond the context is capped, not refused.
    const big = await post('responses', { input: 'x', max_output_tokens: 100000, temperature: 0.5 });
    assert.equal(big.status, 200, big.text);
    assert.equal(big.json.max_output_tokens, 512 - big.json.usage.input_tokens);
    assert.equal(big.json.temperature, 0.5);
    // previous_response_id: no response is stored, so it is not found.
    const prev = await post('responses', { input: 'x', previous_response_id: 'resp_abc' });
    assert.equal(prev.status, 404, prev.text);
    assert.equal(prev.json.error.message, "Response with id 'resp_abc' not found.");
  });

  test('/v1/responses logprobs: null unless include asks for them, then one per output token', async () => {
    const body = { input: 'Count.', max_output_tokens: 5, temperature: 0 };
    const plain = await post('responses', body);
    const msg = plain.json.output.find((o) => o.type === 'message');
    assert.ok(msg, plain.text);
    assert.equal(msg.content[0].logprobs, null);
    const withLp = await post('responses', { ...body, include: ['message.output_text.logprobs'], top_logprobs: 2,
      logit_bias: { 5: 1 }, skip_special_tokens: true });
    assert.equal(withLp.status, 200, withLp.text);
    const lp = withLp.json.output.find((o) => o.type === 'message').content[0].logprobs;
    assert.equal(lp.length, withLp.json.usage.output_tokens);
    for (const e of lp) {
      assert.ok(e.logprob <= 0);
      assert.equal(e.top_logprobs.length, 2);
    }
    assert.equal(withLp.json.top_logprobs, 2);
  });
});
