// Tool calling, reasoning parsers and /v1/responses through unmodified clients: the `openai` package
// (chat with tools, responses.create, responses.stream) and the AI SDK's default `openai(...)` model
// (@ai-sdk/openai, which calls /v1/responses) with generateText and streamText (with tools). The fixture
// model writes random text, so these check the protocol (shapes, event order, sequence numbers, usage,
// streamed text equal to the final text, 400s naming the problem); the parsers themselves are tested on
// fixed model outputs in tests/unit/server/output_parser_test.cc.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, streamText, tool } from 'ai';
import { MODEL, REPO, request, startServer } from './lib/server.mjs';

const TEMPLATE = path.join(REPO, 'tests/data/chat_templates/qwen2.5-instruct.jinja');
const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

describe('tools, reasoning and /v1/responses', () => {
  let server;
  let client;

  before(async () => {
    server = await startServer([
      '--model', MODEL, '--max-model-len', '2048', '--chat-template', TEMPLATE,
      '--enable-auto-tool-choice', '--tool-call-parser', 'hermes', '--reasoning-parser', 'qwen3',
    ]);
    client = new OpenAI({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    const { code, signal } = await server.stop();
    assert.equal(signal, null, server.log());
    assert.equal(code, 0, server.log());
  });

  test('chat with tools: a parsed message (reasoning_content, tool_calls list) and consistent usage', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: TOOLS, max_tokens: 6,
    });
    const m = r.choices[0].message;
    assert.ok(Array.isArray(m.tool_calls));
    assert.ok('reasoning_content' in m, JSON.stringify(m));
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.completion_tokens <= 6 && r.usage.completion_tokens > 0);
  });

  test('streamed chat with tools: the deltas add up to what the same request returns whole', async () => {
    const body = {
      model: MODEL, messages: [{ role: 'user', content: 'Weather in Rome?' }], tools: TOOLS, max_tokens: 12,
      temperature: 0, ignore_eos: true,
    };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let content = '';
    let reasoning = '';
    const calls = [];
    let finish = null;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta.content ?? '';
      reasoning += c.delta.reasoning_content ?? '';
      for (const tc of c.delta.tool_calls ?? []) {
        if (tc.id) calls[tc.index] = { name: tc.function.name, arguments: '' };
        calls[tc.index].arguments += tc.function.arguments ?? '';
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    const m = whole.choices[0].message;
    assert.equal(content, m.content ?? '');
    assert.equal(reasoning, m.reasoning_content ?? '');
    assert.equal(calls.length, m.tool_calls.length);
    assert.equal(finish, whole.choices[0].finish_reason);
  });

  test('a history with assistant tool_calls (JSON-string arguments) and a tool message renders', async () => {
    const messages = [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null,
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '21 C, sunny' },
    ];
    const short = await client.chat.completions.create({ model: MODEL, messages: messages.slice(0, 1), tools: TOOLS, max_tokens: 1 });
    const long = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, max_tokens: 1 });
    // The call and the tool's answer are in the prompt: "<tool_call>", the arguments, "<tool_response>".
    assert.ok(long.usage.prompt_tokens > short.usage.prompt_tokens + 10,
      `${long.usage.prompt_tokens} vs ${short.usage.prompt_tokens}`);
    const bad = await request(`${server.base}/chat/completions`, {
      body: { model: MODEL, max_tokens: 1, messages: [messages[0], { ...messages[1], tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: '{oops' } }] }] },
    });
    assert.equal(bad.status, 400);
    assert.match(bad.json.error.message, /get_weather.*not valid JSON/);
  });

  test('tool_choice "required" and a named function: constrained calls whose arguments match the schema', async () => {
    // Short strings and no extra keys keep the random fixture model's answers within the token budget.
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: {
      type: 'object', properties: { city: { type: 'string', maxLength: 4 } }, required: ['city'], additionalProperties: false } } }];
    for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await client.chat.completions.create({
        model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice, max_tokens: 1500,
        parallel_tool_calls: false, seed: 1,
      });
      const calls = r.choices[0].message.tool_calls;
      assert.ok(calls.length >= 1, JSON.stringify(r.choices[0]));
      assert.equal(calls[0].function.name, 'get_weather');
      assert.equal(typeof JSON.parse(calls[0].function.arguments).city, 'string');
      assert.equal(r.choices[0].finish_reason, tool_choice === 'required' ? 'tool_calls' : 'stop');
    }
  });

  test('tool_choice errors name the problem', async () => {
    const cases = [
      [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, /does not match any of the specified `tools`/],
      [{ tool_choice: 'required' }, /When using `tool_choice`, `tools` must be set/],
      [{ tools: [{ type: 'function', function: {} }] }, /'tools': each function needs a non-empty string 'name'/],
      [{ tools: TOOLS, tool_choice: 'sometimes' }, /'tool_choice' must be/],
    ];
    for (const [extra, re] of cases) {
      const r = await request(`${server.base}/chat/completions`, {
        body: { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, ...extra },
      });
      assert.equal(r.status, 400, JSON.stringify(extra));
      assert.match(r.json.error.message, re);
    }
  });

  test('responses.create: a message item with output_text, usage and the request echoed', async () => {
    const r = await client.responses.create({
      model: MODEL, input: 'Say something.', instructions: 'Be brief.', max_output_tokens: 5, temperature: 0,
    });
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.instructions, 'Be brief.');
    assert.equal(r.max_output_tokens, 5);
    const msg = r.output.find((o) => o.type === 'message');
    assert.ok(msg, JSON.stringify(r.output));
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.equal(typeof r.output_text, 'string');  // the client's own convenience field
    assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 5);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    if (r.status === 'incomplete') {
      assert.equal(r.incomplete_details.reason, 'max_output_tokens');
      assert.equal(r.usage.output_tokens, 5);
    } else {
      assert.equal(r.status, 'completed');
    }
  });

  test('responses.stream: ordered events with consecutive sequence numbers, deltas equal to the final text', async () => {
    const input = [
      { role: 'user', content: [{ type: 'input_text', text: 'Weather?' }] },
      { type: 'function_call', call_id: 'call_9', name: 'get_weather', arguments: '{"city":"Oslo"}' },
      { type: 'function_call_output', call_id: 'call_9', output: 'snow' },
    ];
    const stream = client.responses.stream({
      model: MODEL, input, tools: [{ type: 'function', name: 'get_weather', parameters: TOOLS[0].function.parameters, strict: false }],
      max_output_tokens: 8, temperature: 0,
    });
    const events = [];
    let text = '';
    for await (const ev of stream) {
      events.push(ev);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    const final = await stream.finalResponse();
    assert.equal(events[0].type, 'response.created');
    assert.equal(events[1].type, 'response.in_progress');
    assert.equal(events.at(-1).type, 'response.completed');
    events.forEach((ev, i) => assert.equal(ev.sequence_number, i, ev.type));
    const types = events.map((e) => e.type);
    for (const t of ['response.output_item.added', 'response.output_item.done']) assert.ok(types.includes(t), t);
    const msg = final.output.find((o) => o.type === 'message');
    if (msg) {
      assert.ok(types.includes('response.content_part.added'));
      assert.equal(text, msg.content[0].text);
      const done = events.find((e) => e.type === 'response.output_text.done');
      assert.equal(done.text, text);
    }
    assert.ok(final.usage.output_tokens <= 8);
  });

  test('/v1/responses refuses what it cannot do, naming it', async () => {
    const cases = [
      [{ input: 'x', tools: [{ type: 'web_search' }] }, /only function tools/],
      [{ input: [{ type: 'image_generation_call' }] }, /image_generation_call/],
      [{ input: 'x', frobnicate: 1 }, /'frobnicate' is not a field/],
      [{}, /'input' is required/],
    ];
    for (const [body, re] of cases) {
      const r = await request(`${server.base}/responses`, { body: { model: MODEL, ...body } });
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.match(r.json.error.message, re);
    }
  });

  test("AI SDK: the default openai(...) model (Responses API) with generateText and streamText with tools", async () => {
    const provider = createOpenAI({ baseURL: server.base, apiKey: 'none' });
    const g = await generateText({ model: provider(MODEL), prompt: 'Hello', maxOutputTokens: 6, temperature: 0 });
    assert.equal(typeof g.text, 'string');
    assert.ok(g.usage.outputTokens > 0 && g.usage.outputTokens <= 6, JSON.stringify(g.usage));
    const s = streamText({
      model: provider(MODEL), prompt: 'Weather in Paris?', maxOutputTokens: 8, temperature: 0,
      tools: {
        get_weather: tool({
          description: 'Weather of a city',
          inputSchema: jsonSchema(TOOLS[0].function.parameters),
          execute: async ({ city }) => `sunny in ${city}`,
        }),
      },
    });
    let streamed = '';
    for await (const part of s.textStream) streamed += part;
    assert.equal(streamed, await s.text);
    const finish = await s.finishReason;
    assert.ok(['stop', 'length', 'tool-calls'].includes(finish), finish);
  });
});

