#!/bin/bash
# Where a quantized format's decode batches go to cuBLASLt (issue #9; kernels/cuda/quant_prefill.cuh,
# quant_prefill_min_rows<F>()), on the GPU machine, for a random checkpoint quantized by `scr quantize`:
#   OUT=$OUT [MODEL=8b] [PRESET=fp8] [CANDIDATE=33] [VARIANTS="default SCR_CUDA_QUANT_PREFILL_MIN_ROWS=33 ..."]
#       [BATCHES=32,64,128,256] [ROUNDS=2] [BF16=1] [INT4_BATCHES=] [INT4_VARIANTS=...] bash tests/cuda/qprefill_rows_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr of a CUDA build with MODEL x PRESET (tests/cuda/pack_carry.sh).
#   * logits: qrows_logits.py --mode cublas --quant PRESET --min-rows CANDIDATE with
#     SCR_CUDA_QUANT_PREFILL_MIN_ROWS=CANDIDATE (steps of CANDIDATE+ rows on cuBLASLt against the
#     quantized kernels, within the tolerance; shorter steps the same bits);
#   * per round and variant: `scr cuda-bench --prompt 128 --decode 64 --prefill 0 --batches BATCHES`
#     (device_lib.sh's bench_round), with BF16=1 the bf16 checkpoint beside it (one round);
#   * INT4_BATCHES set: the same MODEL as mlx-int4-g64 with INT4_VARIANTS (default against
#     SCR_CUDA_QUANT_STAGED_PASS_KIB=0), ROUNDS rounds.
set -u
export OUT=${OUT:-/tmp/scr-qprefill-rows}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
device_unpack "$1" /tmp/scr-qprefill-bin
S=$C
PRESET=${PRESET:-fp8}
CAND=${CANDIDATE:-33}
make_model ${MODEL:-8b}
step quant 300 $S/scr quantize "$M" "$M-q" --preset $PRESET
step logits 400 env SCR_CUDA_QUANT_PREFILL_MIN_ROWS=$CAND python3 tests/cuda/qrows_logits.py --mode cublas --quant $PRESET \
    --min-rows $CAND $S/scr "$M-q"
tail -8 "$OUT/logits.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do
    bench_round q "$M-q" $r ${BATCHES:-32,64,128,256} ${VARIANTS:-default SCR_CUDA_QUANT_PREFILL_MIN_ROWS=$CAND SCR_CUDA_QUANT_PREFILL_MIN_ROWS=65}
done
[ "${BF16:-1}" = 1 ] && bench_round bf16 "$M" 1 ${BATCHES:-32,64,128,256} default
rm -rf "$M-q"
if [ -n "${INT4_BATCHES:-}" ]; then
    step quant_int4 300 $S/scr quantize "$M" "$M-int4" --preset mlx-int4-g64
    for r in $(seq 1 "${ROUNDS:-2}"); do
        bench_round int4 "$M-int4" $r $INT4_BATCHES ${INT4_VARIANTS:-default SCR_CUDA_QUANT_STAGED_PASS_KIB=0}
    done
    rm -rf "$M-int4"
fi
rm -rf "$M"
printf '%s\n' "${summary[@]}"
