// Chat message content as the chat template gets it (vLLM's --chat-template-content-format): "string"
// joins a message's text parts with "\n"; "openai" hands the template a list of {"type": "text", "text"}
// parts; "auto" (the default) picks "openai" for templates that loop over a message's content, as vLLM's
// detection does. Checked by rendering through POST /tokenize with a request chat_template and comparing
// with the tokens of the text the template must have produced.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, request, startServer } from './lib/server.mjs';

// Loops over list content: detected as "openai".
const PARTS_TEMPLATE =
  '{% for m in messages %}<{{ m.role }}>{% if m.content is string %}S:{{ m.content }}{% else %}' +
  '{% for p in m.content %}[{{ p.type }}:{{ p.text }}]{% endfor %}{% endif %}{% endfor %}';
// Prints content as it is: "string".
const STRING_TEMPLATE = '{% for m in messages %}<{{ m.role }}>{{ m.content }}|{% endfor %}';

const MESSAGES = [
  { role: 'system', content: 'be brief' },
  { role: 'user', content: ['x', { type: 'text', text: '' }, { type: 'input_text', text: 'y' }, { type: 'text', text: null }] },
  { role: 'assistant', content: [{ type: 'output_text', text: 'a' }, { type: 'refusal', refusal: 'no' }] },
  { role: 'user', content: null },
];

async function ids(server, body) {
  const r = await request(`${server.url}/tokenize`, { body });
  assert.equal(r.status, 200, r.text);
  return r.json.tokens;
}
const rendered = (server, template) =>
  ids(server, { model: MODEL, messages: MESSAGES, chat_template: template, add_generation_prompt: false });
const text = (server, prompt) => ids(server, { model: MODEL, prompt, add_special_tokens: false });

describe('chat template content format', () => {
  let auto;
  let forced;
  before(async () => {
    auto = await startServer(['--model', MODEL, '--max-model-len', '512']);
    forced = await startServer(['--model', MODEL, '--max-model-len', '512', '--chat-template-content-format', 'string']);
  });
  after(async () => {
    for (const s of [auto, forced]) if (s) assert.deepEqual(await s.stop(), { code: 0, signal: null }, s.log());
  });

  test('auto: a template looping over content gets parts (a string is one part, null none)', async () => {
    assert.deepEqual(await rendered(auto, PARTS_TEMPLATE),
      await text(auto, '<system>[text:be brief]<user>[text:x][text:][text:y]<assistant>[text:a][text:no]<user>'));
  });

  test('auto: any other template gets the text parts joined with newlines (empty ones left out, null as "")', async () => {
    assert.deepEqual(await rendered(auto, STRING_TEMPLATE),
      await text(auto, '<system>be brief|<user>x\ny|<assistant>a\nno|<user>|'));
  });

  test('--chat-template-content-format string wins over the detection', async () => {
    assert.deepEqual(await rendered(forced, PARTS_TEMPLATE),
      await text(forced, '<system>S:be brief<user>S:x\ny<assistant>S:a\nno<user>S:'));
    assert.match(forced.log(), /chat template content format: 'string'/);
  });

  test('tool-call arguments that are empty or null reach the template as {}', async () => {
    const template = '{% for m in messages %}{% for c in (m.tool_calls or []) %}{{ c.function.name }}' +
      '{{ c.function.arguments | tojson }};{% endfor %}{% endfor %}';
    const messages = [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'a', type: 'function', function: { name: 'f', arguments: '' } },
        { id: 'b', type: 'function', function: { name: 'g', arguments: null } },
        { id: 'c', type: 'function', function: { name: 'h', arguments: '{"x": 1}' } },
      ] },
    ];
    assert.deepEqual(await ids(auto, { model: MODEL, messages, chat_template: template, add_generation_prompt: false }),
      await text(auto, 'f{};g{};h{"x": 1};'));
  });

  test("an assistant message's reasoning reaches the template as reasoning, reasoning_content and thinking", async () => {
    const template = '{% for m in messages %}{{ m.role }}:{{ m.reasoning }}|{{ m.reasoning_content }}|{{ m.thinking }};{% endfor %}';
    for (const key of ['reasoning', 'reasoning_content']) {
      const messages = [{ role: 'user', content: 'q' }, { role: 'assistant', content: 'a', [key]: 'why' }];
      assert.deepEqual(await ids(auto, { model: MODEL, messages, chat_template: template, add_generation_prompt: false }),
        await text(auto, 'user:||;assistant:why|why|why;'), key);
    }
  });

  test('parts this text model cannot take are a 400 naming their type', async () => {
    const r = await request(`${auto.url}/v1/chat/completions`, {
      body: { model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] },
    });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /content parts of type 'image_url' are not supported/);
  });

  test("OpenAI's chat fields without an effect here are accepted (their types checked); unknown ones are a 400", async () => {
    const chat = (extra) => request(`${auto.url}/v1/chat/completions`, {
      body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, ...extra },
    });
    const plain = await chat({});
    assert.equal(plain.status, 200, plain.text);
    const r = await chat({ store: false, metadata: { team: 'a' }, service_tier: 'auto', prompt_cache_key: 'k',
      safety_identifier: 'u1' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.prompt_tokens, plain.json.usage.prompt_tokens);
    for (const [extra, re] of [[{ store: 'maybe' }, /'store' must be a boolean/],
      [{ metadata: { n: 1 } }, /'metadata': the value of 'n' must be a string/],
      [{ service_tier: 3 }, /'service_tier' must be a string/],
      [{ frobnicate: true }, /'frobnicate' is not a field/]]) {
      const bad = await chat(extra);
      assert.equal(bad.status, 400, JSON.stringify(extra));
      assert.match(bad.json.error.message, re);
    }
  });

  test('an unknown --chat-template-content-format is refused at start-up', async () => {
    await assert.rejects(startServer(['--model', MODEL, '--chat-template-content-format', 'html']), /chat-template-content-format/);
  });
  test('documents reach the template as the variable documents (vLLM; retrieval-augmented templates)', async () => {
    const template = '{% if documents %}{% for d in documents %}[{{ d.title }}|{{ d.text }}]{% endfor %}' +
      '{% else %}none{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}';
    const messages = [{ role: 'user', content: 'hi' }];
    const render = (extra) => ids(auto, { model: MODEL, messages, chat_template: template, add_generation_prompt: false, ...extra });
    const docs = [{ title: 'a', text: 'b' }, { title: 'c', text: 'd' }];
    assert.deepEqual(await render({ documents: docs }), await text(auto, '[a|b][c|d]<user>hi'));
    assert.deepEqual(await render({}), await text(auto, 'none<user>hi'));
    // The field wins over chat_template_kwargs.documents.
    assert.deepEqual(await render({ documents: docs, chat_template_kwargs: { documents: [{ title: 'x', text: 'y' }] } }),
      await text(auto, '[a|b][c|d]<user>hi'));
    // A chat completion takes it too; a value that is not a string is a 400 naming it.
    let r = await request(`${auto.url}/v1/chat/completions`, { body: { model: MODEL, messages, documents: docs, max_tokens: 2 } });
    assert.equal(r.status, 200, r.text);
    r = await request(`${auto.url}/v1/chat/completions`, { body: { model: MODEL, messages, documents: [{ title: 1 }], max_tokens: 2 } });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /'documents\[0\]\.title' must be a string/);
  });
});
