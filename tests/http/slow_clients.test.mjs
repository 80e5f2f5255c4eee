// Slow, silent and idle clients against the real `polylora serve` (tiny fixture model): thousands of
// connections trickling their headers or sending nothing must not delay a normal request (no thread per
// connection; idle ones are shed at --max-connections), idle keep-alive connections cost no CPU, SIGTERM is
// not held up by them, and thousands of fuzzed or malformed requests are each answered with JSON without
// the server's memory growing.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import zlib from 'node:zlib';
import { MODEL, metric, metrics, sleep, startServer } from './lib/server.mjs';
import { cpuSeconds, openFileLimit, parseResponse, rawRequest, httpBytes, rssBytes } from './lib/raw.mjs';

const portOf = (server) => Number(new URL(server.url).port);

// Opens `n` connections (in batches, so that the listen backlog is not overrun); resolves to the sockets.
// Each socket records `closedByServer` (end/close/error seen) and the bytes it received.
async function connectMany(port, n, { batch = 200 } = {}) {
  const socks = [];
  for (let i = 0; i < n; i += batch) {
    const part = await Promise.all(Array.from({ length: Math.min(batch, n - i) }, () => new Promise((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1');
      s.received = Buffer.alloc(0);
      s.closedByServer = false;
      s.on('data', (d) => { s.received = Buffer.concat([s.received, d]); });
      const gone = () => { s.closedByServer = true; };
      s.on('end', gone);
      s.on('close', gone);
      s.on('error', gone);
      s.once('connect', () => resolve(s));
      s.once('error', reject);
    })));
    socks.push(...part);
  }
  return socks;
}
const destroyAll = (socks) => { for (const s of socks) s.destroy(); };

// A normal completion through fetch (a new connection); resolves to its latency in ms.
async function timedCompletion(url) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Connection: 'close' },
    body: JSON.stringify({ prompt: [5, 6, 7], max_tokens: 2 }),
  });
  const json = await r.json();
  const ms = performance.now() - t0;
  assert.equal(r.status, 200, JSON.stringify(json));
  assert.equal(json.usage.completion_tokens, 2);
  return ms;
}

