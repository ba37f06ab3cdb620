#!/bin/bash
# The grouped expert GEMMs (kernels/cuda/moe_gemm.cuh) on the GPU machine, in one call of the run tool:
#   OUT=$OUT [ROUNDS=1] [SKIP_30B=1] [VARIANTS="default gemv"] bash tests/cuda/moe_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz (tests/cuda/pack_carry.sh): scr built with -DSCR_MODELS="qwen3-30b-a3b;tiny-qwen3-moe"
# -DSCR_QUANT=bf16, and scr_cuda_moe. Steps, most important first:
#   1. scr_cuda_moe: float64 checks and batch invariance of both expert paths, then their times at
#      Qwen3-30B-A3B's shape;
#   2. the tiny Qwen3-MoE fixtures (short, long) against transformers in bf16 (grouped GEMMs
#      in every prefill and decode step), and compute-sanitizer memcheck of a bf16 completion;
#   3. Qwen3-30B-A3B (random bf16 weights, /dev/shm): `scr cuda-bench` for each of VARIANTS, alternating,
#      ROUNDS times: default, gemv (SCR_CUDA_MOE_GEMM=0: per-pair GEMVs), ksplit
#      (SCR_CUDA_MOE_WIDE=ksplit: wide steps on the k-split kernel; also reruns step 1 that way).
set -u
CARRY=${1:-.moe-carry}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-moe-out /tmp/scr-moe-logs  # tarred into $OUT at the end (the run tool brings back few files)
device_unpack "$CARRY" /tmp/scr-moe-bin
F=tests/fixtures
IDS=$(seq -s, 1 40)

step moe_checks 240 $C/scr_cuda_moe
grep -E "^(ok|FAIL)|passed|FAILED|^\|" "$LOGS/moe_checks.txt"
if [[ " ${VARIANTS:-} " == *" ksplit "* ]]; then
    step moe_checks_ksplit 240 env SCR_CUDA_MOE_WIDE=ksplit $C/scr_cuda_moe
    grep -E "^FAIL|passed|FAILED|^\|" "$LOGS/moe_checks_ksplit.txt"
fi
step fixtures_bf16 120 python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 $F/Qwen3MoeForCausalLM $F/long/Qwen3MoeForCausalLM
tail -n 6 "$LOGS/fixtures_bf16.txt"
step memcheck_moe 120 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr complete $F/Qwen3MoeForCausalLM --quant bf16 --ids $IDS --max-tokens 4
grep -h "ERROR SUMMARY" "$LOGS/memcheck_moe.txt"

if [ "${SKIP_30B:-0}" != 1 ]; then
    M=/dev/shm/m30b
    step make_random_30b 150 $C/scr make-random models/configs/qwen3_moe/qwen3-30b-a3b.json $M --dtype bf16
    for r in $(seq ${ROUNDS:-1}); do
        for v in ${VARIANTS:-default gemv}; do
            env=()
            [ $v = gemv ] && env=(SCR_CUDA_MOE_GEMM=0)
            [ $v = ksplit ] && env=(SCR_CUDA_MOE_WIDE=ksplit)
            step "bench_30b_${v}_$r" 150 env "${env[@]}" $C/scr cuda-bench $M --prompt 64 --decode 64 --prefill ${PREFILL:-2048} --batches 16,64 --batch-steps 16
            echo "== 30b $v round $r:"; grep -h '^batch-1 decode\|^decode batch\|^prefill' "$LOGS/bench_30b_${v}_$r.txt" | cut -c1-150
        done
    done
    rm -rf $M
fi
printf '%s\n' "${summary[@]}"
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
