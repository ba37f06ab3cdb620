#!/usr/bin/env bash
# Side by side in ONE run: our `scr bench --mode forward` (random-weight Llama-3.2-1B, bf16, 2
# threads, with and without the huge-page copy) and llama.cpp's `llama-bench -t 2 -p 128 -n 64` on
# the same weights as GGUF (BF16 and, made from it by llama-quantize, Q8_0 and Q4_0), with the
# streaming-read floor measured in the same run. Prints a table of tokens/s and ratios.
#
#   bench/compare_llamacpp.sh [SCR_BINARY] [LLAMA_BIN_DIR] [WORK_DIR]
#
# SCR_BINARY: a build with -DSCR_MODELS=llama-3.2-1b -DSCR_QUANT=bf16 (default build-perf-1b/scr).
# LLAMA_BIN_DIR: a CPU build of llama.cpp holding llama-bench and llama-quantize (default
# /work/llamacpp-build/bin). This script does not build llama.cpp; build it outside the repo. On a
# VM whose CPU lists AMX but whose kernel does not grant it, a -DGGML_NATIVE=ON build dies with
# SIGILL in the AMX Q8_0/Q4_0 prefill kernel: build with -DGGML_NATIVE=OFF and the AVX-512 flags
# (docs/PERF.md has the exact line).
# WORK_DIR (default /tmp/scr-compare) receives the model folder and the GGUF files (~7 GB), made
# once and reused. Environment: ROUNDS (default 1; with more, each configuration runs ROUNDS times,
# interleaved, and the best is kept, since other work on the machine only ever slows a run down);
# REPS (default 3): llama-bench repetitions.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
scr=${1:-$here/build-perf-1b/scr}
llama=${2:-/work/llamacpp-build/bin}
work=${3:-/tmp/scr-compare}
rounds=${ROUNDS:-1}
reps=${REPS:-3}
config=$here/models/configs/llama/llama-3.2-1b.json
mkdir -p "$work"
for f in "$scr" "$llama/llama-bench" "$llama/llama-quantize"; do
  [[ -x $f ]] || { echo "compare_llamacpp: $f is missing (see the header of this script)" >&2; exit 2; }
done

# The same random weights for both engines.
[[ -f $work/l1b/model.safetensors ]] || "$scr" make-random "$config" "$work/l1b" --dtype bf16
[[ -f $work/l1b-bf16.gguf ]] || python3 "$here/bench/make_gguf.py" "$config" "$work/l1b-bf16.gguf" --from "$work/l1b"
for q in Q8_0 Q4_0; do
  lq=$(echo $q | tr A-Z a-z)
  [[ -f $work/l1b-$lq.gguf ]] || "$llama/llama-quantize" "$work/l1b-bf16.gguf" "$work/l1b-$lq.gguf" $q 2 > "$work/quantize-$lq.log" 2>&1
done

# Our quantized presets beside llama.cpp's Q8_0/Q4_0, when this scr has them compiled in.
quants=""
for q in int8 mlx-int4-g64; do
  if "$scr" models | grep -qw "$q"; then
    quants="$quants $q"
    [[ -f $work/l1b-$q/model.safetensors ]] || "$scr" quantize "$work/l1b" "$work/l1b-$q" --preset "$q" 2>/dev/null
  fi
done

log=$work/run-$(date -u +%Y%m%dT%H%M%SZ).log
load() { cut -d' ' -f1-3 /proc/loadavg; }
{
  echo "# $(date -u) $(uname -n) $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "# transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
  echo "# scr: $scr ($(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet || echo +dirty)); llama.cpp: $llama"
} | tee "$log"
for round in $(seq "$rounds"); do
  for hp in --no-huge-pages --huge-pages; do
    echo "## load $(load) scr bench $hp (round $round)" | tee -a "$log"
    "$scr" bench "$work/l1b" --mode forward --threads 2 --input-len 128 --context 32 --iters 5 $hp 2>&1 | tee -a "$log"
  done
  for q in $quants; do
    echo "## load $(load) scr bench $q --huge-pages (round $round)" | tee -a "$log"
    echo "size $(stat -c %s "$work/l1b-$q/model.safetensors")" | tee -a "$log"
    "$scr" bench "$work/l1b-$q" --mode forward --threads 2 --input-len 128 --context 32 --iters 5 --huge-pages 2>&1 | tee -a "$log"
  done
  for w in bf16 q8_0 q4_0; do
    echo "## load $(load) llama-bench $w (round $round)" | tee -a "$log"
    "$llama/llama-bench" -m "$work/l1b-$w.gguf" -t 2 -p 128 -n 64 -r "$reps" -o csv 2>/dev/null | tee -a "$log" \
      || echo "llama-bench $w failed (exit ${PIPESTATUS[0]})" | tee -a "$log"
  done
done
echo "## load $(load) end" | tee -a "$log"

