// Many clients at once, and clients that leave: 64 concurrent streams all complete with correct
// usage and are batched by the engine; a client that disconnects mid-stream frees its KV blocks.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metrics, waitIdle, chatPromptTokens, SCRIPTED } from './harness.mjs';

let server, client, idleFree;
before(async () => {
  server = await startServer(SCRIPTED ? ['--step-ms', '2', '--max-num-seqs', '64'] : ['--max-num-seqs', '64']);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 2, timeout: 600_000 });
  idleFree = (await waitIdle(server)).scr_kv_cache_blocks_free;
});
after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0);
});

test('64 concurrent streaming clients complete with correct usage', async () => {
  const before = await metrics(server);
  const clients = Array.from({ length: 64 }, async (_, i) => {
    const messages = [{ role: 'user', content: `say: client number ${i}` }];
    const maxTokens = 4 + (i % 8);
    const stream = await client.chat.completions.create({
      model: server.model, messages, stream: true, stream_options: { include_usage: true },
      ...(SCRIPTED ? { max_tokens: 64 } : { max_tokens: maxTokens, ignore_eos: true }),
    });
    let content = '', usage = null, finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta.content ?? '';
      finish = c.finish_reason ?? finish;
    }
    assert.equal(usage.prompt_tokens, await chatPromptTokens(server, messages), `client ${i} prompt tokens`);
    if (SCRIPTED) {
      assert.equal(content, `client number ${i}`);
      assert.equal(usage.completion_tokens, content.length + 1);
      assert.equal(finish, 'stop');
    } else {
      assert.equal(usage.completion_tokens, maxTokens, `client ${i} completion tokens`);
      assert.equal(finish, 'length');
    }
    return usage.completion_tokens;
  });
  const tokens = (await Promise.all(clients)).reduce((a, b) => a + b, 0);
  const after = await waitIdle(server, idleFree);
  // Batched: far fewer engine steps than tokens generated.
  const steps = after.scr_engine_steps_total - before.scr_engine_steps_total;
  assert.ok(steps < tokens / 4, `engine steps ${steps} for ${tokens} tokens: streams were not batched`);
  assert.equal(after['scr_request_success_total{finished_reason="error"}'], 0);
});

test('a client that disconnects mid-stream frees its request and KV blocks at once', async () => {
  const before = await metrics(server);
  const controller = new AbortController();
  const stream = await client.chat.completions.create({
    model: server.model, messages: [{ role: 'user', content: 'go on forever' }], stream: true,
    max_tokens: Math.min(4000, server.maxModelLen - 64), ignore_eos: true,
  }, { signal: controller.signal });
  let chunks = 0;
  for await (const chunk of stream) {  // the SDK ends the iteration quietly on abort
    if (++chunks === 3) controller.abort();
  }
  assert.ok(chunks >= 3);
  const left = Date.now();
  const after = await waitIdle(server, idleFree, { timeoutMs: 5000 });
  assert.ok(Date.now() - left < 2000, `freed ${Date.now() - left} ms after the disconnect`);
  assert.equal(after.scr_client_disconnects_total, before.scr_client_disconnects_total + 1);
  assert.equal(after.scr_engine_requests_aborted_total, before.scr_engine_requests_aborted_total + 1);
  assert.ok(after.scr_generation_tokens_total - before.scr_generation_tokens_total < 2000);
});
