#!/bin/bash
# A random Qwen3-30B-A3B through the engine in two (or more) builds of scr, rounds interleaved, on the
# GPU machine (issues #9 / #6: a change to the expert kernels measured end to end):
#   OUT=$OUT [ROUNDS=2] [PRESETS="int8"] [ARGS="--prompt 64 --decode 32 --prefill 2048 --batches 256 --batch-steps 16"] \
#       bash tests/cuda/moe_e2e_ab.sh CARRY_A CARRY_B [...]
# Each CARRY/bin.tar.xz holds scr of a CUDA build with qwen3-30b-a3b x bf16 and the PRESETS
# (tests/cuda/pack_carry.sh). The bf16 checkpoint (make_model 30b, 61 GB in /dev/shm) and its PRESETS
# (`scr quantize` of the first carry) are made once; then per round, per format, per carry
# `scr cuda-bench DIR $ARGS`, one line each: prefill tok/s, decode tok/s (run ahead) per batch.
set -u
[ $# -ge 2 ] && [ -f "$1/bin.tar.xz" ] || { echo "usage: [OUT=DIR] [ROUNDS=N] [PRESETS=...] [ARGS=...] bash $0 CARRY_A CARRY_B [...] (each a folder holding bin.tar.xz)" >&2; exit 2; }
. tests/cuda/device_lib.sh
device_begin /tmp/scr-moe-e2e /tmp/scr-moe-e2e-logs  # tarred into $OUT at the end
bins=()
names=("$@")
i=0
for carry in "$@"; do
    device_unpack "$carry" "/tmp/scr-moe-e2e-bin$((++i))"
    bins+=("$C/scr")
done
C=$(dirname "${bins[0]}")  # make_model runs $C/scr
make_model 30b
printf '%s\n' "${summary[@]}"
for p in ${PRESETS:-int8}; do step "quant_$p" 400 "${bins[0]}" quantize "$M" "$M-$p" --preset "$p"; echo "${summary[-1]}"; done
for r in $(seq "${ROUNDS:-2}"); do
    for p in bf16 ${PRESETS:-int8}; do
        d=$M; [ "$p" = bf16 ] || d=$M-$p
        for i in "${!bins[@]}"; do
            k="cb_${p}_$((i + 1))_r$r"
            step "$k" 240 "${bins[$i]}" cuda-bench "$d" ${ARGS:---prompt 64 --decode 32 --prefill 2048 --batches 256 --batch-steps 16}
            echo "round $r $p ${names[$i]} (${summary[-1]#*: }): $(grep -h -o '"prefill_tps": [0-9.]*' "$LOGS/$k.txt" | tr '\n' ' ')" \
                "$(grep -E '^decode batch +[0-9]+:' "$LOGS/$k.txt" | sed -E 's/ sampling on the GPU//; s/;.*//' | tr '\n' ' ')"
        done
    done
done
rm -rf "$M" "$M"-*
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