// --exclude-tools-when-tool-choice-none: with tool_choice "none" the prompt is the one without tools (the
// qwen2.5 template renders tools into the system turn, so they cost prompt tokens); without the flag (the
// server above, as vLLM) the tools stay in. The structured-outputs backend flags are accepted and logged.
describe('--tool-call-parser qwen3_coder with an XML tool-call template', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer([
      '--model', MODEL, '--max-model-len', '4096',
      '--chat-template', path.join(REPO, 'tests/data/chat_templates/qwen3-agentic.jinja'),
      '--enable-auto-tool-choice', '--tool-call-parser', 'qwen3_coder', '--reasoning-parser', 'qwen3',
    ]);
    client = new OpenAI({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    assert.deepEqual(await server.stop(), { code: 0, signal: null }, server.log());
  });

  test('streamed chat with tools: the deltas add up to what the same request returns whole', async () => {
    const body = {
      model: MODEL, messages: [{ role: 'user', content: 'Weather in Rome?' }], tools: TOOLS, max_tokens: 16,
      temperature: 0, ignore_eos: true,
    };
    const whole = await client.chat.completions.create(body);
    const m = whole.choices[0].message;
    assert.ok(Array.isArray(m.tool_calls), JSON.stringify(m));
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let content = '';
    const calls = [];
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta.content ?? '';
      for (const tc of c.delta.tool_calls ?? []) {
        if (tc.id) calls[tc.index] = { name: tc.function.name, arguments: '' };
        calls[tc.index].arguments += tc.function.arguments ?? '';
      }
    }
    assert.equal(content, m.content ?? '');
    assert.equal(calls.length, m.tool_calls.length);
  });

  test('a history with an assistant call renders it as <function=...> with its parameters', async () => {
    const ask = [{ role: 'user', content: 'Weather in Paris?' }];
    const messages = [...ask,
      { role: 'assistant', content: null,
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '21 C, sunny' }];
    const short = await client.chat.completions.create({ model: MODEL, messages: ask, tools: TOOLS, max_tokens: 1 });
    const long = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, max_tokens: 1 });
    assert.ok(long.usage.prompt_tokens > short.usage.prompt_tokens + 10,
      `${long.usage.prompt_tokens} vs ${short.usage.prompt_tokens}`);
  });
});

