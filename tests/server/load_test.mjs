#!/usr/bin/env node
// Bounded load test for a running `scr serve`: streaming chat completions from 1, 8 and 64
// concurrent clients (configurable); reports requests/s, output tokens/s, TTFT, inter-token latency as
// the client sees it (ITL: gaps between network reads that carry content) and time per output token
// (TPOT: (last - first content) / (tokens - 1) per request) percentiles. Each level stops after --requests requests or
// --seconds seconds, whichever comes first.
//
//   node tests/server/load_test.mjs --url http://127.0.0.1:8000 [--levels 1,8,64] [--requests 128]
//        [--seconds 60] [--max-tokens 64] [--prompt-words 32] [--json]
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string', default: 'http://127.0.0.1:8000' },
    levels: { type: 'string', default: '1,8,64' },
    requests: { type: 'string', default: '128' },
    seconds: { type: 'string', default: '60' },
    'max-tokens': { type: 'string', default: '64' },
    'prompt-words': { type: 'string', default: '32' },
    'api-key': { type: 'string', default: process.env.SCR_API_KEY ?? '' },
    json: { type: 'boolean', default: false },
  },
});

const headers = { 'Content-Type': 'application/json', ...(opt['api-key'] ? { Authorization: `Bearer ${opt['api-key']}` } : {}) };
const model = (await (await fetch(`${opt.url}/v1/models`, { headers })).json()).data[0].id;
const maxTokens = Number(opt['max-tokens']);
const words = 'the quick brown fox jumps over the lazy dog while a small engine serves many clients'.split(' ');

// One streaming request; returns its timings (ms) or throws.
async function one(i) {
  const prompt = Array.from({ length: Number(opt['prompt-words']) }, (_, k) => words[(i * 7 + k) % words.length]).join(' ');
  const start = performance.now();
  const res = await fetch(`${opt.url}/v1/chat/completions`, {
    method: 'POST', headers,
    body: JSON.stringify({
      model, messages: [{ role: 'user', content: `${i}: ${prompt}` }], max_tokens: maxTokens, ignore_eos: true,
      stream: true, stream_options: { include_usage: true }, temperature: 0,
    }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const decoder = new TextDecoder();
  let buffer = '', first = 0, last = 0, usage = null;
  const gaps = [];
  for await (const bytes of res.body) {
    // Timestamps are per network read: events that arrive together are seen together.
    const now = performance.now();
    let content = false;
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const data = buffer.slice(6, end);
      buffer = buffer.slice(end + 2);
      if (data === '[DONE]') continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices?.[0]?.delta?.content) content = true;
    }
    if (content) {
      if (!first) first = now; else gaps.push(now - last);
      last = now;
    }
  }
  return { ttft: first - start, e2e: last - start, gaps, tokens: usage.completion_tokens };
}

const pct = (sorted, p) => sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(p / 100 * sorted.length))] : NaN;

async function level(concurrency) {
  const limit = Number(opt.requests), deadline = performance.now() + Number(opt.seconds) * 1000;
  let next = 0;
  const results = [], errors = [];
  const started = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < limit && performance.now() < deadline) {
      const i = next++;
      try { results.push(await one(i)); } catch (e) { errors.push(e.message); }
    }
  }));
  const wall = (performance.now() - started) / 1000;
  const ttft = results.map((r) => r.ttft).sort((a, b) => a - b);
  const itl = results.flatMap((r) => r.gaps).sort((a, b) => a - b);
  const tpot = results.filter((r) => r.tokens > 1).map((r) => (r.e2e - r.ttft) / (r.tokens - 1)).sort((a, b) => a - b);
  const tokens = results.reduce((s, r) => s + r.tokens, 0);
  return {
    concurrency, requests: results.length, errors: errors.length, first_error: errors[0], seconds: wall,
    requests_per_s: results.length / wall, output_tokens_per_s: tokens / wall,
    ttft_ms: { p50: pct(ttft, 50), p90: pct(ttft, 90), p99: pct(ttft, 99) },
    itl_ms: { p50: pct(itl, 50), p90: pct(itl, 90), p99: pct(itl, 99) },
    tpot_ms: { p50: pct(tpot, 50), p90: pct(tpot, 90), p99: pct(tpot, 99) },
  };
}

const rows = [];
for (const c of opt.levels.split(',').map(Number)) rows.push(await level(c));
if (opt.json) {
  console.log(JSON.stringify({ model, max_tokens: maxTokens, prompt_words: Number(opt['prompt-words']), levels: rows }, null, 2));
} else {
  const f = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
  console.log(`model ${model}, ${maxTokens} output tokens per request, ~${opt['prompt-words']}-word prompts`);
  console.log('| clients | requests | errors | req/s | out tok/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | TPOT p50 / p99 ms |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    console.log(`| ${r.concurrency} | ${r.requests} | ${r.errors} | ${f(r.requests_per_s)} | ${f(r.output_tokens_per_s)} | ` +
                `${f(r.ttft_ms.p50)} / ${f(r.ttft_ms.p90)} / ${f(r.ttft_ms.p99)} | ${f(r.itl_ms.p50)} / ${f(r.itl_ms.p90)} / ${f(r.itl_ms.p99)} | ` +
                `${f(r.tpot_ms.p50)} / ${f(r.tpot_ms.p99)} |`);
  }
  if (rows.some((r) => r.errors)) console.log('first error:', rows.find((r) => r.errors).first_error);
}
