// `polylora bench serve` with `vllm bench serve` command lines against a real `polylora serve` on the fixture
// model: ShareGPT through --backend vllm and openai-chat, the other datasets, and the result-JSON options
// (--label, --metadata, --append-result, --goodput, --header, ramp-up, warm-ups).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { BIN, MODEL, REPO, request, startServer } from './lib/server.mjs';

const DATA = path.join(REPO, 'tests/data/bench');
const run = promisify(execFile);

// The keys vLLM's result JSON has for a run with the default --percentile-metrics.
const VLLM_KEYS = ['date', 'endpoint_type', 'label', 'model_id', 'tokenizer_id', 'num_prompts', 'request_rate',
  'burstiness', 'max_concurrency', 'duration', 'completed', 'failed', 'total_input_tokens', 'total_output_tokens',
  'request_throughput', 'request_goodput', 'output_throughput', 'total_token_throughput', 'max_output_tokens_per_s',
  'max_concurrent_requests'];
for (const m of ['ttft', 'tpot', 'itl', 'e2el']) for (const s of ['mean', 'median', 'std', 'p99']) VLLM_KEYS.push(`${s}_${m}_ms`);

describe('polylora bench serve (vllm bench serve command lines)', () => {
  let server;
  let dir;
  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '512']);
    dir = mkdtempSync(path.join(os.tmpdir(), 'bench-serve-'));
  });
  after(async () => {
    const { code, signal } = await server.stop();
    rmSync(dir, { recursive: true, force: true });
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  async function bench(args, file) {
    const argv = ['bench', 'serve', '--base-url', server.url, '--result-dir', dir, '--result-filename', file, ...args];
    const { stdout } = await run(BIN, argv, { maxBuffer: 1 << 24, env: { ...process.env, OMP_WAIT_POLICY: 'passive' } });
    assert.match(stdout, /Serving Benchmark Result/);
    return { stdout, text: readFileSync(path.join(dir, file), 'utf8') };
  }

  test('--backend vllm --dataset-name sharegpt', async () => {
    const { text, stdout } = await bench(['--backend', 'vllm', '--dataset-name', 'sharegpt', '--dataset-path',
      path.join(DATA, 'sharegpt_tiny.json'), '--num-prompts', '10', '--max-concurrency', '4', '--save-result'], 'vllm.json');
    const r = JSON.parse(text);
    for (const key of VLLM_KEYS) assert.ok(key in r, `${key} missing:\n${text}`);
    assert.equal(r.completed, 10, text);
    assert.equal(r.failed, 0, stdout);
    assert.equal(r.num_prompts, 10);
    assert.equal(r.endpoint_type, 'vllm');
    assert.equal(r.label, 'vllm');
    assert.equal(r.request_goodput, null);
    assert.equal(r.request_rate, 'inf');
    assert.equal(r.max_concurrency, 4);
    assert.ok(r.total_input_tokens >= 10 * 4, text);  // every kept prompt has at least 4 tokens
    assert.ok(r.total_output_tokens > 0 && r.mean_ttft_ms > 0, text);
    assert.match(stdout, /tokens counted with POST \/tokenize/);
  });

  test('--backend openai-chat --dataset-name sharegpt', async () => {
    const { text } = await bench(['--backend', 'openai-chat', '--dataset-name', 'sharegpt', '--dataset-path',
      path.join(DATA, 'sharegpt_tiny.json'), '--num-prompts', '10', '--sharegpt-output-len', '6', '--save-result',
      '--save-detailed'], 'chat.json');
    const r = JSON.parse(text);
    for (const key of VLLM_KEYS) assert.ok(key in r, `${key} missing`);
    assert.equal(r.completed, 10, text);
    assert.equal(r.endpoint_type, 'openai-chat');
    assert.ok(r.output_lens.every((n) => n >= 1 && n <= 6), JSON.stringify(r.output_lens));
    assert.equal(r.errors.filter((e) => e).length, 0);
  });

  test('--dataset-name burstgpt: the GPT-4 rows with a response give the input and output lengths', async () => {
    // Valid rows: (12, 7), (25, 3), (9, 11); the ChatGPT rows and the failed GPT-4 row are dropped. Three
    // prompts use each valid row once; ten oversample them.
    const { text } = await bench(['--dataset-name', 'burstgpt', '--dataset-path', path.join(DATA, 'burstgpt_tiny.csv'),
      '--num-prompts', '3', '--ignore-eos', '--save-result'], 'burstgpt.json');
    const r = JSON.parse(text);
    assert.equal(r.completed, 3, text);
    assert.equal(r.total_input_tokens, 12 + 25 + 9);
    assert.equal(r.total_output_tokens, 7 + 3 + 11);
    const many = JSON.parse((await bench(['--dataset-name', 'burstgpt', '--dataset-path', path.join(DATA, 'burstgpt_tiny.csv'),
      '--num-prompts', '10', '--ignore-eos', '--save-result', '--save-detailed'], 'burstgpt10.json')).text);
    assert.equal(many.completed, 10);
    const pairs = many.input_lens.map((n, i) => `${n}:${many.output_lens[i]}`);
    for (const p of pairs) assert.ok(['12:7', '25:3', '9:11'].includes(p), p);
  });

  test('custom prompts get the --tokenizer\'s chat template, as vLLM, unless --custom-skip-chat-template', async () => {
    const prompts = readFileSync(path.join(DATA, 'custom_tiny.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l).prompt);
    let templated = 0, plain = 0;
    for (const content of prompts) {
      templated += (await request(`${server.url}/tokenize`, { body: { messages: [{ role: 'user', content }] } })).json.count;
      plain += (await request(`${server.url}/tokenize`, { body: { prompt: content } })).json.count;
    }
    assert.ok(templated > plain);
    const args = ['--dataset-name', 'custom', '--dataset-path', path.join(DATA, 'custom_tiny.jsonl'), '--custom-output-len', '2',
      '--num-prompts', String(prompts.length), '--tokenizer', MODEL, '--save-result'];
    const withTemplate = await bench(args, 'custom-template.json');
    assert.match(withTemplate.stdout, /chat template applied/);
    assert.equal(JSON.parse(withTemplate.text).total_input_tokens, templated);
    const skipped = await bench([...args, '--custom-skip-chat-template'], 'custom-plain.json');
    assert.equal(JSON.parse(skipped.text).total_input_tokens, plain);
  });

  test('--dataset-name hf is a clear error; --tokenizer takes a hub id from the local cache', async () => {
    await assert.rejects(run(BIN, ['bench', 'serve', '--base-url', server.url, '--dataset-name', 'hf', '--dataset-path', 'org/data']),
      (e) => /--dataset-name hf/.test(e.stderr) && /custom/.test(e.stderr));
    const hub = path.join(dir, 'hub');
    const snap = path.join(hub, 'models--org--tok', 'snapshots', 'abc123');
    mkdirSync(snap, { recursive: true });
    mkdirSync(path.join(hub, 'models--org--tok', 'refs'), { recursive: true });
    writeFileSync(path.join(hub, 'models--org--tok', 'refs', 'main'), 'abc123');
    symlinkSync(path.join(MODEL, 'tokenizer.json'), path.join(snap, 'tokenizer.json'));
    const argv = ['bench', 'serve', '--base-url', server.url, '--dataset-name', 'sharegpt', '--dataset-path',
      path.join(DATA, 'sharegpt_tiny.json'), '--num-prompts', '2', '--tokenizer', 'org/tok'];
    const { stdout } = await run(BIN, argv, { env: { ...process.env, HF_HUB_CACHE: hub } });
    assert.match(stdout, /tokens counted with --tokenizer/);
    await assert.rejects(run(BIN, [...argv.slice(0, -1), 'org/absent'], { env: { ...process.env, HF_HUB_CACHE: hub } }),
      (e) => /org\/absent/.test(e.stderr) && /does not download/.test(e.stderr));
  });

  test('a chat --endpoint with --backend vllm is refused', async () => {
    await assert.rejects(run(BIN, ['bench', 'serve', '--base-url', server.url, '--backend', 'vllm', '--endpoint',
      '/v1/chat/completions']), /openai-chat/);
  });

  test('custom, sonnet, prefix_repetition and random with a prefix, appended to one file', async () => {
    const common = ['--append-result', '--label', 'lbl', '--metadata', 'gpu=none', 'run=ci', '--goodput', 'ttft:60000',
      'e2el:60000', '--header', 'X-Test=1', '--num-warmups', '2', '--tokenizer', MODEL, '--top-p', '0.9', '--top-k',
      '20', '--min-p', '0.01', '--temperature', '0.5', '--ignore-eos'];
    const runs = [
      ['--dataset-name', 'custom', '--dataset-path', path.join(DATA, 'custom_tiny.jsonl'), '--custom-output-len', '4',
        '--num-prompts', '5'],
      ['--dataset-name', 'sonnet', '--dataset-path', path.join(DATA, 'sonnet_tiny.txt'), '--sonnet-input-len', '120',
        '--sonnet-prefix-len', '40', '--sonnet-output-len', '4', '--num-prompts', '4'],
      ['--dataset-name', 'prefix_repetition', '--prefix-repetition-prefix-len', '16', '--prefix-repetition-suffix-len',
        '8', '--prefix-repetition-num-prefixes', '2', '--prefix-repetition-output-len', '4', '--num-prompts', '6'],
      ['--dataset-name', 'random', '--random-input-len', '8', '--random-output-len', '4', '--random-prefix-len', '16',
        '--random-range-ratio', '0.5', '--num-prompts', '6', '--ramp-up-strategy', 'linear', '--ramp-up-start-rps', '5',
        '--ramp-up-end-rps', '50'],
    ];
    let text = '';
    for (const args of runs) text = (await bench([...common, ...args], 'appended.jsonl')).text;
    const lines = text.split('\n');
    assert.equal(lines.length, 4, text);
    const results = lines.map((l) => JSON.parse(l));
    assert.deepEqual(results.map((r) => r.completed), [5, 4, 6, 6]);
    for (const r of results) {
      assert.equal(r.failed, 0);
      assert.equal(r.label, 'lbl');
      assert.equal(r.gpu, 'none');
      assert.equal(r.run, 'ci');
      assert.equal(r.tokenizer_id, MODEL);
      assert.equal(r.request_goodput, r.request_throughput);  // generous SLOs: every request is good
    }
    // --ignore-eos: exactly the requested output lengths.
    assert.deepEqual(results.slice(0, 3).map((r) => r.total_output_tokens), [20, 16, 24]);
    assert.equal(results[2].total_input_tokens, 6 * 24);
    assert.equal(results[3].ramp_up_strategy, 'linear');
    assert.equal(results[3].ramp_up_end_rps, 50);
  });

  test('--extra-body is merged into every request last (its max_tokens wins), and bad JSON is refused', async () => {
    const { text } = await bench(['--dataset-name', 'random', '--random-input-len', '8', '--random-output-len', '9',
      '--num-prompts', '4', '--ignore-eos', '--extra-body', '{"max_tokens": 2, "seed": 5}', '--save-result',
      '--save-detailed'], 'extra.json');
    const r = JSON.parse(text);
    assert.equal(r.completed, 4, text);
    assert.deepEqual(r.output_lens, [2, 2, 2, 2], text);
    for (const [bad, why] of [['{"max_tokens": ', /not valid JSON/], ['[1, 2]', /expected a JSON object/]]) {
      await assert.rejects(run(BIN, ['bench', 'serve', '--base-url', server.url, '--num-prompts', '1', '--extra-body', bad]),
        (e) => why.test(String(e.stderr) + String(e.stdout)));
    }
  });
});
