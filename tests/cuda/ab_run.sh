#!/bin/bash
# The CUDA target's decode options side by side, in one call on the GPU machine (docs/CUDA.md):
#   tests/cuda/ab_run.sh CARRY_DIR [8b]
# Kernel checks first (scr_cuda_linear: bf16 linears vs float64 + batch invariance), then
# scr cuda-bench on a random Llama-3.2-1B with each switch flipped: the defaults (GEMV at 1-8
# rows, MMA linear at 9-256, cuBLASLt above; programmatic dependent launch), SCR_CUDA_PDL=0,
# SCR_CUDA_LINEAR=mma (MMA from 1 row), SCR_CUDA_LINEAR=simt + SCR_CUDA_PREFILL=wmma (no MMA linear,
# no cuBLASLt); an Nsight Compute per-kernel timing of decode steps; with "8b", a random
# Llama-3.1-8B too. Logs to $OUT.
set -u
CARRY=${1:-.cuda-carry}
OUT=${OUT:-/tmp/scr-cuda-out}
LOGS=/tmp/scr-cuda-logs
mkdir -p "$OUT" "$LOGS"
C=/tmp/scr-cuda-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 SCR_REQUIRE_GPU=1
command -v ncu >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
step() {  # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    tail -n 8 "$LOGS/$name.txt"
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
    echo "== $name: rc=$rc"
    { echo "==== $name: $* -> rc=$rc"; cat "$LOGS/$name.txt"; } >> "$OUT/ab_run.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
B="--prompt 128 --decode 128 --prefill 2048 --batches 16,64,256"
[ -x $C/scr_cuda_linear ] && step linear 120 $C/scr_cuda_linear
[ -x $C/scr_cuda_linear ] && step linear_prefill_mma 120 env SCR_CUDA_PREFILL=mma $C/scr_cuda_linear
[ -x $C/scr_cuda_linear ] && step linear_cublas9 120 env SCR_CUDA_CUBLAS_MIN_ROWS=9 $C/scr_cuda_linear
step make_random_1b 90 $C/scr make-random models/configs/llama/llama-3.2-1b.json /tmp/l1b --dtype bf16
step bench_1b 120 $C/scr cuda-bench /tmp/l1b $B
step bench_1b_cublas9 120 env SCR_CUDA_CUBLAS_MIN_ROWS=9 $C/scr cuda-bench /tmp/l1b $B
step bench_1b_cublas33 120 env SCR_CUDA_CUBLAS_MIN_ROWS=33 $C/scr cuda-bench /tmp/l1b $B
step fixtures_bf16 60 python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 tests/fixtures/LlamaForCausalLM tests/fixtures/Qwen3ForCausalLM tests/fixtures/long/LlamaForCausalLM
[ -x $C/scr_cuda_tests ] && step gtest 120 $C/scr_cuda_tests
# Per-kernel GPU time of decode steps (kernel replay, clocks as found): the 4th step's kernels.
step ncu_decode 150 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
    --launch-skip 200 --launch-count 110 $C/scr complete /tmp/l1b --ids 1,2,3,4,5,6,7,8 --max-tokens 6 --temperature 0
cp "$LOGS/ncu_decode.txt" "$OUT/ncu_decode.csv" 2>/dev/null
if [ "${2:-}" = 8b ]; then
    step make_random_8b 200 $C/scr make-random models/configs/llama/llama-3.1-8b.json /dev/shm/l8b --dtype bf16
    step bench_8b 180 $C/scr cuda-bench /dev/shm/l8b --prompt 128 --decode 64 --prefill 2048 --batches 16,64
    step bench_8b_cublas9 120 env SCR_CUDA_CUBLAS_MIN_ROWS=9 $C/scr cuda-bench /dev/shm/l8b --prompt 128 --decode 16 --prefill 0 --batches 16,64
fi
echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
grep -h "batch-1\|of which\|^decode batch\|^prefill\|worst\|FAILED\|passed\|fixtures match\|rel_err" "$LOGS"/*.txt | head -80