describe('slow and silent clients', () => {
  test('10a. 2,100 connections trickling a header byte every 3 s: a normal request is answered within 1 s', async (t) => {
    const N = 2100;
    if (openFileLimit() < N + 500) {
      t.skip(`the test process may open only ${openFileLimit()} files (ulimit -n); ${N + 500} are needed`);
      return;
    }
    const server = await startServer(['--model', MODEL, '--max-model-len', '64']);  // default --max-connections
    let socks = [];
    try {
      const port = portOf(server);
      const req = httpBytes('POST', '/v1/completions', { headers: { 'Content-Type': 'application/json', 'Content-Length': '2' } });
      const t0 = performance.now();
      socks = await connectMany(port, N);
      let sent = 0;
      const trickle = () => {
        for (const s of socks) if (!s.closedByServer) s.write(req.subarray(sent, sent + 1));
        sent += 1;
      };
      trickle();
      const timer = setInterval(trickle, 3000);
      console.log(`# ${N} trickling connections open after ${(performance.now() - t0).toFixed(0)} ms`);
      try {
        const latencies = [];
        for (const wait of [500, 1500, 2000, 2500]) {
          await sleep(wait);
          latencies.push(await timedCompletion(server.url));
        }
        console.log(`# completion latencies with ${N} tricklers: ${latencies.map((x) => x.toFixed(0)).join(', ')} ms`);
        for (const ms of latencies) assert.ok(ms < 1000, `a completion took ${ms} ms`);
        const closed = socks.filter((s) => s.closedByServer).length;
        assert.equal(closed, 0, 'no trickling connection was closed before --header-timeout (10 s)');
        const m = await fetch(`${server.url}/metrics`);
        assert.equal(m.status, 200);
      } finally {
        clearInterval(timer);
      }
    } finally {
      destroyAll(socks);
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });

  test('10b. --header-timeout: a trickling client gets 408 once the total header time has passed', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '64', '--header-timeout', '2']);
    let socks = [];
    try {
      socks = await connectMany(portOf(server), 20);
      const req = httpBytes('GET', '/health');
      const t0 = performance.now();
      let sent = 0;
      const timer = setInterval(() => {
        for (const s of socks) if (!s.closedByServer) s.write(req.subarray(sent, sent + 1));
        sent += 1;
      }, 200);
      while (socks.some((s) => !s.closedByServer) && performance.now() - t0 < 5000) await sleep(50);
      clearInterval(timer);
      const ms = performance.now() - t0;
      for (const s of socks) {
        assert.ok(s.closedByServer, 'closed');
        const r = parseResponse(s.received);
        assert.ok(r, `a response: ${s.received.toString('latin1')}`);
        assert.equal(r.status, 408);
        assert.match(JSON.parse(r.body.toString()).error.message, /headers were not received within 2 s/);
      }
      console.log(`# 20 tricklers (--header-timeout 2): all answered 408 and closed after ${ms.toFixed(0)} ms`);
      assert.ok(ms < 3500, `${ms} ms`);
      await timedCompletion(server.url);
    } finally {
      destroyAll(socks);
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });

  test('10c. --max-connections 32 with 64 silent connections: idle ones are shed, a normal request is answered within 1 s', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '64', '--max-connections', '32']);
    let socks = [];
    try {
      socks = await connectMany(portOf(server), 64, { batch: 8 });
      await sleep(300);
      const latencies = [];
      for (let i = 0; i < 3; ++i) latencies.push(await timedCompletion(server.url));
      await sleep(100);
      const closed = socks.filter((s) => s.closedByServer).length;
      console.log(`# --max-connections 32, 64 silent: completions in ${latencies.map((x) => x.toFixed(0)).join(', ')} ms; ` +
        `${closed} silent connections shed`);
      for (const ms of latencies) assert.ok(ms < 1000, `a completion took ${ms} ms`);
      assert.ok(closed >= 64 - 32 + 1, `at least 33 of the 64 silent connections were closed, got ${closed}`);
      // Still at most 32 open: more silent clients keep being shed, requests keep being served.
      const more = await connectMany(portOf(server), 64, { batch: 8 });
      socks.push(...more);
      assert.ok((await timedCompletion(server.url)) < 1000);
    } finally {
      destroyAll(socks);
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });

  test('11. 1,000 idle keep-alive connections cost under 0.05 cores over 5 s', async (t) => {
    const N = 1000;
    if (openFileLimit() < N + 500) {
      t.skip(`ulimit -n ${openFileLimit()} is too low for ${N} connections`);
      return;
    }
    const server = await startServer(['--model', MODEL, '--max-model-len', '64', '--timeout-keep-alive', '60']);
    let socks = [];
    try {
      socks = await connectMany(portOf(server), N);
      const req = httpBytes('GET', '/health');
      for (const s of socks) s.write(req);
      const t0 = performance.now();
      while (socks.some((s) => !parseResponse(s.received)) && performance.now() - t0 < 10_000) await sleep(20);
      for (const s of socks) assert.equal(parseResponse(s.received)?.status, 200);
      await sleep(500);  // let the server settle
      const pid = server.child.pid;
      const cpu0 = cpuSeconds(pid);
      const w0 = performance.now();
      await sleep(5000);
      const cores = (cpuSeconds(pid) - cpu0) / ((performance.now() - w0) / 1000);
      console.log(`# ${N} idle keep-alive connections: ${cores.toFixed(4)} cores over 5 s`);
      assert.ok(cores < 0.05, `${cores} cores`);
      assert.equal(socks.filter((s) => s.closedByServer).length, 0, 'all still open (--timeout-keep-alive 60)');
      // They are still usable.
      for (const s of socks.slice(0, 10)) {
        s.received = Buffer.alloc(0);
        s.write(req);
      }
      await sleep(300);
      for (const s of socks.slice(0, 10)) assert.equal(parseResponse(s.received)?.status, 200);
    } finally {
      destroyAll(socks);
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });

  test('12. SIGTERM with a trickling and an idle keep-alive client exits within --shutdown-timeout + 1 s', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '64', '--shutdown-timeout', '2',
      '--timeout-keep-alive', '60', '--header-timeout', '60']);
    const port = portOf(server);
    const [trickler, idle] = await connectMany(port, 2);
    const req = httpBytes('POST', '/v1/completions', { headers: { 'Content-Type': 'application/json', 'Content-Length': '2' } });
    let sent = 0;
    const timer = setInterval(() => { if (!trickler.closedByServer) trickler.write(req.subarray(sent, ++sent)); }, 300);
    idle.write(httpBytes('GET', '/health'));
    try {
      const w = performance.now();
      while (!parseResponse(idle.received) && performance.now() - w < 5000) await sleep(10);
      assert.equal(parseResponse(idle.received)?.status, 200);
      await sleep(1000);
      assert.ok(!trickler.closedByServer && !idle.closedByServer);
      const t0 = performance.now();
      server.child.kill('SIGTERM');
      const { code, signal } = await server.exited;
      const ms = performance.now() - t0;
      console.log(`# SIGTERM with a trickling and an idle client: exited after ${ms.toFixed(0)} ms (--shutdown-timeout 2)`);
      assert.deepEqual({ code, signal }, { code: 0, signal: null }, server.log());
      assert.ok(ms < 3000, `exited ${ms} ms after SIGTERM`);
      await sleep(50);
      assert.ok(trickler.closedByServer && idle.closedByServer, 'both connections were closed');
    } finally {
      clearInterval(timer);
      destroyAll([trickler, idle]);
      if (server.child.exitCode === null) await server.stop();
    }
  });
});

