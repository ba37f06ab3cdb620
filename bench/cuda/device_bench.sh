#!/bin/bash
# Issue #6's benchmark table in one call on the GPU machine (docs/CUDA.md, "Benchmark run"):
#   OUT=$OUT bash bench/cuda/device_bench.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr (with its `cuda-bench` command) of a CUDA build holding llama-3.2-1b, llama-3.1-8b and
# qwen3-30b-a3b (bf16), packed by tests/cuda/pack_carry.sh. Random bf16 checkpoints of the three
# shapes are made on the machine (`scr make-random`, into /dev/shm: the disk is 64 GB), then, most
# important first, each step under `timeout` and a whole-run deadline (BENCH_BUDGET_S, default 500 s,
# to stay under 9 minutes of machine time with the start):
#
#   step (expected s / cap s)                                     what
#   probe            (2 / 10)    GPU, memory, /dev/shm, python packages, node
#   linear           (10 / 60)   scr_cuda_linear --no-bench, when the carry holds it
#   make_random_1b   (3 / 30)    2.5 GB checkpoint
#   bench_1b         (15 / 60)   scr cuda-bench --prompt 128 --decode 128 --prefill 2048 --batches 1,16,64,256
#   make_random_8b   (12 / 60)   16 GB checkpoint
#   bench_8b         (35 / 90)   same flags
#   bench_8b_before  (15 / 60)   BEFORE_ENV + BEFORE_ARGS (a session's A/B; default SCR_CUDA_ATTN_SPLIT=0, batch 1 and 4); warm-file start-up
#   bench_1b_before  (8 / 40)    the same for the 1B
#   bench_1b_warm    (8 / 40)    warm-file start-up of the 1B, B=64 again
#   ncu_mma_b16, ncu_attn_b64 (20 / 40 each)  Nsight Compute sections of one launch each (NCU_DETAIL=0: skip)
#   serve_1b         (25 / 60)   scr serve + serve_load.py, 1/16/64 clients, 128-token prompts, 128 out
#   serve_8b         (40 / 75)   same
#   peers_1b         (60 / 100)  transformers: prefill 2k, batch 64 eager, batch 1 eager, batch 1 compiled
#   peers_8b         (90 / 120)  same (torch.compile takes 22-53 s at its first call, facts.md)
#   make_random_30b  (50 / 120)  61 GB checkpoint, after the 8B folder is deleted
#   bench_30b        (40 / 90)   --prompt 64 --decode 64 --prefill 2048 (PREFILL_30B) --batches 16,64
#   peers_30b        (- / 100)   transformers eager (prefill 512, batch 1): only if >= 150 s are left
#   summary          (1 / 15)    bench/cuda/bench_summary.py -> $OUT/summary.md
# Every log is written straight under $OUT/logs (what a cut-short run did still comes back).
set -u
CARRY=${1:-.cudab-carry}
OUT=${OUT:-/tmp/scr-bench-out}
BUDGET=${BENCH_BUDGET_S:-500}
LOGS=$OUT/logs
mkdir -p "$LOGS"
exec > >(tee -a "$OUT/device_bench.log") 2>&1
C=/tmp/scr-cuda-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # cuBLAS(Lt) is there
command -v ncu > /dev/null || export PATH=$PATH:/usr/local/cuda/bin  # Nsight Compute (ncu_* steps)
export PYTHONUNBUFFERED=1
export SCR_HUGE_PAGES=0  # the CUDA target uploads from the file mapping; a huge-page copy of 61 GB would not fit beside /dev/shm
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
SCR=$C/scr
BENCH="$C/scr cuda-bench"
CFG=models/configs
summary=()
note() { summary+=("$1"); echo "== $1"; }
left() { echo $((BUDGET - SECONDS)); }
# step NAME CAP CMD...: runs CMD under timeout min(CAP, time left - 10), output to $LOGS/NAME.txt.
step() {
    local name=$1 cap=$2; shift 2
    local limit=$(( $(left) - 10 ))
    [ "$limit" -gt "$cap" ] && limit=$cap
    if [ "$limit" -lt 5 ]; then note "$name: SKIPPED (no time left)"; return 1; fi
    local t0=$SECONDS
    echo "==== $name (limit $limit s): $*" > "$LOGS/$name.txt"
    timeout -k 5 "$limit" "$@" >> "$LOGS/$name.txt" 2>&1
    local rc=$?
    tail -n 8 "$LOGS/$name.txt"
    note "$name: rc=$rc ($((SECONDS - t0)) s)$([ $rc = 124 ] && echo ' TIMED OUT')"
    return $rc
}
# A folder for a checkpoint of BYTES: /dev/shm when it has room, else /tmp, else nothing.
room_for() {
    local bytes=$1 d
    for d in /dev/shm /tmp; do
        if [ "$(df -B1 --output=avail "$d" 2>/dev/null | tail -1)" -gt "$bytes" ] 2>/dev/null; then echo "$d"; return 0; fi
    done
    return 1
}
have() { [ -f "$1/model.safetensors" ]; }
# serve NAME MODEL_DIR CAP: scr serve in the background, the load generator against it, then stop it.
serve() {
    local name=$1 dir=$2 cap=$3 port=8123
    have "$dir" || { note "$name: SKIPPED (no checkpoint in $dir)"; return 1; }
    python3 bench/cuda/serve_load.py tokenizer "$dir" > /dev/null || { note "$name: cannot write a tokenizer"; return 1; }
    $SCR serve "$dir" --port $port --max-model-len 4096 --kv-cache-memory 8GiB --max-num-seqs 64 \
        > "$LOGS/${name}_server.txt" 2>&1 &
    local pid=$!
    step "$name" "$cap" python3 bench/cuda/serve_load.py load --url http://127.0.0.1:$port --server-pid $pid \
        --levels 1,16,64 --max-tokens 128 --prompt-tokens 128 --requests-per-client 2 --min-requests 4 --seconds 20 \
        --vocab "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$dir/config.json")" \
        --label "$name" --json
    kill -TERM $pid 2>/dev/null  # drains, then exits
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    tail -n 3 "$LOGS/${name}_server.txt"
}
# peers NAME MODEL_DIR CAP ARGS...: the PyTorch peer on the same folder.
peers() {
    local name=$1 dir=$2 cap=$3; shift 3
    have "$dir" || { note "$name: SKIPPED (no checkpoint in $dir)"; return 1; }
    step "$name" "$cap" python3 bench/cuda/peers_torch.py "$dir" "$@"
}

