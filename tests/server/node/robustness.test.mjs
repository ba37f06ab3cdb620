// Bad clients: a few thousand malformed requests (bodies, types, paths, raw garbage on the socket),
// after which the server still answers correctly and holds no KV blocks; and SIGTERM drains.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import OpenAI from 'openai';
import { startServer, metrics, waitIdle, sseData, fetchRetry, SCRIPTED } from './harness.mjs';

// Deterministic PRNG (mulberry32) so a failure can be replayed.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const SEEDS = [
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'say: ok' }], max_tokens: 3, temperature: 0.5, n: 1, stop: ['x'], logprobs: true, top_logprobs: 1 }],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'say: ok' }], max_tokens: 3, stream: true, stream_options: { include_usage: true }, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }],
  ['/v1/completions', { prompt: ['say: a', [5, 6, 7]], max_tokens: 2, echo: true, seed: 4 }],
  ['/v1/messages', { max_tokens: 3, system: 's', messages: [{ role: 'user', content: [{ type: 'text', text: 'say: hi' }] }], stream: true }],
  ['/tokenize', { prompt: 'hello', add_special_tokens: false }],
  ['/detokenize', { tokens: [5, 6, 7] }],
];
const ODD = [null, true, false, -1, 0, 1e308, -1e308, 0.5, 2 ** 53, '', 'x', [], [1, 'a'], {}, { k: null }, '\u0000', 'é'.repeat(50)];
const PATHS = ['/v1/chat/completions', '/v1/completions', '/v1/messages', '/tokenize', '/detokenize', '/v1/models',
               '/v1/chat/completions/extra', '/%00', '/v1/../v1/models', '/metrics?x=1'];

function mutate(r) {
  const [path, seed] = SEEDS[Math.floor(r() * SEEDS.length)];
  let body = JSON.stringify(seed);
  const kind = Math.floor(r() * 6);
  if (kind === 0) {  // byte flips
    const bytes = Buffer.from(body);
    for (let k = 0; k < 1 + r() * 4; k++) bytes[Math.floor(r() * bytes.length)] ^= 1 << Math.floor(r() * 8);
    body = bytes;
  } else if (kind === 1) {  // truncation
    body = body.slice(0, Math.floor(r() * body.length));
  } else if (kind === 2) {  // spliced tokens
    const tokens = ['{', '}', '[', ']', '"', ',', ':', 'null', '1e999', '[[[[[[[[[[[[', '\\ud800', '\\u0000'];
    const at = Math.floor(r() * body.length);
    body = body.slice(0, at) + tokens[Math.floor(r() * tokens.length)] + body.slice(at);
  } else if (kind === 3) {  // type swaps
    const doc = structuredClone(seed);
    const walk = (o, depth) => {
      const keys = Object.keys(o);
      const k = keys[Math.floor(r() * keys.length)];
      if (o[k] && typeof o[k] === 'object' && r() < 0.6 && depth < 4) walk(o[k], depth + 1);
      else o[k] = ODD[Math.floor(r() * ODD.length)];
    };
    walk(doc, 0);
    body = JSON.stringify(doc);
  } else if (kind === 4) {  // deep nesting
    const depth = 10 + Math.floor(r() * 100000);
    body = '{"messages":' + '['.repeat(depth) + ']'.repeat(depth) + '}';
  } else {  // valid JSON of the wrong shape
    body = JSON.stringify(ODD[Math.floor(r() * ODD.length)]);
  }
  return { path: r() < 0.1 ? PATHS[Math.floor(r() * PATHS.length)] : path, body, method: r() < 0.05 ? 'PUT' : 'POST' };
}

// Raw bytes on a socket: broken request lines, lying Content-Length, header floods, half-sent bodies.
function rawGarbage(port, r) {
  const junk = [
    'GARBAGE\r\n\r\n', 'GET\r\n\r\n', 'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"a"',
    'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n',
    'POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n',
    'GET /health HTTP/1.1\r\n' + 'X-Flood: y\r\n'.repeat(5000) + '\r\n',
    'GET /' + 'a'.repeat(100000) + ' HTTP/1.1\r\n\r\n',
    Buffer.from(Array.from({ length: 512 }, () => Math.floor(r() * 256))),
  ];
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.setTimeout(3000, () => socket.destroy());
    socket.on('error', () => resolve());
    socket.on('close', () => resolve());
    socket.on('data', () => {});
    socket.on('connect', () => {
      socket.write(junk[Math.floor(r() * junk.length)]);
      if (r() < 0.5) socket.end(); else setTimeout(() => socket.destroy(), 50);
    });
  });
}

