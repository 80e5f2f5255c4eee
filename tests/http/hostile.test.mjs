// Hostile requests against the real `polylora serve` (tiny fixture model), with and without --api-key:
// invalid UTF-8 in paths and bodies, deep or wide JSON, out-of-range numbers, gzip bombs and bad encodings,
// broken HTTP framing, oversized headers, authentication of every route group, run-time adapter loading
// under a symlink-swap race and with hostile adapter configs, and requests still running at SIGTERM.
// Every refusal must be the right status with an OpenAI-shaped JSON error saying what is wrong, answered
// at once (no allocation or hang driven by the request), and the server must go on serving.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { cpSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import zlib from 'node:zlib';
import { ADAPTERS, MODEL, REFERENCE_PROMPTS, readSse, request, sleep, startServer, tempDir } from './lib/server.mjs';
import { assertOpenAIError, httpBytes, isValidUtf8, parseResponse, rawRequest, rssBytes } from './lib/raw.mjs';

const KEY = 'sk-hostile';
const METRICS_KEY = 'sk-hostile-metrics';
const VOCAB = 1024;  // the fixture's vocabulary
const BODY_TIMEOUT_S = 2;
const MAX_BODY = 2 << 20;  // --max-body-bytes: the ~1 MB gzip bomb fits, a larger Content-Length does not

// POST with a body of raw bytes (Buffer) or a string/object; returns the body's bytes too.
async function post(url, body, { key, headers = {}, method = 'POST' } = {}) {
  const h = { 'Content-Type': 'application/json', ...headers };
  if (key) h.Authorization = `Bearer ${key}`;
  const data = body === undefined ? undefined
    : Buffer.isBuffer(body) || typeof body === 'string' ? body : JSON.stringify(body);
  const t0 = performance.now();
  const r = await fetch(url, { method, headers: h, body: data });
  const buf = Buffer.from(await r.arrayBuffer());
  const ms = performance.now() - t0;
  const text = buf.toString('utf8');
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, headers: r.headers, body: buf, text, json, ms };
}

// A gzip stream of `size` zero bytes (1 GiB compresses to about 1 MB at level 9).
async function gzipZeros(size) {
  const gz = zlib.createGzip({ level: 9, memLevel: 9 });
  const out = [];
  gz.on('data', (d) => out.push(d));
  const ended = new Promise((r) => gz.on('end', r));
  const chunk = Buffer.alloc(1 << 20);
  for (let n = 0; n < size; n += chunk.length) if (!gz.write(chunk)) await new Promise((r) => gz.once('drain', r));
  gz.end();
  await ended;
  return Buffer.concat(out);
}
let bombCache;
const gzipBomb = () => (bombCache ??= gzipZeros(1 << 30));

// Samples the RSS of `pid` every 5 ms while `promise` runs; resolves to [result, max RSS in bytes].
async function withPeakRss(pid, promise) {
  let peak = rssBytes(pid);
  let running = true;
  const poll = (async () => {
    while (running) {
      try {
        peak = Math.max(peak, rssBytes(pid));
      } catch {
        return;
      }
      await sleep(5);
    }
  })();
  try {
    return [await promise, peak];
  } finally {
    running = false;
    await poll;
  }
}

// Routes taking a JSON body, each with a valid body builder around one string field `s` (raw JSON text).
const JSON_ROUTES = {
  '/v1/completions': (s) => `{"prompt": ${s}, "max_tokens": 2}`,
  '/v1/chat/completions': (s) => `{"messages": [{"role": "user", "content": ${s}}], "max_tokens": 2}`,
  '/tokenize': (s) => `{"prompt": ${s}}`,
  '/detokenize': (s) => `{"tokens": [5, 6], "note": ${s}}`,
  '/v1/load_lora_adapter': (s) => `{"lora_name": ${s}, "lora_path": "/nonexistent"}`,
  '/v1/unload_lora_adapter': (s) => `{"lora_name": ${s}}`,
};

