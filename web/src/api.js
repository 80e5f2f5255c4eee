// api.js: the server calls of the playground: /v1/models, streaming /v1/chat/completions (SSE) and
// /metrics (Prometheus text). Errors from the server become ApiError with the server's own message.

export class ApiError extends Error {
  constructor(message, status = 0) {
    super(message);
    this.status = status;
  }
}

function headers(key, json = false) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// The message of an error answer: OpenAI's {"error": {"message"}} when present, else the body or status.
async function errorOf(res) {
  const text = await res.text().catch(() => '');
  let message = '';
  try {
    const j = JSON.parse(text);
    message = j?.error?.message ?? j?.message ?? '';
  } catch {
    message = text.trim();
  }
  return new ApiError(`${res.status} ${res.statusText || ''}: ${message || 'no details'}`.replace(' :', ':'), res.status);
}

async function send(url, init) {
  try {
    return await fetch(url, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${e.message})`);
  }
}

// GET /v1/models: [{id, parent, root, max_model_len}]; the base model has parent null.
export async function listModels(key) {
  const res = await send('/v1/models', { headers: headers(key) });
  if (!res.ok) throw await errorOf(res);
  const body = await res.json();
  return body.data ?? [];
}

// Streams one chat completion. `onDelta(text)` gets each piece of content as it arrives. Resolves to
// { text, finishReason, usage, ttftMs, totalMs, tokens, tokensPerSecond }.
export async function streamChat({ key, model, messages, sampling, signal, onDelta }) {
  const body = { model, messages, stream: true, stream_options: { include_usage: true }, ...sampling };
  const t0 = performance.now();
  const res = await send('/v1/chat/completions', {
    method: 'POST',
    headers: headers(key, true),
    body: JSON.stringify(body),
    signal,
  });
  if (!res.ok) throw await errorOf(res);
  let text = '';
  let finishReason = null;
  let usage = null;
  let tFirst = null;
  let pieces = 0;
  for await (const data of sseData(res.body)) {
    if (data === '[DONE]') break;
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      throw new ApiError(`the server sent an unreadable event: ${data.slice(0, 200)}`);
    }
    if (ev.error) throw new ApiError(ev.error.message ?? JSON.stringify(ev.error), ev.error.code ?? 0);
    if (ev.usage) usage = ev.usage;
    for (const choice of ev.choices ?? []) {
      const piece = choice.delta?.content ?? '';
      if (piece) {
        if (tFirst === null) tFirst = performance.now();
        pieces += 1;
        text += piece;
        onDelta?.(piece, text);
      }
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  }
  const tEnd = performance.now();
  const tokens = usage?.completion_tokens ?? pieces;
  // Decode speed: tokens after the first one over the time after the first one. When every token came in
  // one read (a fast server coalesces its chunks; the browser's clock is coarse) that time is 0: then the
  // rate over the whole request, the one figure left.
  const decodeMs = tFirst === null ? 0 : tEnd - tFirst;
  const totalMs = tEnd - t0;
  let tokensPerSecond = null;
  if (tokens > 1 && decodeMs > 0) tokensPerSecond = ((tokens - 1) * 1000) / decodeMs;
  else if (tokens > 0 && totalMs > 0) tokensPerSecond = (tokens * 1000) / totalMs;
  return {
    text,
    finishReason,
    usage,
    tokens,
    ttftMs: tFirst === null ? null : tFirst - t0,
    totalMs,
    tokensPerSecond,
  };
}

// The data fields of a server-sent event stream, one string per event.
async function* sseData(stream) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block
          .split('\n')
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, ''))
          .join('\n');
        if (data) yield data;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

// Prometheus text format → [{name, labels, value}] (comments and blank lines skipped).
export function parsePrometheus(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
      labels[k] = v.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

// GET /metrics: the playground's figures (sums over label sets where a metric has several).
export async function fetchFigures() {
  const res = await send('/metrics', {});
  if (!res.ok) throw await errorOf(res);
  const samples = parsePrometheus(await res.text());
  const sum = (name) => {
    const s = samples.filter((x) => x.name === name);
    return s.length ? s.reduce((a, x) => a + x.value, 0) : null;
  };
  const perAdapter = samples
    .filter((x) => x.name === 'polylora:adapter_requests_total')
    .map((x) => ({ adapter: x.labels.adapter ?? '?', requests: x.value }));
  return {
    running: sum('vllm:num_requests_running'),
    waiting: sum('vllm:num_requests_waiting'),
    kvUsage: sum('vllm:kv_cache_usage_perc'),
    perAdapter,
  };
}
