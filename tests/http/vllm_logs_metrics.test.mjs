// vLLM's logs and dashboard metrics: the periodic stats line (--log-stats-interval, --disable-log-stats),
// request logs (--enable-log-requests), POLYLORA_LOG_FORMAT=json, the request-phase / iteration / params
// histograms and vllm:cache_config_info on /metrics with consistent values, and the Grafana dashboard in
// docs/grafana: every metric its panels' PromQL expressions name is on /metrics of a running server.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { MODEL, REPO, metric, metrics, request, sleep, startServer } from './lib/server.mjs';

const STATS_RE =
  /Engine 000: Avg prompt throughput: (\d+\.\d) tokens\/s, Avg generation throughput: (\d+\.\d) tokens\/s, Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: (\d+\.\d)%, Prefix cache hit rate: (\d+\.\d)%/;

// Every sample line of a Prometheus text: { name, labels, value }.
function samples(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([^\s{]+)(\{(.*)\})?\s+(\S+)$/.exec(line);
    assert.ok(m, `unparsable metrics line: ${line}`);
    const labels = {};
    for (const [, k, v] of (m[3] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

async function stopOk(server) {
  const { code, signal } = await server.stop();
  assert.equal(signal, null, server.log());
  assert.equal(code, 0, server.log());
}

describe('stats line, request logs and dashboard metrics', () => {
  let server;
  const requests = [
    { prompt: [5, 6, 7, 8], max_tokens: 3, n: 1 },
    { prompt: [9, 10, 11, 12, 13, 14], max_tokens: 5, n: 2 },
    { prompt: [20, 21, 22], max_tokens: 4, n: 1 },
    { prompt: [30, 31, 32, 33, 34], max_tokens: 2, n: 1 },
  ];
  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '512', '--log-stats-interval', '0.3',
      '--enable-log-requests']);
    for (const r of requests) {
      const res = await request(`${server.url}/v1/completions`, { body: { ...r, temperature: 0, ignore_eos: true } });
      assert.equal(res.status, 200, res.text);
    }
  });
  after(() => stopOk(server));

  test('the new vLLM metrics, with values that add up', async () => {
    const text = await metrics(server.url);
    const m = (name, labels) => metric(text, name, labels);
    const n = requests.length;
    assert.equal(m('vllm:request_params_n_count'), n);
    assert.equal(m('vllm:request_params_n_sum'), requests.reduce((a, r) => a + r.n, 0));
    assert.equal(m('vllm:request_params_max_tokens_count'), n);
    assert.equal(m('vllm:request_params_max_tokens_sum'), requests.reduce((a, r) => a + r.max_tokens, 0));
    for (const h of ['queue', 'prefill', 'decode', 'inference']) {
      const name = `vllm:request_${h}_time_seconds`;
      assert.equal(m(`${name}_count`), n, name);
      assert.ok(m(`${name}_sum`) >= 0, name);
      assert.equal(m(`${name}_bucket`, { le: '+Inf' }), n, name);
      assert.equal(m(`${name}_bucket`, { le: '0.3' }) <= n, true, name);
    }
    const inference = m('vllm:request_inference_time_seconds_sum');
    assert.ok(Math.abs(inference - m('vllm:request_prefill_time_seconds_sum') - m('vllm:request_decode_time_seconds_sum')) < 1e-6);
    assert.ok(m('vllm:e2e_request_latency_seconds_sum') + 1e-9 >= inference);
    // Tokens per step sum to the prompt tokens computed (per adapter; n = 2 computes its short prompt twice,
    // unlike vllm:prompt_tokens_total which counts each request's prompt once) and the generated tokens.
    const computedPrompt = samples(text).filter((s) => s.name === 'polylora:adapter_prompt_tokens_total')
      .reduce((a, s) => a + s.value, 0);
    const tokens = computedPrompt + m('vllm:generation_tokens_total');
    assert.equal(m('vllm:iteration_tokens_total_sum'), tokens);
    assert.ok(m('vllm:iteration_tokens_total_count') >= requests.length);
    assert.equal(m('vllm:generation_tokens_total'), requests.reduce((a, r) => a + r.n * r.max_tokens, 0));
    // Bucket bounds as vLLM's.
    assert.notEqual(m('vllm:iteration_tokens_total_bucket', { le: '16384' }), undefined);
    assert.notEqual(m('vllm:request_params_n_bucket', { le: '20' }), undefined);
    assert.notEqual(m('vllm:request_queue_time_seconds_bucket', { le: '7680' }), undefined);
    // The cache configuration.
    const info = samples(text).find((s) => s.name === 'vllm:cache_config_info');
    assert.ok(info, 'vllm:cache_config_info missing');
    assert.equal(info.value, 1);
    assert.equal(info.labels.block_size, '16');
    assert.equal(info.labels.num_gpu_blocks, '4096');
    assert.equal(info.labels.enable_prefix_caching, 'True');
    assert.ok('gpu_memory_utilization' in info.labels);
    // Every vllm: sample has a model_name label, the served name (but vllm:lora_requests_info, whose only
    // labels in vLLM are max_lora, waiting_lora_adapters and running_lora_adapters).
    for (const s of samples(text))
      if (s.name.startsWith('vllm:') && s.name !== 'vllm:lora_requests_info')
        assert.equal(s.labels.model_name, MODEL, `${s.name} lacks model_name`);
  });

  test('every metric of the Grafana dashboard is served, with data', async () => {
    const dash = JSON.parse(readFileSync(path.join(REPO, 'docs/grafana/polylora-dashboard.json'), 'utf8'));
    const exprs = [];
    for (const p of dash.panels) {
      assert.ok(p.targets?.length > 0, `panel ${p.title} has no query`);
      for (const t of p.targets) exprs.push({ panel: p.title, expr: t.expr });
    }
    assert.ok(exprs.length >= 15);
    const text = await metrics(server.url);
    const all = samples(text);
    const served = new Set(all.map((s) => s.name));
    const families = new Set([...served].map((n) => n.replace(/_(bucket|sum|count)$/, '')));
    for (const { panel, expr } of exprs) {
      const names = [...expr.matchAll(/\b([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)/g)].map((x) => x[1]);
      assert.ok(names.length > 0, `panel ${panel}: no metric in ${expr}`);
      for (const name of names) {
        const base = name.replace(/_(bucket|sum|count)$/, '');
        assert.ok(served.has(name) || families.has(base) && served.has(`${base}_count`),
          `panel ${panel}: ${name} is not on /metrics`);
        assert.ok(served.has(name), `panel ${panel}: ${name} (as written) is not a sample on /metrics`);
        // It has a series for the dashboard's model_name variable (the label every panel filters on).
        if (expr.includes('model_name="$model_name"'))
          assert.ok(all.some((s) => s.name === name && s.labels.model_name === MODEL), `${name}: no model_name`);
      }
      // Histograms that panels read have observations after the requests above.
      for (const name of names.filter((x) => x.endsWith('_bucket') || x.endsWith('_sum') || x.endsWith('_count'))) {
        const base = name.replace(/_(bucket|sum|count)$/, '');
        assert.ok(metric(text, `${base}_count`) > 0, `panel ${panel}: ${base} has no data`);
      }
    }
    // The template variable reads model_name.
    assert.ok(dash.templating.list.some((v) => v.name === 'model_name'));
  });

  test('periodic stats line and request logs', async () => {
    await sleep(800);
    const log = server.log();
    const lines = log.split('\n').filter((l) => STATS_RE.test(l));
    assert.ok(lines.length >= 1, log);
    // The requests above were logged as throughput in some line.
    assert.ok(lines.some((l) => Number(STATS_RE.exec(l)[2]) > 0), lines.join('\n'));
    assert.match(log, /Received request [^\s:]+: prompt length: 6 tokens, params: SamplingParams\(n=2, .*max_tokens=5.*\), lora_request: None\./);
    assert.match(log, /Finished request [^\s:]+: finish_reason: length/);
    const received = log.split('\n').filter((l) => l.includes('Received request')).length;
    const finished = log.split('\n').filter((l) => l.includes('Finished request')).length;
    assert.equal(received, requests.length);
    assert.equal(finished, requests.length);
  });
});

describe('--disable-log-stats and the default', () => {
  test('--disable-log-stats: no stats line; requests not logged by default', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '256', '--disable-log-stats',
      '--log-stats-interval', '0.2']);
    try {
      const r = await request(`${server.url}/v1/completions`, { body: { prompt: [5, 6, 7], max_tokens: 3 } });
      assert.equal(r.status, 200, r.text);
      await sleep(700);
      assert.doesNotMatch(server.log(), /Engine 000:/);
      assert.doesNotMatch(server.log(), /Received request/);
    } finally {
      await stopOk(server);
    }
  });
  test('--disable-log-requests is accepted', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '256', '--disable-log-requests']);
    try {
      const r = await request(`${server.url}/v1/completions`, { body: { prompt: [5, 6, 7], max_tokens: 2 } });
      assert.equal(r.status, 200, r.text);
      assert.doesNotMatch(server.log(), /Received request/);
    } finally {
      await stopOk(server);
    }
  });
});

