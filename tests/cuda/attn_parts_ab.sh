#!/bin/bash
# The decode attention's context split (kernels/cuda/attention.cuh, SCR_CUDA_ATTN_PARTS) on and off,
# interleaved, on the GPU machine, for random bf16 checkpoints of the real shapes:
#   OUT=$OUT [MODELS="8b 1b"] [PROMPTS="128 2048 8192"] [BATCHES=1,4,16] [ROUNDS=2] \
#       [CHECKS=1] bash tests/cuda/attn_parts_ab.sh CARRY_DIR [TINY_CARRY_DIR]
# CARRY_DIR/bin.tar.xz: scr of a CUDA build with those models (tests/cuda/pack_carry.sh). With
# TINY_CARRY_DIR (a build with the tiny test models) and CHECKS=1, first scr_cuda_attention and
# scr_cuda_tests, and at the end scr_cuda_attention under memcheck and racecheck, and the batch,
# run-ahead and engine gtests under memcheck.
# Per model, prompt, round and variant: `scr cuda-bench --prompt P --decode 128 --prefill 0
# --batches B`; one line each: the batch-1 latency after the whole prompt, then the batch rows
# (cuda-bench's batch phase takes at most the compiled step's 2,048 prompt tokens).
set -u
export OUT=${OUT:-/tmp/scr-parts-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
if [ -n "${2:-}" ] && [ "${CHECKS:-1}" = 1 ]; then
    device_unpack "$2" /tmp/scr-parts-tiny
    T=$C
    step attention 300 $T/scr_cuda_attention --no-bench
    grep -E "^FAIL|parts|all attention" "$OUT/attention.txt"
    step gtest 300 $T/scr_cuda_tests
    grep -E "^\[  (PASSED|FAILED) " "$OUT/gtest.txt"
fi
device_unpack "$1" /tmp/scr-parts-bin
for m in ${MODELS:-8b 1b}; do
    make_model $m
    for p in ${PROMPTS:-128 2048 8192}; do
        for r in $(seq 1 "${ROUNDS:-2}"); do
            for parts in 4 1; do
                k=${m}_p${p}_parts${parts}_r$r
                step b_$k 150 env SCR_CUDA_ATTN_PARTS=$parts $C/scr cuda-bench $M --prompt $p --decode 128 --prefill 0 --batches ${BATCHES:-1,4,16}
                echo "$k | $(grep -E '^batch-1' "$OUT/b_$k.txt" | sed 's/; floor.*//') | $(grep -E '^decode batch +[0-9]+:' "$OUT/b_$k.txt" | sed -E 's/ sampling on the GPU \(([0-9]+) run ahead\).*/ (\1 ahead)/; s/^decode batch +//' | tr '\n' ' ')"
            done
        done
    done
    rm -rf "$M"
done
if [ -n "${2:-}" ] && [ "${CHECKS:-1}" = 1 ]; then
    export PATH=$PATH:/usr/local/cuda/bin
    step memcheck_attention 200 compute-sanitizer --tool memcheck --error-exitcode 9 $T/scr_cuda_attention --no-bench
    step racecheck_attention 200 compute-sanitizer --tool racecheck --error-exitcode 9 $T/scr_cuda_attention --no-bench
    step memcheck_engine 200 compute-sanitizer --tool memcheck --error-exitcode 9 $T/scr_cuda_tests --gtest_filter='CudaBatch.*:CudaRunAhead.*:CudaEngine.*'
    grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/memcheck_attention.txt" "$OUT/racecheck_attention.txt" "$OUT/memcheck_engine.txt"
fi
printf '%s\n' "${summary[@]}"
