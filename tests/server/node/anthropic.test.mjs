// The official `@anthropic-ai/sdk` client against /v1/messages: what coding agents speak.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, chatPromptTokens, SCRIPTED } from './harness.mjs';

let server, client;
before(async () => {
  server = await startServer();
  client = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 2 });
});
after(async () => { await server.stop(); });

const say = (text) => [{ role: 'user', content: `say: ${text}` }];

describe('messages', () => {
  test('non-streaming', async () => {
    const messages = say('Bonjour');
    const m = await client.messages.create({ model: server.model, max_tokens: 16, messages });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.match(m.id, /^msg_/);
    assert.equal(m.content[0].type, 'text');
    assert.equal(m.usage.input_tokens, await chatPromptTokens(server, messages));
    if (SCRIPTED) {
      assert.equal(m.content[0].text, 'Bonjour');
      assert.equal(m.stop_reason, 'end_turn');
      assert.equal(m.usage.output_tokens, 'Bonjour'.length + 1);
    } else {
      assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
      assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 16);
    }
  });

  test('streaming: event order and the accumulated message', async () => {
    const stream = client.messages.stream({ model: server.model, max_tokens: 12, messages: say('streamed reply'), temperature: 0 });
    const events = [];
    stream.on('streamEvent', (e) => events.push(e.type));
    const final = await stream.finalMessage();
    assert.equal(events[0], 'message_start');
    assert.equal(events.at(-1), 'message_stop');
    assert.ok(events.includes('content_block_start') && events.includes('content_block_stop'));
    assert.ok(events.includes('message_delta'));
    const whole = await client.messages.create({ model: server.model, max_tokens: 12, messages: say('streamed reply'), temperature: 0 });
    assert.equal(final.content[0].text, whole.content[0].text);
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });

  test('system prompt and stop_sequences', { skip: !SCRIPTED && 'needs a predictable model' }, async () => {
    const m = await client.messages.create({
      model: server.model, max_tokens: 30, system: 'You are terse.', messages: say('one two three'), stop_sequences: ['two'],
    });
    assert.equal(m.content[0].text, 'one ');
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, 'two');
  });

  test('count_tokens', async () => {
    const messages = say('count me');
    const r = await client.messages.countTokens({ model: server.model, messages });
    assert.equal(r.input_tokens, await chatPromptTokens(server, messages));
  });

  test('errors are Anthropic-shaped and typed', async () => {
    await assert.rejects(client.messages.create({ model: server.model, messages: say('x') }),  // no max_tokens
                         (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error');
    await assert.rejects(client.messages.create({ model: 'claude-nope', max_tokens: 5, messages: say('x') }),
                         (e) => e instanceof Anthropic.NotFoundError);
  });
});

describe('tool use', () => {
  const tools = [{ name: 'get_weather', description: 'Weather in a city',
                   input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>';

  test('tool_use blocks, streaming and not, and the tool_result turn', { skip: !SCRIPTED && 'needs a predictable model' }, async () => {
    const messages = say(`Let me look. ${call}`);
    const m = await client.messages.create({ model: server.model, max_tokens: 100, tools, messages });
    assert.equal(m.stop_reason, 'tool_use');
    assert.deepEqual(m.content.map((b) => b.type), ['text', 'tool_use']);
    assert.equal(m.content[0].text, 'Let me look.');
    const use = m.content[1];
    assert.equal(use.name, 'get_weather');
    assert.deepEqual(use.input, { city: 'Oslo' });
    assert.match(use.id, /^toolu_/);

    const streamed = await client.messages.stream({ model: server.model, max_tokens: 100, tools, messages }).finalMessage();
    assert.equal(streamed.stop_reason, 'tool_use');
    assert.deepEqual(streamed.content[1].input, { city: 'Oslo' });

    const next = await client.messages.create({
      model: server.model, max_tokens: 10, tools,
      messages: [...messages, { role: 'assistant', content: m.content },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '-3 C' }] }],
    });
    assert.equal(next.role, 'assistant');
  });
});
