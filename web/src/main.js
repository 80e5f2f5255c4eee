// main.js: the playground page. Chat with one model (an adapter or the base model), or send one prompt to
// two to four models at once and watch the answers stream side by side; live figures from /metrics.
import './style.css';
import { ApiError, fetchFigures, listModels, streamChat } from './api.js';

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = 'polylora.apiKey';
const MAX_COLUMNS = 4;
const METRICS_INTERVAL_MS = 1000;

const state = {
  key: sessionStorage.getItem(KEY_STORAGE) ?? '',
  models: [], // from /v1/models: the base model(s) first, then the adapters
  chat: { history: [], abort: null },
  compare: { abort: null },
};

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// ---- errors ---------------------------------------------------------------------------------------

function showBanner(message) {
  const b = $('banner');
  b.textContent = message;
  b.hidden = false;
}
function hideBanner() {
  $('banner').hidden = true;
}
const messageOf = (e) => (e instanceof ApiError ? e.message : `unexpected error: ${e?.message ?? e}`);

function handleAuth(e) {
  if (e instanceof ApiError && e.status === 401) {
    $('key-form').hidden = false;
    $('api-key').focus();
  }
}

// ---- models ---------------------------------------------------------------------------------------

const isBase = (m) => m.parent === null || m.parent === undefined;
const labelOf = (m) => (isBase(m) ? `${m.id} (base model)` : m.id);
const adapters = () => state.models.filter((m) => !isBase(m));

function fillSelect(select, preferred) {
  const current = preferred ?? select.value;
  select.replaceChildren(
    ...state.models.map((m) => el('option', { value: m.id, text: labelOf(m) })),
  );
  if (state.models.some((m) => m.id === current)) select.value = current;
}

async function loadModels() {
  try {
    state.models = await listModels(state.key);
  } catch (e) {
    $('server-info').textContent = 'no models';
    showBanner(messageOf(e));
    handleAuth(e);
    return false;
  }
  hideBanner();
  const base = state.models.find(isBase);
  const n = adapters().length;
  $('server-info').textContent = `${base ? base.id : '?'} · ${n} adapter${n === 1 ? '' : 's'}` +
    (base?.max_model_len ? ` · context ${base.max_model_len}` : '');
  const context = base?.max_model_len;
  if (context > 1) {
    // A short context leaves little room for the answer: keep the default max tokens well inside it.
    const max = $('max-tokens');
    max.max = String(context - 1);
    if (Number(max.value) >= context / 2) max.value = String(Math.max(1, Math.floor(context / 4)));
  }
  fillSelect($('chat-model'), $('chat-model').value || adapters()[0]?.id);
  const pickers = [...$('compare-pickers').querySelectorAll('select')];
  if (pickers.length === 0) {
    const defaults = adapters().map((m) => m.id);
    if (defaults.length < 2) defaults.push(...state.models.filter(isBase).map((m) => m.id));
    addPicker(defaults[0]);
    addPicker(defaults[1] ?? defaults[0]);
  } else {
    pickers.forEach((s) => fillSelect(s));
  }
  return true;
}

$('key-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  state.key = $('api-key').value.trim();
  sessionStorage.setItem(KEY_STORAGE, state.key);
  if (await loadModels()) $('key-form').hidden = true;
});

// ---- sampling settings ----------------------------------------------------------------------------

for (const [input, output] of [['temperature', 'temperature-value'], ['top-p', 'top-p-value']]) {
  const sync = () => ($(output).textContent = $(input).value);
  $(input).addEventListener('input', sync);
  sync();
}

function sampling() {
  const s = { temperature: Number($('temperature').value), top_p: Number($('top-p').value) };
  const max = $('max-tokens').value.trim();
  if (max) s.max_tokens = Math.max(1, Math.floor(Number(max)));
  return s;
}