function hostileSuite({ withKey }) {
  const key = withKey ? KEY : undefined;
  describe(`hostile requests (${withKey ? 'with' : 'without'} --api-key)`, () => {
    let server;
    let port;
    let tmp;
    let allowed;
    let outside;
    const url = (p) => `${server.url}${p}`;
    // A normal request succeeds (the server is still serving, and serving correctly).
    const stillServing = async () => {
      const r = await post(url('/v1/completions'), { prompt: [5, 6, 7], max_tokens: 2, temperature: 0 }, { key });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.usage.completion_tokens, 2);
      assert.equal(server.child.exitCode, null, 'the server is still running');
    };

    before(async () => {
      tmp = tempDir('polylora-hostile-');
      allowed = path.join(tmp.dir, 'allowed');
      outside = path.join(tmp.dir, 'outside');
      mkdirSync(allowed);
      mkdirSync(outside);
      cpSync(ADAPTERS.perexp, path.join(outside, 'adapter'), { recursive: true });
      server = await startServer([
        '--model', MODEL, '--max-model-len', '256', '--max-cpu-loras', '512',
        '--enable-lora-runtime-updating', '--lora-allowed-dirs', allowed,
        '--max-body-bytes', String(MAX_BODY), '--body-timeout', String(BODY_TIMEOUT_S), '--header-timeout', '5',
        ...(withKey ? ['--api-key', KEY] : []),
      ]);
      port = Number(new URL(server.url).port);
    });
    after(async () => {
      const { code, signal } = await server.stop();
      tmp.remove();
      assert.equal(signal, null, server.log());
      assert.equal(code, 0, server.log());
    });

    test('1. invalid UTF-8 in the path: 404 (or 401) with a valid UTF-8 JSON body, bytes replaced', async () => {
      const paths = [
        Buffer.from('/%ff'), Buffer.from('/%c0%af%ed%a0%80'),
        Buffer.from([0x2f, 0xff]), Buffer.from([0x2f, 0xc0, 0xaf]), Buffer.from([0x2f, 0xed, 0xa0, 0x80]),
        Buffer.from([0x2f, 0x61, 0xf4, 0x90, 0x80, 0x80, 0xfe]),
      ];
      for (const p of paths) {
        const rawBytes = p.some((b) => b >= 0x80);
        const req = (prefix, auth) => Buffer.concat([Buffer.from(`GET ${prefix}`), p,
          Buffer.from(` HTTP/1.1\r\nHost: x\r\n${auth ? `Authorization: Bearer ${KEY}\r\n` : ''}\r\n`)]);
        for (const [prefix, auth] of [['', false], ['/v1', false], ['/v1', true]]) {
          const r = await rawRequest(port, req(prefix, auth));
          const status = withKey && prefix === '/v1' && !auth ? 401 : 404;
          assertOpenAIError(r, status, status === 401 ? /API key/ : /no route/);
          assert.ok(isValidUtf8(r.body));
          if (status === 404 && rawBytes) assert.ok(r.json.error.message.includes('\uFFFD'), r.text);
          assert.ok(r.ms < 1000, `${r.ms} ms`);
        }
      }
      // Through fetch too (percent-encoded; the path is not decoded, so no route).
      const r = await post(url('/v1/%ff'), undefined, { method: 'GET', headers: {} });
      assertOpenAIError(r, withKey ? 401 : 404);
      await stillServing();
    });

    test('2. invalid UTF-8, overlong forms, encoded and escaped surrogates in bodies: 400', async () => {
      const bad = [
        ['raw 0xff', Buffer.from([0x22, 0x61, 0xff, 0x62, 0x22]), /UTF-8/],
        ['overlong 0xc0 0xaf', Buffer.from([0x22, 0xc0, 0xaf, 0x22]), /UTF-8/],
        ['overlong 0xe0 0x80 0xaf', Buffer.from([0x22, 0xe0, 0x80, 0xaf, 0x22]), /UTF-8/],
        ['encoded surrogate 0xed 0xa0 0x80', Buffer.from([0x22, 0xed, 0xa0, 0x80, 0x22]), /UTF-8/],
        ['above U+10FFFF', Buffer.from([0x22, 0xf4, 0x90, 0x80, 0x80, 0x22]), /UTF-8/],
        ['truncated sequence', Buffer.from([0x22, 0xe2, 0x82, 0x22]), /UTF-8/],
        ['lone high surrogate escape', Buffer.from('"\\ud800"'), /surrogate/],
        ['lone low surrogate escape', Buffer.from('"x\\udc00y"'), /surrogate/],
        ['high surrogate escape + non-low', Buffer.from('"\\ud800\\u0041"'), /surrogate/],
      ];
      for (const [route, build] of Object.entries(JSON_ROUTES)) {
        for (const [what, s, pattern] of bad) {
          const [pre, post_] = build('@@').split('@@');
          const body = Buffer.concat([Buffer.from(pre), s, Buffer.from(post_)]);
          const r = await post(url(route), body, { key });
          assertOpenAIError(r, 400, pattern);
          assert.ok(isValidUtf8(r.body), `${route} ${what}: the error body is valid UTF-8`);
          assert.ok(r.ms < 1000, `${route} ${what}: ${r.ms} ms`);
        }
      }
      await stillServing();
    });

    test('3. JSON nested 100,000 deep: 400 naming the depth; 100,000 keys: 400 within 2 s', async () => {
      const D = 100_000;
      const deepArray = '['.repeat(D) + ']'.repeat(D);
      const deepObject = '{"a":'.repeat(D) + '1' + '}'.repeat(D);
      const deepMixed = '[{"a":'.repeat(D / 2) + '1' + '}]'.repeat(D / 2);
      for (const [route, build] of Object.entries(JSON_ROUTES)) {
        for (const deep of [deepArray, deepObject, deepMixed]) {
          const r = await post(url(route), build(deep), { key });
          assertOpenAIError(r, 400, /deeper than 64|depth/);
          assert.ok(r.ms < 1000, `${route}: ${r.ms} ms`);
        }
        // Unclosed nesting (truncated) as well.
        const r = await post(url(route), '['.repeat(D), { key });
        assertOpenAIError(r, 400, /deeper|depth/);
        // Deep at the top level.
        const r2 = await post(url(route), deepObject, { key });
        assertOpenAIError(r2, 400, /deeper|depth/);
      }
      const keys = Array.from({ length: 100_000 }, (_, i) => `"k${i}":${i}`).join(',');
      for (const [route, build] of Object.entries(JSON_ROUTES)) {
        for (const body of [`{${keys}}`, build(`{${keys}}`)]) {
          const r = await post(url(route), body, { key });
          assertOpenAIError(r, 400, /members|--max-json-keys/);
          assert.ok(r.ms < 2000, `${route}: 100,000 keys answered in ${r.ms} ms`);
        }
      }
      await stillServing();
    });

    test('4. numbers out of range: 400 naming the field, within a second', async () => {
      const base = { prompt: [5, 6, 7], max_tokens: 2 };
      const chatBase = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
      const cases = [];
      for (const n of ['-1', '0', '1e9', '1e7', '2000', '1025', '9223372036854775808', '1.5', '"two"']) cases.push([{ n }, /'n'/]);
      for (const m of ['9223372036854775807', '18446744073709551615', '1e300', '-5', '0.5', '-9223372036854775808', '1e19'])
        cases.push([{ max_tokens: m }, /max_tokens/]);
      for (const k of ['4294967297', '-1', 'abc', '', '1024', '99999999999999999999', ' 5', '5 ', '0x10', '+5'])
        cases.push([{ logit_bias: `{${JSON.stringify(k)}: 1}` }, /logit_bias/]);
      for (const id of ['4294967297', '1024', '2147483648', '-1', '99999999999999999999', '1e300'])
        cases.push([{ prompt: `[5, ${id}]` }, /prompt/]);
      for (const id of ['1024', '4294967297', '-1', '2147483648'])
        cases.push([{ stop_token_ids: `[${id}]` }, /stop_token_ids/]);
      const render = (obj, over) => {
        const fields = { ...Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, JSON.stringify(v)])), ...over };
        return `{${Object.entries(fields).map(([k, v]) => `${JSON.stringify(k)}: ${v}`).join(', ')}}`;
      };
      for (const [over, pattern] of cases) {
        const r = await post(url('/v1/completions'), render(base, over), { key });
        assertOpenAIError(r, 400, pattern);
        assert.ok(r.ms < 1000, `${JSON.stringify(over)}: ${r.ms} ms`);
        if (over.prompt) continue;
        const c = await post(url('/v1/chat/completions'), render(chatBase, over), { key });
        assertOpenAIError(c, 400, pattern);
        assert.ok(c.ms < 1000, `chat ${JSON.stringify(over)}: ${c.ms} ms`);
      }
      for (const ids of ['[1024]', '[-1]', '[4294967297]', '[2147483648]', '[99999999999999999999]', '[1e300]', '[1.5]', '["1"]']) {
        const r = await post(url('/detokenize'), `{"tokens": ${ids}}`, { key });
        assertOpenAIError(r, 400, /tokens/);
        assert.ok(r.ms < 1000, `detokenize ${ids}: ${r.ms} ms`);
      }
      // n at the cap with a tiny request is fine (and bounded).
      const ok = await post(url('/v1/completions'), { prompt: [5], max_tokens: 1, n: 4 }, { key });
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.json.choices.length, 4);
      await stillServing();
    });

    test('5. gzip bomb: 413 while inflating, RSS stays low; invalid gzip 400; unknown encoding 415; small gzip 200', async () => {
      const bomb = await gzipBomb();
      assert.ok(bomb.length < MAX_BODY, `bomb of ${bomb.length} bytes`);
      // Many concatenated gzip members (RFC 1952 allows them): 1,024 × 1 MiB of zeros in ~1 MB as well.
      const one = zlib.gzipSync(Buffer.alloc(1 << 20), { level: 9 });
      const multi = Buffer.concat(Array.from({ length: 1024 }, () => one));
      const pid = server.child.pid;
      const before = rssBytes(pid);
      for (const [what, body] of [['one member', bomb], ['1,024 members', multi]]) {
        for (const k of withKey ? [KEY, undefined] : [undefined]) {
          const [r, peak] = await withPeakRss(pid, post(url('/tokenize'), body, { key: k, headers: { 'Content-Encoding': 'gzip' } }));
          if (withKey && !k) assertOpenAIError(r, 401);  // authentication comes before inflation
          else assertOpenAIError(r, 413, /decompressed request body exceeds/);
          assert.ok(r.ms < 3000, `${what}: ${r.ms} ms`);
          console.log(`# gzip bomb (${what}, key ${k ? 'sent' : 'not sent'}): ${r.status} in ${r.ms.toFixed(0)} ms, ` +
            `RSS ${(before / 2 ** 20).toFixed(1)} MiB before, peak ${(peak / 2 ** 20).toFixed(1)} MiB`);
          assert.ok(peak < 300 * 2 ** 20, `peak RSS ${peak} bytes`);
        }
      }
      // The same bomb as deflate (zlib and raw).
      const deflateBomb = zlib.deflateSync(Buffer.alloc(256 << 20), { level: 9 });
      const rd = await post(url('/tokenize'), deflateBomb, { key, headers: { 'Content-Encoding': 'deflate' } });
      assertOpenAIError(rd, 413, /decompressed/);
      // Invalid / truncated gzip.
      for (const body of [Buffer.from('not gzip at all'), bomb.subarray(0, 5000), Buffer.concat([one.subarray(0, 10), Buffer.alloc(100, 0x55)])]) {
        const r = await post(url('/tokenize'), body, { key, headers: { 'Content-Encoding': 'gzip' } });
        assertOpenAIError(r, 400, /not valid gzip/);
      }
      // A valid gzip member followed by garbage is not silently truncated.
      const small = zlib.gzipSync('{"prompt": "hello world"}');
      const trailing = await post(url('/tokenize'), Buffer.concat([small, Buffer.from('garbage')]), { key, headers: { 'Content-Encoding': 'gzip' } });
      assertOpenAIError(trailing, 400, /gzip/);
      // Unknown or stacked encodings.
      for (const enc of ['br', 'compress', 'zstd', 'gzip, gzip', 'gzip, br', 'x-unknown']) {
        const r = await post(url('/tokenize'), small, { key, headers: { 'Content-Encoding': enc } });
        assertOpenAIError(r, 415, /Content-Encoding/);
      }
      // Valid small bodies work: gzip, x-gzip, deflate (zlib), deflate (raw), two gzip members.
      const plain = await post(url('/tokenize'), '{"prompt": "hello world"}', { key });
      assert.equal(plain.status, 200, plain.text);
      const half = zlib.gzipSync('{"prompt": "hello');
      const rest = zlib.gzipSync(' world"}');
      for (const [enc, body] of [['gzip', small], ['x-gzip', small], ['GZip', small],
        ['deflate', zlib.deflateSync('{"prompt": "hello world"}')], ['deflate', zlib.deflateRawSync('{"prompt": "hello world"}')],
        ['gzip', Buffer.concat([half, rest])]]) {
        const r = await post(url('/tokenize'), body, { key, headers: { 'Content-Encoding': enc } });
        assert.equal(r.status, 200, `${enc}: ${r.text}`);
        assert.deepEqual(r.json.tokens, plain.json.tokens);
      }
      const after = rssBytes(pid);
      console.log(`# RSS after the gzip cases: ${(after / 2 ** 20).toFixed(1)} MiB`);
      await stillServing();
    });

    test('6. framing: bad Content-Length, bad chunks, oversized headers answered at once; a stalled body gets 408', async () => {
      const auth = withKey ? { Authorization: `Bearer ${KEY}` } : {};
      const hdr = (extra) => ({ ...auth, 'Content-Type': 'application/json', ...extra });
      const immediate = [
        ['negative Content-Length', httpBytes('POST', '/tokenize', { headers: hdr({ 'Content-Length': '-1' }) }), 400, /Content-Length/],
        ['huge Content-Length', httpBytes('POST', '/tokenize', { headers: hdr({ 'Content-Length': '99999999999999999999' }) }), [400, 413], /Content-Length|exceeds/],
        ['non-numeric Content-Length', httpBytes('POST', '/tokenize', { headers: hdr({ 'Content-Length': 'abc' }) }), 400, /Content-Length/],
        ['two different Content-Lengths', httpBytes('POST', '/tokenize', { headers: [...Object.entries(hdr({})), ['Content-Length', '5'], ['Content-Length', '6']] }), 400, /Content-Length/],
        ['Content-Length above --max-body-bytes', httpBytes('POST', '/tokenize', { headers: hdr({ 'Content-Length': String(MAX_BODY + 1) }) }), 413, /--max-body-bytes/],
        ['malformed chunk size', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'chunked' }), body: 'zz\r\n{"prompt": "x"}\r\n0\r\n\r\n' }), 400, /chunk/],
        ['chunk size overflowing', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'chunked' }), body: 'ffffffffffffffffffff\r\nab\r\n' }), [400, 413], /chunk|exceeds/],
        ['chunks above --max-body-bytes', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'chunked' }), body: `${(MAX_BODY + 1).toString(16)}\r\n` }), 413, /--max-body-bytes/],
        ['1 MB header value', httpBytes('GET', '/health', { headers: { 'X-Big': 'a'.repeat(1 << 20) } }), 431, /--max-header-bytes/],
        ['200 headers', httpBytes('GET', '/health', { headers: Array.from({ length: 200 }, (_, i) => [`X-H${i}`, 'v']) }), 431, /--max-header-count/],
        ['1 MB request line', Buffer.from(`GET /${'a'.repeat(1 << 20)} HTTP/1.1\r\nHost: x\r\n\r\n`), 431, /--max-header-bytes/],
        ['garbage request line', Buffer.from('\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n', 'latin1'), 400, /malformed/],
        ['bad HTTP version', Buffer.from('GET / HTTP/9.9\r\nHost: x\r\n\r\n'), 400, /malformed/],
        ['Transfer-Encoding gzip, chunked', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'gzip, chunked' }), body: 'f\r\n{"prompt": "x"}\r\n0\r\n\r\n' }), 400, /Transfer-Encoding/],
        ['Transfer-Encoding chunked, gzip', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'chunked, gzip' }), body: '{"prompt": "x"}' }), 400, /Transfer-Encoding/],
        ['Transfer-Encoding identity', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'identity', 'Content-Length': '15' }), body: '{"prompt": "x"}' }), 400, /Transfer-Encoding/],
        ['Content-Length and Transfer-Encoding', httpBytes('POST', '/tokenize', { headers: hdr({ 'Content-Length': '4', 'Transfer-Encoding': 'chunked' }), body: 'f\r\n{"prompt": "x"}\r\n0\r\n\r\n' }), 400, /Transfer-Encoding/],
        ['header without colon', Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n'), 400, /malformed/],
      ];
      for (const [what, bytes, status, pattern] of immediate) {
        const r = await rawRequest(port, bytes, { closeWaitMs: 1000 });
        assertOpenAIError(r, status, pattern);
        assert.ok(r.ms < 500, `${what}: answered in ${r.ms} ms`);
        assert.ok(r.closed, `${what}: the connection is closed after the error`);
        assert.ok(r.closedMs < 1500, `${what}: closed after ${r.closedMs} ms`);
      }
      // absolute-form targets are routed (and authenticated) by their path.
      const abs = await rawRequest(port, Buffer.from('GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n'));
      assert.equal(abs.status, 200);
      const absModels = await rawRequest(port, Buffer.from('GET HTTP://x:1/v1/models?a=1 HTTP/1.1\r\nHost: x\r\n\r\n'));
      if (withKey) assertOpenAIError(absModels, 401);
      else assert.equal(absModels.status, 200, absModels.text);
      // Stalled bodies: answered 408 once --body-timeout has passed, not left hanging.
      const stalled = [
        ['chunked body without its last chunk', httpBytes('POST', '/tokenize', { headers: hdr({ 'Transfer-Encoding': 'chunked' }), body: '3\r\n{"p\r\n' })],
        ['Content-Length body cut short', httpBytes('POST', '/tokenize', { headers: hdr({ 'Content-Length': '100' }), body: '{"prompt": ' })],
      ];
      const results = await Promise.all(stalled.map(([, bytes]) => rawRequest(port, bytes, { timeoutMs: 10_000, closeWaitMs: 1000 })));
      for (const [i, r] of results.entries()) {
        const what = stalled[i][0];
        assertOpenAIError(r, 408, /not received within 2 s/);
        assert.ok(r.ms > BODY_TIMEOUT_S * 1000 - 200 && r.ms < BODY_TIMEOUT_S * 1000 + 1000, `${what}: 408 after ${r.ms} ms`);
        assert.ok(r.closed, `${what}: closed`);
        console.log(`# ${what}: 408 after ${r.ms.toFixed(0)} ms (--body-timeout ${BODY_TIMEOUT_S})`);
      }
      await stillServing();
    });

    if (withKey) {
      test('7. auth: /v1, /tokenize, /detokenize need the key; /metrics is open; --metrics-api-key guards it', async () => {
        const routes = [
          ['POST', '/tokenize', { prompt: 'hi' }], ['POST', '/detokenize', { tokens: [5, 6] }],
          ['POST', '/v1/completions', { prompt: [5], max_tokens: 1 }], ['GET', '/v1/models', undefined],
          ['POST', '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }],
          ['POST', '/v1/load_lora_adapter', { lora_name: 'x', lora_path: '/nonexistent' }],
        ];
        for (const [method, p, body] of routes) {
          for (const k of [undefined, 'wrong', `${KEY}x`, KEY.slice(0, -1), '']) {
            const r = await post(url(p), body, { key: k, method });
            assertOpenAIError(r, 401, /API key/);
          }
          const raw = await post(url(p), body, { method, headers: { Authorization: KEY } });  // no "Bearer"
          assertOpenAIError(raw, 401);
        }
        assert.equal((await post(url('/tokenize'), { prompt: 'hi' }, { key })).status, 200);
        assert.equal((await post(url('/detokenize'), { tokens: [5, 6] }, { key })).status, 200);
        const m = await fetch(url('/metrics'));
        assert.equal(m.status, 200, 'without --metrics-api-key /metrics is open');
        assert.equal((await fetch(url('/health'))).status, 200);
        // A second server with --metrics-api-key.
        const s2 = await startServer(['--model', MODEL, '--max-model-len', '64', '--api-key', KEY, '--metrics-api-key', METRICS_KEY]);
        try {
          for (const k of [undefined, KEY, 'wrong']) assertOpenAIError(await post(`${s2.url}/metrics`, undefined, { method: 'GET', key: k }), 401);
          const ok = await fetch(`${s2.url}/metrics`, { headers: { Authorization: `Bearer ${METRICS_KEY}` } });
          assert.equal(ok.status, 200);
          assert.match(await ok.text(), /# TYPE/);
          // The metrics key is not an API key.
          assertOpenAIError(await post(`${s2.url}/tokenize`, { prompt: 'hi' }, { key: METRICS_KEY }), 401);
          assert.equal((await post(`${s2.url}/tokenize`, { prompt: 'hi' }, { key: KEY })).status, 200);
        } finally {
          assert.deepEqual(await s2.stop(), { code: 0, signal: null });
        }
        await stillServing();
      });
    } else {
      test('7. auth: without --api-key every route is open (/tokenize, /detokenize, /metrics)', async () => {
        assert.equal((await post(url('/tokenize'), { prompt: 'hi' })).status, 200);
        assert.equal((await post(url('/detokenize'), { tokens: [5, 6] })).status, 200);
        assert.equal((await fetch(url('/metrics'))).status, 200);
        assert.equal((await post(url('/tokenize'), { prompt: 'hi' }, { key: 'anything' })).status, 200);
      });
    }

    test('8. hostile adapter configs: FIFO, symlinked config, deep or catastrophic patterns, fractional r', async () => {
      const load = (name, dir) => post(url('/v1/load_lora_adapter'), { lora_name: name, lora_path: dir }, { key });
      const config = JSON.parse(readFileSync(path.join(ADAPTERS.perexp, 'adapter_config.json'), 'utf8'));
      const variant = (name, mutate) => {
        const dir = path.join(allowed, name);
        cpSync(ADAPTERS.perexp, dir, { recursive: true });
        const c = structuredClone(config);
        const text = mutate(c);
        writeFileSync(path.join(dir, 'adapter_config.json'), typeof text === 'string' ? text : JSON.stringify(c));
        return dir;
      };
      // adapter_config.json is a FIFO (opening it must not block).
      const fifoDir = path.join(allowed, 'fifo');
      cpSync(ADAPTERS.perexp, fifoDir, { recursive: true });
      execFileSync('rm', [path.join(fifoDir, 'adapter_config.json')]);
      execFileSync('mkfifo', [path.join(fifoDir, 'adapter_config.json')]);
      let r = await load('fifo', fifoDir);
      assertOpenAIError(r, 400, /regular file/);
      assert.ok(r.ms < 1000, `FIFO: ${r.ms} ms`);
      // The safetensors file is a FIFO.
      const fifoWeights = path.join(allowed, 'fifo-weights');
      cpSync(ADAPTERS.perexp, fifoWeights, { recursive: true });
      execFileSync('rm', [path.join(fifoWeights, 'adapter_model.safetensors')]);
      execFileSync('mkfifo', [path.join(fifoWeights, 'adapter_model.safetensors')]);
      r = await load('fifo-weights', fifoWeights);
      assertOpenAIError(r, 400, /regular file/);
      assert.ok(r.ms < 1000, `FIFO weights: ${r.ms} ms`);
      // adapter_config.json is a symlink (to an outside config).
      const linkDir = path.join(allowed, 'link-config');
      cpSync(ADAPTERS.perexp, linkDir, { recursive: true });
      execFileSync('rm', [path.join(linkDir, 'adapter_config.json')]);
      symlinkSync(path.join(outside, 'adapter', 'adapter_config.json'), path.join(linkDir, 'adapter_config.json'));
      assertOpenAIError(await load('link-config', linkDir), 400, /symbolic link/);
      // The adapter directory itself is a symlink to an outside adapter.
      symlinkSync(path.join(outside, 'adapter'), path.join(allowed, 'link-dir'));
      assertOpenAIError(await load('link-dir', path.join(allowed, 'link-dir')), 400, /symbolic link/);
      // A path outside the allowed directories, and one climbing out with '..'.
      assertOpenAIError(await load('out', path.join(outside, 'adapter')), [400, 403]);
      assertOpenAIError(await load('dotdot', `${allowed}/../outside/adapter`), [400, 403]);
      // rank_pattern with 50,000 nested parentheses.
      const deep = variant('deep-pattern', (c) => { c.rank_pattern = { [`${'('.repeat(50_000)}q_proj${')'.repeat(50_000)}`]: 4 }; });
      r = await load('deep-pattern', deep);
      assertOpenAIError(r, 400, /rank_pattern/);
      assert.ok(r.ms < 2000, `deep pattern: ${r.ms} ms`);
      const unbalanced = variant('unbalanced-pattern', (c) => { c.rank_pattern = { [`${'('.repeat(50_000)}q_proj`]: 4 }; });
      r = await load('unbalanced-pattern', unbalanced);
      assertOpenAIError(r, 400, /rank_pattern/);
      // A catastrophic-backtracking pattern: refused or loaded, but quickly.
      const cat = variant('catastrophic', (c) => { c.rank_pattern = { '(.*)*(.*)*(.*)*(.*)*(.*)*X': 4 }; c.alpha_pattern = { '(a+)+$': 8 }; });
      r = await load('catastrophic', cat);
      assert.ok(r.status === 200 || r.status === 400, r.text);
      if (r.status === 400) assertOpenAIError(r, 400, /pattern/);
      assert.ok(r.ms < 2000, `catastrophic pattern: ${r.ms} ms`);
      console.log(`# catastrophic pattern: ${r.status} in ${r.ms.toFixed(0)} ms`);
      if (r.status === 200) {
        const c = await post(url('/v1/completions'), { model: 'catastrophic', prompt: [5, 6], max_tokens: 2 }, { key });
        assert.equal(c.status, 200, c.text);
        assert.equal((await post(url('/v1/unload_lora_adapter'), { lora_name: 'catastrophic' }, { key })).status, 200);
      }
      // r is not an integer.
      for (const [name, mutate] of [['r-fraction', (c) => { c.r = 16.5; }], ['r-string', (c) => { c.r = '8'; }],
        ['r-huge', (c) => { c.r = 1e300; }], ['r-negative', (c) => { c.r = -8; }], ['r-zero', (c) => { c.r = 0; }]]) {
        const res = await load(name, variant(name, mutate));
        assertOpenAIError(res, 400, /'r'|\br\b/);
      }
      // Config not JSON, deep JSON, invalid UTF-8.
      assertOpenAIError(await load('not-json', variant('not-json', () => '{"r": 8,')), 400);
      assertOpenAIError(await load('deep-json', variant('deep-json', () => `{"r": 8, "x": ${'['.repeat(100_000)}${']'.repeat(100_000)}}`)), 400, /deep|depth|nest/);
      const badUtf8 = variant('bad-utf8', (c) => JSON.stringify(c));
      const cfgPath = path.join(badUtf8, 'adapter_config.json');
      const cfg = readFileSync(cfgPath);
      writeFileSync(cfgPath, Buffer.concat([cfg.subarray(0, cfg.length - 1), Buffer.from(', "x": "\xc0\xaf"}', 'latin1')]));
      r = await load('bad-utf8', badUtf8);
      assertOpenAIError(r, 400, /UTF-8|ill-formed/);
      assert.ok(isValidUtf8(r.body));
      // Nothing of these was loaded.
      const models = await post(url('/v1/models'), undefined, { method: 'GET', key });
      assert.equal(models.status, 200);
      assert.deepEqual(models.json.data.map((m) => m.id), [MODEL]);
      await stillServing();
    });

    test('8. symlink-swap race: 200 loads while a directory flips between a real adapter and a link outside', async () => {
      // Inside: per-expert-r8. Outside (reachable only through the symlink): attn-only-r16, whose
      // completions differ, so every loaded adapter can be told apart by what it generates.
      const outsideAdapter = path.join(outside, 'attn');
      cpSync(ADAPTERS.attn, outsideAdapter, { recursive: true });
      const real = path.join(allowed, 'race-real');
      const link = path.join(allowed, 'race-link');
      const slot = path.join(allowed, 'race-slot');
      cpSync(ADAPTERS.perexp, real, { recursive: true });
      symlinkSync(outsideAdapter, link);
      cpSync(ADAPTERS.perexp, path.join(allowed, 'ref-inside'), { recursive: true });
      const gen = async (model) => {
        const r = await post(url('/v1/completions'), { model, prompt: REFERENCE_PROMPTS[1], max_tokens: 6, temperature: 0, ignore_eos: true }, { key });
        assert.equal(r.status, 200, r.text);
        return r.json.choices[0].text;
      };
      assert.equal((await post(url('/v1/load_lora_adapter'), { lora_name: 'ref-inside', lora_path: path.join(allowed, 'ref-inside') }, { key })).status, 200);
      const insideText = await gen('ref-inside');
      const baseText = await gen(MODEL);
      assert.notEqual(insideText, baseText, 'the inside adapter changes the output');
      // The swapper: a separate process renaming in a tight loop (slot <- real dir, slot <- symlink).
      const swapper = spawn(process.execPath, ['-e', `
        const fs = require('fs');
        const [real, link, slot] = process.argv.slice(1);
        let n = 0;
        fs.renameSync(real, slot);
        let slotIsReal = true;
        const tick = () => {
          for (let i = 0; i < 200; ++i) {
            if (slotIsReal) { fs.renameSync(slot, real); fs.renameSync(link, slot); }
            else { fs.renameSync(slot, link); fs.renameSync(real, slot); }
            slotIsReal = !slotIsReal; ++n;
          }
          setImmediate(tick);
        };
        process.on('SIGTERM', () => {
          if (!slotIsReal) { fs.renameSync(slot, link); fs.renameSync(real, slot); }
          console.log(n); process.exit(0);
        });
        tick();`, real, link, slot], { stdio: ['ignore', 'pipe', 'inherit'] });
      let swaps = '';
      swapper.stdout.on('data', (d) => { swaps += d; });
      const swapperDone = new Promise((r) => swapper.on('exit', r));
      await sleep(100);
      const N = 200;
      const statuses = {};
      const loaded = [];
      const names = Array.from({ length: N }, (_, i) => `race-${i}`);
      for (let i = 0; i < N; i += 20) {
        const batch = await Promise.all(names.slice(i, i + 20).map((name) =>
          post(url('/v1/load_lora_adapter'), { lora_name: name, lora_path: slot }, { key }).then((r) => [name, r])));
        for (const [name, r] of batch) {
          statuses[r.status] = (statuses[r.status] ?? 0) + 1;
          if (r.status === 200) loaded.push(name);
          else assertOpenAIError(r, [400, 404]);
        }
      }
      swapper.kill('SIGTERM');
      await swapperDone;
      console.log(`# race: ${swaps.trim()} swaps; load statuses ${JSON.stringify(statuses)}`);
      assert.ok(loaded.length > 0, 'some loads succeeded (the slot was a real adapter part of the time)');
      // Every adapter that was loaded generates what the inside adapter does, never the outside one.
      const models = await post(url('/v1/models'), undefined, { method: 'GET', key });
      const listed = models.json.data.map((m) => m.id).filter((id) => id.startsWith('race-')).sort();
      assert.deepEqual(listed, [...loaded].sort());
      for (let i = 0; i < loaded.length; i += 16) {
        const texts = await Promise.all(loaded.slice(i, i + 16).map((name) => gen(name)));
        for (const [j, t] of texts.entries()) assert.equal(t, insideText, `${loaded[i + j]} generates like the inside adapter`);
      }
      for (const name of [...loaded, 'ref-inside']) {
        const r = await post(url('/v1/unload_lora_adapter'), { lora_name: name }, { key });
        assert.equal(r.status, 200, r.text);
      }
      const after = await post(url('/v1/models'), undefined, { method: 'GET', key });
      assert.deepEqual(after.json.data.map((m) => m.id), [MODEL]);
      await stillServing();
    });
  });
}

