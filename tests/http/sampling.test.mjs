// Black-box tests of sampling and stop conditions through `polylora serve` on the built-in demo model
// (models/demo: it repeats its input; adapters reverse / upper / spell / rot13), whose tokenizer is byte
// level, so a stop string of k characters spans k tokens. Values are chosen so that a mistake shows:
// multi-token stop strings (cut exactly before them, or after them with include_stop_str_in_output, in
// completions and chat, streamed and not, nothing after the stop in any chunk), stop_reason as a JSON
// string for a stop string (also the digit "3") and a number for a stop token id, logit_bias forcing or
// forbidding tokens, min_tokens holding back stop tokens, EOS and stop strings, echo with logprobs for the
// prompt tokens (equal to prompt_logprobs), n > 1 with seeds, and the HTTP 503 / error event a request still
// running at the --shutdown-timeout deadline gets.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { MODEL, REPO, makePrompt, readSse, request, sleep, startServer } from './lib/server.mjs';

const DEMO = path.join(REPO, 'models/demo');
const PRESENT = existsSync(path.join(DEMO, 'config.json'));
const INPUT = 'the red fox sees 3 owls';
const chatPrompt = (input) => `<|im_start|>user\n${input}<|im_end|>\n<|im_start|>assistant\n`;
const GREEDY = { temperature: 0 };
const EOS = 2;  // <|im_end|>, the demo model's eos_token_id

