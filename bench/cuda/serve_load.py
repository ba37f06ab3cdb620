#!/usr/bin/env python3
"""Load generator for `scr serve` (the Python twin of tests/server/load_test.mjs), standard library only.

Streams /v1/completions (token-id prompts of an exact length) or /v1/chat/completions from 1, 16 and
64 concurrent clients and reports, per level: TTFT p50/p99 (request sent -> first content event),
ITL p50/p99 (gaps between network reads that carry content, as the client sees them), TPOT p50
((last - first content) / (tokens - 1) per request) and total output tokens/s (all completion tokens
of the level / its wall time). Each client runs --requests-per-client requests back to back (all
clients start together, so the first TTFTs of a level include the queue of its prompts); a level
also stops starting requests after --seconds.

    serve_load.py load --url http://127.0.0.1:8000 [--levels 1,16,64] [--max-tokens 128]
                       [--prompt-tokens 128] [--vocab N] [--api completions|chat] [--json]
    serve_load.py tokenizer MODEL_DIR    # a synthetic tokenizer.json for a random-weight checkpoint

The HTTP client is asyncio streams with HTTP/1.1 chunked decoding (no aiohttp/httpx needed), so the
same file runs here and on the GPU machine. One JSON line per level is printed with --json
(prefix "JSON "), then a Markdown table.
"""
import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.parse


# ---------------------------------------------------------------------------------------------
# A minimal HTTP/1.1 client over asyncio streams.

class HttpError(Exception):
    pass


