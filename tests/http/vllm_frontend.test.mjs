// vLLM frontend flags with their vLLM meaning (docs/vllm-flags.md, issue 18): --generation-config
// defaults applied to requests that omit a field (auto / vllm / DIR, --override-generation-config),
// --response-role, --return-tokens-as-token-ids, the access log (--uvicorn-log-level,
// --disable-uvicorn-access-log, --disable-access-log-for-endpoints), --enable-force-include-usage,
// --default-chat-template-kwargs, h11 limits, repeated scalar flags (the last wins, as argparse), and vLLM
// flags that cannot be honoured here (a startup error naming the flag).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { BIN, MODEL, metric, metrics, readSse, request, sleep, startServer, tempDir } from './lib/server.mjs';

const PROMPT = [77, 570, 220, 147, 27];
const MESSAGES = [{ role: 'user', content: 'Tell me a story about a cat.' }];

function serveFails(args) {
  return new Promise((resolve) => {
    execFile(BIN, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', ...args], { timeout: 30_000 },
      (err, stdout, stderr) => resolve({ code: err ? err.code : 0, output: stdout + stderr }));
  });
}

const ids = (r) => {
  assert.equal(r.status, 200, r.text);
  return r.json.choices.map((c) => c.logprobs.tokens ?? c.logprobs.content.map((t) => t.token));
};
const completion = (url, extra) =>
  request(`${url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 24, ignore_eos: true, logprobs: 0,
    return_tokens_as_token_ids: true, ...extra } });

describe('--generation-config DIR: the file\'s sampling values are the defaults of requests that omit them', () => {
  // Values far from vLLM's defaults (temperature 1, top_p 1, top_k -1, repetition_penalty 1), so that
  // a request given them explicitly and one given vLLM's defaults explicitly sample differently.
  const gen = { temperature: 0.45, top_p: 0.8, top_k: 7, repetition_penalty: 1.6, max_new_tokens: 5, eos_token_id: 2 };
  let tmp, server, vllmMode, overridden;
  before(async () => {
    tmp = tempDir();
    writeFileSync(path.join(tmp.dir, 'generation_config.json'), JSON.stringify(gen));
    [server, vllmMode, overridden] = await Promise.all([
      startServer(['--model', MODEL, '--generation-config', tmp.dir]),
      startServer(['--model', MODEL, '--generation-config', 'vllm']),
      startServer(['--model', MODEL, '--generation-config', tmp.dir, '--override-generation-config', '{"temperature": 0}']),
    ]);
  });
  after(async () => {
    await Promise.all([server, vllmMode, overridden].map((s) => s && s.stop()));
    tmp && tmp.remove();
  });

  test('a seeded request without the fields samples as one that gives the file\'s values', async () => {
    const explicit = { temperature: gen.temperature, top_p: gen.top_p, top_k: gen.top_k, repetition_penalty: gen.repetition_penalty };
    const vllmDefaults = { temperature: 1, top_p: 1, top_k: -1, repetition_penalty: 1 };
    for (const seed of [1, 2, 3]) {
      const omitted = ids(await completion(server.url, { seed }));
      assert.deepEqual(omitted, ids(await completion(server.url, { seed, ...explicit })), `seed ${seed}`);
      assert.notDeepEqual(omitted, ids(await completion(server.url, { seed, ...vllmDefaults })), `seed ${seed}`);
    }
    // One field given by the request, the others from the file.
    const mixed = ids(await completion(server.url, { seed: 4, temperature: 1.3 }));
    assert.deepEqual(mixed, ids(await completion(server.url, { seed: 4, ...explicit, temperature: 1.3 })));
  });

  test('max_new_tokens caps every request (vLLM\'s get_max_tokens: the least of the request\'s, the file\'s and the context\'s)', async () => {
    const chat = await request(`${server.url}/v1/chat/completions`, { body: { messages: MESSAGES, ignore_eos: true } });
    assert.equal(chat.status, 200, chat.text);
    assert.equal(chat.json.usage.completion_tokens, 5);
    assert.equal(chat.json.choices[0].finish_reason, 'length');
    const given = await request(`${server.url}/v1/chat/completions`, { body: { messages: MESSAGES, ignore_eos: true, max_tokens: 9 } });
    assert.equal(given.json.usage.completion_tokens, 5);
    const fewer = await request(`${server.url}/v1/chat/completions`, { body: { messages: MESSAGES, ignore_eos: true, max_tokens: 3 } });
    assert.equal(fewer.json.usage.completion_tokens, 3);
    const cmpl = await request(`${server.url}/v1/completions`, { body: { prompt: PROMPT, ignore_eos: true } });
    assert.equal(cmpl.json.usage.completion_tokens, 5);
    const big = await request(`${server.url}/v1/completions`, { body: { prompt: PROMPT, ignore_eos: true, max_tokens: 40 } });
    assert.equal(big.json.usage.completion_tokens, 5);
  });

  test('--generation-config vllm ignores the file: vLLM\'s own defaults', async () => {
    const omitted = ids(await completion(vllmMode.url, { seed: 5 }));
    assert.deepEqual(omitted, ids(await completion(vllmMode.url, { seed: 5, temperature: 1, top_p: 1, top_k: -1 })));
    const chat = await request(`${vllmMode.url}/v1/chat/completions`, { body: { messages: MESSAGES, ignore_eos: true } });
    assert.ok(chat.json.usage.completion_tokens > 5, chat.text);
    vllmMode.stop();
  });

  test('--override-generation-config wins over the file (temperature 0: greedy without a seed)', async () => {
    const runs = [];
    for (let i = 0; i < 3; i++) runs.push(ids(await completion(overridden.url, {}))[0]);
    assert.deepEqual(runs[1], runs[0]);
    assert.deepEqual(runs[2], runs[0]);
    assert.deepEqual(runs[0], ids(await completion(overridden.url, { temperature: 0 }))[0]);
  });
});

describe('--response-role, --return-tokens-as-token-ids, --enable-force-include-usage, --default-chat-template-kwargs', () => {
  let server;
  const template = '{{ greeting }}{% for m in messages %}{{ m.content }}{% endfor %}';
  before(async () => {
    server = await startServer(['--model', MODEL, '--response-role', 'narrator', '--return-tokens-as-token-ids',
      '--enable-force-include-usage', '--chat-template', template,
      '--default-chat-template-kwargs', '{"greeting": "Once upon a time, in a land far away. "}']);
  });
  after(async () => server && (await server.stop()));
  const chat = (body) => request(`${server.url}/v1/chat/completions`, { body: { max_tokens: 3, ...body } });

  test('the generated message has the response role; without a generation prompt, the final message\'s', async () => {
    const r = await chat({ messages: MESSAGES });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.role, 'narrator');
    const cont = await chat({ messages: MESSAGES, add_generation_prompt: false });
    assert.equal(cont.json.choices[0].message.role, 'user');
    const s = await fetch(`${server.url}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: MESSAGES, max_tokens: 3, stream: true }) });
    const { events } = await readSse(s);
    assert.equal(events[0].choices[0].delta.role, 'narrator');
  });

  test('echo repeats the final message when it has the response role', async () => {
    const withRole = await chat({ messages: [...MESSAGES, { role: 'narrator', content: 'The cat' }], echo: true });
    assert.ok(withRole.json.choices[0].message.content.startsWith('The cat'), withRole.text);
    const other = await chat({ messages: [...MESSAGES, { role: 'assistant', content: 'The cat' }], echo: true });
    assert.ok(!other.json.choices[0].message.content.startsWith('The cat'), other.text);
  });

  test('logprob tokens are token_id:N unless the request says otherwise', async () => {
    const r = await chat({ messages: MESSAGES, logprobs: true, top_logprobs: 2 });
    const content = r.json.choices[0].logprobs.content;
    assert.equal(content.length, 3);
    for (const t of content) {
      assert.match(t.token, /^token_id:\d+$/);
      for (const a of t.top_logprobs) assert.match(a.token, /^token_id:\d+$/);
      assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
    }
    const c = await request(`${server.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 3, logprobs: 1, temperature: 0 } });
    const tokenIds = c.json.choices[0].logprobs.tokens.map((t) => Number(/^token_id:(\d+)$/.exec(t)[1]));
    const plain = await request(`${server.url}/v1/completions`,
      { body: { prompt: PROMPT, max_tokens: 3, logprobs: 1, temperature: 0, return_tokens_as_token_ids: false } });
    const texts = plain.json.choices[0].logprobs.tokens;
    for (let i = 0; i < 3; i++) {
      const d = await request(`${server.url}/detokenize`, { body: { tokens: [tokenIds[i]] } });
      assert.equal(texts[i], d.json.prompt);
    }
  });

  test('streams end with usage without stream_options (vLLM\'s should_include_usage: no per-chunk usage unless asked)', async () => {
    const s = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: PROMPT, max_tokens: 4, ignore_eos: true, stream: true }) });
    const { events } = await readSse(s);
    const last = events.at(-1);
    assert.equal(last.usage.completion_tokens, 4);
    assert.equal(last.usage.prompt_tokens, PROMPT.length);
    assert.ok(events.filter((e) => e.choices.length > 0).every((e) => !e.usage));
    // include_usage false is overridden by the flag; continuous stats when asked.
    const c = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: PROMPT, max_tokens: 3, ignore_eos: true, stream: true,
        stream_options: { include_usage: false, continuous_usage_stats: true } }) });
    const cont = (await readSse(c)).events;
    assert.equal(cont.at(-1).usage.completion_tokens, 3);
    assert.ok(cont.filter((e) => e.choices.length > 0).every((e) => e.usage && e.usage.prompt_tokens === PROMPT.length));
  });

  test('the default chat template kwargs render, and a request\'s kwargs win', async () => {
    const tok = async (prompt) => (await request(`${server.url}/tokenize`, { body: { prompt, add_special_tokens: false } })).json.count;
    const text = MESSAGES[0].content;
    const d = await chat({ messages: MESSAGES });
    assert.equal(d.json.usage.prompt_tokens, await tok(`Once upon a time, in a land far away. ${text}`));
    const r = await chat({ messages: MESSAGES, chat_template_kwargs: { greeting: 'Hi. ' } });
    assert.equal(r.json.usage.prompt_tokens, await tok(`Hi. ${text}`));
  });
});

describe('the access log (uvicorn\'s, under vLLM)', () => {
  let on, off, quiet;
  before(async () => {
    [on, off, quiet] = await Promise.all([
      startServer(['--model', MODEL, '--disable-access-log-for-endpoints', '/health,/metrics']),
      startServer(['--model', MODEL, '--uvicorn-log-level', 'warning']),
      startServer(['--model', MODEL, '--disable-uvicorn-access-log']),
    ]);
  });
  after(async () => Promise.all([on, off, quiet].map((s) => s && s.stop())));

  test('a line per request with its status; excluded paths and higher levels log none', async () => {
    for (const s of [on, off, quiet]) {
      await request(`${s.url}/v1/models`, { method: 'GET' });
      await request(`${s.url}/no/such/route`, { method: 'GET' });
      await request(`${s.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 2 } });
      await request(`${s.url}/health`, { method: 'GET' });
      await metrics(s.url);
    }
    await sleep(200);
    const log = on.log();
    assert.match(log, /"GET \/v1\/models HTTP\/1\.1" 200/);
    assert.match(log, /"GET \/no\/such\/route HTTP\/1\.1" 404/);
    assert.match(log, /"POST \/v1\/completions HTTP\/1\.1" 200/);
    assert.doesNotMatch(log, /"GET \/health HTTP/);
    assert.doesNotMatch(log, /"GET \/metrics HTTP/);
    for (const s of [off, quiet]) assert.doesNotMatch(s.log(), /HTTP\/1\.1" \d{3}/);
  });
});