python3 - "$log" <<'EOF'
import csv, io, re, sys
text = open(sys.argv[1]).read()
best = {}
def keep(key, v):
    best[key] = max(best.get(key, 0.0), v)
loads = [float(m) for m in re.findall(r"^## load (\S+)", text, re.M)]
for block in re.split(r"^## ", text, flags=re.M)[1:]:
    head = block.splitlines()[0]
    if " scr bench " in head:
        words = head.split()
        q = words[words.index("bench") + 1]
        if not q.startswith("--"):  # a quantized preset: huge pages, its own byte count
            for pat, key in [(r"prefill \d+ tokens .*?: ([\d.]+) tokens/s", "pp"), (r"decode batch 1 .*?: ([\d.]+) tokens/s", "tg")]:
                m = re.search(pat, block)
                if m: keep(("scrq", q, key), float(m.group(1)))
            m = re.search(r"^size (\d+)", block, re.M)
            if m: best[("scrq", q, "bytes")] = float(m.group(1))
            continue
        hp = "huge" if "--huge-pages" in head else "4k"
        for pat, key in [(r"prefill \d+ tokens .*?: ([\d.]+) tokens/s", "pp"), (r"decode batch 1 .*?: ([\d.]+) tokens/s", "tg"),
                         (r"memory read bandwidth .*?: ([\d.]+) GB/s", "bw_anon"), (r"weight read bandwidth .*?: ([\d.]+) GB/s", "bw_w")]:
            m = re.search(pat, block)
            if m: keep(("scr", hp, key), float(m.group(1)))
    elif " llama-bench " in head:
        words = head.split()
        w = words[words.index("llama-bench") + 1]
        rows = [l for l in block.splitlines()[1:] if l.strip()]
        for r in csv.DictReader(io.StringIO("\n".join(rows))):
            key = "pp" if int(r["n_prompt"]) > 0 else "tg"
            keep(("llama", w, key), float(r["avg_ts"]))
            keep(("llama", w, "bytes"), float(r["model_size"]))
wb = 2471763968  # bf16 weight bytes read per decode step (scr info)
print()
print(f"load average (1 min) during the run: {min(loads):.1f} to {max(loads):.1f}")
print(f"streaming read, 2 threads: anonymous huge pages {best.get(('scr','huge','bw_anon'),0):.1f} GB/s; "
      f"the model's weight pages: 4 KiB file mapping {best.get(('scr','4k','bw_w'),0):.1f} GB/s, "
      f"huge-page copy {best.get(('scr','huge','bw_w'),0):.1f} GB/s")
floor_hp = best.get(("scr", "huge", "bw_w"), 0) * 1e9 / wb
floor_4k = best.get(("scr", "4k", "bw_w"), 0) * 1e9 / wb
print()
print("| engine, weights | bytes/token | pp128 tok/s | tg tok/s | tg vs floor (same pages) | tg vs llama.cpp same format |")
print("|---|---:|---:|---:|---:|---:|")
lt = best.get(("llama", "bf16", "tg"), 0)
for hp, name, fl in [("4k", "scr bf16, 4 KiB pages (file mapping)", floor_4k), ("huge", "scr bf16, huge-page copy", floor_hp)]:
    pp, tg = best.get(("scr", hp, "pp"), 0), best.get(("scr", hp, "tg"), 0)
    print(f"| {name} | {wb/1e9:.2f} GB | {pp:.1f} | {tg:.2f} | {tg/fl if fl else 0:.0%} | {tg/lt if lt else 0:.2f}x |")
for q, peer in [("int8", "q8_0"), ("mlx-int4-g64", "q4_0")]:
    by = best.get(("scrq", q, "bytes"), 0)
    if not by: continue
    pp, tg = best.get(("scrq", q, "pp"), 0), best.get(("scrq", q, "tg"), 0)
    fl = best.get(("scr", "huge", "bw_w"), 0) * 1e9 / by
    lt_q = best.get(("llama", peer, "tg"), 0)
    print(f"| scr {q}, huge-page copy | {by/1e9:.2f} GB | {pp:.1f} | {tg:.2f} | {tg/fl if fl else 0:.0%} | {tg/lt_q if lt_q else 0:.2f}x vs {peer.upper()} |")
for w in ["bf16", "q8_0", "q4_0"]:
    pp, tg, by = best.get(("llama", w, "pp"), 0), best.get(("llama", w, "tg"), 0), best.get(("llama", w, "bytes"), 0)
    # llama-bench maps the GGUF (load_mode mmap): its pages are 4 KiB page-cache pages.
    fl = best.get(("scr", "4k", "bw_w"), 0) * 1e9 / by if by else 0
    print(f"| llama.cpp {w.upper()} (mmap, 4 KiB pages) | {by/1e9:.2f} GB | {pp:.1f} | {tg:.2f} | {tg/fl if fl else 0:.0%} | - |")
EOF
echo "log: $log"