# ---- probe (what the machine has; nothing here can fail the run)
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
    nproc; free -g | head -2; df -h /dev/shm /tmp . | sed 's/^/  /'
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    for m in aiohttp httpx numpy safetensors accelerate; do python3 -c "import $m; print('$m', getattr($m, '__version__', '?'))" 2>&1 | tail -1; done
    command -v node >/dev/null && echo "node $(node --version)" || echo "node: absent (serve_load.py needs none)"
} > "$LOGS/probe.txt" 2>&1
cat "$LOGS/probe.txt"

D1=$(room_for 3000000000 || echo /tmp)/scr-l1b
D8=$(room_for 17000000000 || echo /tmp)/scr-l8b
rm -rf "$D1" "$D8"

# ---- The bf16 linears against float64 (and their batch invariance per regime), when carried
[ -x $C/scr_cuda_linear ] && step linear 60 $C/scr_cuda_linear --no-bench

# ---- Llama-3.2-1B and Llama-3.1-8B: scr cuda-bench
step make_random_1b 30 $SCR make-random $CFG/llama/llama-3.2-1b.json "$D1" --dtype bf16 &&
    step bench_1b 60 $BENCH "$D1" --prompt 128 --decode 128 --prefill 2048 --batches 1,16,64,256
step make_random_8b 60 $SCR make-random $CFG/llama/llama-3.1-8b.json "$D8" --dtype bf16 &&
    step bench_8b 90 $BENCH "$D8" --prompt 128 --decode 128 --prefill 2048 --batches 1,16,64,256
