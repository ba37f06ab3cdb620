#!/bin/bash
# The persistent batch-1 decode kernel (kernels/cuda/decode1.cuh) on the GPU machine, one call
# (issue #6):
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=2] bash tests/cuda/decode1_run.sh CARRY_DIR [TEST_CARRY_DIR]
# CARRY_DIR/bin.tar.xz: scr of a CUDA build holding llama-3.2-1b / llama-3.1-8b (bf16);
# TEST_CARRY_DIR/bin.tar.xz (optional): scr_cuda_tests of a build with the tiny fixtures (f32, bf16),
# run first: the bit-for-bit checks against the launch-per-op step, then memcheck and racecheck.
# Per model: a random checkpoint in /dev/shm; 64 greedy tokens with the kernel (SCR_CUDA_DECODE1=1)
# and without (the default launches), which must agree; the 1B against transformers (with the
# kernel); then ROUNDS x (SCR_CUDA_DECODE1=1, default) of `scr cuda-bench --prompt 128 --decode 128
# --prefill 0 --batches 1,4`.
set -u
CARRY=${1:-.d1-carry}
TCARRY=${2:-}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-d1-out /tmp/scr-d1-logs  # tarred into $OUT at the end (the run tool brings back few files)
if [ -n "$TCARRY" ]; then
    device_unpack "$TCARRY" /tmp/scr-d1-tests
    T=$C
    export SCR_REQUIRE_GPU=1
    step gtest 300 $T/scr_cuda_tests
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" "$LOGS/gtest.txt" | head -20
    step memcheck 300 compute-sanitizer --tool memcheck $T/scr_cuda_tests --gtest_filter='CudaDecode1.*'
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$LOGS/memcheck.txt" | head -5
    step racecheck 300 compute-sanitizer --tool racecheck $T/scr_cuda_tests --gtest_filter='CudaDecode1.*'
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$LOGS/racecheck.txt" | head -5
    unset SCR_REQUIRE_GPU
fi
device_unpack "$CARRY" /tmp/scr-d1-bin
IDS=$(seq -s, 11 130)
for m in ${MODELS:-1b 8b}; do
    make_model $m
    step "greedy_${m}_on" 120 env SCR_CUDA_DECODE1=1 $C/scr complete $M --ids $IDS --max-tokens 64 --json
    step "greedy_${m}_off" 120 $C/scr complete $M --ids $IDS --max-tokens 64 --json
    if cmp -s "$LOGS/greedy_${m}_on.txt" "$LOGS/greedy_${m}_off.txt"; then echo "== $m greedy 64: same ids"; else
        echo "== $m greedy 64: DIFFERENT"; head -c 600 "$LOGS/greedy_${m}_on.txt"; echo; head -c 600 "$LOGS/greedy_${m}_off.txt"; echo; fi
    if [ $m = 1b ]; then
        step "transformers_$m" 240 env SCR_CUDA_DECODE1=1 python3 tests/cuda/compare_transformers.py $C/scr $M --tokens 300
        tail -n 2 "$LOGS/transformers_$m.txt"
    fi
    for r in $(seq ${ROUNDS:-2}); do
        for v in decode1 launches; do
            env=(); [ $v = decode1 ] && env=(SCR_CUDA_DECODE1=1)
            step "bench_${m}_${v}_$r" 90 env "${env[@]}" $C/scr cuda-bench $M --prompt 128 --decode 128 --prefill 0 --batches 1,4
            echo "== $m $v round $r: $(grep -h '^batch-1 decode\|^decode batch' "$LOGS/bench_${m}_${v}_$r.txt" | cut -c1-110 | tr '\n' ' ')"
        done
    done
    rm -rf $M
done
printf '%s\n' "${summary[@]}"
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