describe('sampling and stop conditions (demo model)', { skip: PRESENT ? false : 'models/demo is absent' }, () => {
  let server;
  let client;

  before(async () => {
    server = await startServer([], { timeoutMs: 120_000 });
    client = new OpenAI({ baseURL: server.base, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    if (!server) return;
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  const post = async (route, body) => {
    const r = await request(`${server.base}/${route}`, { body });
    assert.equal(r.status, 200, r.text);
    return r.json;
  };
  const completion = (body) => post('completions', { model: 'demo', prompt: chatPrompt(INPUT), ...body });
  const chat = (body) => post('chat/completions', { model: 'demo', messages: [{ role: 'user', content: INPUT }], ...body });
  // A streamed request: the parsed events (raw, so that types are as sent) and whether [DONE] came.
  const stream = async (route, body) => {
    const r = await fetch(`${server.base}/${route}`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...body, stream: true }),
    });
    assert.equal(r.status, 200, await r.clone().text());
    const { events, done } = await readSse(r);
    assert.ok(done, 'the stream ends with [DONE]');
    return events;
  };
  const streamCompletion = (body) => stream('completions', { model: 'demo', prompt: chatPrompt(INPUT), ...body });
  const streamChat = (body) => stream('chat/completions', { model: 'demo', messages: [{ role: 'user', content: INPUT }], ...body });
  // Concatenated text per choice index, and the chunk that carried each choice's finish_reason.
  const collect = (events, chatApi) => {
    const texts = new Map();
    const finals = new Map();
    for (const ev of events) {
      assert.ok(!ev.error, `unexpected error event ${JSON.stringify(ev)}`);
      for (const c of ev.choices) {
        const piece = chatApi ? c.delta.content ?? '' : c.text;
        assert.ok(!finals.has(c.index) || piece === '', `text after the final chunk of choice ${c.index}`);
        texts.set(c.index, (texts.get(c.index) ?? '') + piece);
        if (c.finish_reason) finals.set(c.index, c);
      }
    }
    return { texts, finals };
  };
  const tokenize = async (prompt) => (await post('../tokenize', { prompt, add_special_tokens: false })).tokens;

  test('the greedy answers are the documented ones (the basis of the other tests)', async () => {
    const c = await completion({ max_tokens: 64, ...GREEDY, return_tokens_as_token_ids: true });
    assert.equal(c.choices[0].text, INPUT);
    assert.equal(c.choices[0].finish_reason, 'stop');
    assert.equal(c.choices[0].stop_reason, null);  // EOS
    assert.deepEqual(c.choices[0].token_ids, [...(await tokenize(INPUT)), EOS]);
    const up = await completion({ model: 'upper', max_tokens: 64, ...GREEDY });
    assert.equal(up.choices[0].text, INPUT.toUpperCase());
    const rev = await chat({ model: 'reverse', ...GREEDY });
    assert.equal(rev.choices[0].message.content, 'owls 3 sees fox red the');
  });

  // Greedy output, then a stop string spanning several tokens in the middle of it.
  for (const { model, stop } of [{ model: 'demo', stop: 'fox se' }, { model: 'upper', stop: 'D FOX S' }, { model: 'rot13', stop: 'frrf 3 b' }]) {
    test(`completions: a multi-token stop string (${model}, ${JSON.stringify(stop)}), streamed and not`, async () => {
      const base = { model, max_tokens: 64, ...GREEDY };
      const full = (await completion(base)).choices[0].text;
      const at = full.indexOf(stop);
      assert.ok(at > 0 && at + stop.length < full.length, `${JSON.stringify(stop)} inside ${JSON.stringify(full)}`);
      assert.ok((await tokenize(stop)).length >= 4, 'the stop string spans several tokens');

      const r = await completion({ ...base, stop: [stop, 'never-generated'], return_tokens_as_token_ids: true });
      const ch = r.choices[0];
      assert.equal(ch.text, full.slice(0, at));
      assert.equal(ch.finish_reason, 'stop');
      assert.equal(ch.stop_reason, stop);
      // Generation ran until the stop string was complete: its tokens were generated, not returned as text.
      assert.equal(r.usage.completion_tokens, at + stop.length);
      assert.deepEqual(ch.token_ids, await tokenize(full.slice(0, at + stop.length)));

      const inc = await completion({ ...base, stop, include_stop_str_in_output: true });
      assert.equal(inc.choices[0].text, full.slice(0, at + stop.length));
      assert.equal(inc.choices[0].finish_reason, 'stop');
      assert.equal(inc.choices[0].stop_reason, stop);

      for (const include of [false, true]) {
        const events = await streamCompletion({ ...base, stop: [stop], include_stop_str_in_output: include });
        const { texts, finals } = collect(events, false);
        const want = include ? full.slice(0, at + stop.length) : full.slice(0, at);
        assert.equal(texts.get(0), want, `include_stop_str_in_output ${include}`);
        assert.equal(finals.get(0).finish_reason, 'stop');
        assert.equal(finals.get(0).stop_reason, stop);
        // Nothing past the cut in any chunk; the pieces are a prefix of the answer at every point.
        let sofar = '';
        for (const ev of events) for (const c of ev.choices) {
          sofar += c.text;
          assert.ok(want.startsWith(sofar), `chunk overran: ${JSON.stringify(sofar)}`);
        }
        assert.ok(events.filter((e) => e.choices.some((c) => c.text)).length > 1, 'streamed in several chunks');
      }
    });
  }

  test('chat: a multi-token stop string, streamed and not (and through the openai client)', async () => {
    const base = { model: 'reverse', ...GREEDY };
    const full = (await chat(base)).choices[0].message.content;  // "owls 3 sees fox red the"
    const stop = 'sees fox';
    const at = full.indexOf(stop);
    assert.ok(at > 0, full);
    const r = await chat({ ...base, stop: [stop] });
    assert.equal(r.choices[0].message.content, full.slice(0, at));
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].stop_reason, stop);
    assert.equal(r.usage.completion_tokens, at + stop.length);

    const events = await streamChat({ ...base, stop });
    const { texts, finals } = collect(events, true);
    assert.equal(texts.get(0), full.slice(0, at));
    assert.equal(finals.get(0).finish_reason, 'stop');
    assert.equal(finals.get(0).stop_reason, stop);

    const inc = await client.chat.completions.create({
      model: 'reverse', messages: [{ role: 'user', content: INPUT }], ...GREEDY, stop, include_stop_str_in_output: true,
    });
    assert.equal(inc.choices[0].message.content, full.slice(0, at + stop.length));
    assert.equal(inc.choices[0].stop_reason, stop);
    let text = '';
    for await (const chunk of await client.chat.completions.create({
      model: 'reverse', messages: [{ role: 'user', content: INPUT }], ...GREEDY, stop, stream: true,
    })) for (const c of chunk.choices) text += c.delta.content ?? '';
    assert.equal(text, full.slice(0, at));
  });

  test('the earliest of several stop strings wins; one found across the held-back boundary', async () => {
    // "red" ends before "sees 3" starts; the longer stop string makes the stream hold back more text.
    const r = await completion({ ...GREEDY, max_tokens: 64, stop: ['sees 3 owls', 'red'] });
    assert.equal(r.choices[0].text, 'the ');
    assert.equal(r.choices[0].stop_reason, 'red');
    const { texts, finals } = collect(await streamCompletion({ ...GREEDY, max_tokens: 64, stop: ['sees 3 owls', 'red'] }), false);
    assert.equal(texts.get(0), 'the ');
    assert.equal(finals.get(0).stop_reason, 'red');
    // A stop string that is the whole rest of the answer: nothing of it leaks while it is being matched.
    const whole = await streamCompletion({ ...GREEDY, max_tokens: 64, stop: 'fox sees 3 owls' });
    assert.equal(collect(whole, false).texts.get(0), 'the red ');
  });

  test('a stop string of digits comes back as a JSON string ("3"), not a number', async () => {
    for (const stop of ['3', ['3']]) {
      const r = await request(`${server.base}/completions`, {
        body: { model: 'demo', prompt: chatPrompt(INPUT), max_tokens: 64, ...GREEDY, stop },
      });
      assert.equal(r.status, 200, r.text);
      assert.match(r.text, /"stop_reason":"3"/);
      assert.equal(r.json.choices[0].stop_reason, '3');
      assert.equal(typeof r.json.choices[0].stop_reason, 'string');
      assert.equal(r.json.choices[0].text, 'the red fox sees ');
      assert.equal(r.json.choices[0].finish_reason, 'stop');
    }
    const c = await chat({ ...GREEDY, stop: '3' });
    assert.equal(c.choices[0].message.content, 'the red fox sees ');
    assert.strictEqual(c.choices[0].stop_reason, '3');
    for (const [events, chatApi] of [[await streamCompletion({ ...GREEDY, max_tokens: 64, stop: '3' }), false], [await streamChat({ ...GREEDY, stop: ['3'] }), true]]) {
      const { texts, finals } = collect(events, chatApi);
      assert.equal(texts.get(0), 'the red fox sees ');
      assert.strictEqual(finals.get(0).stop_reason, '3');
    }
    // The spell adapter writes "three": "3" never appears, so it ends on EOS with stop_reason null.
    const spelled = await completion({ model: 'spell', max_tokens: 64, ...GREEDY, stop: '3' });
    assert.equal(spelled.choices[0].text, 'the red fox sees three owls');
    assert.strictEqual(spelled.choices[0].stop_reason, null);
  });

  test('stop_token_ids: finish_reason stop, stop_reason the id as a number, the token is the last one', async () => {
    const [x] = await tokenize('x');  // "fo|x": the 11th token of the answer
    for (const events of [null, await streamCompletion({ ...GREEDY, max_tokens: 64, stop_token_ids: [x] })]) {
      if (events) {
        const { texts, finals } = collect(events, false);
        assert.equal(texts.get(0), 'the red fo');
        assert.strictEqual(finals.get(0).stop_reason, x);
        assert.equal(finals.get(0).finish_reason, 'stop');
        continue;
      }
      const r = await request(`${server.base}/completions`, {
        body: { model: 'demo', prompt: chatPrompt(INPUT), max_tokens: 64, ...GREEDY, stop_token_ids: [x], return_tokens_as_token_ids: true },
      });
      assert.equal(r.status, 200, r.text);
      const ch = r.json.choices[0];
      assert.match(r.text, new RegExp(`"stop_reason":${x}[,}]`));
      assert.strictEqual(ch.stop_reason, x);
      assert.equal(ch.finish_reason, 'stop');
      assert.deepEqual(ch.token_ids, await tokenize('the red fox'));
      assert.equal(r.json.usage.completion_tokens, 'the red fox'.length);
      // The stop token's text is not part of the output (as vLLM), unless include_stop_str_in_output.
      assert.equal(ch.text, 'the red fo');
    }
    const inc = await completion({ ...GREEDY, max_tokens: 64, stop_token_ids: [x], include_stop_str_in_output: true });
    assert.equal(inc.choices[0].text, 'the red fox');
    const c = await chat({ ...GREEDY, stop_token_ids: [x] });
    assert.equal(c.choices[0].message.content, 'the red fo');
    assert.strictEqual(c.choices[0].stop_reason, x);
    // A stop token id and a stop string: whichever comes first (here the string).
    const both = await completion({ ...GREEDY, max_tokens: 64, stop_token_ids: [x], stop: 'red' });
    assert.equal(both.choices[0].text, 'the ');
    assert.strictEqual(both.choices[0].stop_reason, 'red');
  });

  test('logit_bias: +100 forces a token greedy would not pick; -100 forbids the greedy token', async () => {
    const [q] = await tokenize('Q');
    const forced = await completion({ ...GREEDY, max_tokens: 12, logit_bias: { [q]: 100 }, return_tokens_as_token_ids: true });
    assert.deepEqual(forced.choices[0].token_ids, Array(12).fill(q));
    assert.equal(forced.choices[0].text, 'Q'.repeat(12));
    assert.equal(forced.choices[0].finish_reason, 'length');
    const forcedChat = await client.chat.completions.create({
      model: 'upper', messages: [{ role: 'user', content: INPUT }], max_tokens: 5, ...GREEDY, logit_bias: { [q]: 100 },
    });
    assert.equal(forcedChat.choices[0].message.content, 'QQQQQ');
    // Streamed as well (the bias is a sampling setting of every sequence of the request).
    const { texts } = collect(await streamCompletion({ ...GREEDY, max_tokens: 6, logit_bias: { [q]: 100 } }), false);
    assert.equal(texts.get(0), 'QQQQQQ');

    const [t] = await tokenize('t');  // the greedy first token
    const banned = await completion({ ...GREEDY, max_tokens: 24, logit_bias: { [t]: -100 }, return_tokens_as_token_ids: true });
    assert.ok(!banned.choices[0].token_ids.includes(t), JSON.stringify(banned.choices[0]));
    assert.notEqual(banned.choices[0].text.slice(0, 1), 't');
    // A small bias leaves greedy output alone; several entries act together.
    const small = await completion({ ...GREEDY, max_tokens: 64, logit_bias: { [q]: 0.01 } });
    assert.equal(small.choices[0].text, INPUT);
    const [z] = await tokenize('z');
    const two = await completion({ ...GREEDY, max_tokens: 4, logit_bias: { [q]: 50, [z]: 100 } });
    assert.equal(two.choices[0].text, 'zzzz');
  });

  test('logit_bias beyond [-100, 100] is clamped as vLLM does: 1000 forces, -1e9 bans', async () => {
    const [q] = await tokenize('Q');
    const forced = await completion({ ...GREEDY, max_tokens: 6, logit_bias: { [q]: 1000 } });
    assert.equal(forced.choices[0].text, 'QQQQQQ');
    const [t] = await tokenize('t');
    const banned = await completion({ ...GREEDY, max_tokens: 24, logit_bias: { [t]: -1e9 }, return_tokens_as_token_ids: true });
    assert.ok(!banned.choices[0].token_ids.includes(t), JSON.stringify(banned.choices[0]));
    // The same tokens as with the largest bias accepted before (the clamp, not some other value).
    const hundred = await completion({ ...GREEDY, max_tokens: 24, logit_bias: { [t]: -100 }, return_tokens_as_token_ids: true });
    assert.deepEqual(banned.choices[0].token_ids, hundred.choices[0].token_ids);
  });

  test('chat prompt_logprobs: at the top of the response (vLLM), one entry per prompt token', async () => {
    const r = await chat({ ...GREEDY, max_tokens: 2, prompt_logprobs: 1 });
    assert.ok(Array.isArray(r.prompt_logprobs), JSON.stringify(Object.keys(r)));
    assert.equal(r.prompt_logprobs.length, r.usage.prompt_tokens);
    assert.strictEqual(r.prompt_logprobs[0], null);
    // The values of a completion over the same prompt text.
    const c = await completion({ ...GREEDY, max_tokens: 1, prompt_logprobs: 1 });
    assert.deepEqual(r.prompt_logprobs, c.choices[0].prompt_logprobs);
    assert.equal(r.choices[0].prompt_logprobs, undefined);
    // Not asked for: absent.
    assert.equal((await chat({ ...GREEDY, max_tokens: 1 })).prompt_logprobs, undefined);
  });

  test('min_tokens holds back stop_token_ids and EOS: exactly k tokens come first', async () => {
    const [s] = await tokenize('#');
    for (const k of [0, 1, 5, 9]) {
      const r = await completion({
        ...GREEDY, max_tokens: 30, min_tokens: k, stop_token_ids: [s], logit_bias: { [s]: 100 }, return_tokens_as_token_ids: true,
      });
      const ch = r.choices[0];
      // The stop token would be picked at once; min_tokens masks it until k tokens are out.
      assert.equal(ch.token_ids.length, k + 1, `min_tokens ${k}: ${JSON.stringify(ch)}`);
      assert.equal(ch.token_ids.at(-1), s);
      assert.ok(!ch.token_ids.slice(0, k).includes(s));
      assert.equal(ch.finish_reason, 'stop');
      assert.strictEqual(ch.stop_reason, s);
      assert.equal(r.usage.completion_tokens, k + 1);
      assert.equal(ch.text, INPUT.slice(0, k));  // greedy text until then; the stop token's own text left out
    }
    // EOS in the same way (stop_reason null), for chat too.
    for (const k of [0, 4]) {
      const r = await completion({ ...GREEDY, max_tokens: 30, min_tokens: k, logit_bias: { [EOS]: 100 }, return_tokens_as_token_ids: true });
      assert.equal(r.choices[0].token_ids.length, k + 1);
      assert.equal(r.choices[0].token_ids.at(-1), EOS);
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.strictEqual(r.choices[0].stop_reason, null);
      assert.equal(r.choices[0].text, INPUT.slice(0, k));
      const c = await chat({ ...GREEDY, min_tokens: k, logit_bias: { [EOS]: 100 } });
      assert.equal(c.usage.completion_tokens, k + 1);
      assert.equal(c.choices[0].message.content, INPUT.slice(0, k));
    }
    // The natural EOS (after 23 tokens) is held back by min_tokens 30, up to max_tokens.
    const longer = await completion({ ...GREEDY, max_tokens: 40, min_tokens: 30, return_tokens_as_token_ids: true });
    assert.ok(longer.choices[0].token_ids.length >= 30);
    assert.ok(!longer.choices[0].token_ids.slice(0, 30).includes(EOS));
    assert.ok(longer.choices[0].text.startsWith(INPUT));
  });

  test('min_tokens and stop strings: a match must end after the first min_tokens tokens (as vLLM)', async () => {
    // "e" first ends token 3 ("the"), next token 6 ("the re").
    const cases = [[0, 'th', 3], [2, 'th', 3], [3, 'the r', 6], [5, 'the r', 6], [6, 'the red fox s', 14]];
    for (const [k, text, tokens] of cases) {
      const r = await completion({ ...GREEDY, max_tokens: 64, min_tokens: k, stop: 'e' });
      assert.equal(r.choices[0].text, text, `min_tokens ${k}`);
      assert.equal(r.usage.completion_tokens, tokens, `min_tokens ${k}`);
      assert.equal(r.choices[0].stop_reason, 'e');
    }
    // A multi-token stop string that straddles the min_tokens boundary still counts.
    const r = await completion({ ...GREEDY, max_tokens: 64, min_tokens: 9, stop: 'fox sees' });
    assert.equal(r.choices[0].text, 'the red ');
    assert.equal(r.usage.completion_tokens, 16);
  });

  const checkEchoLogprobs = (choice, promptIds, promptText, promptLogprobs, k) => {
    const lp = choice.logprobs;
    const P = promptIds.length;
    const G = choice.text.length - promptText.length;
    assert.ok(choice.text.startsWith(promptText), JSON.stringify(choice.text));
    assert.equal(lp.tokens.length, P + G);  // byte-level: one generated token per character here
    for (const key of ['token_logprobs', 'top_logprobs', 'text_offset']) assert.equal(lp[key].length, lp.tokens.length, key);
    assert.strictEqual(lp.token_logprobs[0], null);
    assert.strictEqual(lp.top_logprobs[0], null);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 1; i < lp.tokens.length; ++i) {
      assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + lp.tokens[i - 1].length, `text_offset[${i}]`);
      assert.equal(typeof lp.token_logprobs[i], 'number');
      assert.ok(lp.token_logprobs[i] <= 0);
      assert.equal(lp.top_logprobs[i][lp.tokens[i]], lp.token_logprobs[i]);
    }
    assert.equal(lp.tokens.join(''), choice.text);
    // Prompt positions: the values prompt_logprobs gives for the same tokens.
    for (let i = 1; i < P; ++i) {
      const entry = promptLogprobs[i];
      assert.equal(lp.token_logprobs[i], entry[String(promptIds[i])].logprob, `prompt position ${i}`);
      const alts = Object.values(entry).filter((e) => e.rank <= k).map((e) => [e.decoded_token, e.logprob]);
      for (const [tok, logprob] of alts) assert.equal(lp.top_logprobs[i][tok], logprob, `top_logprobs[${i}][${tok}]`);
      assert.ok(Object.keys(lp.top_logprobs[i]).length <= k + 1);
    }
  };

  test('echo + logprobs: logprobs for the prompt tokens too (string and token-id prompts)', async () => {
    const text = 'the red fox';
    const ids = await tokenize(text);
    const k = 2;
    for (const prompt of [text, ids]) {
      const body = { model: 'demo', prompt, max_tokens: 5, ...GREEDY, echo: true, logprobs: k };
      const withPl = await post('completions', { ...body, prompt_logprobs: k });
      const ch = withPl.choices[0];
      assert.equal(withPl.usage.prompt_tokens, ids.length);
      assert.equal(ch.prompt_logprobs.length, ids.length);
      assert.strictEqual(ch.prompt_logprobs[0], null);
      checkEchoLogprobs(ch, ids, text, ch.prompt_logprobs, k);
      // Without prompt_logprobs in the request: the same logprobs, and prompt_logprobs with `logprobs`
      // alternatives all the same (vLLM: echo sets prompt_logprobs = logprobs when none is given).
      const plain = await post('completions', body);
      assert.deepEqual(plain.choices[0].prompt_logprobs, ch.prompt_logprobs);
      assert.deepEqual(plain.choices[0].logprobs, ch.logprobs);
      // prompt_logprobs of a separate call without echo agree.
      const separate = await post('completions', { model: 'demo', prompt, max_tokens: 1, prompt_logprobs: k, ...GREEDY });
      checkEchoLogprobs(ch, ids, text, separate.choices[0].prompt_logprobs, k);
      // The generated positions equal a request without echo (with prompt_logprobs, so that it too computes
      // the whole prompt instead of reading it from the prefix cache: the same arithmetic, the same values).
      const noEcho = await post('completions', { model: 'demo', prompt, max_tokens: 5, ...GREEDY, logprobs: k, prompt_logprobs: 0 });
      const g = noEcho.choices[0].logprobs;
      assert.deepEqual(ch.logprobs.tokens.slice(ids.length), g.tokens);
      assert.deepEqual(ch.logprobs.token_logprobs.slice(ids.length), g.token_logprobs);
      assert.deepEqual(ch.logprobs.top_logprobs.slice(ids.length), g.top_logprobs);
      assert.equal(ch.text, text + noEcho.choices[0].text);

      // Streamed: the pieces add up to the same text and logprobs.
      const events = await stream('completions', body);
      const joined = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
      let streamed = '';
      for (const ev of events) for (const c of ev.choices) {
        streamed += c.text;
        if (c.logprobs) for (const key of Object.keys(joined)) joined[key].push(...c.logprobs[key]);
      }
      assert.equal(streamed, ch.text);
      assert.deepEqual(joined, ch.logprobs);
    }
  });

  test('echo + logprobs with n > 1 and a prompt of several strings: every choice has the prompt part', async () => {
    const prompts = ['the red fox', 'an owl'];
    const r = await post('completions', { model: 'demo', prompt: prompts, n: 2, max_tokens: 3, ...GREEDY, echo: true, logprobs: 1, prompt_logprobs: 1 });
    assert.equal(r.choices.length, 4);
    for (const ch of r.choices) {
      const p = Math.floor(ch.index / 2);
      checkEchoLogprobs(ch, await tokenize(prompts[p]), prompts[p], ch.prompt_logprobs, 1);
    }
  });

  test('echo + logprobs under chunked prefill: every prompt position has its logprob', async () => {
    // 16 tokens a step: the 84-token prompt's logprobs come from six chunks.
    const chunked = await startServer(['--max-num-batched-tokens', '16'], { timeoutMs: 120_000 });
    try {
      const text = 'the red fox sees 3 owls and the big cat eats 5 fish near the old tree by the river';
      const ids = await tokenize(text);
      assert.ok(ids.length > 64);
      const body = { model: 'demo', prompt: text, max_tokens: 4, ...GREEDY, echo: true, logprobs: 1, prompt_logprobs: 1 };
      const one = (await request(`${chunked.base}/completions`, { body })).json.choices[0];
      checkEchoLogprobs(one, ids, text, one.prompt_logprobs, 1);
      const whole = (await post('completions', body)).choices[0];
      assert.deepEqual(one.logprobs.tokens, whole.logprobs.tokens);
      for (let i = 1; i < ids.length; ++i)
        assert.ok(Math.abs(one.logprobs.token_logprobs[i] - whole.logprobs.token_logprobs[i]) < 1e-3, `position ${i}`);
    } finally {
      await chunked.stop();
    }
  });

  test('n > 1 with a seed: reproducible, independent choices; streamed choices equal the body', async () => {
    const body = { max_tokens: 16, temperature: 1.5, seed: 1234, n: 3, ignore_eos: true, return_tokens_as_token_ids: true };
    const a = await completion(body);
    const b = await completion(body);
    assert.equal(a.choices.length, 3);
    assert.deepEqual(a.choices.map((c) => c.token_ids), b.choices.map((c) => c.token_ids));
    assert.equal(a.usage.completion_tokens, 48);
    assert.ok(new Set(a.choices.map((c) => c.token_ids.join(','))).size > 1, 'the choices are independent samples');
    const other = await completion({ ...body, seed: 99 });
    assert.notDeepEqual(other.choices.map((c) => c.token_ids), a.choices.map((c) => c.token_ids));
    // Each sequence has its own generator (seed + index), the same whatever else is in the batch.
    const single = await completion({ ...body, n: 1, seed: 1235 });
    assert.deepEqual(single.choices[0].token_ids, a.choices[1].token_ids);
    const { texts, finals } = collect(await streamCompletion(body), false);
    assert.deepEqual([...texts.keys()].sort(), [0, 1, 2]);
    for (const c of a.choices) {
      assert.equal(texts.get(c.index), c.text);
      assert.equal(finals.get(c.index).finish_reason, 'length');
    }
    // Chat, with a stop string applied to each choice separately.
    const chatBody = { n: 4, temperature: 1, seed: 7, max_tokens: 30, stop: ' ' };
    const c1 = await chat(chatBody);
    const c2 = await chat(chatBody);
    assert.deepEqual(c1.choices.map((c) => c.message.content), c2.choices.map((c) => c.message.content));
    for (const c of c1.choices) {
      assert.ok(!c.message.content.includes(' '), JSON.stringify(c));
      if (c.finish_reason === 'stop' && c.stop_reason !== null) assert.equal(c.stop_reason, ' ');
    }
    const sc = collect(await streamChat(chatBody), true);
    for (const c of c1.choices) assert.equal(sc.texts.get(c.index), c.message.content);
  });
});