describe('clients that go away', () => {
  test('a client closing while its generation runs stops it, also with a pipelined request buffered', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '4096']);
    const running = async () => metric(await metrics(server.url), 'vllm:num_requests_running');
    try {
      const port = portOf(server);
      const long = httpBytes('POST', '/v1/completions', { headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: [5, 6, 7], max_tokens: 3000, ignore_eos: true }) });
      for (const [what, bytes] of [['plain', long], ['pipelined', Buffer.concat([long, httpBytes('GET', '/health')])],
        ['pipelined, arriving later', [long]]]) {
        const [sock] = await connectMany(port, 1);
        for (const b of Array.isArray(bytes) ? bytes : [bytes]) sock.write(b);
        const t0 = performance.now();
        while ((await running()) !== 1 && performance.now() - t0 < 3000) await sleep(20);
        assert.equal(await running(), 1, `${what}: the generation runs`);
        if (Array.isArray(bytes)) {
          sock.write(httpBytes('GET', '/health'));
          await sleep(100);
        }
        sock.destroy();
        const t1 = performance.now();
        while ((await running()) !== 0 && performance.now() - t1 < 3000) await sleep(20);
        const ms = performance.now() - t1;
        console.log(`# ${what}: the generation stopped ${ms.toFixed(0)} ms after the client left`);
        assert.equal(await running(), 0, `${what}: still running ${ms} ms after the client left`);
      }
      // A pipelined request sent while a (short) one runs is answered after it, in order.
      const [sock] = await connectMany(port, 1);
      sock.write(httpBytes('POST', '/v1/completions', { headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: [5, 6, 7], max_tokens: 20, ignore_eos: true }) }));
      await sleep(50);
      sock.write(httpBytes('GET', '/version', { headers: { Connection: 'close' } }));
      const t2 = performance.now();
      while (!sock.closedByServer && performance.now() - t2 < 5000) await sleep(20);
      const first = parseResponse(sock.received);
      assert.equal(first?.status, 200);
      assert.equal(JSON.parse(first.body.toString()).usage.completion_tokens, 20);
      const second = parseResponse(sock.received.subarray(first.length));
      assert.equal(second?.status, 200);
      assert.ok(JSON.parse(second.body.toString()).version);
      sock.destroy();
    } finally {
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });
});

// --- 13: fuzzing -----------------------------------------------------------------------------------------

// Deterministic PRNG (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const VALID = [
  ['/v1/completions', { prompt: [5, 6, 7, 8], max_tokens: 2, temperature: 0.7, top_p: 0.9, logprobs: 2, stop: ['x'], seed: 3 }],
  ['/v1/completions', { prompt: 'hello there', max_tokens: 1, logit_bias: { 17: 2 }, echo: true }],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, top_k: 5 }],
  ['/tokenize', { prompt: 'hello world', return_token_strs: true }],
  ['/detokenize', { tokens: [5, 6, 7] }],
];
const WEIRD_VALUES = [null, true, -1, 0, 1e308, -1e308, 2 ** 63, 4294967297, 1.5, '', 'x'.repeat(300), '\u0000',
  '\ud83d\ude00', [], {}, [[[]]], { a: { b: {} } }, [1, 'a', null], '9223372036854775807'];
const WEIRD_KEYS = ['prompt', 'messages', 'max_tokens', 'temperature', 'logit_bias', 'stop', 'stop_token_ids',
  'logprobs', 'top_logprobs', 'prompt_logprobs', 'model', 'echo', 'min_tokens', 'seed', 'tokens', '', '__proto__',
  'constructor', 'x'.repeat(100), 'top_k', 'min_p', 'best_of', 'response_format', 'tools', 'chat_template'];

