#!/usr/bin/env python3
"""The summary table of bench/cuda/device_bench.sh: reads the JSON lines its steps logged.

    bench_summary.py LOGS_DIR  > summary.md

bench_<m>.txt: `scr cuda-bench` ("JSON {...}": decode_ms, floor_ms from the copy bandwidth measured in the
same run, batch_tps, prefill_tps, ...); peers_<m>.txt: peers_torch.py; serve_<m>.txt: serve_load.py.
llama.cpp figures are not re-run: they are quoted from ../shared/notes/facts.md (same H200 machine,
random bf16 weights, flash-attn on, measured 2026-11-30).
"""
import glob
import json
import re
import os
import sys

MODELS = [("1b", "Llama-3.2-1B"), ("8b", "Llama-3.1-8B"), ("30b", "Qwen3-30B-A3B")]

# ../shared/notes/facts.md: llama-bench tg (batch 1), llama-batched-bench (128 prompt + 128 generated,
# decode-phase tok/s at B = 1 / 16 / 64 / 256) and llama-bench pp512 (prefill, 512 tokens, not 2k).
LLAMA_CPP = {
    "1b": {"b1": 782, "16": 7243, "64": 19135, "256": 31127, "prefill": None},
    "8b": {"b1": 208, "16": 2145, "64": 6757, "256": 13192, "prefill": 24000},
}
LLAMA_CPP_SOURCE = ("llama.cpp CUDA BF16, flash-attn: ../shared/notes/facts.md (same H200 machine, not re-run here); "
                    "batch 1 = llama-bench tg, B = 16/64/256 = llama-batched-bench decode phase, prefill = pp512")


def json_lines(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("JSON "):
                try:
                    out.append(json.loads(line[5:]))
                except json.JSONDecodeError:
                    pass
    return out


def prefill_tokens(path):
    """The prompt length of scr cuda-bench's prefill line ("prefill 2048 tokens: ..."), or None."""
    if not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"prefill (\d+) tokens", line)
            if m:
                return int(m.group(1))
    return None


def fmt(x, digits=0):
    if x is None or x != x:
        return "—"
    return f"{x:,.{digits}f}"


def ratio(a, b):
    if not a or not b:
        return "—"
    return f"{a / b:.2f}x"


