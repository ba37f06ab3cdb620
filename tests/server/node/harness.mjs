// Starts a server process for the client tests and reads its state back.
//   SCR_SERVE_CMD   the binary: `scr` (with SCR_SERVE_ARGS="serve [MODEL]") or scr_fake_serve
//   SCR_SERVE_KIND  "model" (a real model: outputs are checked for shape) or "scripted" (the scripted
//                   engine of tests/server/fake_model.hpp: outputs are checked exactly)
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

export const KIND = process.env.SCR_SERVE_KIND ?? 'scripted';
export const SCRIPTED = KIND === 'scripted';

export async function startServer(extraArgs = [], { timeoutMs = 120_000 } = {}) {
  const cmd = process.env.SCR_SERVE_CMD;
  if (!cmd) throw new Error('SCR_SERVE_CMD is not set (see tests/server/CMakeLists.txt)');
  const baseArgs = (process.env.SCR_SERVE_ARGS ?? '').split(' ').filter(Boolean);
  const args = [...baseArgs, '--host', '127.0.0.1', '--port', '0', ...extraArgs];
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr = (stderr + d).slice(-20000); });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in ${timeoutMs} ms:\n${stderr}`)), timeoutMs);
    const lines = createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      const m = line.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    exited.then(({ code, signal }) => { clearTimeout(timer); reject(new Error(`server exited (${code ?? signal}) before listening:\n${stderr}`)); });
  });
  const url = `http://127.0.0.1:${port}`;
  const models = await (await fetch(`${url}/v1/models`, { headers: authHeaders(extraArgs) })).json();
  return {
    child, port, url, baseURL: `${url}/v1`, model: models.data[0].id, maxModelLen: models.data[0].max_model_len,
    exited, stderr: () => stderr,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
}

function authHeaders(args) {
  const i = args.indexOf('--api-key');
  return i >= 0 ? { Authorization: `Bearer ${args[i + 1]}` } : {};
}

// fetch, retried when a pooled keep-alive connection turns out closed: the server drops connections
// idle for 5 s, and a client that reuses one at that moment sees a socket error (the SDKs retry these
// too). Any other failure is thrown.
export async function fetchRetry(url, init, attempts = 3) {
  for (let i = 1; ; i++) {
    try {
      return await fetch(url, init);
    } catch (e) {
      const code = e.cause?.code;
      if (i >= attempts || !(code === 'UND_ERR_SOCKET' || code === 'ECONNRESET')) throw e;
    }
  }
}

// Prometheus text -> { 'name{labels}': value }.
export async function metrics(server) {
  const text = await (await fetchRetry(`${server.url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out[line.slice(0, at)] = Number(line.slice(at + 1));
  }
  return out;
}

// Waits until the engine runs nothing and holds no more KV blocks than at `baseline` (free count).
export async function waitIdle(server, baselineFree, { timeoutMs = 10_000 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let m;
  while (Date.now() < deadline) {
    m = await metrics(server);
    if (m.scr_num_requests_running === 0 && m.scr_num_requests_waiting === 0 &&
        m.scr_http_active_generations === 0 &&
        (baselineFree === undefined || m.scr_kv_cache_blocks_free >= baselineFree)) return m;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`server not idle after ${timeoutMs} ms: running=${m.scr_num_requests_running} ` +
                  `waiting=${m.scr_num_requests_waiting} active=${m.scr_http_active_generations} ` +
                  `free=${m.scr_kv_cache_blocks_free} baseline=${baselineFree}`);
}

// Prompt tokens the server counts for a chat conversation (its /tokenize), for usage checks.
export async function chatPromptTokens(server, messages) {
  const r = await fetchRetry(`${server.url}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages }),
  });
  return (await r.json()).count;
}

// Parses an SSE body into the JSON payloads of its data lines (and '[DONE]').
export function sseData(text) {
  return text.split('\n\n').filter(Boolean).map((block) => {
    const data = block.split('\n').find((l) => l.startsWith('data: ')).slice(6);
    return data === '[DONE]' ? data : JSON.parse(data);
  });
}