function formatStats(r) {
  const parts = [];
  parts.push(`TTFT ${r.ttftMs === null ? '–' : `${Math.round(r.ttftMs)} ms`}`);
  const tps = r.tokensPerSecond;
  parts.push(`${tps === null ? '–' : tps.toFixed(tps >= 100 ? 0 : 1)} tok/s`);
  parts.push(`${r.tokens} token${r.tokens === 1 ? '' : 's'}`);
  if (r.finishReason) parts.push(r.finishReason);
  return parts.join(' · ');
}

// ---- tabs -----------------------------------------------------------------------------------------

function selectTab(name) {
  for (const t of ['chat', 'compare']) {
    $(`tab-${t}`).setAttribute('aria-selected', String(t === name));
    $(`${t}-view`).hidden = t !== name;
  }
}
$('tab-chat').addEventListener('click', () => selectTab('chat'));
$('tab-compare').addEventListener('click', () => selectTab('compare'));

// ---- chat -----------------------------------------------------------------------------------------

function submitOnEnter(textarea) {
  textarea.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      textarea.form.requestSubmit();
    }
  });
}
submitOnEnter($('chat-input'));
submitOnEnter($('compare-input'));

function setBusy(prefix, busy) {
  $(`${prefix}-send`).disabled = busy;
  $(`${prefix}-stop`).disabled = !busy;
}

$('chat-clear').addEventListener('click', () => {
  state.chat.abort?.abort();
  state.chat.history = [];
  $('chat-log').replaceChildren();
});
$('chat-stop').addEventListener('click', () => state.chat.abort?.abort());

$('chat-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const content = $('chat-input').value.trim();
  const model = $('chat-model').value;
  if (!content || state.chat.abort) return;
  if (!model) {
    showBanner('No model to chat with: the model list has not loaded.');
    return;
  }
  const log = $('chat-log');
  log.querySelector('.hint')?.remove();
  $('chat-input').value = '';
  state.chat.history.push({ role: 'user', content });
  log.append(el('div', { class: 'message user' }, el('div', { class: 'body', text: content })));
  const body = el('div', { class: 'body streaming' });
  const stats = el('div', { class: 'stats' });
  const bubble = el('div', { class: 'message assistant', 'data-model': model },
    el('div', { class: 'who', text: model }), body, stats);
  log.append(bubble);
  log.scrollTop = log.scrollHeight;

  const abort = new AbortController();
  state.chat.abort = abort;
  setBusy('chat', true);
  try {
    const r = await streamChat({
      key: state.key,
      model,
      messages: state.chat.history,
      sampling: sampling(),
      signal: abort.signal,
      onDelta: (_, text) => {
        body.textContent = text;
        log.scrollTop = log.scrollHeight;
      },
    });
    state.chat.history.push({ role: 'assistant', content: r.text });
    if (!r.text) body.append(el('span', { class: 'muted', text: '(empty answer)' }));
    stats.textContent = formatStats(r);
  } catch (e) {
    state.chat.history.pop(); // the failed turn is not part of the conversation
    if (e.name === 'AbortError') {
      stats.textContent = 'stopped';
    } else {
      bubble.classList.add('failed');
      bubble.append(el('div', { class: 'error-text', role: 'alert', text: messageOf(e) }));
      handleAuth(e);
    }
  } finally {
    body.classList.remove('streaming');
    state.chat.abort = null;
    setBusy('chat', false);
  }
});

// ---- side by side ---------------------------------------------------------------------------------

function updatePickerButtons() {
  const wraps = [...$('compare-pickers').children];
  $('compare-add').disabled = wraps.length >= MAX_COLUMNS;
  for (const w of wraps) w.querySelector('button').disabled = wraps.length <= 2;
}

function addPicker(preferred) {
  const wraps = $('compare-pickers');
  if (wraps.children.length >= MAX_COLUMNS) return;
  const select = el('select', { class: 'model-select', 'aria-label': `model ${wraps.children.length + 1}` });
  fillSelect(select, preferred);
  const remove = el('button', { type: 'button', class: 'icon', title: 'remove this column', text: '×' });
  const wrap = el('div', { class: 'picker' }, select, remove);
  remove.addEventListener('click', () => {
    wrap.remove();
    updatePickerButtons();
  });
  wraps.append(wrap);
  updatePickerButtons();
}

