#!/bin/bash
# Quantized presets end to end on the GPU machine, in one call (docs/CUDA.md, "Quantized presets end to end"):
#   tests/cuda/quant_e2e_run.sh CARRY_DIR [ONE_B_PRESETS]
# CARRY_DIR holds bin.tar.xz (tests/cuda/pack_carry.sh of a CUDA build with the quantized tiny presets),
# the quantized tiny checkpoints and expected.json (CPU logits and greedy tokens of the same checkpoints,
# made here by tests/cuda/quant_e2e.py expect). ONE_B_PRESETS (e.g. "int8 mlx-int4-g32"): also make a
# random Llama-3.2-1B (bf16) on the machine, quantize it there, and time batch-1 decode for each.
set -u
CARRY=${1:-.cudaq2-carry}
ONE_B=${2:-}
OUT=${OUT:-/tmp/scr-cudaq2-out}
mkdir -p "$OUT"
C=/tmp/scr-cudaq2-bin
rm -rf $C /tmp/l1b*; mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
summary=()
step() {  # step NAME TIMEOUT CMD...: run, keep the log in $OUT/NAME.txt, record rc and seconds
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# Most important first: a run cut short still returns what it did.
# Without expected.f32.xz in CARRY (too big to travel beside the binaries), the CUDA logits come back in
# $OUT/got.json + got.f32.xz; then, here: python3 tests/cuda/quant_e2e.py compare CARRY_DIR GOT_DIR.
step e2e_tiny 60 python3 tests/cuda/quant_e2e.py check $C/scr "$CARRY" --rtol 2e-3 --record "$OUT"
cat "$OUT/e2e_tiny.txt"
if [ -n "$ONE_B" ]; then
    step make_random_1b 25 $C/scr make-random "${ONE_B_CONFIG:-models/configs/llama/llama-3.2-1b.json}" /tmp/l1b --dtype bf16
    models="/tmp/l1b"
    for p in $ONE_B; do
        step "quantize_1b_$p" 25 $C/scr quantize /tmp/l1b "/tmp/l1b-$p" --preset "$p"
        models="$models /tmp/l1b-$p"
    done
    for m in $models; do
        step "bench_$(basename $m)" 20 $C/scr bench "$m" --mode forward --batch 1 --context 128 --input-len 128 --iters 25
        grep -h "^forward:\|^prefill\|^decode" "$OUT/bench_$(basename $m).txt"
    done
fi
echo "==== summary"; printf '%s\n' "${summary[@]}"
