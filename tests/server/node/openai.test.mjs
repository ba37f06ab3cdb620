// The official `openai` client against a running server: chat (streaming and not), completions,
// tools, n, logprobs, seed, stop, and errors surfacing as the SDK's own error classes.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, chatPromptTokens, SCRIPTED } from './harness.mjs';

let server, client;
before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 2 });
});
after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, 'server exits 0 on SIGTERM');
});

const say = (text) => [{ role: 'user', content: `say: ${text}` }];

describe('chat completions', () => {
  test('non-streaming: message, finish_reason and usage', async () => {
    const messages = say('Hello, world!');
    const params = SCRIPTED ? { messages, max_tokens: 50 }
                            : { messages, max_tokens: 8, ignore_eos: true, temperature: 0 };
    const r = await client.chat.completions.create({ model: server.model, ...params });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.model, server.model);
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.equal(r.usage.prompt_tokens, await chatPromptTokens(server, messages));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    if (SCRIPTED) {
      assert.equal(r.choices[0].message.content, 'Hello, world!');
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.equal(r.usage.completion_tokens, 'Hello, world!'.length + 1);  // + end of turn
    } else {
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.equal(r.usage.completion_tokens, 8);
    }
  });

  test('streaming with include_usage matches the non-streaming reply', async () => {
    const messages = say('stream me');
    const common = { model: server.model, messages, max_tokens: 12, temperature: 0, ...(SCRIPTED ? {} : { ignore_eos: true }) };
    const whole = await client.chat.completions.create(common);
    const stream = await client.chat.completions.create({ ...common, stream: true, stream_options: { include_usage: true } });
    let content = '', role = null, finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices.length === 0) continue;
      const c = chunk.choices[0];
      role ??= c.delta.role ?? null;
      content += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.ok(chunks >= 3);
    assert.equal(role, 'assistant');
    assert.equal(content, whole.choices[0].message.content, 'greedy stream == greedy non-stream');
    assert.equal(finish, whole.choices[0].finish_reason);
    assert.deepEqual(usage.completion_tokens, whole.usage.completion_tokens);
    assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  });

  test('n, logprobs and top_logprobs', async () => {
    const r = await client.chat.completions.create({
      model: server.model, messages: say('ab'), n: 2, max_tokens: 5, ignore_eos: true,
      logprobs: true, top_logprobs: 2,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'length');
      assert.equal(c.logprobs.content.length, 5, 'one logprob entry per generated token');
      for (const entry of c.logprobs.content) {
        assert.equal(typeof entry.token, 'string');
        assert.ok(entry.logprob <= 0);
        assert.ok(Array.isArray(entry.bytes));
        assert.equal(entry.top_logprobs.length, 2);
      }
    }
    assert.equal(r.usage.completion_tokens, 10);
  });

  test('a seed makes sampling reproducible', async () => {
    const params = { model: server.model, messages: say('seeded'), max_tokens: 10, temperature: 1.0, seed: 1234 };
    const a = await client.chat.completions.create(params);
    const b = await client.chat.completions.create(params);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  });

  test('stop strings end the reply and are not included', { skip: !SCRIPTED && 'needs a predictable model' }, async () => {
    const r = await client.chat.completions.create({ model: server.model, messages: say('one two three'), stop: ['two'] });
    assert.equal(r.choices[0].message.content, 'one ');
    assert.equal(r.choices[0].finish_reason, 'stop');
  });
});

describe('completions', () => {
  test('non-streaming and streaming', async () => {
    const prompt = SCRIPTED ? 'say: hi' : 'The capital of France is';
    const common = { model: server.model, prompt, max_tokens: 6, temperature: 0, ...(SCRIPTED ? {} : { ignore_eos: true }) };
    const r = await client.completions.create(common);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    if (SCRIPTED) {
      assert.equal(r.choices[0].text, 'hi');
      assert.equal(r.choices[0].finish_reason, 'stop');
    } else {
      assert.equal(r.usage.completion_tokens, 6);
      assert.equal(r.choices[0].finish_reason, 'length');
    }
    let text = '';
    for await (const chunk of await client.completions.create({ ...common, stream: true })) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, r.choices[0].text);
  });

  test('echo and legacy logprobs', async () => {
    const prompt = SCRIPTED ? 'say: xy' : 'Hello';
    const echoed = await client.completions.create({ model: server.model, prompt, max_tokens: 2, echo: true, ignore_eos: true });
    assert.ok(echoed.choices[0].text.startsWith(prompt));
    const r = await client.completions.create({ model: server.model, prompt, max_tokens: 3, logprobs: 2, ignore_eos: true });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 3);
    assert.equal(lp.token_logprobs.length, 3);
    assert.equal(lp.top_logprobs.length, 3);
    assert.equal(lp.text_offset[0], 0);
  });
});

