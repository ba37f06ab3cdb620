#!/bin/bash
# Variants of the one-row int4 tensor-core GEMV (quant_mma1_kernel, issue #9) side by side, on the
# GPU machine, in one call (variants: see venv below):
#   OUT=$OUT [VARIANTS="default xone"] [CHECK_VARIANTS=...] [MODELS=8b] [ROUNDS=2] [NOBENCH=1] [SHAPES=NxK,...] [FORMATS=...]
#       [CB_PREFILL=0] [E2E_FORMATS="int4 bf16"] [LATENCY=1]
#       bash tests/cuda/tc1_variants_ab.sh [CARRY_DIR|-] [GEMV_CARRY_DIR]
# GEMV_CARRY_DIR/bin.tar.xz (optional): scr_cuda_quant_gemv. Its checks of the MLX int4 formats
#   under every variant, then (unless NOBENCH=1) its bench (one-row GEMV and the fused launches) per
#   variant, interleaved, ROUNDS rounds.
# CARRY_DIR/bin.tar.xz (optional, "-" to skip): scr of a CUDA build with llama-3.2-1b (1b) and/or
#   llama-3.1-8b (8b) x mlx-int4-g64 (and bf16 for E2E_FORMATS="int4 bf16"). Per model: a random bf16
#   checkpoint, `scr quantize` for int4, then per format and variant 64 greedy ids and the logits of
#   a 1-token prompt, each compared bit for bit with the first variant's, then `scr cuda-bench`
#   (prefill CB_PREFILL tokens; with LATENCY=1 also `scr bench --mode latency`, the engine's path)
#   per variant, interleaved, ROUNDS rounds.
# Both carries are packed by tests/cuda/pack_carry.sh. Summary in $OUT/summary.txt.
set -u
. tests/cuda/device_lib.sh
device_begin /tmp/scr-tc1v-out /tmp/scr-tc1v-logs  # tarred into $OUT at the end (the run tool brings back few files)
read -r -a VARS <<< "${VARIANTS:-default xone}"
read -r -a CVARS <<< "${CHECK_VARIANTS:-${VARS[*]}}"  # the variants whose GEMV checks run (default: all)
# A variant is "default", a value of SCR_CUDA_QUANT_TC1_VARIANT, or a whole NAME=VALUE assignment
# (e.g. SCR_CUDA_QUANT_TC1_PARTS=fifths), or several of those joined by "+" (e.g.
# xone+SCR_CUDA_QUANT_TC1_PARTS=4). venv prints them as words for env.
venv() {
    local part
    for part in ${1//+/ }; do
        case $part in
        default) echo "SCR_CUDA_QUANT_TC1_VARIANT=" ;;
        *=*) echo "$part" ;;
        *) echo "SCR_CUDA_QUANT_TC1_VARIANT=$part" ;;
        esac
    done
}
ROUNDS=${ROUNDS:-2}
if [ -n "${2:-}" ]; then
    device_unpack "$2" /tmp/scr-tc1v-gemv
    export SCR_REQUIRE_GPU=1
    G=$C/scr_cuda_quant_gemv
    for v in "${CVARS[@]}"; do
        step check_$v 400 env $(venv $v) $G --no-bench --formats mlx-int4-g32,mlx-int4-g64,mlx-int4-g128
        echo "check $v: $(grep -c ' -> ok' "$LOGS/check_$v.txt") ok, $(grep -c 'FAILED' "$LOGS/check_$v.txt") FAILED; $(tail -1 "$LOGS/check_$v.txt")"
    done
    SHAPES=${SHAPES:-3072x2048,2048x8192,128256x2048,4096x4096,6144x4096,14336x4096,4096x14336,128256x4096}
    for r in $(seq 1 "$([ -n "${NOBENCH:-}" ] && echo 0 || echo "$ROUNDS")"); do
        for v in "${VARS[@]}"; do
            step bench_${v}_$r 300 env $(venv $v) $G --formats "${FORMATS:-mlx-int4-g64}" --shapes $SHAPES
            echo "== GEMV $v round $r"
            grep -E " tc1 " "$LOGS/bench_${v}_$r.txt" | grep -E "  1 "
            grep -E "^bench fused" "$LOGS/bench_${v}_$r.txt"
        done
    done
    unset SCR_REQUIRE_GPU
fi
if [ -n "${1:-}" ] && [ "$1" != - ]; then
    device_unpack "$1" /tmp/scr-tc1v-bin
    S=$C/scr
    for m in ${MODELS:-8b}; do
        make_model_any "$m"
        for fmt in ${E2E_FORMATS:-int4}; do
            if [ "$fmt" = bf16 ]; then
                q=$M
            else
                q=$M-int4
                step quant_$m 400 $S quantize "$M" "$q" --preset mlx-int4-g64
            fi
            k=${m}_$fmt
            IDS=$(seq -s, 11 130)
            for v in "${VARS[@]}"; do
                step greedy_${k}_$v 120 env $(venv $v) $S complete "$q" --ids "$IDS" --max-tokens 64 --json
                step logits1_${k}_$v 120 env $(venv $v) $S logits "$q" --ids 11
            done
            for v in "${VARS[@]:1}"; do
                for w in greedy logits1; do
                    if cmp -s "$LOGS/${w}_${k}_${VARS[0]}.txt" "$LOGS/${w}_${k}_$v.txt"; then s=same; else s=DIFFERENT; fi
                    echo "== $k $w: $v vs ${VARS[0]}: $s ($(wc -c < "$LOGS/${w}_${k}_$v.txt") bytes)"
                done
            done
            for r in $(seq 1 "$ROUNDS"); do
                for v in "${VARS[@]}"; do
                    step cb_${k}_${v}_$r 200 env $(venv $v) $S cuda-bench "$q" --prompt 128 --decode 128 --prefill "${CB_PREFILL:-0}" --batches 1
                    echo "$k $v round $r: $(grep -h -o '"decode_device_ms": [0-9.]*\|"batch_tps": {[^}]*}\|"prefill_tps": [0-9.]*' "$LOGS/cb_${k}_${v}_$r.txt" | tr '\n' ' ')"
                    grep -h "step parts" "$LOGS/cb_${k}_${v}_$r.txt" | sed 's/^/    /'
                    if [ "${LATENCY:-0}" = 1 ]; then  # the engine's path: one request at a time, 256 tokens each
                        step lat_${k}_${v}_$r 300 env $(venv $v) $S bench "$q" --mode latency --concurrency 1 --num-prompts 3 \
                            --input-len 128 --output-len 256 --prefix-caching off --temperature 0
                        echo "$k $v round $r, engine: $(grep -h -E 'output tokens/s|TPOT' "$LOGS/lat_${k}_${v}_$r.txt" | tr -s ' ' | tr '\n' ' ')"
                    fi
                done
            done
            [ "$q" != "$M" ] && rm -rf "$q"
        done
        rm -rf "$M"
    done
fi
printf '%s\n' "${summary[@]}"
tar -C "$LOGS/.." -cJf "$OUT/logs.tar.xz" "$(basename "$LOGS")"
