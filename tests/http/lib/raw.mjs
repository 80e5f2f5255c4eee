// tests/http/lib/raw.mjs: raw-socket HTTP/1.1 for black-box tests that send what fetch() will not (bad
// framing, invalid bytes, slow or silent clients), a minimal response parser, the OpenAI error-body check,
// and /proc readers (RSS, CPU time) for the server process.
import net from 'node:net';
import { readFileSync } from 'node:fs';
import assert from 'node:assert/strict';

// Parses one HTTP/1.1 response at the start of `buf` (Content-Length or chunked body). Returns undefined
// while incomplete, else { status, headers, body, length } (length: bytes of `buf` used).
export function parseResponse(buf) {
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) return undefined;
  const head = buf.subarray(0, end).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(head[0]);
  if (!m) throw new Error(`not an HTTP response: ${JSON.stringify(head[0])}`);
  const headers = {};
  for (const line of head.slice(1)) {
    const i = line.indexOf(':');
    headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  const status = Number(m[1]);
  let pos = end + 4;
  if (status === 100) {
    const rest = parseResponse(buf.subarray(pos));
    return rest && { ...rest, length: rest.length + pos };
  }
  if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
    const parts = [];
    for (;;) {
      const le = buf.indexOf('\r\n', pos);
      if (le < 0) return undefined;
      const size = parseInt(buf.subarray(pos, le).toString('latin1'), 16);
      if (buf.length < le + 2 + size + 2) return undefined;
      parts.push(buf.subarray(le + 2, le + 2 + size));
      pos = le + 2 + size + 2;
      if (size === 0) return { status, headers, body: Buffer.concat(parts), length: pos };
    }
  }
  const len = Number(headers['content-length'] ?? 0);
  if (buf.length < pos + len) return undefined;
  return { status, headers, body: buf.subarray(pos, pos + len), length: pos + len };
}

// Sends `data` (string: latin1 bytes, Buffer, or an array of them written one after another) on a new
// connection and reads one response. Resolves to { status, headers, body, text, json, ms (until the
// response was complete), closed (the server closed the connection within closeWaitMs after it; with
// closeWaitMs 0 it resolves as soon as the response is complete),
// closedMs, error, timedOut }. Never rejects.
export function rawRequest(port, data, { timeoutMs = 10_000, closeWaitMs = 0, host = '127.0.0.1' } = {}) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const sock = net.connect(port, host);
    let buf = Buffer.alloc(0);
    let res;
    let finished = false;
    let closeTimer;
    const finish = (extra = {}) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      clearTimeout(closeTimer);
      sock.destroy();
      const out = { ...(res ?? {}), ...extra };
      if (res) {
        out.text = res.body.toString('utf8');
        try {
          out.json = JSON.parse(out.text);
        } catch {
          out.json = undefined;
        }
      }
      resolve(out);
    };
    const timer = setTimeout(() => finish({ timedOut: true, closed: false, partial: buf.toString('latin1') }),
      timeoutMs);
    sock.on('connect', () => {
      for (const d of Array.isArray(data) ? data : [data]) sock.write(typeof d === 'string' ? Buffer.from(d, 'latin1') : d);
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (res) return;
      try {
        const r = parseResponse(buf);
        if (!r) return;
        res = { ...r, ms: performance.now() - t0 };
        if (closeWaitMs <= 0) finish({ closed: false });
        else closeTimer = setTimeout(() => finish({ closed: false }), closeWaitMs);
      } catch (e) {
        finish({ error: e.message });
      }
    });
    const onGone = (err) => {
      if (!res) {
        try {
          const r = parseResponse(buf);
          if (r) res = { ...r, ms: performance.now() - t0 };
        } catch {
          // not a response
        }
      }
      finish({ closed: true, closedMs: performance.now() - t0, error: res ? undefined : (err?.message ?? 'closed without a response') });
    };
    sock.on('end', () => onGone());
    sock.on('error', (e) => onGone(e));
    sock.on('close', () => onGone());
  });
}

// A request as latin1 bytes: method, target, headers (object or [name, value] list) and body.
export function httpBytes(method, target, { headers = {}, body, host = 'x' } = {}) {
  const list = Array.isArray(headers) ? headers : Object.entries(headers);
  let s = `${method} ${target} HTTP/1.1\r\nHost: ${host}\r\n`;
  for (const [k, v] of list) s += `${k}: ${v}\r\n`;
  const b = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  if (b && !list.some(([k]) => /^(content-length|transfer-encoding)$/i.test(k))) s += `Content-Length: ${b.length}\r\n`;
  s += '\r\n';
  return b ? Buffer.concat([Buffer.from(s, 'latin1'), b]) : Buffer.from(s, 'latin1');
}

// The OpenAI error shape: {error: {message, type, param, code}}, code = status, message a non-empty string.
// `r` has status and either json or text (raw responses) or a fetch-like { status, json, text }.
export function assertOpenAIError(r, status, messagePattern) {
  const where = `status ${r.status}, body ${r.text?.slice(0, 400)}${r.error ? `, error ${r.error}` : ''}`;
  if (Array.isArray(status)) assert.ok(status.includes(r.status), `expected one of ${status}: ${where}`);
  else assert.equal(r.status, status, `expected ${status}: ${where}`);
  const ct = typeof r.headers?.get === 'function' ? r.headers.get('content-type') : r.headers?.['content-type'];
  assert.match(ct ?? '', /application\/json/, where);
  assert.ok(r.json && typeof r.json.error === 'object' && r.json.error !== null, `not a JSON error body: ${where}`);
  const e = r.json.error;
  assert.deepEqual(Object.keys(e).sort(), ['code', 'message', 'param', 'type'], where);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  assert.equal(e.code, r.status);
  if (messagePattern) assert.match(e.message, messagePattern, where);
  // Raw responses: the body bytes themselves are valid UTF-8 (a lossy decode would hide bad bytes).
  if (Buffer.isBuffer(r.body)) assert.ok(isValidUtf8(r.body), `body is not valid UTF-8: ${where}`);
}

// Strict UTF-8 check of a Buffer (TextDecoder fatal mode).
export function isValidUtf8(b) {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(b);
    return true;
  } catch {
    return false;
  }
}

// Resident set size of a process in bytes (VmRSS of /proc/<pid>/status).
export function rssBytes(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m[1]) * 1024;
}

// CPU time (user + system) of a process in seconds, from /proc/<pid>/stat (clock ticks of 1/100 s).
export function cpuSeconds(pid) {
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');  // fields from 3 on
  return (Number(f[11]) + Number(f[12])) / 100;  // utime (14), stime (15)
}

// The soft limit on open files of this (test) process, from /proc/self/limits.
export function openFileLimit() {
  const m = /Max open files\s+(\d+|unlimited)/.exec(readFileSync('/proc/self/limits', 'utf8'));
  return !m || m[1] === 'unlimited' ? Infinity : Number(m[1]);
}
