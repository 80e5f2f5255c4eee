// Overload (a bounded waiting queue answers 503 and the server keeps serving) and SIGTERM (requests in
// flight complete, or are finished cleanly when the grace period runs out; the process exits 0).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, makePrompt, metric, metrics, readSse, request, sleep, startServer } from './lib/server.mjs';

const completion = (url, body, signal) => fetch(`${url}/v1/completions`, {
  method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal,
});

// Reads SSE events until `count` data lines arrived, without cancelling the body; returns a reader
// that the caller keeps reading from, and the text read so far.
async function readSome(response, count) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while ((text.match(/^data: /gm) ?? []).length < count) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  return {
    text,
    async rest() {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return text;
        text += decoder.decode(value, { stream: true });
      }
    },
  };
}

function parseSse(text) {
  const events = [];
  let done = false;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    if (line === 'data: [DONE]') done = true;
    else events.push(JSON.parse(line.slice(6)));
  }
  return { events, done };
}

describe('overload', () => {
  test('a full waiting queue answers 503 with a clear message; the others succeed; serving goes on', async () => {
    const server = await startServer([
      '--model', MODEL, '--max-model-len', '512', '--max-num-seqs', '1', '--max-waiting-requests', '2',
    ]);
    try {
      const N = 16;
      const results = await Promise.all(Array.from({ length: N }, async (_, i) => {
        const body = { prompt: makePrompt(500 + i, 8), max_tokens: 128, ignore_eos: true, stream: i % 2 === 0 };
        const r = await completion(server.url, body);
        if (r.status !== 200) return { status: r.status, json: await r.json() };
        if (body.stream) {
          const { events, done } = await readSse(r);
          const tokens = events.reduce((n, e) => n + (e.choices?.[0]?.text !== undefined ? 1 : 0), 0);
          return { status: 200, done, tokens, finish: events.at(-1).choices[0].finish_reason };
        }
        const json = await r.json();
        return { status: 200, done: true, tokens: json.usage.completion_tokens, finish: json.choices[0].finish_reason };
      }));
      const ok = results.filter((r) => r.status === 200);
      const rejected = results.filter((r) => r.status !== 200);
      assert.ok(ok.length >= 1, 'some requests are served');
      assert.ok(rejected.length >= 1, `some requests are refused: ${JSON.stringify(results.map((r) => r.status))}`);
      // One running plus two waiting are admitted at any moment; a burst of 16 cannot all fit.
      for (const r of rejected) {
        assert.equal(r.status, 503);
        assert.equal(r.json.error.code, 503);
        assert.equal(r.json.error.type, 'ServiceUnavailableError');
        assert.match(r.json.error.message, /overloaded/);
        assert.match(r.json.error.message, /retry/);
      }
      for (const r of ok) {
        assert.ok(r.done);
        assert.equal(r.finish, 'length');
      }
      const m = await metrics(server.url);
      assert.equal(metric(m, 'vllm:num_requests_running'), 0);
      assert.equal(metric(m, 'vllm:num_requests_waiting'), 0);
      // Still serving.
      const after = await request(`${server.url}/v1/completions`, { body: { prompt: 'hello', max_tokens: 4, ignore_eos: true } });
      assert.equal(after.status, 200, after.text);
      assert.equal(after.json.usage.completion_tokens, 4);
    } finally {
      const { code, signal } = await server.stop();
      assert.equal(signal, null, server.log());
      assert.equal(code, 0, server.log());
    }
  });
});

describe('SIGTERM', () => {
  test('requests in flight complete, new ones are refused, and the process exits 0', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '2048']);
    let exited = false;
    try {
      const streamRes = await completion(server.url, {
        prompt: makePrompt(7, 16), max_tokens: 1500, ignore_eos: true, stream: true, stream_options: { include_usage: true },
      });
      assert.equal(streamRes.status, 200);
      const plain = completion(server.url, { prompt: makePrompt(8, 16), max_tokens: 1000, ignore_eos: true });
      const partial = await readSome(streamRes, 3);
      assert.ok(!/\[DONE\]/.test(partial.text), 'still streaming when the signal arrives');
      server.child.kill('SIGTERM');
      await sleep(300);
      // New requests are refused (503 while draining, or no connection once stopped).
      try {
        const late = await request(`${server.url}/v1/completions`, { body: { prompt: 'hi', max_tokens: 2 } });
        assert.equal(late.status, 503, late.text);
        assert.match(late.json.error.message, /shutting down/);
      } catch (e) {
        if (e instanceof assert.AssertionError) throw e;
      }
      const { events, done } = parseSse(await partial.rest());
      assert.ok(done, 'the stream ended with [DONE]');
      const finish = events.flatMap((e) => e.choices).map((c) => c.finish_reason).filter(Boolean);
      assert.deepEqual(finish, ['length']);
      assert.equal(events.at(-1).usage.completion_tokens, 1500);
      const plainRes = await plain;
      assert.equal(plainRes.status, 200);
      const body = await plainRes.json();
      assert.equal(body.usage.completion_tokens, 1000);
      assert.equal(body.choices[0].finish_reason, 'length');
      const { code, signal } = await server.exited;
      exited = true;
      assert.equal(signal, null, server.log());
      assert.equal(code, 0, server.log());
      assert.match(server.log(), /signal 15 received/);
    } finally {
      if (!exited) await server.stop();
    }
  });

  test('when the grace period runs out, requests in flight are finished cleanly and the process exits 0', async () => {
    const server = await startServer(['--model', MODEL, '--max-model-len', '4096', '--shutdown-timeout', '0']);
    let exited = false;
    try {
      const streamRes = await completion(server.url, { prompt: makePrompt(9, 16), max_tokens: 4000, ignore_eos: true, stream: true });
      assert.equal(streamRes.status, 200);
      const partial = await readSome(streamRes, 3);
      server.child.kill('SIGTERM');
      let text;
      try {
        text = await partial.rest();
      } catch (e) {
        text = null;  // the connection may be closed by the stopping server; that is a clean end too
      }
      if (text !== null) {
        // Ended cleanly: an error event saying why, then [DONE].
        const { events, done } = parseSse(text);
        assert.ok(done, 'the stream ended with [DONE]');
        const tokens = events.flatMap((e) => e.choices ?? []).filter((c) => c.text).length;
        assert.ok(tokens < 4000, 'cut short by the shutdown');
        const last = events.at(-1);
        assert.ok(last.error, `the last event explains the end: ${JSON.stringify(last)}`);
        assert.match(last.error.message, /shut down/);
      }
      const { code, signal } = await server.exited;
      exited = true;
      assert.equal(signal, null, server.log());
      assert.equal(code, 0, server.log());
    } finally {
      if (!exited) await server.stop();
    }
  });
});
