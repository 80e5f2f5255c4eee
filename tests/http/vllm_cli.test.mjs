// vLLM command lines with `polylora serve` (docs/vllm-flags.md, issue 18 items 1 and 2): the long
// vLLM-style command line of the docs starts and serves completions (base model and both adapters, chat
// through the inline --chat-template); flags without a use here are logged, values polylora cannot honour
// stop the start with an error naming the flag; a --config YAML file; and `--model org/name` served from a
// fake Hugging Face cache (refs, snapshots, files symlinked into blobs/, as huggingface_hub lays it out),
// with hub-id adapters, --revision by hash, HF_HOME, and the error when a model is absent.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, copyFileSync, symlinkSync, writeFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { ADAPTERS, BIN, MODEL, REPO, request, startServer, tempDir } from './lib/server.mjs';

// The sh block under "One long vLLM-style command line" in docs/vllm-flags.md, split as sh would
// (backslash-newline continuations, single quotes), without `polylora serve`.
function docCommandLine() {
  const doc = readFileSync(path.join(REPO, 'docs/vllm-flags.md'), 'utf8');
  const section = doc.slice(doc.indexOf('## One long vLLM-style command line'));
  const m = /```sh\n([\s\S]*?)```/.exec(section);
  assert.ok(m, 'docs/vllm-flags.md has the sh block');
  const text = m[1].replace(/\\\n/g, ' ');
  const words = [];
  let cur = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "'") {
      const end = text.indexOf("'", i + 1);
      cur = (cur ?? '') + text.slice(i + 1, end);
      i = end;
    } else if (/\s/.test(c)) {
      if (cur !== null) words.push(cur);
      cur = null;
    } else {
      cur = (cur ?? '') + c;
    }
  }
  if (cur !== null) words.push(cur);
  assert.deepEqual(words.slice(0, 2), ['polylora', 'serve']);
  return words.slice(2);
}

// Runs `polylora serve ARGS` expecting it to fail at startup; resolves to { code, output }.
function serveFails(args, env = {}) {
  return new Promise((resolve) => {
    execFile(BIN, ['serve', '--host', '127.0.0.1', '--port', '0', ...args], { env: { ...process.env, ...env }, timeout: 30_000 },
      (err, stdout, stderr) => resolve({ code: err ? err.code : 0, output: stdout + stderr }));
  });
}

const completion = (url, model, extra = {}) =>
  request(`${url}/v1/completions`, { body: { model, prompt: [77, 570, 220], max_tokens: 4, temperature: 0, ...extra } });

describe('the long vLLM-style command line of docs/vllm-flags.md', () => {
  let server;
  before(async () => {
    const args = [];
    const words = docCommandLine();
    for (let i = 0; i < words.length; i++) {
      if (words[i] === '--host' || words[i] === '--port') {
        i++;  // startServer picks them
        continue;
      }
      args.push(words[i].replaceAll('tests/data/', `${REPO}/tests/data/`));
    }
    server = await startServer(args);
  });
  after(async () => server && (await server.stop()));

  test('serves the base model and both adapters', async () => {
    const models = await request(`${server.url}/v1/models`, { method: 'GET' });
    assert.equal(models.status, 200, models.text);
    const ids = models.json.data.map((m) => m.id).sort();
    assert.deepEqual(ids, ['attn', 'experts', 'tiny']);
    for (const model of ['tiny', 'attn', 'experts']) {
      const r = await completion(server.url, model);
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.choices[0].finish_reason === 'length' || r.json.choices[0].finish_reason === 'stop', true);
      assert.ok(r.json.usage.completion_tokens >= 1);
    }
  });

  test('the inline --chat-template is used', async () => {
    const r = await request(`${server.url}/v1/chat/completions`, {
      body: { model: 'tiny', messages: [{ role: 'user', content: 'hello' }], max_tokens: 2, temperature: 0 },
    });
    assert.equal(r.status, 200, r.text);
    // The template renders only the contents: "hello" is the whole prompt.
    const tok = await request(`${server.url}/tokenize`, { body: { model: 'tiny', prompt: 'hello' } });
    if (tok.status === 200) assert.equal(r.json.usage.prompt_tokens, tok.json.count ?? tok.json.tokens.length);
  });

  test('flags without a use here are logged once, the dtype mapping is explained', () => {
    const log = server.log();
    for (const flag of ['--trust-remote-code', '--swap-space 4',
      '--download-dir /tmp/models', '--distributed-executor-backend mp']) {
      const lines = log.split('\n').filter((l) => l.includes(`${flag}: accepted for vLLM compatibility, not needed here`));
      assert.equal(lines.length, 1, `${flag} logged once:\n${log}`);
    }
    assert.match(log, /--dtype half: polylora computes in bfloat16 or float32, not float16; using bfloat16/);
    assert.match(log, /--enable-lora: accepted; LoRA is always enabled/);
    // --kv-cache-dtype auto: a real setting (float32 for now), named in the KV cache's start-up line.
    assert.match(log, /KV cache: \d+ blocks of \d+ tokens \([\d.]+ MiB, float32\)/);
  });
});