describe('--exclude-tools-when-tool-choice-none', () => {
  let server;
  let plain;
  before(async () => {
    server = await startServer([
      '--model', MODEL, '--max-model-len', '2048', '--chat-template', TEMPLATE, '--exclude-tools-when-tool-choice-none',
      '--guided-decoding-backend', 'xgrammar', '--structured-outputs-config', '{"backend": "xgrammar"}',
    ]);
    plain = await startServer(['--model', MODEL, '--max-model-len', '2048', '--chat-template', TEMPLATE]);
  });
  after(async () => {
    for (const s of [server, plain]) if (s) assert.deepEqual(await s.stop(), { code: 0, signal: null }, s.log());
  });

  const promptTokens = async (s, extra) => {
    const r = await request(`${s.base}/chat/completions`, {
      body: { model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], max_tokens: 1, temperature: 0, ...extra },
    });
    assert.equal(r.status, 200, r.text);
    return r.json.usage.prompt_tokens;
  };

  test('tool_choice "none" leaves the tools out of the prompt; "auto"-less default and other servers keep them', async () => {
    const bare = await promptTokens(server, {});
    const withTools = await promptTokens(plain, { tools: TOOLS, tool_choice: 'none' });
    assert.ok(withTools > bare + 10, `the template renders the tools: ${withTools} vs ${bare} prompt tokens`);
    assert.equal(await promptTokens(server, { tools: TOOLS, tool_choice: 'none' }), bare);
    assert.equal(await promptTokens(plain, {}), bare);
    // A named function keeps its tools in the prompt on the excluding server too.
    const named = await promptTokens(server, {
      tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    assert.equal(named, withTools);
  });

  test('the structured-outputs backend flags are accepted and logged, not warned about', () => {
    const log = server.log();
    for (const flag of ['--guided-decoding-backend xgrammar', '--structured-outputs-config {"backend": "xgrammar"}']) {
      assert.match(log, new RegExp(`${flag.replace(/[{}"]/g, '.')}: accepted for vLLM compatibility, not needed here \\(.*grammar engine`));
    }
    assert.doesNotMatch(log, /has no structured outputs yet/);
  });
});