// One fuzzed request: { kind, bytes (a whole HTTP request) }. Never large generations: the server runs
// with --max-model-len 64, and 'n' / 'stream' are never set by the mutations.
function fuzzCase(rand, i) {
  const pick = (arr) => arr[Math.floor(rand() * arr.length)];
  const [route, valid] = pick(VALID);
  const kind = pick(['structural', 'structural', 'textual', 'textual', 'truncated', 'random-body', 'random-request',
    'valid', 'chunked', 'gzip', 'headers']);
  let body;
  if (kind === 'valid') {
    body = Buffer.from(JSON.stringify(valid));
  } else if (kind === 'structural') {
    const obj = structuredClone(valid);
    for (let k = 1 + Math.floor(rand() * 3); k > 0; --k) {
      const op = rand();
      const keys = Object.keys(obj);
      if (op < 0.4 && keys.length) obj[pick(keys)] = pick(WEIRD_VALUES);
      else if (op < 0.7) obj[pick(WEIRD_KEYS)] = pick(WEIRD_VALUES);
      else if (keys.length) delete obj[pick(keys)];
    }
    if (typeof obj.max_tokens === 'number' && obj.max_tokens > 8) obj.max_tokens = 2;
    body = Buffer.from(rand() < 0.5 ? JSON.stringify(obj) : JSON.stringify([obj]));
  } else if (kind === 'textual') {
    const b = Buffer.from(JSON.stringify(valid));
    const out = [...b];
    for (let k = 1 + Math.floor(rand() * 4); k > 0; --k) {
      const pos = Math.floor(rand() * out.length);
      const op = rand();
      if (op < 0.3) out[pos] = Math.floor(rand() * 256);  // may be an invalid UTF-8 byte
      else if (op < 0.5) out.splice(pos, 1 + Math.floor(rand() * 5));
      else if (op < 0.7) out.splice(pos, 0, ...Buffer.from(pick(['{', '[', ']', '}', '"', '\\', ',', ':', '\\u', '\\ud800', '\xc0\xaf', '9', 'e', '-'])));
      else out.splice(pos, 0, ...out.slice(pos, pos + Math.floor(rand() * 10)));
    }
    body = Buffer.from(out);
  } else if (kind === 'truncated') {
    const b = Buffer.from(JSON.stringify(valid));
    body = b.subarray(0, Math.floor(rand() * b.length));
  } else if (kind === 'random-body') {
    body = Buffer.from(Array.from({ length: Math.floor(rand() * 400) }, () => Math.floor(rand() * 256)));
  } else if (kind === 'random-request') {
    // Random bytes as the whole request (garbage request line / headers), ended so that it is complete.
    const junk = Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 200) }, () => Math.floor(rand() * 256)));
    return { kind, route, bytes: Buffer.concat([junk, Buffer.from('\r\n\r\n')]) };
  }
  const headers = { 'Content-Type': 'application/json', Connection: i % 3 === 0 ? 'keep-alive' : 'close' };
  if (kind === 'chunked') {
    // A valid body in random chunks; now and then a malformed chunk size or extension.
    body = Buffer.from(JSON.stringify(valid));
    let framed = '';
    for (let p = 0; p < body.length;) {
      const piece = body.subarray(p, p + 1 + Math.floor(rand() * 20));
      const n = piece.length;
      const size = rand() < 0.05 ? pick(['zz', '-1', '', 'ffffffffffffffffffff', `${n};ext="x"`, ` ${n}`]) : n.toString(16);
      framed += `${size}\r\n${piece.toString('latin1')}\r\n`;
      p += n;
    }
    framed += '0\r\n\r\n';
    return { kind, route, bytes: Buffer.concat([httpBytes('POST', route, { headers: { ...headers, 'Transfer-Encoding': 'chunked' } }), Buffer.from(framed, 'latin1')]) };
  }
  if (kind === 'gzip') {
    // A (possibly mutated) body gzipped; now and then corrupted after compression.
    const gz = Buffer.from(zlib.gzipSync(rand() < 0.5 ? JSON.stringify(valid) : JSON.stringify(valid).slice(0, 10)));
    if (rand() < 0.5) gz[Math.floor(rand() * gz.length)] ^= 1 + Math.floor(rand() * 255);
    return { kind, route, bytes: httpBytes('POST', route, { headers: { ...headers, 'Content-Encoding': pick(['gzip', 'gzip', 'deflate', 'br']) }, body: gz }) };
  }
  if (kind === 'headers') {
    // Random extra header fields, some with bytes outside ASCII or control characters.
    const extra = Array.from({ length: 1 + Math.floor(rand() * 5) }, () => [
      pick(['X-A', 'Authorization', 'Content-Type', 'Accept-Encoding', 'Expect', 'X-\xff', 'Te', 'Upgrade', 'X-B', 'Accept', 'X-Forwarded-For']),
      Buffer.from(Array.from({ length: Math.floor(rand() * 40) },
        () => (rand() < 0.97 ? 32 + Math.floor(rand() * 95) : Math.floor(rand() * 256)))).toString('latin1'),
    ]);
    return { kind, route, bytes: httpBytes('POST', route, { headers: [...Object.entries(headers), ...extra], body: Buffer.from(JSON.stringify(valid)) }) };
  }
  return { kind, route, bytes: httpBytes('POST', route, { headers, body }) };
}

