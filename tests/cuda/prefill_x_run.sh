#!/bin/bash
# Dense prefill with x as bf16 hi + lo (default) against x rounded to bf16 alone
# (SCR_CUDA_PREFILL_X=bf16, runtime/cuda/prefill_gemm.cu; issue #6), in one call on the GPU machine:
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=2] bash tests/cuda/prefill_x_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: `scr` of a CUDA build with llama-3.2-1b and llama-3.1-8b x bf16. Per model: a
# random checkpoint, `scr cuda-bench --prefill 2048` in both modes interleaved, ROUNDS rounds; on
# the 1B, both modes against transformers in float32 (compare_transformers.py, 300-token prompt:
# above the 256-row decode buckets, so its prefill takes the mode). Summary in $OUT/summary.txt.
set -u
source "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/scr-prefill-x-out}; LOGS=$OUT/logs; mkdir -p "$LOGS"
device_unpack "$1" /tmp/scr-prefill-x-bin
S=$C/scr
CB="--prompt 128 --decode 16 --prefill 2048 --batches 1"
for m in ${MODELS:-1b 8b}; do
    make_model $m
    for r in $(seq 1 ${ROUNDS:-2}); do
        step hilo_${m}_$r 120 $S cuda-bench $M $CB
        step bf16x_${m}_$r 120 env SCR_CUDA_PREFILL_X=bf16 $S cuda-bench $M $CB
        for v in hilo bf16x; do
            echo "$m $v round $r: $(grep -h '^prefill' "$LOGS/${v}_${m}_$r.txt" | tr '\n' ' ')" >> "$OUT/summary.txt"
        done
    done
    if [ $m = 1b ]; then
        step compare_hilo 200 python3 tests/cuda/compare_transformers.py $S $M --tokens 300
        step compare_bf16x 200 env SCR_CUDA_PREFILL_X=bf16 python3 tests/cuda/compare_transformers.py $S $M --tokens 300
        for v in hilo bf16x; do { echo "== 1B vs transformers fp32, 300 tokens, $v"; tail -n 4 "$LOGS/compare_$v.txt"; } >> "$OUT/summary.txt"; done
    fi
    [ $m = 8b ] && rm -rf $M
done
printf '%s\n' "${summary[@]}" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$LOGS"
