#!/bin/bash
# Issue #9's CUDA figures in one call of the run tool (docs/CUDA.md, "Quantized presets end to end"):
#   OUT=$OUT [MODEL=1b|8b] [PRESETS="mlx-int4-g64 int8 fp8"] [AB_ENV=SCR_CUDA_QUANT_FUSED=0] [FUSED_AB=1] [FUSED_AB_ARGS=...] [BATCH8=1] \
#       bash tests/cuda/quant_bench_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: `scr` of a CUDA build with llama-3.2-1b (or, MODEL=8b, llama-3.1-8b) x bf16
# and the PRESETS (the MODEL=8b variant has not run on the device yet: the session-4 budget ran out).
# A random Llama-3.2-1B is made and quantized on the machine (`scr quantize`), then batch-1 decode
# and 128-token prefill of each preset side by side (`scr bench --mode forward`, CUDA graphs, two
# rounds), each quantized model again with AB_ENV (default: the unfused launches), and the fused
# launches' logits against the unfused ones (tests/cuda/quant_fused_ab.py; FUSED_AB=0 skips it).
set -u
CARRY=${1:-.quant-carry}
OUT=${OUT:-/tmp/scr-quant-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
C=/tmp/scr-quant-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 SCR_HUGE_PAGES=0
summary=()
step() {  # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# The 1B lives in /tmp; the 8B (16 GB + its quantized copies) in /dev/shm, whose name keeps "l1b" out.
if [ "${MODEL:-1b}" = 8b ]; then CONFIG=models/configs/llama/llama-3.1-8b.json; T=/dev/shm
else CONFIG=models/configs/llama/llama-3.2-1b.json; T=/tmp; fi
step make_random 120 $C/scr make-random $CONFIG $T/l1b --dtype bf16
PRESETS=${PRESETS:-mlx-int4-g64 int8 fp8}
AB_ENV=${AB_ENV:-SCR_CUDA_QUANT_FUSED=0}
for p in $PRESETS; do step "quantize_$p" 120 $C/scr quantize $T/l1b "$T/l1b-$p" --preset "$p"; done
du -sb $T/l1b $T/l1b-* 2>/dev/null
BENCH="--mode forward --batch 1 --context 128 --input-len 128 --iters 50"
for round in 1 2; do
    for m in l1b $(for p in $PRESETS; do echo l1b-$p; done); do
        step "bench_${m}_$round" 60 $C/scr bench $T/$m $BENCH
        echo "== $m round $round: $(grep -h '^forward:\|^prefill\|^decode' "$LOGS/bench_${m}_$round.txt" | tr '\n' ' ')"
    done
done
for p in $PRESETS; do
    m=l1b-$p
    step "bench_${m}_ab" 60 env $AB_ENV $C/scr bench $T/$m $BENCH
    echo "== $m $AB_ENV: $(grep -h '^forward:\|^prefill\|^decode' "$LOGS/bench_${m}_ab.txt" | tr '\n' ' ')"
done
# BATCH8=1: each quantized model also at batch 8 (decode), default and with AB_ENV.
if [ "${BATCH8:-0}" = 1 ]; then
    for p in $PRESETS; do
        m=l1b-$p
        step "bench8_${m}" 60 $C/scr bench $T/$m ${BENCH/--batch 1/--batch 8}
        echo "== $m batch 8: $(grep -h '^forward:\|^prefill\|^decode' "$LOGS/bench8_${m}.txt" | tr '\n' ' ')"
        step "bench8_${m}_ab" 60 env $AB_ENV $C/scr bench $T/$m ${BENCH/--batch 1/--batch 8}
        echo "== $m batch 8 $AB_ENV: $(grep -h '^forward:\|^prefill\|^decode' "$LOGS/bench8_${m}_ab.txt" | tr '\n' ' ')"
    done
fi
# FUSED_AB_ARGS: extra quant_fused_ab.py arguments, e.g. "--test-env SCR_CUDA_QUANT_GEMV=smem --ref-env SCR_CUDA_QUANT_GEMV=mma".
[ "${FUSED_AB:-1}" = 1 ] && step fused_ab ${FUSED_AB_LIMIT:-60} python3 tests/cuda/quant_fused_ab.py $C/scr ${FUSED_AB_ARGS:-} \
    $(for p in $PRESETS; do echo "l1b-$p=$T/l1b-$p:$p:ready"; done)
[ -f "$LOGS/fused_ab.txt" ] && { echo "== fused vs unfused logits"; tail -8 "$LOGS/fused_ab.txt"; }
printf '%s\n' "${summary[@]}"
cp "$LOGS"/bench_l1b*_1.txt "$OUT/" 2>/dev/null
