#!/bin/bash
# The one-row int4 tensor-core GEMV (quant_mma1_kernel, issue #9) by default against AB_ENV, on the
# GPU machine, in one call. Session 12 ran it with AB_ENV=SCR_CUDA_QUANT_TC1_VARIANT=xpose (the lane
# transpose of sessions 7-11; AB_ENV's default) and AB_ENV=SCR_CUDA_QUANT_TC1_PARTS=fifths (the
# earlier parts rule):
#   OUT=$OUT [AB_ENV=...] [MODELS=1b] [ROUNDS=2] [SHAPES=NxK,...] bash tests/cuda/tc1_xpose_ab.sh [CARRY_DIR] [GEMV_CARRY_DIR]
# GEMV_CARRY_DIR/bin.tar.xz (optional): scr_cuda_quant_gemv. Its checks (all of them with the
#   default; the int4 formats with AB_ENV and with SCR_CUDA_QUANT_TC1_VARIANT=narrow2), then the
#   one-row GEMV times of the default and AB_ENV, interleaved, ROUNDS rounds.
# CARRY_DIR/bin.tar.xz (optional, "-" to skip): scr of a CUDA build with one of llama-3.2-1b (1b) /
#   llama-3.1-8b (8b) x mlx-int4-g64. Per model: a random bf16 checkpoint (transformers), `scr
#   quantize`, then 64 greedy ids (decode steps) and the logits of a 1-token prompt with both,
#   compared bit for bit (and the logits' relative L2 difference), then `scr cuda-bench` of both,
#   interleaved, ROUNDS rounds.
# Both carries are packed by tests/cuda/pack_carry.sh. Summary in $OUT/summary.txt.
set -u
OUT=${OUT:-/tmp/scr-xpose-out}
LOGS=/tmp/scr-xpose-logs  # tarred into $OUT at the end (the run tool brings back few files)
mkdir -p "$LOGS" "$OUT"
exec > >(tee -a "$OUT/summary.txt") 2>&1
. tests/cuda/device_lib.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
AB_ENV=${AB_ENV:-SCR_CUDA_QUANT_TC1_VARIANT=xpose}
echo "AB_ENV: $AB_ENV"
declare -A envs=([default]="" [ab]="$AB_ENV" [narrow2]="SCR_CUDA_QUANT_TC1_VARIANT=narrow2")  # expanded unquoted: "" adds nothing
ROUNDS=${ROUNDS:-2}
if [ -n "${2:-}" ]; then
    device_unpack "$2" /tmp/scr-xpose-gemv
    export SCR_REQUIRE_GPU=1
    G=$C/scr_cuda_quant_gemv
    step check_default 500 $G --no-bench
    for v in ab narrow2; do
        step check_$v 300 env ${envs[$v]} $G --no-bench --formats mlx-int4-g32,mlx-int4-g64,mlx-int4-g128
    done
    for v in default ab narrow2; do
        echo "check $v: $(grep -c ' -> ok' "$LOGS/check_$v.txt") ok, $(grep -c 'FAILED' "$LOGS/check_$v.txt") FAILED; $(tail -1 "$LOGS/check_$v.txt")"
    done
    grep "check prefill" "$LOGS/check_default.txt" | head -20
    SHAPES=${SHAPES:-2048x2048,3072x2048,8192x2048,2048x8192,128256x2048,4096x4096,6144x4096,14336x4096,4096x14336,128256x4096}
    for r in $(seq 1 "$ROUNDS"); do
        for v in default ab; do
            step bench_${v}_$r 200 env ${envs[$v]} $G --formats mlx-int4-g64,mlx-int4-g32 --shapes $SHAPES
            echo "== GEMV $v round $r"
            grep -E " tc1 " "$LOGS/bench_${v}_$r.txt" | grep -E "  1 "
        done
    done
    unset SCR_REQUIRE_GPU
fi
if [ -n "${1:-}" ] && [ "$1" != - ]; then
    device_unpack "$1" /tmp/scr-xpose-bin
    S=$C/scr
    for m in ${MODELS:-1b}; do
        make_model_any "$m"
        q=$M-int4
        step quant_$m 400 $S quantize "$M" "$q" --preset mlx-int4-g64
        rm -rf "$M"
        IDS=$(seq -s, 11 130)
        for v in default ab; do
            step greedy_${m}_$v 120 env ${envs[$v]} $S complete "$q" --ids "$IDS" --max-tokens 64 --json
            step logits1_${m}_$v 120 env ${envs[$v]} $S logits "$q" --ids 11
        done
        for w in greedy logits1; do
            if cmp -s "$LOGS/${w}_${m}_default.txt" "$LOGS/${w}_${m}_ab.txt"; then s=same; else s=DIFFERENT; fi
            echo "== $m $w: default vs AB_ENV: $s ($(wc -c < "$LOGS/${w}_${m}_default.txt") bytes)"
        done
        python3 -c "
import re, sys, numpy as np
a, b = (np.array([float(v) for v in re.findall(r'-?[0-9.]+(?:e[-+]?[0-9]+)?', open(f).read().split('[', 1)[-1])]) for f in sys.argv[1:])
n = min(len(a), len(b))
print('== $m logits1: %d values, rel. L2 difference %.3e, argmax %d / %d' % (n, np.linalg.norm(a[:n] - b[:n]) / np.linalg.norm(b[:n]), a[:n].argmax(), b[:n].argmax()))
" "$LOGS/logits1_${m}_default.txt" "$LOGS/logits1_${m}_ab.txt" || true
        for r in $(seq 1 "$ROUNDS"); do
            for v in default ab; do
                step cb_${m}_${v}_$r 200 env ${envs[$v]} $S cuda-bench "$q" --prompt 128 --decode 128 --prefill 2048 --batches 1
                echo "$m $v round $r: $(grep -h -i 'prefill\|batch 1\|B=1 ' "$LOGS/cb_${m}_${v}_$r.txt" | tr '\n' ' ')"
            done
        done
        rm -rf "$q"
    done
fi
printf '%s\n' "${summary[@]}"
tar -C "$LOGS/.." -cJf "$OUT/logs.tar.xz" "$(basename "$LOGS")"
