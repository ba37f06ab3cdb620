#!/bin/bash
# MLX int4 decode of 2 token rows on quant_mma1_kernel (issue #9; kernels/cuda/quant_mma1.cuh,
# kQmma1MaxRows) against the earlier rule (one row on it, 2+ rows on quant_mma_kernel), on the GPU
# machine, for random checkpoints of the real shapes quantized with `scr quantize`:
#   OUT=$OUT [MODELS="8b 1b"] [VARIANTS="default SCR_CUDA_QUANT_TC1_ROWS=1 SCR_CUDA_QUANT_TC1_SWIGLU=fused"]
#       [BATCHES=1,2,3,4,8] [PROMPT=128] [ROUNDS=2] [CHECKS=1] [KBENCH=1] [BASE=CARRY_DIR] \
#       bash tests/cuda/qrows_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr and scr_cuda_quant_gemv of a CUDA build with those models x
# mlx-int4-g64 (tests/cuda/pack_carry.sh). The variant `base` runs the scr of the BASE carry with
# its defaults (an A/B of two builds: batch 1 must not move). A variant A=1+B=2 sets both.
#   CHECKS=1: scr_cuda_quant_gemv --no-bench on the three MLX int4 formats (float64 bounds; each row
#             of a 2-row launch against the row alone, bit for bit), and the same under compute-sanitizer's
#             memcheck for g64 and g128; per model, `scr logits --all` of 1- to 4-token prompts (steps of 1-4
#             rows) against SCR_CUDA_QUANT_TC1_ROWS=1 (tests/cuda/qrows_logits.py);
#   KBENCH=1: per-launch times of the 8B shapes at 1, 2 and 4 rows (scr_cuda_quant_gemv's table);
#   per model, round and variant: `scr cuda-bench --prompt P --decode 64 --prefill 0 --batches B`.
set -u
export OUT=${OUT:-/tmp/scr-qrows-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
device_unpack "$1" /tmp/scr-qrows-bin
S=$C
SB=
if [ -n "${BASE:-}" ]; then
    device_unpack "$BASE" /tmp/scr-qrows-base
    SB=$C
    C=$S  # make_model runs $C/scr: this build's
    export LD_LIBRARY_PATH=$S/lib:$LD_LIBRARY_PATH  # the main carry's libraries first
fi
if [ "${CHECKS:-1}" = 1 ]; then
    step qgemv 400 $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g32,mlx-int4-g64,mlx-int4-g128
    grep -E "FAILED|declined|checks passed|passed|failed" "$OUT/qgemv.txt" | tail -12
    grep -cE "tc1.* rows  2:.* -> ok" "$OUT/qgemv.txt" | sed 's/^/tc1 2-row value checks ok: /'
    grep -E "tc1 .*batch invariance" "$OUT/qgemv.txt" | head -6
fi
if [ "${KBENCH:-1}" = 1 ]; then
    step qbench 300 $S/scr_cuda_quant_gemv --formats mlx-int4-g64 --shapes 6144x4096,4096x4096,28672x4096,14336x4096,4096x14336,128256x4096
    grep -E "^ *[0-9]+x[0-9]+ .*(tc1|mma)" "$OUT/qbench.txt" | grep -E " (1|2|4) +[0-9.]+ " | head -60
fi
for m in ${MODELS:-8b 1b}; do
    make_model $m
    step quant_$m 300 $S/scr quantize "$M" "$M-int4" --preset mlx-int4-g64
    rm -rf "$M"
    Q=$M-int4
    if [ "${CHECKS:-1}" = 1 ]; then
        step logits_$m 300 python3 tests/cuda/qrows_logits.py $S/scr "$Q"
        tail -6 "$OUT/logits_$m.txt"
    fi
    for r in $(seq 1 "${ROUNDS:-2}"); do
        bench_round $m "$Q" $r ${BATCHES:-1,2,3,4,8} ${VARIANTS:-default SCR_CUDA_QUANT_TC1_ROWS=1 SCR_CUDA_QUANT_TC1_SWIGLU=fused}
    done
    rm -rf "$Q"
done
if [ "${CHECKS:-1}" = 1 ]; then
    step memcheck_qgemv 400 compute-sanitizer --tool memcheck --error-exitcode 9 $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g64,mlx-int4-g128
    grep -h "ERROR SUMMARY\|checks passed" "$OUT/memcheck_qgemv.txt" | tail -3
fi
printf '%s\n' "${summary[@]}"