def main():
    logs = sys.argv[1]
    print("## Benchmark run (bench/cuda/device_bench.sh)\n")
    for line in json_lines(os.path.join(logs, "bench_1b.txt"))[:1]:
        print(f"Ceilings measured in this run: device copy {fmt(line.get('copy_gbs'))} GB/s (read + write), "
              f"pinned host->device {fmt(line.get('h2d_gbs'), 1)} GB/s. Floor = weight bytes read per decode "
              f"token / the copy bandwidth.\n")
    print("| model | figure | scr | % of floor | transformers (this run) | scr / transformers | llama.cpp (facts.md) | scr / llama.cpp |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for key, name in MODELS:
        bench = (json_lines(os.path.join(logs, f"bench_{key}.txt")) or [None])[0]
        peers = json_lines(os.path.join(logs, f"peers_{key}.txt"))
        lcpp = LLAMA_CPP.get(key, {})
        if bench is None and not peers:
            print(f"| {name} | (no figures: see logs/bench_{key}.txt) | | | | | | |")
            continue
        bench = bench or {}

        def peer(figure, **match):
            rows = [p for p in peers if p.get("figure") == figure and "tok_s" in p
                    and all(p.get(k) == v for k, v in match.items())]
            compiled = [p for p in rows if "compile" in p.get("mode", "")]
            best = (compiled or rows or [None])[-1]
            return best

        b1 = bench.get("decode_tps")
        floor_pct = 100 * bench["floor_ms"] / bench["decode_ms"] if bench.get("decode_ms") else None
        p = peer("decode_b1")
        label = "" if p is None else (" (compiled)" if "compile" in p.get("mode", "") else " (eager)")
        print(f"| {name} | batch-1 decode, tok/s | {fmt(b1)} | {fmt(floor_pct, 1)} % | {fmt(p and p['tok_s'])}{label} | "
              f"{ratio(b1, p and p['tok_s'])} | {fmt(lcpp.get('b1'))} | {ratio(b1, lcpp.get('b1'))} |")
        for B, tps in (bench.get("batch_tps") or {}).items():
            if str(B) == "1":  # the engine's own batch-1 path: the next token drawn on the GPU, 4 bytes back
                pct = 100 * tps * bench["floor_ms"] / 1000 if bench.get("floor_ms") and tps else None
                print(f"| {name} | batch-1 decode, sampling on the GPU (the engine's path), tok/s | {fmt(tps)} | {fmt(pct, 1)} % | "
                      f"{fmt(p and p['tok_s'])}{label} | {ratio(tps, p and p['tok_s'])} | {fmt(lcpp.get('b1'))} | {ratio(tps, lcpp.get('b1'))} |")
                continue
            pb = peer("decode_batch", batch=int(B))
            print(f"| {name} | decode batch {B}, tok/s | {fmt(tps)} | | {fmt(pb and pb['tok_s'])}{' (eager)' if pb else ''} | "
                  f"{ratio(tps, pb and pb['tok_s'])} | {fmt(lcpp.get(str(B)))} | {ratio(tps, lcpp.get(str(B)))} |")
        pp = peer("prefill")
        pre = bench.get("prefill_tps")
        ours = prefill_tokens(os.path.join(logs, f"bench_{key}.txt"))  # scr's prompt length, from its log
        theirs = pp and pp.get("tokens")
        length = f" {ours or theirs}" if (ours or theirs) else ""
        if pp and ours and theirs and ours != theirs:  # not like for like: say so in the peer's cell
            length = f" {ours} (transformers: {theirs})"
        print(f"| {name} | prefill{length}, tok/s | {fmt(pre)} | | {fmt(pp and pp['tok_s'])} | "
              f"{ratio(pre, pp and pp['tok_s'])} | {fmt(lcpp.get('prefill'))}{' (pp512)' if lcpp.get('prefill') else ''} | "
              f"{ratio(pre, lcpp.get('prefill'))} |")
        if bench:
            print(f"| {name} | start-up: upload s (floor) / first token ms | {fmt(bench.get('upload_s'), 2)} "
                  f"({fmt(bench.get('upload_floor_s'), 2)}) / {fmt(bench.get('first_token_ms'))} | | | | | |")
        for p in peers:
            if p.get("error"):
                print(f"| {name} | transformers {p.get('figure')} failed | | | {p['error'][:120]} | | | |")
        comp = [p for p in peers if "compile_s" in p]
        if comp:
            print(f"| {name} | transformers compile time (first call), s | | | {fmt(comp[-1]['compile_s'], 1)} | | | |")
    print(f"\n{LLAMA_CPP_SOURCE}.\n")

    print("### Through `scr serve` (serve_load.py: streaming /v1/completions, 128-token prompts, 128 tokens out)\n")
    print("| model | clients | requests | errors | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | output tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, name in MODELS:
        for r in json_lines(os.path.join(logs, f"serve_{key}.txt")):
            print(f"| {name} | {r['clients']} | {r['requests']} | {r['errors']} | {fmt(r['ttft_ms']['p50'], 1)} / "
                  f"{fmt(r['ttft_ms']['p99'], 1)} | {fmt(r['itl_ms']['p50'], 2)} / {fmt(r['itl_ms']['p99'], 2)} | "
                  f"{fmt(r['tpot_ms']['p50'], 2)} | {fmt(r['output_tok_s'])} |")

    made = []
    for path in sorted(glob.glob(os.path.join(logs, "make_random_*.txt"))):
        with open(path, errors="replace") as f:
            made += [line.strip() for line in f if line.startswith("wrote ")]
    if made:
        print("\nRandom checkpoints (`scr make-random`): " + "; ".join(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