describe('pipelined requests', () => {
  test('requests sent back to back on one connection are all answered, in order; no connection slot leaks', async () => {
    // Before the fix a session whose next request was already buffered had no pending operation while its
    // handler ran and was destroyed: no response, and its --max-connections slot was never given back.
    const server = await startServer(['--model', MODEL, '--max-model-len', '64', '--max-connections', '8']);
    try {
      const port = Number(new URL(server.url).port);
      const three = Buffer.concat([
        httpBytes('GET', '/health'),
        httpBytes('POST', '/tokenize', { headers: { 'Content-Type': 'application/json' }, body: '{"prompt": ' }),
        httpBytes('POST', '/tokenize', { headers: { 'Content-Type': 'application/json', Connection: 'close' }, body: '{"prompt": "hi"}' }),
      ]);
      // 6 at a time (under the limit of 8, so that none is shed as idle), 7 rounds: 42 connections.
      for (let round = 0; round < 7; ++round) {
        const all = await Promise.all(Array.from({ length: 6 }, () => new Promise((resolve) => {
          const sock = net.connect(port, '127.0.0.1');
          let buf = Buffer.alloc(0);
          sock.on('data', (d) => { buf = Buffer.concat([buf, d]); });
          sock.on('error', () => {});
          const timer = setTimeout(() => sock.destroy(), 5000);
          sock.on('close', () => {
            clearTimeout(timer);
            const statuses = [];
            for (let r; (r = parseResponse(buf)); buf = buf.subarray(r.length)) statuses.push(r.status);
            resolve(statuses);
          });
          sock.on('connect', () => sock.write(three));
        })));
        for (const statuses of all) assert.deepEqual(statuses, [200, 400, 200]);
      }
      // 42 pipelining connections came and went through 8 slots: new connections are still served.
      for (let i = 0; i < 10; ++i) {
        const r = await fetch(`${server.url}/health`, { headers: { Connection: 'close' } });
        assert.equal(r.status, 200);
      }
    } finally {
      assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
    }
  });
});