$('compare-add').addEventListener('click', () => {
  const used = new Set([...$('compare-pickers').querySelectorAll('select')].map((s) => s.value));
  const next = state.models.find((m) => !used.has(m.id)) ?? state.models[0];
  addPicker(next?.id);
});
$('compare-stop').addEventListener('click', () => state.compare.abort?.abort());

$('compare-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const prompt = $('compare-input').value.trim();
  const models = [...$('compare-pickers').querySelectorAll('select')].map((s) => s.value).filter(Boolean);
  if (!prompt || state.compare.abort) return;
  if (models.length === 0) {
    showBanner('No models to compare: the model list has not loaded.');
    return;
  }
  const columns = $('compare-columns');
  columns.style.setProperty('--columns', String(models.length));
  const abort = new AbortController();
  state.compare.abort = abort;
  setBusy('compare', true);
  const settings = sampling();
  const runs = models.map((model) => {
    const output = el('div', { class: 'output streaming' });
    const stats = el('div', { class: 'stats', text: 'waiting for the first token…' });
    const column = el('div', { class: 'column', 'data-model': model },
      el('div', { class: 'who', text: model }), output, stats);
    return { model, column, output, stats };
  });
  columns.replaceChildren(...runs.map((r) => r.column));
  await Promise.all(runs.map(async ({ model, column, output, stats }) => {
    try {
      const r = await streamChat({
        key: state.key,
        model,
        messages: [{ role: 'user', content: prompt }],
        sampling: settings,
        signal: abort.signal,
        onDelta: (_, text) => {
          output.textContent = text;
          stats.textContent = 'streaming…';
        },
      });
      if (!r.text) output.append(el('span', { class: 'muted', text: '(empty answer)' }));
      stats.textContent = formatStats(r);
    } catch (e) {
      if (e.name === 'AbortError') {
        stats.textContent = 'stopped';
      } else {
        column.classList.add('failed');
        stats.textContent = '';
        column.append(el('div', { class: 'error-text', role: 'alert', text: messageOf(e) }));
        handleAuth(e);
      }
    } finally {
      output.classList.remove('streaming');
    }
  }));
  state.compare.abort = null;
  setBusy('compare', false);
});

// ---- metrics --------------------------------------------------------------------------------------

const fmt = (v) => (v === null || Number.isNaN(v) ? '–' : String(Math.round(v * 100) / 100));

async function refreshMetrics() {
  try {
    const f = await fetchFigures();
    $('m-running').textContent = fmt(f.running);
    $('m-waiting').textContent = fmt(f.waiting);
    const kv = f.kvUsage === null ? null : f.kvUsage * 100;
    $('m-kv').textContent = kv === null ? '–' : `${kv.toFixed(1)} %`;
    $('m-kv-bar').style.width = `${Math.min(100, kv ?? 0)}%`;
    const rows = f.perAdapter
      .sort((a, b) => b.requests - a.requests || a.adapter.localeCompare(b.adapter))
      .map((a) => el('tr', {}, el('td', { text: a.adapter }), el('td', { class: 'num', text: fmt(a.requests) })));
    $('m-adapters').replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { class: 'muted', text: 'none yet' }))]));
    $('metrics-updated').textContent = new Date().toLocaleTimeString();
    $('metrics-error').hidden = true;
  } catch (e) {
    $('metrics-error').textContent = `metrics: ${messageOf(e)}`;
    $('metrics-error').hidden = false;
  }
}

async function pollMetrics() {
  if (!document.hidden) await refreshMetrics();
  setTimeout(pollMetrics, METRICS_INTERVAL_MS);
}

// ---- start ----------------------------------------------------------------------------------------

if (state.key) $('api-key').value = state.key;
loadModels();
pollMetrics();
