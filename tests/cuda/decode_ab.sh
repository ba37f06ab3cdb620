#!/bin/bash
# Batch-1 decode work (issue #6) in one call on the GPU machine, old vs new paths side by side:
#   tests/cuda/decode_ab.sh CARRY_DIR [quick]
# Correctness first (scr_cuda_linear: bf16 linears vs float64, batch invariance, the GEMV variants
# bit-identical, then their batch-1 timings; scr_cuda_tests; the bf16 fixtures), then
# scr cuda-bench (or, without it, `scr bench --mode forward`) on a random Llama-3.2-1B with each switch flipped (SCR_CUDA_GEMV=row|rows, and
# SCR_CUDA_ROPE_ATTN=0: RoPE+KV append and attention as two launches), greedy tokens of all
# variants compared (the new paths keep the old arithmetic), then an Nsight Compute per-kernel CSV of decode
# steps with the defaults (and with the earlier GEMV unless "quick"). Logs to $OUT.
set -u
CARRY=${1:-.decode-carry}
OUT=${OUT:-/tmp/scr-decode-out}
LOGS=/tmp/scr-decode-logs
mkdir -p "$OUT" "$LOGS"
C=/tmp/scr-decode-bin
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
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
    echo "== $name: rc=$rc ($((SECONDS - t0)) s)"
    { echo "==== $name: $* -> rc=$rc"; cat "$LOGS/$name.txt"; } >> "$OUT/decode_ab.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -x $C/scr_cuda_linear ] && step linear 60 $C/scr_cuda_linear
grep -E "GEMV|rw<=|FAILED|INVARIANT|passed" "$LOGS/linear.txt" | head -20
step make_random_1b 60 $C/scr make-random models/configs/llama/llama-3.2-1b.json /tmp/l1b --dtype bf16
B="--prompt 128 --decode 128 --prefill 0 --batches 16,64"
if $C/scr cuda-bench --help > /dev/null 2>&1; then
step bench_new 60 $C/scr cuda-bench /tmp/l1b $B
step bench_old 60 env SCR_CUDA_GEMV=row SCR_CUDA_ROPE_ATTN=0 $C/scr cuda-bench /tmp/l1b $B
step bench_gemv_rows 60 env SCR_CUDA_GEMV=rows $C/scr cuda-bench /tmp/l1b $B
step bench_rope_attn_2launch 60 env SCR_CUDA_ROPE_ATTN=0 $C/scr cuda-bench /tmp/l1b $B
for f in new old gemv_rows rope_attn_2launch; do echo "-- $f"; grep -E "batch-1|^decode batch" "$LOGS/bench_$f.txt"; done
else  # a binary without `scr cuda-bench` (CPU-only command set): scr's bare forward benchmark
    F="bench /tmp/l1b --mode forward --input-len 16 --context 192 --iters 50"
    for b in 1 16; do
        step fwd${b}_new 60 $C/scr $F --batch $b
        step fwd${b}_old 60 env SCR_CUDA_GEMV=row SCR_CUDA_ROPE_ATTN=0 $C/scr $F --batch $b
        step fwd${b}_gemv_rows 60 env SCR_CUDA_GEMV=rows $C/scr $F --batch $b
        step fwd${b}_rope_attn_2launch 60 env SCR_CUDA_ROPE_ATTN=0 $C/scr $F --batch $b
    done
    for f in new old gemv_rows rope_attn_2launch; do echo "-- $f"; grep -h "^decode batch" "$LOGS/fwd1_$f.txt" "$LOGS/fwd16_$f.txt"; done
fi
G="complete /tmp/l1b --ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 48 --temperature 0 --json"
step greedy_new 30 $C/scr $G
step greedy_old 30 env SCR_CUDA_GEMV=row SCR_CUDA_ROPE_ATTN=0 $C/scr $G
step greedy_2launch 30 env SCR_CUDA_ROPE_ATTN=0 $C/scr $G
for f in old 2launch; do
    if cmp -s "$LOGS/greedy_new.txt" "$LOGS/greedy_$f.txt"; then echo "greedy tokens: new == $f"; else echo "greedy tokens: new != $f"; fi
done | tee -a "$OUT/decode_ab.log"
[ -x $C/scr_cuda_tests ] && step gtest 90 $C/scr_cuda_tests
step fixtures_bf16 60 python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 tests/fixtures/LlamaForCausalLM tests/fixtures/Qwen3ForCausalLM
NCU="ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --launch-skip 200 --launch-count 110"
step ncu_new 90 $NCU $C/scr complete /tmp/l1b --ids 1,2,3,4,5,6,7,8 --max-tokens 6 --temperature 0
cp "$LOGS/ncu_new.txt" "$OUT/ncu_new.csv" 2>/dev/null
if [ "${2:-}" != quick ]; then
    step ncu_old 90 env SCR_CUDA_GEMV=row SCR_CUDA_ROPE_ATTN=0 $NCU $C/scr complete /tmp/l1b --ids 1,2,3,4,5,6,7,8 --max-tokens 6 --temperature 0
    cp "$LOGS/ncu_old.txt" "$OUT/ncu_old.csv" 2>/dev/null
fi
echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
grep -h "of which\|FAILED\|PASSED\|passed\|fixtures match\|rel_err\|differs\|NOT BATCH" "$LOGS"/*.txt | head -40
