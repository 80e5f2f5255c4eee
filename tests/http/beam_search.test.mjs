// Black-box tests of use_beam_search (vLLM's beam search on /v1/completions and /v1/chat/completions):
// the server's beams against a beam search written here from the server's own one-token top-2·width
// logprobs (vLLM's algorithm: candidates from each live beam's 2·width alternatives, EOS ends a beam,
// the best `width` by cumulative logprob / length^length_penalty survive, finished and live beams ranked the
// same way at the end), width 1 against greedy decoding, and the fields that cannot go with it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, metric, readSse, request, startServer } from './lib/server.mjs';

const EOS = 2;  // the model's (and its tokenizer's) eos id

describe('beam search', () => {
  let server;
  const post = (path, body) => request(`${server.url}${path}`, { body });
  const complete = (body) => post('/v1/completions', { model: MODEL, ...body });
  const chat = (body) => post('/v1/chat/completions', { model: MODEL, ...body });

  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '512', '--max-logprobs', '40']);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  // The one-token alternatives of a sequence: [id, logprob] best first, as the server reports them.
  async function alternatives(tokens, k) {
    const r = await complete({ prompt: tokens, max_tokens: 1, temperature: 0, logprobs: k, return_tokens_as_token_ids: true });
    assert.equal(r.status, 200, r.text);
    return Object.entries(r.json.choices[0].logprobs.top_logprobs[0]).map(([key, lp]) => [Number(key.split(':')[1]), lp]);
  }

  async function reference(prompt, { width, maxTokens, lengthPenalty = 1, ignoreEos = false, includeStop = false }) {
    const score = (b) => {
      let len = b.tokens.length;
      if (b.tokens[len - 1] === EOS) len -= 1;
      return b.cum / len ** lengthPenalty;
    };
    let beams = [{ tokens: prompt, cum: 0, eos: false }];
    const finished = [];
    for (let t = 0; t < maxTokens && beams.length > 0; ++t) {
      const next = [];
      for (const b of beams) {
        for (const [id, lp] of await alternatives(b.tokens, 2 * width)) {
          const nb = { tokens: [...b.tokens, id], cum: b.cum + lp, eos: false };
          if (id === EOS && !ignoreEos) {
            finished.push({ ...nb, eos: true, tokens: includeStop ? nb.tokens : b.tokens });
          } else {
            next.push(nb);
          }
        }
      }
      next.sort((a, b) => score(b) - score(a));  // stable, as Python's sorted
      beams = next.slice(0, width);
    }
    const all = [...finished, ...beams].sort((a, b) => score(b) - score(a)).slice(0, width);
    return all.map((b) => ({ ids: b.tokens.slice(prompt.length), cum: b.cum, eos: b.eos }));
  }

  const checkAgainst = (choices, ref) => {
    assert.equal(choices.length, ref.length);
    choices.forEach((c, i) => {
      assert.equal(c.index, i);
      assert.deepEqual(c.token_ids, ref[i].ids, `beam ${i}`);
      assert.equal(c.finish_reason, ref[i].eos ? 'stop' : 'length', `beam ${i}`);
      assert.equal(c.stop_reason, ref[i].eos ? EOS : null, `beam ${i}`);
    });
  };

  test('width 1 is greedy decoding', async () => {
    const prompt = [11, 12, 13, 14];
    const greedy = await complete({ prompt, max_tokens: 8, temperature: 0, ignore_eos: true, return_token_ids: true });
    const beam = await complete({ prompt, max_tokens: 8, use_beam_search: true, ignore_eos: true, return_token_ids: true });
    assert.equal(beam.status, 200, beam.text);
    assert.equal(beam.json.choices.length, 1);
    assert.deepEqual(beam.json.choices[0].token_ids, greedy.json.choices[0].token_ids);
    assert.equal(beam.json.choices[0].text, greedy.json.choices[0].text);
    assert.equal(beam.json.usage.completion_tokens, 8);
    assert.equal(beam.json.usage.prompt_tokens, 4);
  });

  test('width 4 equals a beam search over the server\'s own alternatives, with its logprobs', async () => {
    const prompt = [100, 200, 300];
    const ref = await reference(prompt, { width: 4, maxTokens: 5, ignoreEos: true });
    const r = await complete({ prompt, n: 4, max_tokens: 5, use_beam_search: true, ignore_eos: true, return_token_ids: true, logprobs: 2 });
    assert.equal(r.status, 200, r.text);
    checkAgainst(r.json.choices, ref);
    r.json.choices.forEach((c, i) => {
      const sum = c.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
      assert.ok(Math.abs(sum - ref[i].cum) < 1e-3, `beam ${i}: ${sum} vs ${ref[i].cum}`);
      assert.equal(c.logprobs.tokens.length, 5);
      c.logprobs.top_logprobs.forEach((top) => assert.ok(Object.keys(top).length >= 2));
    });
    // The beams are distinct and ranked: scores (all of length 3 + 5) never increase.
    const cums = r.json.choices.map((c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0));
    for (let i = 1; i < cums.length; ++i) assert.ok(cums[i] <= cums[i - 1] + 1e-6);
    assert.equal(new Set(r.json.choices.map((c) => c.token_ids.join(','))).size, 4);
    assert.equal(r.json.usage.completion_tokens, 20);
  });

  test('EOS ends a beam (stop, stop_reason the EOS id), length_penalty ranks the ends', async () => {
    // A search wide enough that the EOS token is among the alternatives of some beam: found by trying
    // prompts, so that the test exercises finished beams (asserted below).
    let found = null;
    for (let p = 20; p < 60 && !found; p += 7) {
      const prompt = [p, p + 1, p + 2];
      for (const lengthPenalty of [1.0, 0.0]) {
        const ref = await reference(prompt, { width: 10, maxTokens: 3, lengthPenalty });
        if (ref.some((b) => b.eos)) found = { prompt, ref, lengthPenalty };
      }
    }
    assert.ok(found, 'no prompt put the EOS token among the top 20 alternatives');
    const { prompt, ref, lengthPenalty } = found;
    const r = await complete({ prompt, n: 10, max_tokens: 3, use_beam_search: true, length_penalty: lengthPenalty, return_token_ids: true });
    assert.equal(r.status, 200, r.text);
    checkAgainst(r.json.choices, ref);
    for (const c of r.json.choices) assert.ok(!c.token_ids.includes(EOS) || c.finish_reason === 'length');
    // include_stop_str_in_output keeps the EOS in the ids of the beams it ended.
    const ref2 = await reference(prompt, { width: 10, maxTokens: 3, lengthPenalty, includeStop: true });
    const r2 = await complete({ prompt, n: 10, max_tokens: 3, use_beam_search: true, length_penalty: lengthPenalty, include_stop_str_in_output: true, return_token_ids: true });
    checkAgainst(r2.json.choices, ref2);
    for (const c of r2.json.choices) if (c.finish_reason === 'stop') assert.equal(c.token_ids.at(-1), EOS);
  });

  test('several prompts: each its own search, choices numbered across them', async () => {
    const prompts = [[31, 32, 33], [41, 42]];
    const body = { n: 2, max_tokens: 3, use_beam_search: true, ignore_eos: true, return_token_ids: true };
    const both = await complete({ ...body, prompt: prompts });
    assert.equal(both.status, 200, both.text);
    assert.deepEqual(both.json.choices.map((c) => c.index), [0, 1, 2, 3]);
    for (const [i, prompt] of prompts.entries()) {
      const one = await complete({ ...body, prompt });
      assert.deepEqual(both.json.choices.slice(2 * i, 2 * i + 2).map((c) => c.token_ids), one.json.choices.map((c) => c.token_ids));
    }
    assert.equal(both.json.usage.prompt_tokens, 5);
    assert.equal(both.json.usage.completion_tokens, 12);
  });

  test('chat and streaming: the whole beams come as one final output', async () => {
    const body = { messages: [{ role: 'user', content: 'hello there' }], max_tokens: 4, use_beam_search: true, n: 2, ignore_eos: true };
    const r = await chat({ ...body, return_token_ids: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices.length, 2);
    const ref = await reference(r.json.prompt_token_ids, { width: 2, maxTokens: 4, ignoreEos: true });
    r.json.choices.forEach((c, i) => {
      assert.deepEqual(c.token_ids, ref[i].ids);
      assert.equal(c.finish_reason, 'length');
      assert.equal(typeof c.message.content, 'string');
    });
    const s = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: MODEL, ...body, stream: true }),
    });
    assert.equal(s.status, 200);
    const { events, done } = await readSse(s);
    assert.ok(done);
    const content = [0, 1].map((i) => events.filter((e) => e.choices?.[0]?.index === i).map((e) => e.choices[0].delta.content ?? '').join(''));
    assert.deepEqual(content, r.json.choices.map((c) => c.message.content));
  });

  test('a client that goes mid-search cancels its rounds; the server serves on', async () => {
    const ac = new AbortController();
    const pending = fetch(`${server.url}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify({ model: MODEL, prompt: [7, 8, 9], n: 8, max_tokens: 480, use_beam_search: true, ignore_eos: true }),
    }).catch((e) => e);
    await new Promise((res) => setTimeout(res, 100));
    ac.abort();
    assert.equal((await pending).name, 'AbortError');
    let running = -1;
    for (let i = 0; i < 100 && running !== 0; ++i) {
      await new Promise((res) => setTimeout(res, 50));
      const m = await request(`${server.url}/metrics`, { method: 'GET' });
      running = metric(m.text, 'vllm:num_requests_running') + metric(m.text, 'vllm:num_requests_waiting');
    }
    assert.equal(running, 0, 'the search\'s rounds stopped');
    // No round starts after that: the count of finished one-token requests stays put, short of the 8 ·
    // 480 the whole search makes.
    const done = async () => metric((await request(`${server.url}/metrics`, { method: 'GET' })).text,
      'vllm:request_success_total', { finished_reason: 'length' });
    const before = await done();
    await new Promise((res) => setTimeout(res, 400));
    assert.equal(await done(), before);
    assert.ok(before < 8 * 480, `${before} requests finished`);
    const r = await complete({ prompt: [5, 6, 7], max_tokens: 3, use_beam_search: true, n: 2 });
    assert.equal(r.status, 200, r.text);
  });

  test('fields that cannot go with beam search are refused; length_penalty without it is accepted', async () => {
    let r = await complete({ prompt: [5, 6, 7], max_tokens: 2, use_beam_search: true, prompt_logprobs: 1 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /prompt_logprobs/);
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, use_beam_search: true, echo: true, logprobs: 1 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /echo/);
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, length_penalty: 'long' });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /length_penalty/);
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, length_penalty: 2.0 });
    assert.equal(r.status, 200, r.text);
    // 2·n alternatives per round must fit --max-logprobs (40 here), as in vLLM.
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2, use_beam_search: true, n: 21 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /logprobs of 42.*max allowed: 40/);
    // echo without logprobs puts the prompt before each beam.
    r = await complete({ prompt: 'abc', max_tokens: 2, use_beam_search: true, echo: true, n: 2, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    for (const c of r.json.choices) assert.ok(c.text.startsWith('abc'));
    // The server still serves ordinary requests.
    r = await complete({ prompt: [5, 6, 7], max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
  });
});