describe('13. fuzzed and malformed requests', () => {
  test('5,000 fuzzed requests: each answered with JSON, the server lives, RSS stays flat', async () => {
    // A small KV cache (128 blocks, enough for 16 requests of up to 64 tokens): the cache's pages are touched
    // lazily as blocks are first used (fresh blocks are handed out before cached ones are evicted), so with
    // the default 4,096 blocks RSS climbs by ~100 MiB over the first few thousand requests without any
    // leak. With 128 blocks the first 100 requests already touch all of them.
    const server = await startServer(['--model', MODEL, '--max-model-len', '64', '--num-kv-blocks', '128',
      '--header-timeout', '2', '--body-timeout', '2']);
    try {
      const port = portOf(server);
      const pid = server.child.pid;
      const rand = rng(20261201);
      const TOTAL = 5000;
      const CONCURRENCY = 16;
      const statuses = {};
      const kinds = {};
      let next = 0;
      let rssAt100;
      const failures = [];
      const t0 = performance.now();
      const worker = async () => {
        while (next < TOTAL) {
          const i = next++;
          const c = fuzzCase(rand, i);
          const r = await rawRequest(port, c.bytes, { timeoutMs: 10_000 });
          const key = `${c.kind}:${r.status}`;
          kinds[key] = (kinds[key] ?? 0) + 1;
          statuses[r.status] = (statuses[r.status] ?? 0) + 1;
          const sse = /text\/event-stream/.test(r.headers?.['content-type'] ?? '');
          if (!r.status || r.timedOut || (!r.json && !sse) || r.status >= 500) {
            failures.push({ i, kind: c.kind, status: r.status, error: r.error, timedOut: r.timedOut,
              text: r.text?.slice(0, 200), request: c.bytes.toString('latin1').slice(0, 300) });
          } else if (r.status !== 200 && !sse) {
            const e = r.json?.error;
            if (!e || typeof e.message !== 'string' || e.code !== r.status)
              failures.push({ i, kind: c.kind, status: r.status, text: r.text?.slice(0, 200) });
          }
          if (i === 100) rssAt100 = rssBytes(pid);
        }
      };
      await Promise.all(Array.from({ length: CONCURRENCY }, worker));
      const seconds = (performance.now() - t0) / 1000;
      await sleep(300);
      const rssEnd = rssBytes(pid);
      const allowed = Math.max(rssAt100 * 0.1, 10 * 2 ** 20);
      console.log(`# ${TOTAL} fuzzed requests in ${seconds.toFixed(1)} s; statuses ${JSON.stringify(statuses)}`);
      console.log(`# by kind: ${JSON.stringify(kinds)}`);
      console.log(`# RSS after 100: ${(rssAt100 / 2 ** 20).toFixed(1)} MiB, after ${TOTAL}: ${(rssEnd / 2 ** 20).toFixed(1)} MiB ` +
        `(allowed growth: max(10%, 10 MiB) = ${(allowed / 2 ** 20).toFixed(1)} MiB)`);
      assert.deepEqual(failures.slice(0, 5), [], `${failures.length} requests not answered with a JSON body`);
      assert.equal(server.child.exitCode, null, 'the server is alive');
      assert.ok(rssEnd - rssAt100 <= allowed, `RSS grew by ${((rssEnd - rssAt100) / 2 ** 20).toFixed(1)} MiB`);
      assert.ok(statuses[200] > 0 && statuses[400] > 0);
      await timedCompletion(server.url);
    } finally {
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });
});