async def _read_headers(reader):
    status_line = await reader.readline()
    if not status_line:
        raise HttpError("connection closed before the status line")
    parts = status_line.decode("latin-1").split(" ", 2)
    status = int(parts[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def _body_pieces(reader, headers):
    """Yields the body as it arrives (one piece per network read, chunked encoding undone)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise HttpError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readline()  # the empty trailer line
                return
            data = await reader.readexactly(size)
            await reader.readline()  # CRLF after the chunk
            yield data
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise HttpError("connection closed inside the body")
            left -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def http_request(url, method, path, body=None, headers=None):
    """Opens a connection, sends one request; returns (status, headers, reader, writer)."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    payload = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {u.hostname}:{u.port or 80}", "Connection: close",
            "Accept: */*", f"Content-Length: {len(payload)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    status, resp_headers = await _read_headers(reader)
    return status, resp_headers, reader, writer


async def http_json(url, method, path, body=None, headers=None):
    status, h, reader, writer = await http_request(url, method, path, body, headers)
    data = b"".join([piece async for piece in _body_pieces(reader, h)])
    writer.close()
    return status, json.loads(data) if data else None


# ---------------------------------------------------------------------------------------------
# One streaming request and a level of concurrent clients.

def make_prompt(args, i):
    if args.api == "chat":
        words = "the quick brown fox jumps over the lazy dog while a small engine serves many clients".split()
        return " ".join(words[(i * 7 + k) % len(words)] for k in range(args.prompt_tokens))
    # Token ids, different from the first one on, so that no request hits another's prefix cache.
    rng = random.Random(1000 + i)
    hi = max(args.vocab - 1, 300)
    return [rng.randrange(256, hi) for _ in range(args.prompt_tokens)]


async def one_request(args, model, i):
    prompt = make_prompt(args, i)
    body = {"model": model, "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if args.api == "chat":
        body["messages"] = [{"role": "user", "content": f"{i}: {prompt}"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    start = time.perf_counter()
    status, h, reader, writer = await http_request(args.url, "POST", path, body, headers)
    try:
        if status != 200:
            text = b"".join([p async for p in _body_pieces(reader, h)]).decode(errors="replace")
            raise HttpError(f"HTTP {status}: {text[:300]}")
        buffer, first, last, usage, gaps, events = "", 0.0, 0.0, None, [], 0
        async for piece in _body_pieces(reader, h):
            now = time.perf_counter()  # per network read: events that arrive together are seen together
            buffer += piece.decode("utf-8", errors="replace")
            content = False
            while True:
                end = buffer.find("\n\n")
                if end < 0:
                    break
                event, buffer = buffer[:end], buffer[end + 2:]
                data = "".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk.get("error"):
                    raise HttpError(str(chunk["error"].get("message", chunk["error"])))
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk.get("choices") or []:
                    if c.get("text") or (c.get("delta") or {}).get("content"):
                        content = True
                        events += 1
            if content:
                if first:
                    gaps.append(now - last)
                else:
                    first = now
                last = now
        if not first:
            raise HttpError("the stream carried no content")
        if usage is None and not args.count_events:
            raise HttpError("the stream carried no usage chunk (--count-events counts content events instead)")
        tokens = usage["completion_tokens"] if usage else events
        return {"ttft": first - start, "e2e": last - start, "gaps": gaps,
                "tokens": tokens, "prompt_tokens": (usage or {}).get("prompt_tokens", 0)}
    finally:
        writer.close()


def pct(sorted_values, p):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


async def level(args, model, clients, first_index):
    total = max(args.min_requests, clients * args.requests_per_client)
    deadline = time.perf_counter() + args.seconds
    counter = iter(range(total))
    results, errors = [], []

    async def client():
        for i in counter:
            if time.perf_counter() > deadline:
                return
            try:
                results.append(await asyncio.wait_for(one_request(args, model, first_index + i), args.request_timeout))
            except Exception as e:  # noqa: BLE001 - every failure is counted and the first one shown
                errors.append(f"{type(e).__name__}: {e}")

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - started
    ms = lambda xs: sorted(1e3 * x for x in xs)  # noqa: E731
    ttft = ms(r["ttft"] for r in results)
    itl = ms(g for r in results for g in r["gaps"])
    tpot = ms((r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1)
    tokens = sum(r["tokens"] for r in results)
    return {
        "clients": clients, "requests": len(results), "errors": len(errors),
        "first_error": errors[0] if errors else None, "seconds": round(wall, 3),
        "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in results) / max(1, len(results)), 1),
        "output_tokens": tokens, "output_tok_s": round(tokens / wall, 1),
        "ttft_ms": {"p50": round(pct(ttft, 50), 2), "p99": round(pct(ttft, 99), 2)},
        "itl_ms": {"p50": round(pct(itl, 50), 3), "p99": round(pct(itl, 99), 3)},
        "tpot_ms": {"p50": round(pct(tpot, 50), 3)},
    }


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


async def wait_ready(url, seconds, server_pid=0):
    deadline = time.perf_counter() + seconds
    while True:
        if server_pid and not alive(server_pid):
            raise SystemExit(f"serve_load: the server (pid {server_pid}) exited before {url}/health answered")
        try:
            status, _ = await http_json(url, "GET", "/health")
            if status == 200:
                return
        except (OSError, HttpError, ValueError):
            pass
        if time.perf_counter() > deadline:
            raise SystemExit(f"serve_load: {url}/health not ready after {seconds} s")
        await asyncio.sleep(0.2)


async def run_load(args):
    await wait_ready(args.url, args.ready_timeout, args.server_pid)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    status, models = await http_json(args.url, "GET", "/v1/models", headers=headers)
    if status != 200:
        raise SystemExit(f"serve_load: GET /v1/models -> {status}: {models}")
    model = models["data"][0]["id"]
    if args.warmup:  # first requests pay for lazy work (graph capture per batch bucket)
        await level(argparse.Namespace(**{**vars(args), "max_tokens": 4}), model, 1, 10**6)
    rows, first_index = [], 0
    for c in [int(x) for x in args.levels.split(",")]:
        r = await level(args, model, c, first_index)
        first_index += 100000
        r.update({"model": model, "label": args.label, "api": args.api, "max_tokens": args.max_tokens})
        rows.append(r)
        if args.json:
            print("JSON " + json.dumps(r), flush=True)
    f = lambda x: "-" if x != x else f"{x:.1f}"  # noqa: E731 - NaN prints as "-"
    print(f"model {model} ({args.label}), {args.api}, {args.max_tokens} output tokens per request, "
          f"prompt {args.prompt_tokens} {'words' if args.api == 'chat' else 'tokens'}")
    print("| clients | requests | errors | out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['clients']} | {r['requests']} | {r['errors']} | {f(r['output_tok_s'])} | "
              f"{f(r['ttft_ms']['p50'])} / {f(r['ttft_ms']['p99'])} | {r['itl_ms']['p50']:.2f} / {r['itl_ms']['p99']:.2f} | "
              f"{r['tpot_ms']['p50']:.2f} |")
    bad = [r for r in rows if r["errors"]]
    if bad:
        print("first error:", bad[0]["first_error"])
    return 1 if bad or any(r["requests"] == 0 for r in rows) else 0


# ---------------------------------------------------------------------------------------------
# A synthetic tokenizer for random-weight checkpoints (which have none, and `scr serve` needs one).

def bytes_to_unicode():
    """GPT-2's byte -> printable character table (ByteLevel pre-tokenizer/decoder)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def synthetic_tokens(vocab_size):
    """The synthetic vocabulary in id order (byte-level strings): ids 0-255 are the bytes, every
    other id the word " w<id>" (\u0120 is the byte-level space). bench/make_gguf.py --vocab words
    writes the same list into a GGUF for llama-server."""
    byte_chars = bytes_to_unicode()
    return [byte_chars[b] for b in range(256)] + [f"\u0120w{i}" for i in range(256, vocab_size)]


def write_tokenizer(model_dir):
    """Byte-level BPE: ids 0-255 are the bytes (any text encodes, one token per byte: no merges),
    every other id of the config's vocabulary is the word " w<id>", so each generated token
    decodes to visible text of its own (one content event per token)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vocab_size = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    vocab = {t: i for i, t in enumerate(synthetic_tokens(vocab_size))}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": template, "model_max_length": cfg.get("max_position_embeddings", 4096)}, f)
    print(f"wrote {model_dir}/tokenizer.json ({vocab_size} tokens, synthetic byte-level BPE)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="write a synthetic tokenizer.json into a random-weight model folder")
    t.add_argument("model_dir")
    lo = sub.add_parser("load", help="run the load levels against a running server")
    lo.add_argument("--url", default="http://127.0.0.1:8000")
    lo.add_argument("--levels", default="1,16,64")
    lo.add_argument("--requests-per-client", type=int, default=2)
    lo.add_argument("--min-requests", type=int, default=4, help="at least this many requests per level")
    lo.add_argument("--seconds", type=float, default=30, help="no new request starts after this (per level)")
    lo.add_argument("--request-timeout", type=float, default=120)
    lo.add_argument("--ready-timeout", type=float, default=60, help="wait this long for /health")
    lo.add_argument("--server-pid", type=int, default=0, help="stop waiting for /health when this process is gone")
    lo.add_argument("--max-tokens", type=int, default=128)
    lo.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (chat: words)")
    lo.add_argument("--vocab", type=int, default=256, help="token ids of the prompts are drawn below this")
    lo.add_argument("--api", choices=["completions", "chat"], default="completions")
    lo.add_argument("--api-key", default=os.environ.get("SCR_API_KEY", ""))
    lo.add_argument("--label", default="")
    lo.add_argument("--no-warmup", dest="warmup", action="store_false")
    lo.add_argument("--json", action="store_true")
    lo.add_argument("--count-events", action="store_true",
                    help="a stream without a usage chunk counts its content events as tokens (servers that send none)")
    args = p.parse_args()
    if args.cmd == "tokenizer":
        write_tokenizer(args.model_dir)
        return 0
    return asyncio.run(run_load(args))


if __name__ == "__main__":
    sys.exit(main())
