// Every JSON Schema feature the structured-output engine supports, sampled through the server and checked
// by an independent validator (ajv 2020-12 with ajv-formats): types and type lists, properties / required /
// additionalProperties false, enum / const, anyOf / oneOf, $ref / $defs (recursive), items /
// prefixItems / minItems / maxItems, string lengths, pattern, formats (date-time, date, time, uuid, email,
// ipv4), integer and number bounds (inclusive, exclusive, fractional, negative). The fixture model writes
// random text, so each valid sample is the engine's doing; several seeds and n > 1 per schema. (Extra
// properties under an additionalProperties schema have free-form names, which a random model never closes;
// tests/unit/structured/sample_test.cc samples those with closing tokens favoured.)
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { MODEL, request, startServer } from './lib/server.mjs';

const SCHEMAS = {
  object: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 8 },
      active: { type: 'boolean' },
      nothing: { type: 'null' },
      maybe: { type: ['integer', 'null'], minimum: -9, maximum: 9 },
      opt: { type: 'string', maxLength: 3 },
    },
    required: ['name', 'active', 'nothing', 'maybe'],
    additionalProperties: false,
  },
  enumConst: {
    type: 'object',
    properties: { kind: { enum: ['a', 'b', 3, null, true, { x: [1] }] }, fixed: { const: 'v1' } },
    required: ['kind', 'fixed'],
    additionalProperties: false,
  },
  unions: {
    type: 'array',
    items: {
      anyOf: [
        { type: 'string', maxLength: 4 },
        { type: 'integer', exclusiveMinimum: 10, exclusiveMaximum: 20 },
        {
          oneOf: [
            { type: 'object', properties: { t: { const: 'x' } }, required: ['t'], additionalProperties: false },
            { type: 'object', properties: { u: { type: 'number', minimum: 0.5, maximum: 0.75 } }, required: ['u'], additionalProperties: false },
          ],
        },
      ],
    },
    minItems: 1,
    maxItems: 4,
  },
  recursive: {
    $defs: {
      node: {
        type: 'object',
        properties: { v: { type: 'integer', minimum: 0, maximum: 99 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } },
        required: ['v', 'kids'],
        additionalProperties: false,
      },
    },
    $ref: '#/$defs/node',
  },
  tuple: {
    type: 'array',
    prefixItems: [{ type: 'string', format: 'date' }, { type: 'integer', minimum: -3, maximum: -1 }],
    items: { type: 'boolean' },
    minItems: 2,
    maxItems: 4,
  },
  strings: {
    type: 'object',
    properties: {
      code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
      when: { type: 'string', format: 'date-time' },
      day: { type: 'string', format: 'date' },
      at: { type: 'string', format: 'time' },
      id: { type: 'string', format: 'uuid' },
      mail: { type: 'string', format: 'email' },
      ip: { type: 'string', format: 'ipv4' },
      short: { type: 'string', minLength: 2, maxLength: 3 },
    },
    required: ['code', 'when', 'day', 'at', 'id', 'mail', 'ip', 'short'],
    additionalProperties: false,
  },
  numbers: {
    type: 'object',
    properties: {
      i: { type: 'integer', minimum: -250, maximum: 1234 },
      ie: { type: 'integer', exclusiveMinimum: -5, exclusiveMaximum: 5 },
      f: { type: 'number', minimum: -2.5, maximum: 3.125 },
      fe: { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 0.01 },
      neg: { type: 'number', maximum: -1000.5 },
      pos: { type: 'number', exclusiveMinimum: 99.99 },
      any: { type: 'number' },
    },
    required: ['i', 'ie', 'f', 'fe', 'neg', 'pos', 'any'],
    additionalProperties: false,
  },
};

describe('JSON Schema samples checked by ajv', () => {
  let server;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);

  before(async () => {
    server = await startServer(['--model', MODEL, '--max-model-len', '2048']);
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  for (const [name, schema] of Object.entries(SCHEMAS)) {
    test(`${name}: every sample parses and validates`, async () => {
      const validate = ajv.compile(schema);
      const replies = await Promise.all([11, 12, 13].map((seed) => request(`${server.url}/v1/completions`, {
        body: {
          model: MODEL, prompt: `Sample ${name}:`, max_tokens: 600, temperature: 1.0, seed, n: 3,
          structured_outputs: { json: schema },
        },
      })));
      let samples = 0;
      for (const r of replies) {
        assert.equal(r.status, 200, r.text);
        for (const c of r.json.choices) {
          assert.equal(c.finish_reason, 'stop', c.text);
          let value;
          assert.doesNotThrow(() => { value = JSON.parse(c.text); }, c.text);
          assert.ok(validate(value), `${c.text}\n${JSON.stringify(validate.errors)}`);
          samples += 1;
        }
      }
      assert.equal(samples, 9);
    });
  }

  test('what cannot be enforced is a 400 naming it', async () => {
    for (const [schema, re] of [
      [{ type: 'integer', multipleOf: 3 }, /multipleOf/],
      [{ type: 'string', pattern: '^a+$', maxLength: 3 }, /together with pattern/],
      [{ type: 'object', patternProperties: { '^x': {} } }, /patternProperties/],
      [{ type: 'array', uniqueItems: true }, /uniqueItems/],
      [{ type: 'number', minimum: 2, maximum: 1 }, /no number lies between/],
      [{ type: 'string', format: 'hostname' }, /format 'hostname'/],
    ]) {
      const r = await request(`${server.url}/v1/completions`, {
        body: { model: MODEL, prompt: 'x', max_tokens: 5, structured_outputs: { json: schema } },
      });
      assert.equal(r.status, 400, JSON.stringify(schema));
      assert.match(r.json.error.message, re);
    }
  });
});
