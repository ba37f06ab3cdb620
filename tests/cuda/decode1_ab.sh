#!/bin/bash
# Variants of the persistent batch-1 decode kernel (kernels/cuda/decode1.cuh) against each other and
# the launch-per-op step, one call on the GPU machine (issue #6):
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=2] [VARIANTS="A B ..."] [GTEST=0] bash tests/cuda/decode1_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz (tests/cuda/pack_carry.sh): scr of a CUDA build holding llama-3.2-1b /
# llama-3.1-8b (bf16) and scr_cuda_tests of the same build (the tiny fixtures, f32 and bf16).
# A variant is NAME=VALUE[+NAME=VALUE...] added to SCR_CUDA_DECODE1=1 (`plain`: nothing added).
# Per variant: CudaDecode1.* (the kernel's bits against the launches). Per model: a random
# checkpoint in /dev/shm; the logits of a one-token prompt (one batch-1 step) and 64 greedy ids of
# every variant against the launches'; per variant one
# traced run (SCR_CUDA_DECODE1_TRACE=1: the phase table of its last launch); then ROUNDS rounds of
# `scr cuda-bench --prompt 128 --decode 64 --prefill 0 --batches 1` over the variants and the
# launches (`default`), interleaved. $OUT gets summary.txt and the step logs as logs.tar.xz.
set -u
CARRY=${1:-.d1-carry}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-d1ab-out /tmp/scr-d1ab-logs  # tarred into $OUT at the end (the run tool brings back few files)
device_unpack "$CARRY" /tmp/scr-d1ab-bin
S=$C
VARIANTS=${VARIANTS:-plain}
envs() { [ "$1" = plain ] && echo SCR_CUDA_DECODE1=1 || echo "SCR_CUDA_DECODE1=1 ${1//+/ }"; }
key() { printf %s "${1//SCR_CUDA_DECODE1_/}" | tr -c 'A-Za-z0-9' _; }
for v in $([ "${GTEST:-1}" = 0 ] || echo $VARIANTS); do  # GTEST=0: none (CudaDecode1.KeepsTheBits checks every sync form itself)
    k=$(key "$v")
    step "gtest_$k" 200 env SCR_REQUIRE_GPU=1 $(envs "$v") $C/scr_cuda_tests --gtest_filter='CudaDecode1.*'
    echo "== $v: $(grep -hE '^\[  (PASSED|FAILED) ' "$LOGS/gtest_$k.txt" | tr '\n' ' ')"
done
IDS=$(seq -s, 11 130)
for m in ${MODELS:-1b}; do
    make_model $m
    step "greedy_${m}_launches" 120 $C/scr complete $M --ids $IDS --max-tokens 64 --json
    step "logits_${m}_launches" 120 $C/scr logits $M --ids 17
    for v in $VARIANTS; do
        k=$(key "$v")
        # A one-token prompt is one batch-1 step: the kernel's logits on the model's own shapes (the
        # tiny fixture of CudaDecode1 reaches only one-piece phases), bit for bit against the launches'.
        step "logits_${m}_$k" 120 env $(envs "$v") $C/scr logits $M --ids 17
        grep -q '^{"logits": ' "$LOGS/logits_${m}_$k.txt" && cmp -s "$LOGS/logits_${m}_launches.txt" "$LOGS/logits_${m}_$k.txt" &&
            echo "== $m $v logits of a 1-token step: same bits" || echo "== $m $v logits of a 1-token step: DIFFERENT (or no logits)"
        step "greedy_${m}_$k" 120 env $(envs "$v") $C/scr complete $M --ids $IDS --max-tokens 64 --json
        cmp -s "$LOGS/greedy_${m}_launches.txt" "$LOGS/greedy_${m}_$k.txt" && echo "== $m $v greedy 64: same ids" ||
            echo "== $m $v greedy 64: DIFFERENT"
        step "trace_${m}_$k" 120 env $(envs "$v") SCR_CUDA_DECODE1_TRACE=1 $C/scr cuda-bench $M --prompt 128 --decode 16 --prefill 0 --batches 1
        echo "== $m $v trace:"; grep -A16 "^decode1 trace" "$LOGS/trace_${m}_$k.txt"
    done
    for r in $(seq ${ROUNDS:-2}); do
        bench_round "$m" $M $r 1 default $(for v in $VARIANTS; do [ $v = plain ] && echo SCR_CUDA_DECODE1=1 || echo "SCR_CUDA_DECODE1=1+$v"; done)
    done
    rm -rf $M
done
printf '%s\n' "${summary[@]}"
# The run tool brings back a limited number of files: the step logs go home as one archive.
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
