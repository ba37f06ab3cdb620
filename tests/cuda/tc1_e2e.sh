#!/bin/bash
# The one-row tensor-core int4 GEMV (quant_mma1_kernel, issue #9) end to end on the GPU machine:
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=2] bash tests/cuda/tc1_e2e.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: `scr` of a CUDA build with llama-3.2-1b and llama-3.1-8b x bf16;mlx-int4-g64.
# Per model: a random bf16 checkpoint, `scr quantize --preset mlx-int4-g64`, then batch-1 decode
# (`scr bench --mode forward`, CUDA graphs) of bf16, int4 (default = tc1) and int4 with
# SCR_CUDA_QUANT_GEMV=smem1 (the previous one-row kernel), interleaved, ROUNDS rounds; then the
# 1B's logits with tc1 against smem1 (tests/cuda/quant_fused_ab.py). Summary in $OUT/summary.txt.
set -u
source "$(dirname "$0")/device_lib.sh"
CARRY=${1:-.q7-carry}
OUT=${OUT:-/tmp/scr-tc1-out}; LOGS=$OUT/logs; mkdir -p "$LOGS"
device_unpack "$CARRY" /tmp/scr-tc1-bin
S=/tmp/scr-tc1-bin/scr
BENCH="--mode forward --batch 1 --context 128 --input-len 128 --iters 50"
for M in ${MODELS:-1b 8b}; do
    if [ "$M" = 8b ]; then CONFIG=models/configs/llama/llama-3.1-8b.json; D=/dev/shm/l8b
    else CONFIG=models/configs/llama/llama-3.2-1b.json; D=/tmp/l1b; fi
    step "make_$M" 200 $S make-random $CONFIG $D --dtype bf16
    step "quant_$M" 200 $S quantize $D $D-int4 --preset mlx-int4-g64
    for r in $(seq 1 ${ROUNDS:-2}); do
        step "bf16_${M}_$r" 90 $S bench $D $BENCH
        step "tc1_${M}_$r" 90 $S bench $D-int4 $BENCH
        step "smem1_${M}_$r" 90 env SCR_CUDA_QUANT_GEMV=smem1 $S bench $D-int4 $BENCH
        for v in bf16 tc1 smem1; do
            echo "$M round $r $v: $(grep -h '^forward:\|^decode' "$LOGS/${v}_${M}_$r.txt" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
        done
    done
done
if [ -d /tmp/l1b-int4 ]; then
    step fused_ab 120 python3 tests/cuda/quant_fused_ab.py $S --test-env SCR_CUDA_QUANT_GEMV=tc1 --ref-env SCR_CUDA_QUANT_GEMV=smem1 \
        l1b-int4=/tmp/l1b-int4:mlx-int4-g64:ready
    { echo "== 1B logits, tc1 vs smem1"; tail -8 "$LOGS/fused_ab.txt"; } | tee -a "$OUT/summary.txt"
fi
printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$LOGS"
