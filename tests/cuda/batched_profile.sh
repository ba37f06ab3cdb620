#!/bin/bash
# Where a batched decode step spends its time (issue #6: Llama-3.1-8B at B=16/64/256 behind
# llama.cpp), and a same-binary A/B of a switch, in one call of the run tool:
#   OUT=$OUT [AB_ENV=SCR_CUDA_FUSED_SPLIT=0] [MODELS="8b 1b"] [BENCH_BATCHES="16 64 256"] [NCU=1] [NCU_BATCHES="64 16"] \
#       [NCU_EXTRA="--cache-control none"] bash tests/cuda/batched_profile.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr of a CUDA build holding the MODELS (bf16; 8b = llama-3.1-8b, 1b =
# llama-3.2-1b, 30b = qwen3-30b-a3b, 61 GB in /dev/shm), and
# optionally scr_cuda_linear (run first when present).
#  * `scr bench --mode forward`: prefill of 2,048 tokens, then decode at B = 16/64/256, context 192
#    (CUDA graphs; B x vocab logits copied to the host every step), with the defaults and with
#    AB_ENV, alternating, per model;
#  * NCU=1 (default): Nsight Compute, kernels in isolation, of `scr bench --mode forward --batch B`
#    on the 8B for B in NCU_BATCHES (default "64 16"), defaults, summarised per kernel name for one
#    decode step by tests/cuda/ncu_step_table.py.
set -u
CARRY=${1:-.bp-carry}
OUT=${OUT:-/tmp/scr-bp-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
. tests/cuda/device_lib.sh
device_unpack "$CARRY" /tmp/scr-bp-bin
AB_ENV=${AB_ENV:-SCR_CUDA_FUSED_SPLIT=0}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -x $C/scr_cuda_linear ]; then
    step linear 120 $C/scr_cuda_linear
    grep -E "FAIL|passed|batch-invariant|error" "$LOGS/linear.txt" | head -20
fi
for m in ${MODELS:-8b 1b}; do
    cfg=$(model_config "$m") || exit 2
    M=/dev/shm/l$m
    step "make_random_$m" 90 $C/scr make-random "$cfg" $M --dtype bf16
    for B in ${BENCH_BATCHES-16 64 256}; do
        for v in default ab; do
            env=(); [ $v = ab ] && env=($AB_ENV)
            args=(--mode forward --batch $B --context 192 --iters 4 --input-len 16)
            [ $B = 64 ] && args=(--mode forward --batch $B --context 192 --iters 4 --input-len 2048)
            step "bench_${m}_${v}_$B" 60 env "${env[@]}" $C/scr bench $M "${args[@]}"
            echo "== $m $v ($([ $v = ab ] && echo "$AB_ENV" || echo defaults)) B=$B: $(grep -h '^decode batch\|^prefill 2048' "$LOGS/bench_${m}_${v}_$B.txt" | cut -c1-120 | tr '\n' ' ')"
        done
    done
    if [ $m = 8b ] && [ "${NCU:-1}" = 1 ]; then
        for B in ${NCU_BATCHES:-64 16}; do
            step ncu_b$B 150 ncu --clock-control none ${NCU_EXTRA:-} --launch-count 1800 --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
                $C/scr bench $M --mode forward --batch $B --input-len 16 --context 192 --iters 1
            python3 tests/cuda/ncu_step_table.py "$LOGS/ncu_b$B.txt" > "$OUT/ncu_b${B}_table.md" 2>&1
            cat "$OUT/ncu_b${B}_table.md"
        done
    fi
    rm -rf $M
done
printf '%s\n' "${summary[@]}"
