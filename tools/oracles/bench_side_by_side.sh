#!/bin/sh
# Side-by-side load time and encode throughput: our tokenizer (bench/text_bench) vs @lenml/tokenizers
# (transformers.js) on the same tokenizer files and inputs, in one run. CPU time on both sides.
#   tools/oracles/bench_side_by_side.sh BUILD_DIR      (BUILD_DIR configured with -DSCR_BENCH=ON)
# Inputs: "prose" = the English prose / code / markup items of tests/text/corpus/texts.json;
#         "hard"  = the whole corpus (scripts, emoji, 1000-char words, ...).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$1
corpus=$here/../../tests/text/corpus/texts.json
out=$(mktemp -d)
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); json.dump(t[:13]*20, open(sys.argv[2],'w'))" "$corpus" "$out/prose.json"
cp "$corpus" "$out/hard.json"
for input in prose hard; do
  for m in llama3_2 qwen3 gemma3 llama2; do
    node "$here/oracle.mjs" bench "$m" "$out/$input.json" 3 | sed "s/^{/{\"input\":\"$input\",/" >> "$out/js.jsonl"
  done
  SCR_TEXT_BENCH_CORPUS="$out/$input.json" "$build/bench/text_bench" --benchmark_filter='^(load|encode)/' \
    --benchmark_min_time=1 --benchmark_format=json > "$out/cpp_$input.json" 2>/dev/null
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'input':<6} {'model':<9} {'load ms ours':>12} {'load ms JS':>11} {'encode MB/s ours':>17} {'encode MB/s JS':>15} {'ratio':>7}")
for line in open(f"{out}/js.jsonl"):
    r = json.loads(line)
    size = sum(len(t.encode()) for t in json.load(open(f"{out}/{r['input']}.json")))
    cpp = {b["name"]: b for b in json.load(open(f"{out}/cpp_{r['input']}.json"))["benchmarks"]}
    load = cpp[f"load/{r['name']}"]["cpu_time"]
    enc = cpp[f"encode/{r['name']}"]
    mbs = size / (enc["cpu_time"] / 1e3) / 1e6  # encode cpu_time is in ms per pass over the input
    print(f"{r['input']:<6} {r['name']:<9} {load:>12.1f} {r['load_ms']:>11.1f} {mbs:>17.2f} {r['mb_per_s']:>15.2f} {mbs / r['mb_per_s']:>6.1f}x")
PY
rm -rf "$out"
