// Structured outputs and tool calls through unmodified clients, each answer checked by the client's own
// zod schema (an independent validator): the `openai` package's chat.completions.parse (zodResponseFormat,
// and zodFunction tools with tool_choice "required"), responses.parse (zodTextFormat); the AI SDK's
// generateObject and streamObject with the default openai(...) model (/v1/responses) and the chat model;
// LangChain's ChatOpenAI withStructuredOutput (its default json_schema method and function calling) and
// bindTools with a named and a "required" tool choice. The fixture model writes random text, so every
// conforming answer comes from the structured-output engine (numbers with fractional and exclusive bounds,
// bounded integers, enums, bounded arrays and strings, nullable fields).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject, streamObject } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import { MODEL, REPO, startServer } from './lib/server.mjs';

const TEMPLATE = path.join(REPO, 'tests/data/chat_templates/qwen2.5-instruct.jinja');

const Reading = z.object({
  station: z.string().max(10),
  count: z.number().int().min(-5).max(120),
  level: z.number().min(-1.5).max(2.25),
  ratio: z.number().gt(0).lt(1),
  tags: z.array(z.enum(['wind', 'rain', 'sun'])).min(1).max(3),
  note: z.string().max(6).nullable(),
});

const Weather = z.object({ city: z.string().max(12), days: z.number().int().min(1).max(7) });

function checked(schema, value, what) {
  const r = schema.safeParse(value);
  assert.ok(r.success, `${what}: ${JSON.stringify(value)} ${r.success ? '' : JSON.stringify(r.error.issues)}`);
  return r.data;
}

describe('clients with structured outputs and tools (zod-validated)', () => {
  let server;
  let client;

  before(async () => {
    server = await startServer([
      '--model', MODEL, '--max-model-len', '2048', '--chat-template', TEMPLATE,
      '--enable-auto-tool-choice', '--tool-call-parser', 'hermes',
    ]);
    client = new OpenAI({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('openai chat.completions.parse: zodResponseFormat and zodFunction tools with tool_choice "required"', async () => {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.parse({
        model: MODEL, messages: [{ role: 'user', content: 'A reading, as JSON' }], max_tokens: 500, seed,
        temperature: 1, response_format: zodResponseFormat(Reading, 'reading'),
      });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'stop', m.content);
      checked(Reading, m.parsed, 'parsed');
      assert.deepEqual(m.parsed, JSON.parse(m.content));
    }
    const r = await client.chat.completions.parse({
      model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 300, seed: 9, temperature: 1,
      tools: [zodFunction({ name: 'get_weather', parameters: Weather })], tool_choice: 'required',
    });
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls.length >= 1, JSON.stringify(r.choices[0].message));
    for (const c of calls) {
      assert.equal(c.function.name, 'get_weather');
      checked(Weather, c.function.parsed_arguments, 'parsed_arguments');
    }
  });

  test('openai responses.parse with zodTextFormat', async () => {
    const r = await client.responses.parse({
      model: MODEL, input: 'A reading', max_output_tokens: 500, temperature: 1,
      text: { format: zodTextFormat(Reading, 'reading') },
    });
    assert.equal(r.status, 'completed', JSON.stringify(r.output));
    checked(Reading, r.output_parsed, 'output_parsed');
  });

  test('AI SDK generateObject and streamObject: the default openai(...) model and the chat model', async () => {
    const provider = createOpenAI({ baseURL: server.base, apiKey: 'none' });
    for (const model of [provider(MODEL), provider.chat(MODEL)]) {
      const g = await generateObject({ model, schema: Reading, prompt: 'A reading', maxOutputTokens: 500, temperature: 1, seed: 4 });
      checked(Reading, g.object, 'generateObject');
      assert.equal(g.finishReason, 'stop');
    }
    const s = streamObject({ model: provider(MODEL), schema: Reading, prompt: 'Another', maxOutputTokens: 500, temperature: 1, seed: 5 });
    let partials = 0;
    for await (const p of s.partialObjectStream) {
      assert.equal(typeof p, 'object');
      partials += 1;
    }
    const object = await s.object;
    checked(Reading, object, 'streamObject');
    assert.ok(partials >= 2, `${partials} partial objects`);
  });

  test('LangChain ChatOpenAI withStructuredOutput (default json_schema and function calling) and bindTools', async () => {
    const llm = (seed) => new ChatOpenAI({
      model: MODEL, apiKey: 'none', configuration: { baseURL: server.base }, temperature: 1, maxTokens: 500,
      maxRetries: 0, modelKwargs: { seed },
    });
    for (const [seed, config] of [[6, undefined], [7, { method: 'functionCalling' }], [8, { method: 'jsonSchema', strict: true }]]) {
      const structured = llm(seed).withStructuredOutput(Reading, config);
      const out = await structured.invoke('A reading, please');
      checked(Reading, out, `withStructuredOutput ${JSON.stringify(config)}`);
    }
    // includeRaw: the raw AIMessage beside the parsed value.
    const raw = await llm(10).withStructuredOutput(Weather, { name: 'weather', includeRaw: true }).invoke('Weather?');
    checked(Weather, raw.parsed, 'includeRaw parsed');
    assert.deepEqual(JSON.parse(raw.raw.content), raw.parsed);

    const getWeather = tool(async ({ city }) => `sunny in ${city}`, {
      name: 'get_weather', description: 'Weather of a city for some days', schema: Weather,
    });
    for (const [seed, choice] of [[11, 'get_weather'], [12, 'required'], [13, 'any']]) {
      const msg = await llm(seed).bindTools([getWeather], { tool_choice: choice }).invoke('Weather in Paris for 3 days?');
      assert.ok(msg.tool_calls.length >= 1, `${choice}: ${JSON.stringify(msg)}`);
      for (const c of msg.tool_calls) {
        assert.equal(c.name, 'get_weather');
        assert.equal(typeof c.id, 'string');
        checked(Weather, c.args, `bindTools ${choice}`);
      }
      assert.deepEqual(msg.invalid_tool_calls ?? [], []);
      // The tool runs on the parsed call, as an agent would.
      const result = await getWeather.invoke(msg.tool_calls[0]);
      assert.equal(result.content, `sunny in ${msg.tool_calls[0].args.city}`);
    }
  });
});