# Session 5's A/B from the same binary: the cuBLASLt path as it was (warp-per-row RMSNorm, a hi/lo
# split and closing pass per matrix), docs/CUDA.md "Session 5: batched decode". Being the second
# process on these files, its start-up line is also the warm-file start-up.
# The session's A/B, same binary (BEFORE_ENV; session 6: the batch-1 attention split off).
# BEFORE_ARGS: its cuda-bench flags (session 8: the key-per-lane prefill attention, at 2k).
BEFORE_ENV=${BEFORE_ENV:-SCR_CUDA_ATTN_SPLIT=0}
BEFORE_ARGS=${BEFORE_ARGS:---prompt 128 --decode 128 --prefill 0 --batches 4}
have "$D8" && step bench_8b_before 60 env $BEFORE_ENV $BENCH "$D8" $BEFORE_ARGS
have "$D1" && step bench_1b_before 40 env $BEFORE_ENV $BENCH "$D1" $BEFORE_ARGS
have "$D1" && step bench_1b_warm 40 $BENCH "$D1" --prompt 128 --decode 32 --prefill 0 --batches 64
# Why the 8B's B=16 step (the MMA linear) and B=64 attention sit below the bandwidth: one launch of
# each under Nsight Compute's sections (NCU_DETAIL=0 skips).
if [ "${NCU_DETAIL:-1}" = 1 ] && have "$D8" && command -v ncu > /dev/null; then
    NCU_SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
    step ncu_mma_b16 40 ncu --clock-control none --kernel-name regex:mma_linear --launch-skip 300 --launch-count 2 $NCU_SECTIONS \
        $SCR bench "$D8" --mode forward --batch 16 --input-len 16 --context 192 --iters 1
    step ncu_attn_b64 40 ncu --clock-control none --kernel-name regex:rope_attention --launch-skip 40 --launch-count 1 $NCU_SECTIONS \
        $SCR bench "$D8" --mode forward --batch 64 --input-len 16 --context 192 --iters 1
fi

# ---- through the server
serve serve_1b "$D1" 60
serve serve_8b "$D8" 75

# ---- the PyTorch peer on the same folders
peers peers_1b "$D1" 100 --label llama-3.2-1b
peers peers_8b "$D8" 120 --label llama-3.1-8b
rm -rf "$D8" "$D1"

# ---- Qwen3-30B-A3B (61 GB): fewer steps
if ! $SCR models 2>/dev/null | grep -q qwen3-30b-a3b; then
    note "30B-A3B: SKIPPED (not compiled into this scr)"
elif D30=$(room_for 62000000000); then
    D30=$D30/scr-q30b
    rm -rf "$D30"
    step make_random_30b 120 $SCR make-random $CFG/qwen3_moe/qwen3-30b-a3b.json "$D30" --dtype bf16 &&
        step bench_30b 90 $BENCH "$D30" --prompt 64 --decode 64 --prefill ${PREFILL_30B:-2048} --batches 16,64 --batch-steps 16
    if ! have "$D30"; then
        note "peers_30b: SKIPPED (no checkpoint)"
    elif [ "$(left)" -lt 150 ]; then
        note "peers_30b: SKIPPED (needs >= 150 s left for loading 61 GB into transformers; $(left) s left)"
    else
        peers peers_30b "$D30" 100 --label qwen3-30b-a3b --figures prefill,eager --prefill 512 --prompt 64 --eager-decode 16
    fi
    rm -rf "$D30"
else
    note "30B: SKIPPED (neither /dev/shm nor /tmp has 62 GB free: $(df -h --output=target,avail /dev/shm /tmp | tr '\n' ' '))"
fi

# ---- the table
python3 bench/cuda/bench_summary.py "$LOGS" > "$OUT/summary.md" 2> "$LOGS/summary_errors.txt"
echo; echo "==== steps"; printf '%s\n' "${summary[@]}"
echo; cat "$OUT/summary.md"
echo "total ${SECONDS} s"
# The run tool brings back only a few files: the logs travel as one archive.
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$LOGS"
