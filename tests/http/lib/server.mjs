// tests/http/lib/server.mjs: starts the real `polylora serve` binary for black-box HTTP tests, and small
// raw-HTTP helpers (JSON requests, SSE streams, Prometheus text). The binary is $POLYLORA_BIN, else
// build/src/apps/polylora (then build-cpu/...) under the repository root.
import { spawn, execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const MODEL = path.join(REPO, 'tests/data/models/qwen3-moe-tiny');
export const ADAPTERS = {
  attn: path.join(MODEL, 'adapters/attn-only-r16'),
  experts: path.join(MODEL, 'adapters/experts-attn-r8'),
  perexp: path.join(MODEL, 'adapters/per-expert-r8'),
};
// Token-id prompts of the fixture's reference.json (greedy references are computed for these).
export const REFERENCE_PROMPTS = [
  [77],
  [570, 220, 147, 27, 959, 354, 789, 113, 979],
  [542, 144, 686, 312, 465, 40, 426, 283, 678, 825, 41, 181, 278, 158, 307, 977, 867, 158, 797, 853, 475, 42, 576,
    395, 782, 357, 507, 349, 596, 836, 479, 487, 46, 801, 955, 482, 891, 836, 609, 902],
];

function findBinary() {
  if (process.env.POLYLORA_BIN) return path.resolve(process.env.POLYLORA_BIN);
  for (const dir of ['build', 'build-cpu']) {
    const p = path.join(REPO, dir, 'src/apps/polylora');
    if (existsSync(p)) return p;
  }
  throw new Error('polylora binary not found: set POLYLORA_BIN or build into build/');
}
export const BIN = findBinary();

const childEnv = (extra = {}) => ({ ...process.env, OMP_WAIT_POLICY: 'passive', ...extra });

// Starts `polylora serve ARGS` on a free port (--port 0; the bound port is read from the log) and
// waits until GET /health answers 200. Returns { url, base, child, log(), stop() }; stop() sends
// SIGTERM and resolves to { code, signal } once the process has exited.
export async function startServer(args, { env = {}, timeoutMs = 60_000 } = {}) {
  // --num-kv-blocks 4096 unless the test sets its own.
  const kv = args.includes('--num-kv-blocks') ? [] : ['--num-kv-blocks', '4096'];
  const argv = ['serve', '--host', '127.0.0.1', '--port', '0', ...kv, ...args];
  const child = spawn(BIN, argv, { env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  let exitInfo = null;
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exitInfo = { code, signal };
      resolve(exitInfo);
    });
  });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in time:\n${log}`)), timeoutMs);
    const onData = (d) => {
      log += d.toString();
      const m = /serving the OpenAI API on http:\/\/[^\s:]+:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    exited.then((e) => {
      clearTimeout(timer);
      reject(new Error(`server exited early (${JSON.stringify(e)}):\n${log}`));
    });
  });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch {
      // not accepting yet
    }
    if (exitInfo) throw new Error(`server exited early:\n${log}`);
    if (Date.now() > deadline) throw new Error(`/health never answered 200:\n${log}`);
    await sleep(50);
  }
  return {
    url,
    base: `${url}/v1`,
    child,
    exited,
    log: () => log,
    async stop({ timeoutMs: t = 60_000 } = {}) {
      if (!exitInfo) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), t);
      const e = await exited;
      clearTimeout(timer);
      return e;
    },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Runs `polylora generate` (greedy, ignore_eos) and returns the generated ids per prompt.
export async function offlineGreedy(prompts, maxTokens, { loras = {}, adapter } = {}) {
  const args = ['generate', '--model', MODEL, '--max-tokens', String(maxTokens), '--ignore-eos', '--temperature', '0'];
  for (const [name, dir] of Object.entries(loras)) args.push('--lora', `${name}=${dir}`);
  if (adapter) args.push('--adapter', adapter);
  for (const p of prompts) args.push('--prompt-ids', p.join(','));
  const { stdout } = await promisify(execFile)(BIN, args, { env: childEnv(), maxBuffer: 1 << 24 });
  const lines = stdout.trim().split('\n');
  if (lines.length !== prompts.length) throw new Error(`unexpected generate output:\n${stdout}`);
  return lines.map((l) => l.split(',').map(Number));
}

// JSON request; `body` may be an object (serialised) or a raw string. Returns { status, headers, text, json }.
export async function request(url, { method = 'POST', body, key, headers = {} } = {}) {
  const h = { ...headers };
  if (body !== undefined) h['Content-Type'] = 'application/json';
  if (key) h.Authorization = `Bearer ${key}`;
  const r = await fetch(url, {
    method: body === undefined && method === 'POST' ? 'POST' : method,
    headers: h,
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, headers: r.headers, text, json };
}

// Reads an SSE response body: returns { events (parsed JSON of each data line), done (saw [DONE]) }.
// `onEvent(ev, i)` may return true to stop reading early (the caller then aborts the request).
export async function readSse(response, onEvent) {
  const decoder = new TextDecoder();
  let buf = '';
  const events = [];
  let done = false;
  for await (const chunk of response.body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') {
          done = true;
          continue;
        }
        const ev = JSON.parse(data);
        events.push(ev);
        if (onEvent && onEvent(ev, events.length - 1)) return { events, done, stopped: true };
      }
    }
  }
  return { events, done, stopped: false };
}

// Prometheus text: value of the first sample whose name and labels match (labels: subset match).
export function metric(text, name, labels = {}) {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = /^([^\s{]+)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const got = {};
    for (const [, k, v] of (m[3] || '').matchAll(/(\w+)="([^"]*)"/g)) got[k] = v;
    if (Object.entries(labels).every(([k, v]) => got[k] === v)) return Number(m[4]);
  }
  return undefined;
}

export async function metrics(url) {
  // After a burst of ~1,000 streams the client's pool holds many idle keep-alive sockets; one the server
  // has just closed (its keep-alive timeout) can be picked and fail with "fetch failed" before any request
  // byte is sent. Such a transport error is retried on a fresh connection; HTTP errors are not.
  for (let attempt = 0; ; ++attempt) {
    try {
      const r = await fetch(`${url}/metrics`, attempt > 0 ? { headers: { connection: 'close' } } : undefined);
      if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
      return await r.text();
    } catch (e) {
      if (attempt >= 3 || !(e instanceof TypeError)) throw e;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}

export function tempDir(prefix = 'polylora-http-') {
  const dir = mkdtempSync(path.join(os.tmpdir(), prefix));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

// Deterministic pseudo-random token-id prompts (vocabulary of the fixture: 1024; avoid ids < 4).
export function makePrompt(seed, length) {
  let x = (seed * 7919 + 12345) % 2147483647;  // MINSTD: exact in doubles
  const ids = [];
  for (let i = 0; i < length; ++i) {
    x = (x * 48271) % 2147483647;
    ids.push(4 + (x % 1000));
  }
  return ids;
}