describe('--quantization int8 (docs/quantization.md)', () => {
  test('serves the INT8 model and the adapters; the start-up line gives the INT8 size', async () => {
    const server = await startServer(['--model', MODEL, '-q', 'int8', '--lora-modules', `attn=${ADAPTERS.attn}`]);
    try {
      const log = server.log();
      const m = /quantized to INT8 .* parameters ([\d.]+) MB -> ([\d.]+) MB/.exec(log);
      assert.ok(m, log);
      assert.ok(Number(m[2]) < 0.75 * Number(m[1]), m[0]);
      assert.match(log, new RegExp(`${m[2].replace('.', '\\.')} MB of parameters, INT8 weights`));
      for (const model of [MODEL, 'attn']) {
        const r = await completion(server.url, model);
        assert.equal(r.status, 200, r.text);
        assert.ok(r.json.usage.completion_tokens >= 1);
      }
    } finally {
      await server.stop();
    }
  });
});

describe('--device cpu -tp 2 (docs/tensor-parallel.md)', () => {
  test('serves the base model and an adapter with the numbers of -tp 1', async () => {
    const runs = [];
    // -ep: expert parallelism (docs/tensor-parallel.md), 4 of the 8 experts whole on each rank; then the
    // adapter's LoRA fully sharded.
    for (const tp of [['1'], ['2'], ['2', '-ep'], ['2', '--fully-sharded-loras']]) {
      const server = await startServer(['--model', MODEL, '--device', 'cpu', '-tp', ...tp, '--lora-modules',
        `attn=${ADAPTERS.attn}`]);
      try {
        if (tp[0] === '2') assert.match(server.log(), /tensor parallelism: 2 ranks/);
        if (tp[1] === '-ep') assert.match(server.log(), /4 whole experts each \(expert parallelism\)/);
        if (tp[1] === '--fully-sharded-loras') assert.match(server.log(), /, fully sharded LoRA/);
        const out = [];
        for (const model of [MODEL, 'attn']) {
          const r = await completion(server.url, model, { logprobs: 3 });
          assert.equal(r.status, 200, r.text);
          out.push(r.json.choices[0]);
        }
        runs.push(out);
      } finally {
        await server.stop();
      }
    }
    for (const run of runs.slice(1))
      for (let i = 0; i < 2; i++) {
        assert.equal(run[i].text, runs[0][i].text);
        const [a, b] = [runs[0][i].logprobs.token_logprobs, run[i].logprobs.token_logprobs];
        a.forEach((lp, k) => assert.ok(Math.abs(lp - b[k]) < 1e-4, `token ${k}: ${lp} vs ${b[k]}`));
      }
  });
});