// A request still running when --shutdown-timeout runs out gets HTTP 503 with a JSON error (non-streamed) or
// an error event then [DONE] (streamed); the server exits 0.
describe('shutdown deadline', () => {
  test('requests still running at the deadline: 503 + JSON error, or an error event and [DONE]', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '8192', '--shutdown-timeout', '1']);
    let exited = false;
    try {
      const body = (prompt) => ({ model: MODEL, prompt, max_tokens: 8000, ignore_eos: true, temperature: 0 });
      const streamRes = await fetch(`${server.base}/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...body(makePrompt(3, 8)), stream: true }),
      });
      assert.equal(streamRes.status, 200);
      const streamed = readSse(streamRes);
      const plain = request(`${server.base}/completions`, { body: body(makePrompt(4, 8)) });
      // Both running, then SIGTERM.
      for (let i = 0; ; ++i) {
        const m = await (await fetch(`${server.url}/metrics`)).text();
        if (/vllm:num_requests_running\{[^}]*\} 2\b/.test(m)) break;
        assert.ok(i < 200, `the requests never ran:\n${m}`);
        await sleep(25);
      }
      const t0 = Date.now();
      server.child.kill('SIGTERM');
      const r = await plain;
      const waited = Date.now() - t0;
      assert.equal(r.status, 503, r.text);
      assert.match(r.headers.get('content-type'), /application\/json/);
      assert.ok(r.json && r.json.error, r.text);
      assert.match(r.json.error.message, /shut down/);
      assert.equal(r.json.error.code, 503);
      assert.ok(waited >= 800, `the running request got its grace period (answered after ${waited} ms)`);
      const { events, done } = await streamed;
      assert.ok(done, 'the stream ended with [DONE]');
      assert.ok(events.length > 1, 'tokens were streamed before the deadline');
      const last = events.at(-1);
      assert.ok(last.error, `the last event is the error: ${JSON.stringify(last)}`);
      assert.match(last.error.message, /shut down/);
      assert.equal(last.error.code, 503);
      assert.ok(events.slice(0, -1).every((e) => !e.error && e.choices.every((c) => c.finish_reason === null)));
      const { code, signal } = await server.exited;
      exited = true;
      assert.equal(signal, null, server.log());
      assert.equal(code, 0, server.log());
    } finally {
      if (!exited) await server.stop();
    }
  });
});
