// Black-box tests of issue 19 items 1 and 2 with the official `openai` client: response_format json_schema
// (the response parses and follows the schema on a random tiny model), json_object, guided_choice and
// guided_regex, structured_outputs, and 400s naming the problem for bad schemas, grammars and formats.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { MODEL, request, startServer } from './lib/server.mjs';

const SCHEMA = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 12 },
    population: { type: 'integer', minimum: 0, maximum: 999 },
    kind: { enum: ['town', 'city'] },
  },
  required: ['city', 'population', 'kind'],
  additionalProperties: false,
};

function conforms(v) {
  return v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).join(',') === 'city,population,kind' &&
    typeof v.city === 'string' && [...v.city].length <= 12 && Number.isInteger(v.population) && v.population >= 0 &&
    v.population <= 999 && ['town', 'city'].includes(v.kind);
}

describe('structured outputs', () => {
  let server;
  let client;
  const post = (path, body) => request(`${server.url}${path}`, { body });

  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '1024']);
    client = new OpenAI({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('response_format json_schema: every response parses and follows the schema', async () => {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.create({
        model: MODEL, messages: [{ role: 'user', content: 'A city, as JSON' }], max_tokens: 300, seed,
        temperature: 1.0, response_format: { type: 'json_schema', json_schema: { name: 'place', schema: SCHEMA, strict: true } },
      });
      const text = r.choices[0].message.content;
      assert.equal(r.choices[0].finish_reason, 'stop', text);
      assert.ok(conforms(JSON.parse(text)), text);
    }
  });

  test('json_object, guided_choice, guided_regex and structured_outputs on both routes', async () => {
    let r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 400, seed: 4,
      response_format: { type: 'json_object' },
    });
    const obj = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof obj, 'object');
    assert.ok(!Array.isArray(obj) && obj !== null);
    const c = await client.completions.create({ model: MODEL, prompt: 'Mood:', max_tokens: 10, seed: 5, guided_choice: ['happy', 'sad'] });
    assert.ok(['happy', 'sad'].includes(c.choices[0].text), c.choices[0].text);
    const g = await client.completions.create({ model: MODEL, prompt: 'Id:', max_tokens: 20, seed: 6, guided_regex: '[a-f]{3}\\d{2}' });
    assert.match(g.choices[0].text, /^[a-f]{3}\d{2}$/);
    r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'y' }], max_tokens: 20, seed: 7,
      structured_outputs: { grammar: 'root ::= "yes" | "no"' },
    });
    assert.ok(['yes', 'no'].includes(r.choices[0].message.content), r.choices[0].message.content);
  });

  test('bad formats, schemas and grammars are 400s naming the problem; the server keeps serving', async () => {
    const chat = (extra) => post('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'z' }], max_tokens: 5, ...extra });
    let r = await chat({ response_format: { type: 'nonsense' } });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /response_format\.type/);
    r = await chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: {} } } } });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /patternProperties/);
    r = await chat({ guided_json: { type: 'strin' } });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /unknown type 'strin'/);
    r = await post('/v1/completions', { model: MODEL, prompt: 'a', max_tokens: 5, guided_grammar: 'root ::= item' });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /'item' is used but never defined/);
    r = await chat({ guided_regex: 'a', guided_choice: ['b'] });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /only one structured-output constraint/);
    r = await chat({ response_format: { type: 'text' } });
    assert.equal(r.status, 200, r.text);
  });
});
