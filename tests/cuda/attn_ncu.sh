#!/bin/bash
# Nsight Compute's full set for one batch-1 decode attention launch (rope_attention_kernel) of the
# Llama-3.2-1B / Llama-3.1-8B MLX int4 g64 engines, on the GPU machine:
#   OUT=$OUT [MODELS="1b 8b"] [KERNEL=regex:rope_attention] [SKIP=600] bash tests/cuda/attn_ncu.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz holds scr of a CUDA build with those models (tests/cuda/pack_carry.sh).
# Per model: a random checkpoint (transformers), `scr quantize`, then `scr cuda-bench` under ncu,
# profiling the launch after SKIP matching ones (a graph-replayed decode step; clocks as found).
# Text report in $OUT/ncu_KEY.txt, stall samples per SASS instruction in $OUT/sass_KEY.csv, and a
# digest of the headline metrics and the hottest instructions on stdout (ncu_digest, device_lib.sh).
set -u
CARRY=${1:-.x8-carry}
export OUT=${OUT:-/tmp/scr-attn-ncu}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
device_unpack "$CARRY" /tmp/scr-attn-ncu-bin
for m in ${MODELS:-1b 8b}; do
    make_model_any "$m"
    q=$M-int4
    step quant_$m 400 $C/scr quantize "$M" "$q" --preset mlx-int4-g64
    rm -rf "$M"
    ncu_profile "$m" "${KERNEL:-regex:rope_attention}" "${SKIP:-600}" 300 \
        $C/scr cuda-bench "$q" --prompt 128 --decode 128 --prefill 0 --batches 1
    rm -rf "$q"
done
printf '%s\n' "${summary[@]}"