describe('malformed requests', () => {
  let server, idleFree;
  before(async () => {
    server = await startServer(['--max-body-bytes', '1048576']);
    idleFree = (await waitIdle(server)).scr_kv_cache_blocks_free;
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0);
  });

  test('3000 mutated requests and 300 raw garbage connections, then the server still works', async () => {
    const r = rng(77);
    const statuses = {};
    let next = 0, resets = 0;
    const total = 3000;
    const worker = async () => {
      while (next < total) {
        next++;
        const { path, body, method } = mutate(r);
        let res;
        try {
          res = await fetch(server.url + path, {
            method, body, headers: { 'Content-Type': 'application/json' }, signal: AbortSignal.timeout(3000),
          });
          const text = await res.text();
          statuses[res.status] = (statuses[res.status] ?? 0) + 1;
          assert.ok(res.status < 500, `${res.status} for ${path}: ${text.slice(0, 300)}`);
          if (res.status >= 400 && !path.startsWith('/v1/messages')) {
            const err = JSON.parse(text).error;
            for (const key of ['message', 'type', 'param', 'code']) assert.ok(key in err, `error.${key} in ${text}`);
          }
        } catch (e) {
          if (e.cause?.code === 'UND_ERR_SOCKET' || e.cause?.code === 'ECONNRESET') resets++;  // keep-alive race
          else if (e.name !== 'TimeoutError' && e.name !== 'AbortError') throw e;  // a long generation: we hang up
        }
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    for (let i = 0; i < 300; i += 10) await Promise.all(Array.from({ length: 10 }, () => rawGarbage(server.port, r)));
    assert.ok((statuses[400] ?? 0) > total / 2, JSON.stringify(statuses));
    assert.ok(resets < total / 100, `${resets} connections reset`);

    // Still healthy, still correct, nothing leaked.
    assert.equal((await fetchRetry(`${server.url}/health`)).status, 200);
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 2 });
    const reply = await client.chat.completions.create({
      model: server.model, messages: [{ role: 'user', content: 'say: still here' }], max_tokens: 5, ignore_eos: true,
    });
    assert.equal(reply.usage.completion_tokens, 5);
    if (SCRIPTED) assert.equal(reply.choices[0].message.content, 'still');
    const m = await waitIdle(server, idleFree);
    assert.equal(m.scr_kv_cache_blocks_free, idleFree, 'KV blocks leaked');
  });
});

describe('SIGTERM', () => {
  test('drains: the in-flight stream finishes, new work is refused, exit code 0', async () => {
    const server = await startServer(SCRIPTED ? ['--step-ms', '20', '--drain-timeout', '30'] : ['--drain-timeout', '60']);
    const body = { model: server.model, messages: [{ role: 'user', content: 'say: a reply that takes about a second to stream' }],
                   max_tokens: SCRIPTED ? 100 : 24, stream: true, stream_options: { include_usage: true },
                   ...(SCRIPTED ? {} : { ignore_eos: true }) };
    const res = await fetch(`${server.baseURL}/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    let text = '', signalled = false, refused = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      if (!signalled) {
        signalled = true;
        server.child.kill('SIGTERM');
        await new Promise((r) => setTimeout(r, 100));
        refused = await fetch(`${server.baseURL}/chat/completions`, {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...body, stream: false }),
        }).then((r) => r.status, () => 'connection refused');
      }
    }
    assert.ok(refused === 503 || refused === 'connection refused', `new request during drain: ${refused}`);
    const events = sseData(text);
    assert.equal(events.at(-1), '[DONE]');
    const usage = events.at(-2).usage;
    assert.equal(usage.completion_tokens, SCRIPTED ? 'a reply that takes about a second to stream'.length + 1 : 24);
    const content = events.slice(0, -2).map((e) => e.choices[0]?.delta?.content ?? '').join('');
    if (SCRIPTED) assert.equal(content, 'a reply that takes about a second to stream');
    const { code } = await server.exited;
    assert.equal(code, 0);
  });

  test('requests still running at the drain timeout end with an error event; exit code 0', async () => {
    const server = await startServer(SCRIPTED ? ['--step-ms', '5', '--drain-timeout', '0.5'] : ['--drain-timeout', '0.5']);
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 2 });
    const stream = await client.chat.completions.create({
      model: server.model, messages: [{ role: 'user', content: 'long' }], stream: true,
      max_tokens: Math.min(4000, server.maxModelLen - 64), ignore_eos: true,
    });
    const started = Date.now();
    await assert.rejects((async () => {
      let first = true;
      for await (const _ of stream) {
        if (first) { first = false; server.child.kill('SIGTERM'); }
      }
    })(), (e) => e instanceof OpenAI.APIError && /aborted/.test(e.message));
    const { code } = await server.exited;
    assert.equal(code, 0);
    assert.ok(Date.now() - started < 15_000);
  });
});