describe('tools', () => {
  const tools = [{
    type: 'function',
    function: { name: 'get_weather', description: 'Weather in a city',
                parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  }];
  const call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>';

  test('a tool call comes back as tool_calls with finish_reason tool_calls', async () => {
    const messages = SCRIPTED ? say(call) : [{ role: 'user', content: 'What is the weather in Paris? Use the tool.' }];
    const r = await client.chat.completions.create({ model: server.model, messages, tools, max_tokens: 200 });
    const c = r.choices[0];
    if (!SCRIPTED && c.finish_reason !== 'tool_calls') {
      assert.ok(['stop', 'length'].includes(c.finish_reason));  // a small model may answer in prose
      return;
    }
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].type, 'function');
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    const args = JSON.parse(c.message.tool_calls[0].function.arguments);
    if (SCRIPTED) {
      assert.deepEqual(args, { city: 'Paris' });
      assert.equal(c.message.content, null);
    }
    // The conversation continues with the tool's result.
    const next = await client.chat.completions.create({
      model: server.model, tools, max_tokens: 8,
      messages: [...messages, c.message, { role: 'tool', tool_call_id: c.message.tool_calls[0].id, content: '21 C' }],
    });
    assert.equal(next.choices[0].message.role, 'assistant');
  });

  test('streamed tool calls', { skip: !SCRIPTED && 'needs a predictable model' }, async () => {
    const stream = await client.chat.completions.create({ model: server.model, messages: say(`Sure. ${call}`), tools, stream: true });
    let content = '', finish = null;
    const calls = [];
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta.content ?? '';
      for (const tc of c.delta.tool_calls ?? []) calls.push(tc);
      finish = c.finish_reason ?? finish;
    }
    assert.equal(content, 'Sure.');
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].index, 0);
    assert.match(calls[0].id, /^call_/);
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris' });
  });
});

describe('errors surface as the SDK error classes', () => {
  const rejects = (promise, cls, check) => assert.rejects(promise, (err) => {
    assert.ok(err instanceof cls, `expected ${cls.name}, got ${err.constructor.name}: ${err.message}`);
    check?.(err);
    return true;
  });

  test('400 BadRequestError', async () => {
    await rejects(client.chat.completions.create({ model: server.model, messages: say('x'), temperature: 5 }),
                  OpenAI.BadRequestError, (e) => { assert.equal(e.status, 400); assert.equal(e.param, 'temperature'); });
    await rejects(client.chat.completions.create({ model: server.model, messages: [] }), OpenAI.BadRequestError);
    await rejects(client.chat.completions.create({ model: server.model, messages: say('x'), max_tokens: 10_000_000 }),
                  OpenAI.BadRequestError, (e) => assert.equal(e.code, 'context_length_exceeded'));
    await rejects(client.chat.completions.create({ model: server.model, messages: say('x'), nonsense: 1 }),
                  OpenAI.BadRequestError, (e) => assert.equal(e.code, 'unknown_parameter'));
    await rejects(client.chat.completions.create({ model: server.model, messages: say('x'), stream: true, n: 'two' }),
                  OpenAI.BadRequestError, (e) => assert.equal(e.param, 'n'));
    await rejects(client.completions.create({ model: server.model, prompt: 'hello world '.repeat(server.maxModelLen) }),
                  OpenAI.BadRequestError, (e) => assert.equal(e.code, 'context_length_exceeded'));
  });

  test('404 NotFoundError for an unknown model', async () => {
    await rejects(client.chat.completions.create({ model: 'no-such-model', messages: say('x') }),
                  OpenAI.NotFoundError, (e) => assert.equal(e.code, 'model_not_found'));
  });

  test('models.list', async () => {
    const page = await client.models.list();
    assert.deepEqual(page.data.map((m) => m.id), [server.model]);
  });
});

describe('authentication and limits', () => {
  let guarded;
  before(async () => { guarded = await startServer(['--api-key', 'sk-right', '--max-body-bytes', '65536']); });
  after(async () => { await guarded.stop(); });

  test('401 AuthenticationError for a wrong key; the right key works', async () => {
    const wrong = new OpenAI({ baseURL: guarded.baseURL, apiKey: 'sk-wrong', maxRetries: 2 });
    await assert.rejects(wrong.models.list(), OpenAI.AuthenticationError);
    const right = new OpenAI({ baseURL: guarded.baseURL, apiKey: 'sk-right', maxRetries: 2 });
    const r = await right.chat.completions.create({ model: guarded.model, messages: say('ok'), max_tokens: 4 });
    assert.equal(r.choices.length, 1);
  });

  test('413 for an oversized body', async () => {
    const right = new OpenAI({ baseURL: guarded.baseURL, apiKey: 'sk-right', maxRetries: 2 });
    await assert.rejects(right.chat.completions.create({ model: guarded.model, messages: say('x'.repeat(100_000)) }),
                         (e) => e instanceof OpenAI.APIError && e.status === 413);
  });
});
