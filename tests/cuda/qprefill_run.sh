#!/bin/bash
# Quantized prefill on cuBLASLt (kernels/cuda/quant_prefill.cuh, issue #9) and the one-row int4
# kernel's 32-bit scale loads, on the GPU machine, in one call:
#   OUT=$OUT [MODELS="1b 8b"] [PRESETS=mlx-int4-g64] [ROUNDS=2] bash tests/cuda/qprefill_run.sh CARRY_DIR [GEMV_CARRY_DIR]
# CARRY_DIR/bin.tar.xz: `scr` of a CUDA build with llama-3.2-1b and/or llama-3.1-8b x the PRESETS;
# GEMV_CARRY_DIR (optional): scr_cuda_quant_gemv, whose checks now include 300-row prefill calls.
# Per model and preset: a random bf16 checkpoint, `scr quantize --preset P`, then `scr cuda-bench`
# (prefill 2048 tokens, batch-1 decode) of bf16 once (if compiled in) and of P with the new defaults and with the
# previous behaviour (SCR_CUDA_QUANT_PREFILL_MIN_ROWS=0: the quantized kernels for every row count;
# SCR_CUDA_QUANT_TC1_VARIANT=narrow2: 16-bit scale loads), interleaved, ROUNDS rounds; then the 1B
# int4's logits with the cuBLASLt prefill from 33 rows against the kernels (quant_fused_ab.py: its
# 41- and 200-token prompts take the new path). Summary in $OUT/summary.txt.
set -u
source "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/scr-qprefill-out}; LOGS=$OUT/logs; mkdir -p "$LOGS"
if [ -n "${2:-}" ]; then
    device_unpack "$2" /tmp/scr-qprefill-gemv
    export SCR_REQUIRE_GPU=1
    step gemv_checks 400 $C/scr_cuda_quant_gemv --no-bench
    { echo "== scr_cuda_quant_gemv --no-bench: $(grep -c ' -> ok' "$LOGS/gemv_checks.txt") ok, $(grep -c 'FAILED' "$LOGS/gemv_checks.txt") FAILED"
      grep "check prefill" "$LOGS/gemv_checks.txt"; tail -1 "$LOGS/gemv_checks.txt"; } >> "$OUT/summary.txt"
    unset SCR_REQUIRE_GPU
fi
device_unpack "$1" /tmp/scr-qprefill-bin
S=$C/scr
CB="--prompt 128 --decode 128 --prefill 2048 --batches 1"
OLD="SCR_CUDA_QUANT_PREFILL_MIN_ROWS=0 SCR_CUDA_QUANT_TC1_VARIANT=narrow2"
for m in ${MODELS:-1b 8b}; do
    make_model_any $m
    step bf16_$m 120 $S cuda-bench $M $CB
    echo "$m bf16: $(grep -h -i 'prefill\|batch 1\|B=1 ' "$LOGS/bf16_$m.txt" | tr '\n' ' ')" >> "$OUT/summary.txt"
    for p in ${PRESETS:-mlx-int4-g64}; do
        q=$M-int4; [ $p = mlx-int4-g64 ] || q=$M-$p
        step quant_${m}_$p 300 $S quantize $M $q --preset $p
        for r in $(seq 1 ${ROUNDS:-2}); do
            step new_${m}_${p}_$r 120 $S cuda-bench $q $CB
            step old_${m}_${p}_$r 180 env $OLD $S cuda-bench $q $CB
            for v in new old; do
                echo "$m $p $v round $r: $(grep -h -i 'prefill\|batch 1\|B=1 ' "$LOGS/${v}_${m}_${p}_$r.txt" | tr '\n' ' ')" >> "$OUT/summary.txt"
            done
        done
        [ "$m" = 8b ] && rm -rf $q
    done
    [ "$m" = 8b ] && rm -rf $M
done
for p in ${PRESETS:-mlx-int4-g64}; do
    q=/dev/shm/m1b-int4; [ $p = mlx-int4-g64 ] || q=/dev/shm/m1b-$p
    [ -d $q ] || continue
    step logits_ab_$p 200 python3 tests/cuda/quant_fused_ab.py $S --test-env SCR_CUDA_QUANT_PREFILL_MIN_ROWS=33 \
        --ref-env SCR_CUDA_QUANT_PREFILL_MIN_ROWS=0 l1b-$p=$q:$p:ready
    { echo "== 1B $p logits, cuBLASLt prefill from 33 rows vs the kernels"; tail -n 8 "$LOGS/logits_ab_$p.txt"; } >> "$OUT/summary.txt"
done
printf '%s\n' "${summary[@]}" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$LOGS"