describe('vLLM command-line forms', () => {
  test('a repeated scalar flag takes its last value (argparse); aliases of vLLM names reach the same setting', async () => {
    const s = await startServer(['--model', MODEL, '--max-model-len', '64', '--max-model-len', '200',
      '--num-gpu-blocks-override', '300', '--h11-max-header-count', '12', '--seed', '1', '--seed', '2']);
    try {
      const m = await request(`${s.url}/v1/models`, { method: 'GET' });
      assert.equal(m.json.data[0].max_model_len, 200);
      assert.equal(metric(await metrics(s.url), 'vllm:cache_config_info', { num_gpu_blocks: '300' }), 1);
      const headers = {};
      for (let i = 0; i < 14; i++) headers[`x-extra-${i}`] = 'v';
      const r = await request(`${s.url}/v1/models`, { method: 'GET', headers });
      assert.equal(r.status, 431);
    } finally {
      await s.stop();
    }
  });

  test('flags without a use here start and are logged; tool and structured-output flags are accepted', async () => {
    const s = await startServer(['--model', MODEL, '--max-logprobs', '20', '--disable-cascade-attn', '--config-format', 'auto',
      '-asc', '1', '--enable-expert-parallel', '--no-enable-expert-parallel', '--limit-mm-per-prompt', '{"image": 0}',
      '--max-log-len', '100', '--enable-prompt-tokens-details', '--chat-template-content-format', 'string',
      '--ssl-cert-reqs', '0', '--root-path', '/api', '--preemption-mode', 'recompute',
      '--enable-auto-tool-choice', '--tool-call-parser', 'hermes', '--reasoning-parser', 'qwen3']);
    try {
      const log = s.log();
      for (const flag of ['--disable-cascade-attn', '--api-server-count 1', '--limit-mm-per-prompt',
        '--root-path /api'])
        assert.equal(log.split(`${flag}`).length - 1 >= 1, true, `${flag} logged:\n${log}`);
      // a real setting now (tests/http/chat_content.test.mjs): the template's content form, as set
      assert.match(log, /chat template content format: 'string'\n/);
      assert.doesNotMatch(log, /--enable-expert-parallel: accepted/);  // --no-... last: the default
      const r = await request(`${s.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 2 } });
      assert.equal(r.status, 200, r.text);
    } finally {
      await s.stop();
    }
  });

  test('--max-logprobs caps the log-probs a request may ask for, with vLLM\'s message above it', async () => {
    const s = await startServer(['--model', MODEL, '--max-logprobs', '30']);
    try {
      const chat = (k) => request(`${s.url}/v1/chat/completions`, {
        body: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, logprobs: true, top_logprobs: k, temperature: 0 },
      });
      const ok = await chat(25);  // past the default cap of 20
      assert.equal(ok.status, 200, ok.text);
      const content = ok.json.choices[0].logprobs.content;
      assert.ok(content.length >= 1);
      for (const c of content) assert.equal(c.top_logprobs.length, 25);
      const over = await chat(31);
      assert.equal(over.status, 400, over.text);
      assert.match(over.text, /Requested sample logprobs of 31, which is greater than max allowed: 30/);
      const comp = await request(`${s.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 2, logprobs: 30, temperature: 0 } });
      assert.equal(comp.status, 200, comp.text);
      // (a dict keyed by token text, as vLLM's: ids that decode alike share a key, so fewer keys than 30
      // may come back; more than the default cap of 20 shows the cap was raised)
      for (const alts of comp.json.choices[0].logprobs.top_logprobs) {
        const n = Object.keys(alts).length;
        assert.ok(n > 20 && n <= 31, `${n} alternatives`);
      }
      const prompt = await request(`${s.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 1, prompt_logprobs: 31 } });
      assert.equal(prompt.status, 400, prompt.text);
      assert.match(prompt.text, /Requested prompt logprobs of 31, which is greater than max allowed: 30/);
      const all = await request(`${s.url}/v1/completions`, { body: { prompt: PROMPT, max_tokens: 1, logprobs: -1 } });
      assert.equal(all.status, 400, all.text);
      assert.match(all.text, /-1: the whole vocabulary\), which is greater than max allowed: 30/);
    } finally {
      await s.stop();
    }
  });

  for (const [args, words] of [
    [['--ssl-keyfile', '/tmp/k.pem', '--ssl-certfile', '/tmp/c.pem'], ['--ssl-', 'TLS']],
    [['--speculative-config', '{"method": "ngram"}'], ['--speculative-config', 'speculative']],
    [['--headless'], ['--headless']],
    [['--max-logprobs', '2000'], ['--max-logprobs', '1024', '2000']],
    [['--uds', '/tmp/polylora.sock'], ['--uds', 'TCP']],
    [['-dcp', '2'], ['--decode-context-parallel-size 2']],
    [['--preemption-mode', 'swap'], ['--preemption-mode swap']],
  ]) {
    test(`cannot be honoured: ${args.join(' ')}`, async () => {
      const { code, output } = await serveFails(args);
      assert.notEqual(code, 0, output);
      for (const w of words) assert.ok(output.includes(w), `${w} in:\n${output}`);
    });
  }
});
