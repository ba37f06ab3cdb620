#!/bin/bash
# MLX int4 decode of 3-16 token rows on quant_staged_kernel (issue #9; kernels/cuda/quant_staged.cuh)
# against quant_mma_kernel (SCR_CUDA_QUANT_STAGED=0, the earlier rule), on the GPU machine, for
# random checkpoints of the real shapes quantized with `scr quantize`:
#   OUT=$OUT [MODELS="8b 1b"] [VARIANTS="default SCR_CUDA_QUANT_STAGED=0 SCR_CUDA_QUANT_STAGED=all"] [BATCHES=1,2,3,4,8,16]
#       [PROMPT=128] [ROUNDS=2] [CHECKS=1] [QGEMV=1] [MEMCHECK=1] [UPTO=] [KBENCH=1] [KVARIANTS=default] [KGREP=.] [KROWS="4|8|16"]
#       [SHAPES=...] [BF16=0] bash tests/cuda/qstaged_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr and scr_cuda_quant_gemv of a CUDA build with those models x
# mlx-int4-g64 (tests/cuda/pack_carry.sh). A variant A=1+B=2 sets both.
#   CHECKS=1: scr_cuda_quant_gemv --no-bench on the three MLX int4 formats (float64 bounds up to 64 rows;
#             8, 17 and 64 rows against each row in launches of 3, 9 and 9, bit for bit), the same under compute-sanitizer's
#             memcheck for g64 and g128; per model, `scr logits --all` of prompts of 1-17 tokens against
#             SCR_CUDA_QUANT_STAGED=0 (tests/cuda/qrows_logits.py --mode staged);
#   QGEMV=0: of the checks only the logits (no scr_cuda_quant_gemv, no memcheck);
#   UPTO=N (with CHECKS=1): the same GEMV checks and memcheck with SCR_CUDA_QUANT_STAGED_UPTO=N
#             (17-N rows in passes of 16: values at 64 rows, each row against launches of 9), and
#             per model qrows_logits.py --mode passes (prompts of up to 64 tokens) under it;
#   KBENCH=1: per-launch times of the 8B shapes at 4, 8 and 16 rows (KROWS; scr_cuda_quant_gemv's table);
#   per model, round and variant: `scr cuda-bench --prompt P --decode 64 --prefill 0 --batches B`,
#   and with BF16=1 the bf16 checkpoint's defaults (variant bf16).
set -u
export OUT=${OUT:-/tmp/scr-qstaged-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
device_unpack "$1" /tmp/scr-qstaged-bin
S=$C
if [ "${CHECKS:-1}" = 1 ] && [ "${QGEMV:-1}" = 1 ]; then
    step qgemv 500 $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g32,mlx-int4-g64,mlx-int4-g128
    grep -E "FAILED|declined|checks passed|passed|failed" "$OUT/qgemv.txt" | tail -12
    grep -cE "tc1 +s[0-9]+w[0-9]+g[0-9]+ rows +(3|4|5|8|13|16|64).* -> ok" "$OUT/qgemv.txt" | sed 's/^/staged value checks ok: /'
    grep -cE "tc1 +s[0-9]+w[0-9]+g[0-9]+ rows +(3|4|5|8|13|16|64).* -> FAILED" "$OUT/qgemv.txt" | sed 's/^/staged value checks FAILED: /'
    grep -E "vs launches of (3|9)" "$OUT/qgemv.txt" | grep -c " -> ok" | sed 's/^/staged invariance checks ok: /'
    grep -E "vs launches of (3|9)" "$OUT/qgemv.txt" | grep -v " -> ok" | head -5
    if [ -n "${UPTO:-}" ]; then
        step qgemv_upto 500 env SCR_CUDA_QUANT_STAGED_UPTO=$UPTO $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g32,mlx-int4-g64,mlx-int4-g128
        grep -E "FAILED|declined|checks passed|passed|failed" "$OUT/qgemv_upto.txt" | tail -6
        grep -cE "tc1 +s[0-9]+w[0-9]+g[0-9]+ rows +64.* -> ok" "$OUT/qgemv_upto.txt" | sed 's/^/staged 64-row value checks ok: /'
        grep -E "vs launches of 9" "$OUT/qgemv_upto.txt" | grep -c " -> ok" | sed "s/^/staged $UPTO vs 9 invariance checks ok: /"
        grep -E "tc1.* -> FAILED" "$OUT/qgemv_upto.txt" | head -5
    fi
fi
if [ "${KBENCH:-1}" = 1 ]; then
    for kv in ${KVARIANTS:-default}; do  # e.g. "default SCR_CUDA_QUANT_STAGED_SLICES=2"
        kk=$(printf %s "${kv//SCR_CUDA_/}" | tr -c 'A-Za-z0-9' _)
        e=
        [ "$kv" = default ] || e=${kv//+/ }
        step qbench_$kk 400 env $e $S/scr_cuda_quant_gemv --formats mlx-int4-g64 \
            --shapes ${SHAPES:-6144x4096,4096x4096,28672x4096,4096x14336,128256x4096,3072x2048,16384x2048,2048x8192}
        echo "== per launch, $kv"
        grep -E "^ *[0-9]+x[0-9]+ .*(tc1|mma)" "$OUT/qbench_$kk.txt" | grep -E " (${KROWS:-4|8|16}) +[0-9.]+ " | grep -E "${KGREP:-.}" | head -200
    done
fi
for m in ${MODELS-8b 1b}; do
    make_model $m
    step quant_$m 300 $S/scr quantize "$M" "$M-int4" --preset mlx-int4-g64
    [ "${BF16:-0}" = 1 ] || rm -rf "$M"
    Q=$M-int4
    if [ "${CHECKS:-1}" = 1 ]; then
        step logits_$m 400 python3 tests/cuda/qrows_logits.py --mode staged $S/scr "$Q"
        tail -8 "$OUT/logits_$m.txt"
        if [ -n "${UPTO:-}" ]; then
            step logits_upto_$m 400 env SCR_CUDA_QUANT_STAGED_UPTO=$UPTO python3 tests/cuda/qrows_logits.py --mode passes $S/scr "$Q"
            tail -8 "$OUT/logits_upto_$m.txt"
        fi
    fi
    for r in $(seq 1 "${ROUNDS:-2}"); do
        bench_round $m "$Q" $r ${BATCHES:-1,2,3,4,8,16} ${VARIANTS:-default SCR_CUDA_QUANT_STAGED=0 SCR_CUDA_QUANT_STAGED=all}
        [ "${BF16:-0}" = 1 ] && bench_round ${m}_bf16 "$M" $r ${BATCHES:-1,2,3,4,8,16} default
    done
    rm -rf "$Q" "$M"
done
if [ "${CHECKS:-1}" = 1 ] && [ "${QGEMV:-1}" = 1 ] && [ "${MEMCHECK:-1}" = 1 ]; then
    step memcheck_qgemv 500 compute-sanitizer --tool memcheck --error-exitcode 9 $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g64,mlx-int4-g128
    grep -h "ERROR SUMMARY\|checks passed" "$OUT/memcheck_qgemv.txt" | tail -3
    if [ -n "${UPTO:-}" ]; then
        step memcheck_qgemv_upto 500 env SCR_CUDA_QUANT_STAGED_UPTO=$UPTO compute-sanitizer --tool memcheck --error-exitcode 9 \
            $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g64
        grep -h "ERROR SUMMARY\|checks passed" "$OUT/memcheck_qgemv_upto.txt" | tail -3
    fi
fi
printf '%s\n' "${summary[@]}"