describe('values polylora cannot honour stop the start, naming the flag', () => {
  for (const [args, pattern] of [
    [['-tp', '3'], /--tensor-parallel-size 3: the model's 4 attention heads do not split over 3 ranks/],
    [['--tensor-parallel-size=8'], /--tensor-parallel-size 8: the model's 4 attention heads/],
    [['-pp', '2'], /--pipeline-parallel-size 2/],
    [['--kv-cache-dtype', 'fp8'], /--kv-cache-dtype fp8: polylora cannot honour this value.*fp8/],
    [['--kv-cache-dtype', 'bfloat16', '--device', 'cpu'],
      /--kv-cache-dtype bfloat16: polylora cannot honour this value on the CPU backend/],
    [['--quantization', 'awq'], /--quantization awq: polylora cannot honour/],
    [['-q', 'fp8'], /--quantization fp8: polylora cannot honour this value.*\(accepted: none, int8, mxfp4\)/],
    [['--quantization', 'mxfp4'], /--quantization mxfp4: .*qwen3-moe-tiny is not an MXFP4 checkpoint/],
    [['--model', path.join(REPO, 'tests/data/models/gpt-oss-mxfp4-tiny'), '-q', 'int8'],
      /--quantization int8: .*gpt-oss-mxfp4-tiny is an MXFP4 checkpoint/],
    [['--max-model-len', '1.5K'], /--max-model-len '1.5K': decimals are not allowed/],
    [['--lora-modules', '{"name": "x"}'], /--lora-modules .*needs "name" and "path"/],
    [['--dtype', 'float64'], /--dtype/],
    [['--no-such-vllm-flag'], /no-such-vllm-flag/],
    [['--tool-parser-plugin', '/tmp/parser.py'],
      /--tool-parser-plugin \/tmp\/parser.py: polylora cannot honour this flag: tool-call parsers are built in/],
  ]) {
    test(args.join(' '), async () => {
      const r = await serveFails(['--model', MODEL, ...args]);
      assert.notEqual(r.code, 0, r.output);
      assert.match(r.output, pattern);
    });
  }
});

describe('--config FILE.yaml', () => {
  let server;
  let tmp;
  before(async () => {
    tmp = tempDir();
    const file = path.join(tmp.dir, 'vllm.yaml');
    writeFileSync(file, [
      '# a vLLM config file',
      `model: ${MODEL}`,
      'served_model_name: from-yaml',
      'max-model-len: 2k',
      'enable-lora: true',
      'tensor-parallel-size: 1',
      'lora-modules:',
      `  - attn=${ADAPTERS.attn}`,
      `  - '{"name": "experts", "path": "${ADAPTERS.experts}"}'`,
      'enable-prefix-caching: false',
      'max-num-seqs: 4',
      '',
    ].join('\n'));
    // The command line wins over the file (max-num-seqs).
    server = await startServer(['--config', file, '--max-num-seqs', '8']);
  });
  after(async () => {
    if (server) await server.stop();
    tmp?.remove();
  });
  test('the file sets the flags', async () => {
    const models = await request(`${server.url}/v1/models`, { method: 'GET' });
    assert.deepEqual(models.json.data.map((m) => m.id).sort(), ['attn', 'experts', 'from-yaml']);
    const base = models.json.data.find((m) => m.id === 'from-yaml');
    if (base.max_model_len !== undefined) assert.equal(base.max_model_len, 2000);
    assert.equal((await completion(server.url, 'attn')).status, 200);
    assert.match(server.log(), /--config .*vllm\.yaml: 8 setting\(s\)/);
  });
});

// A fake Hugging Face cache: <hub>/models--org--name/{blobs/<sha>, refs/main, snapshots/<hash>/<file> -> blob}.
function addToCache(hub, repoId, srcDir, hash) {
  const repo = path.join(hub, `models--${repoId.replace('/', '--')}`);
  mkdirSync(path.join(repo, 'blobs'), { recursive: true });
  mkdirSync(path.join(repo, 'refs'), { recursive: true });
  const snap = path.join(repo, 'snapshots', hash);
  mkdirSync(snap, { recursive: true });
  for (const name of readdirSync(srcDir)) {
    const src = path.join(srcDir, name);
    if (!statSync(src).isFile()) continue;
    const blob = `${hash.slice(0, 8)}-${name}`;
    copyFileSync(src, path.join(repo, 'blobs', blob));
    symlinkSync(path.join('..', '..', 'blobs', blob), path.join(snap, name));
  }
  return { repo, snap };
}

describe('--model org/name from the local Hugging Face cache', () => {
  const MAIN = '1111111111111111111111111111111111111111';
  const OLD = '2222222222222222222222222222222222222222';
  let tmp;
  let hub;
  before(() => {
    tmp = tempDir('polylora-hf-');
    hub = path.join(tmp.dir, 'home', 'hub');
    const { repo } = addToCache(hub, 'org/tiny', MODEL, MAIN);
    writeFileSync(path.join(repo, 'refs', 'main'), MAIN);
    addToCache(hub, 'org/tiny', MODEL, OLD);  // an older snapshot, reached by hash only
    const a = addToCache(hub, 'org/tiny-attn', ADAPTERS.attn, MAIN);
    writeFileSync(path.join(a.repo, 'refs', 'main'), MAIN);
  });
  after(() => tmp?.remove());

  test('HF_HUB_CACHE: the positional hub id and a hub-id adapter', async () => {
    const server = await startServer(['org/tiny', '--lora-modules', 'attn=org/tiny-attn'], { env: { HF_HUB_CACHE: hub } });
    try {
      const models = await request(`${server.url}/v1/models`, { method: 'GET' });
      assert.deepEqual(models.json.data.map((m) => m.id).sort(), ['attn', 'org/tiny']);
      for (const model of ['org/tiny', 'attn']) {
        const r = await completion(server.url, model);
        assert.equal(r.status, 200, r.text);
      }
      assert.match(server.log(), new RegExp(`model 'org/tiny' \\(revision main\\): .*snapshots/${MAIN}`));
    } finally {
      await server.stop();
    }
  });

  test('HF_HOME and --revision by commit hash', async () => {
    const server = await startServer(['--model', 'org/tiny', '--revision', OLD],
      { env: { HF_HUB_CACHE: '', HF_HOME: path.dirname(hub) } });
    try {
      assert.equal((await completion(server.url, 'org/tiny')).status, 200);
      assert.match(server.log(), new RegExp(`snapshots/${OLD}`));
    } finally {
      await server.stop();
    }
  });

  test('absent models, revisions and adapters are clear errors', async () => {
    let r = await serveFails(['--model', 'org/absent'], { HF_HUB_CACHE: hub });
    assert.notEqual(r.code, 0);
    assert.ok(r.output.includes(`model 'org/absent' is neither a local directory nor in the Hugging Face cache at ${hub}; polylora does not download`), r.output);
    r = await serveFails(['--model', 'org/tiny', '--revision', 'v2'], { HF_HUB_CACHE: hub });
    assert.notEqual(r.code, 0);
    assert.match(r.output, /revision 'v2'/);
    r = await serveFails(['--model', 'org/tiny', '--lora-modules', 'x=org/no-adapter'], { HF_HUB_CACHE: hub });
    assert.notEqual(r.code, 0);
    assert.match(r.output, /adapter 'org\/no-adapter' is neither a local directory nor in the Hugging Face cache/);
  });
});
