#!/bin/bash
# The bf16 linears' regime boundary (kernels/cuda/linear.cuh: kMmaMinRows, GEMV at 1 row, MMA
# linear at 2-32) against the earlier boundary and the MMA linear from one row, interleaved, on the
# GPU machine, for random bf16 checkpoints of the real shapes (and their MLX int4 g64 quantization):
#   OUT=$OUT [MODELS="8b 1b"] [VARIANTS="default SCR_CUDA_LINEAR=gemv-to-8 SCR_CUDA_LINEAR=mma"]
#       [BATCHES=1,2,3,4,6,8,16] [PROMPT=128] [ROUNDS=2] [QUANT=1] [CHECKS=1] [NCU=0] [BASE=CARRY_DIR] \
#       bash tests/cuda/regime_ab.sh CARRY_DIR [TINY_CARRY_DIR]
# CARRY_DIR/bin.tar.xz: scr of a CUDA build with those models x bf16 (and mlx-int4-g64 for QUANT=1;
# tests/cuda/pack_carry.sh). With TINY_CARRY_DIR (a build with the tiny test models) and CHECKS=1,
# first scr_cuda_linear (each regime's batch invariance), scr_cuda_attention and scr_cuda_tests,
# and at the end the batch, run-ahead and engine gtests under memcheck.
# Per model, round and variant: `scr cuda-bench --prompt P --decode 64 --prefill 0 --batches B`,
# one line of decode tok/s per batch (sampling on the GPU). The variant `base` runs the scr of the
# BASE carry with its defaults (an A/B of two builds). NCU=1: Nsight Compute's full set on
# single 8B launches (NCU_SPECS, default: gate/up and down on the MMA linear at batch 4 and on the
# GEMV at batch 1), a digest of each on stdout, the details in $OUT/ncu_KEY.txt.
set -u
export OUT=${OUT:-/tmp/scr-regime-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
if [ -n "${2:-}" ] && [ "${CHECKS:-1}" = 1 ]; then
    device_unpack "$2" /tmp/scr-regime-tiny
    T=$C
    step linear 240 $T/scr_cuda_linear --no-bench
    grep -E "FAILED|NOT BATCH|differs|rows +(1|2|3|8|9|33):|passed|failed" "$OUT/linear.txt" | head -40
    step attention 300 $T/scr_cuda_attention --no-bench
    grep -E "^FAIL|parts|all attention" "$OUT/attention.txt"
    step gtest 300 $T/scr_cuda_tests
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" "$OUT/gtest.txt" | head -40
fi
device_unpack "$1" /tmp/scr-regime-bin
S=$C
SB=
if [ -n "${BASE:-}" ]; then  # variant `base`: the defaults of another build (BASE=CARRY_DIR)
    device_unpack "$BASE" /tmp/scr-regime-base
    SB=$C
fi
for m in ${MODELS:-8b 1b}; do
    make_model $m
    [ "${QUANT:-1}" = 1 ] && step quant_$m 300 $S/scr quantize "$M" "$M-int4" --preset mlx-int4-g64
    for r in $(seq 1 "${ROUNDS:-2}"); do
        bench_round $m "$M" $r ${BATCHES:-1,2,3,4,6,8,16} ${VARIANTS:-default SCR_CUDA_LINEAR=gemv-to-8 SCR_CUDA_LINEAR=mma}
        if [ "${QUANT:-1}" = 1 ] && [ -d "$M-int4" ]; then
            step q_${m}_r$r 200 $S/scr cuda-bench $M-int4 --prompt ${PROMPT:-128} --decode 64 --prefill 0 --batches ${BATCHES:-1,2,3,4,6,8,16}
            decode_line q_${m}_r$r
        fi
    done
    if [ "${NCU:-0}" = 1 ] && [ $m = 8b ]; then
        # One launch each (Nsight Compute's full set): KEY:KERNEL_REGEX:SKIP:BATCH. A batch-4 decode
        # step launches 129 MMA linears (per layer QKV, o, gate/up, down; then lm_head), a batch-1
        # step 129 GEMVs in the same order; skip 260 lands on layer 0's gate/up of a replayed graph step
        # (a bucket's first step runs eagerly, then as a graph); the GEMV skips also count the prefill's lm_head.
        for spec in ${NCU_SPECS:-mma_gateup:mma_linear_kernel:260:4 mma_down:mma_linear_kernel:261:4 gemv_gateup:gemv_kernel:260:1 gemv_down:gemv_kernel:261:1}; do
            IFS=: read -r key kre skip b <<< "$spec"
            timeout 240 ncu --kernel-name "regex:$kre" --launch-skip $skip --launch-count 1 --clock-control none --set full \
                --import-source no -o /tmp/scr-ncu-$key -f $S/scr cuda-bench $M --prompt 128 --decode 16 --prefill 0 --batches $b \
                > /tmp/ncu_run_$key.txt 2>&1
            echo "==== ncu $key rc=$? ($(grep -m1 -o 'mma_linear_kernel<[^>]*>\|gemv_kernel<[^>]*>' /tmp/ncu_run_$key.txt))"
            [ -f /tmp/scr-ncu-$key.ncu-rep ] || { tail -5 /tmp/ncu_run_$key.txt; continue; }
            ncu -i /tmp/scr-ncu-$key.ncu-rep --print-details all > "$OUT/ncu_$key.txt" 2>&1
            grep -E "  (void|scr)|Duration|DRAM Throughput|Memory Throughput|Registers Per|Block Size|Grid Size|Warp Cycles Per Issued|Issued Warp Per|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Stall (Long|Short|Wait|Barrier|Math|Not|MIO|LG)" "$OUT/ncu_$key.txt" | head -30
        done
    fi
    rm -rf "$M" "$M-int4"
done
if [ -n "${2:-}" ] && [ "${CHECKS:-1}" = 1 ]; then
    step memcheck_engine 300 compute-sanitizer --tool memcheck --error-exitcode 9 $T/scr_cuda_tests --gtest_filter='CudaBatch.*:CudaRunAhead.*:CudaEngine.*'
    grep -h "ERROR SUMMARY" "$OUT/memcheck_engine.txt"
fi
printf '%s\n' "${summary[@]}"