describe('POLYLORA_LOG_FORMAT=json', () => {
  test('every log line is a JSON object with time, level, message, logger', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '256', '--log-stats-interval', '0.2',
      '--enable-log-requests'], { env: { POLYLORA_LOG_FORMAT: 'json' } });
    let log;
    try {
      const r = await request(`${server.url}/v1/completions`, { body: { prompt: [5, 6, 7], max_tokens: 3, stop: ['"q\\'] } });
      assert.equal(r.status, 200, r.text);
      await sleep(600);
    } finally {
      await stopOk(server);
      log = server.log();
    }
    const lines = log.split('\n').filter((l) => l.trim() !== '');
    assert.ok(lines.length > 3, log);
    const records = lines.map((l) => {
      let j;
      assert.doesNotThrow(() => { j = JSON.parse(l); }, `not JSON: ${l}`);
      return j;
    });
    for (const j of records) {
      assert.equal(typeof j.message, 'string');
      assert.match(j.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.ok(['TRACE', 'DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'].includes(j.level), j.level);
      assert.equal(j.logger, 'polylora');
    }
    assert.ok(records.some((j) => STATS_RE.test(j.message)), log);
    // A message with quotes and a backslash (the stop string) survives as JSON.
    assert.ok(records.some((j) => j.message.includes("stop=['\"q\\']")), log);
  });
});
