#!/bin/bash
# The bf16 linears' regime boundary (kernels/cuda/linear.cuh: kMmaMinRows, GEMV at 1-2 rows, MMA
# linear at 3-32) against the earlier boundary and the MMA linear from one row, interleaved, on the
# GPU machine, for random bf16 checkpoints of the real shapes (and their MLX int4 g64 quantization):
#   OUT=$OUT [MODELS="8b 1b"] [VARIANTS="default SCR_CUDA_LINEAR=gemv-to-8 SCR_CUDA_LINEAR=mma"]
#       [BATCHES=1,2,3,4,6,8,16] [PROMPT=128] [ROUNDS=2] [QUANT=1] [CHECKS=1] [NCU=0] \
#       bash tests/cuda/regime_ab.sh CARRY_DIR [TINY_CARRY_DIR]
# CARRY_DIR/bin.tar.xz: scr of a CUDA build with those models x bf16 (and mlx-int4-g64 for QUANT=1;
# tests/cuda/pack_carry.sh). With TINY_CARRY_DIR (a build with the tiny test models) and CHECKS=1,
# first scr_cuda_linear (each regime's batch invariance), scr_cuda_attention and scr_cuda_tests,
# and at the end the batch, run-ahead and engine gtests under memcheck.
# Per model, round and variant: `scr cuda-bench --prompt P --decode 64 --prefill 0 --batches B`,
# one line of decode tok/s per batch (sampling on the GPU). NCU=1: Nsight Compute's full set on one
# 8B gate/up and one down MMA-linear launch at batch 4 (ncu_digest of tests/cuda/device_lib.sh).
set -u
export OUT=${OUT:-/tmp/scr-regime-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
if [ -n "${2:-}" ] && [ "${CHECKS:-1}" = 1 ]; then
    device_unpack "$2" /tmp/scr-regime-tiny
    T=$C
    step linear 240 $T/scr_cuda_linear --no-bench
    grep -E "FAILED|NOT BATCH|differs|rows +(1|2|3|8|9|33):|passed|failed" "$OUT/linear.txt" | head -40
    step attention 300 $T/scr_cuda_attention --no-bench
    grep -E "^FAIL|parts|all attention" "$OUT/attention.txt"
    step gtest 300 $T/scr_cuda_tests
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" "$OUT/gtest.txt" | head -40
fi
device_unpack "$1" /tmp/scr-regime-bin
S=$C
line() {  # line KEY: the decode rows of step KEY's log on one line
    echo "$1 | $(grep -E '^decode batch +[0-9]+:' "$OUT/$1.txt" | sed -E 's/^decode batch +([0-9]+): ([0-9]+) tok\/s sampling on the GPU \(([0-9]+) run ahead\).*/\1: \2 (\3)/' | tr '\n' ' ')"
}
for m in ${MODELS:-8b 1b}; do
    make_model $m
    [ "${QUANT:-1}" = 1 ] && step quant_$m 300 $S/scr quantize "$M" "$M-int4" --preset mlx-int4-g64
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for v in ${VARIANTS:-default SCR_CUDA_LINEAR=gemv-to-8 SCR_CUDA_LINEAR=mma}; do
            k=${m}_${v##*=}_r$r
            e=; [ "$v" = default ] || e=$v
            step b_$k 200 env $e $S/scr cuda-bench $M --prompt ${PROMPT:-128} --decode 64 --prefill 0 --batches ${BATCHES:-1,2,3,4,6,8,16}
            line b_$k
        done
        if [ "${QUANT:-1}" = 1 ] && [ -d "$M-int4" ]; then
            step q_${m}_r$r 200 $S/scr cuda-bench $M-int4 --prompt ${PROMPT:-128} --decode 64 --prefill 0 --batches ${BATCHES:-1,2,3,4,6,8,16}
            line q_${m}_r$r
        fi
    done
    if [ "${NCU:-0}" = 1 ] && [ $m = 8b ]; then
        # One launch each of the 8B's gate/up (SwiGLU + norm) and down MMA linears at batch 4, full set.
        for kn in "gateup:mma_linear_kernel<4096, 1, true, true>" "down:mma_linear_kernel<14336, 1, false, false>"; do
            key=${m}_${kn%%:*}
            timeout 240 ncu --kernel-name-base demangled --kernel-name "regex:${kn#*:}" --launch-skip 40 --launch-count 1 \
                --clock-control none --set full --import-source no -o /tmp/scr-ncu-$key -f \
                $S/scr cuda-bench $M --prompt 128 --decode 16 --prefill 0 --batches 4 > "$OUT/ncu_run_$key.txt" 2>&1
            echo "==== ncu $key rc=$?"
            ncu_digest /tmp/scr-ncu-$key $key
        done
    fi
    rm -rf "$M" "$M-int4"
done
if [ -n "${2:-}" ] && [ "${CHECKS:-1}" = 1 ]; then
    step memcheck_engine 300 compute-sanitizer --tool memcheck --error-exitcode 9 $T/scr_cuda_tests --gtest_filter='CudaBatch.*:CudaRunAhead.*:CudaEngine.*'
    grep -h "ERROR SUMMARY" "$OUT/memcheck_engine.txt"
fi
printf '%s\n' "${summary[@]}"