hostileSuite({ withKey: false });
hostileSuite({ withKey: true });

describe('9. requests still running at SIGTERM (--shutdown-timeout 1)', () => {
  for (const withKey of [false, true]) {
    test(`a non-streaming request gets 503 JSON, a stream an error event then [DONE]; exit within 2 s (${withKey ? 'with' : 'without'} key)`, async () => {
      const key = withKey ? KEY : undefined;
      const server = await startServer(['--model', MODEL, '--max-model-len', '4096', '--shutdown-timeout', '1',
        ...(withKey ? ['--api-key', KEY] : [])]);
      let exited = false;
      try {
        const headers = { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) };
        const body = (stream) => JSON.stringify({ prompt: [5, 6, 7, 8], max_tokens: 4000, ignore_eos: true, stream });
        const plain = fetch(`${server.url}/v1/completions`, { method: 'POST', headers, body: body(false) });
        const streamRes = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers, body: body(true) });
        assert.equal(streamRes.status, 200);
        let seen = 0;
        const events = [];
        let done = false;
        const reading = readSse(streamRes, (ev) => { events.push(ev); seen += 1; return false; })
          .then((r) => { done = r.done; });
        while (seen < 3) await sleep(10);
        const t0 = performance.now();
        server.child.kill('SIGTERM');
        const r = await plain;
        const text = await r.text();
        assert.equal(r.status, 503, text);
        assertOpenAIError({ status: r.status, headers: r.headers, text, json: JSON.parse(text) }, 503, /shut/);
        await reading;
        assert.ok(done, 'the stream ended with [DONE]');
        const last = events.at(-1);
        assert.ok(last.error, `the last event is an error: ${JSON.stringify(last)}`);
        assert.match(last.error.message, /shut/);
        const { code, signal } = await server.exited;
        exited = true;
        const ms = performance.now() - t0;
        console.log(`# SIGTERM with two running requests: exited after ${ms.toFixed(0)} ms`);
        assert.ok(ms < 2000, `exited ${ms} ms after SIGTERM`);
        assert.deepEqual({ code, signal }, { code: 0, signal: null }, server.log());
      } finally {
        if (!exited) await server.stop();
      }
    });
  }
});
