#!/bin/bash
# The size rule of the MLX int4 staged passes (issue #9; kernels/cuda/quant_staged.cuh,
# kQsPassMinKiB): which launches of 17-64 token rows run in passes of 16 and which stay on
# quant_mma_kernel, on the GPU machine, in one call:
#   OUT=$OUT [PHASE="checks kbench graphs e2e"] [VARIANTS=...] [BATCHES=24,32,48,64] [ROUNDS=1]
#       [MEMCHECK=0] [LOGITS=0] bash tests/cuda/qpass_rule_ab.sh S_CARRY T_CARRY
# S_CARRY/bin.tar.xz: scr and scr_cuda_quant_gemv of a CUDA build with llama-3.2-1b and llama-3.1-8b
# x mlx-int4-g64 (tests/cuda/pack_carry.sh); T_CARRY/bin.tar.xz: scr_cuda_tests of the fixtures'
# CUDA build (for the graph test), run with S_CARRY's lib/.
#   checks: scr_cuda_quant_gemv --no-bench on the three MLX int4 formats (the regimes of each shape
#           under the rule, bit for bit; values against float64), with MEMCHECK=1 also under memcheck;
#   kbench: per-launch times at 16-64 rows of the 1B and 8B shapes, staged (tc1) and quant_mma_kernel (mma);
#   graphs: scr_cuda_tests' CudaGraphs test, plain and under compute-sanitizer's memcheck;
#   e2e:    per model and round, `scr cuda-bench --prompt 128 --decode 64 --prefill 0` for each
#           variant (qstaged_ab.sh's bench_round), e.g. SCR_CUDA_QUANT_STAGED_PASS_KIB=N; with LOGITS=1
#           first per model qrows_logits.py --mode staged and --mode passes (steps of 1-64 rows against
#           SCR_CUDA_QUANT_STAGED=0, within the tolerance; 1-2 rows the same bits).
set -u
S_CARRY=$1
T_CARRY=$2
export OUT=${OUT:-/tmp/scr-qpass-ab}
mkdir -p "$OUT"
PHASE=${PHASE:-checks kbench graphs e2e}
has() { case " $PHASE " in *" $1 "*) return 0 ;; esac; return 1; }
SHAPES_ALL=6144x4096,4096x4096,28672x4096,4096x14336,128256x4096,3072x2048,2048x2048,16384x2048,2048x8192
if has checks || has kbench; then
    OUT=$OUT CHECKS=$(has checks && echo 1 || echo 0) KBENCH=$(has kbench && echo 1 || echo 0) MODELS="" \
        MEMCHECK=${MEMCHECK:-0} KROWS="16|24|32|48|64" KGREP="tc1|mma" SHAPES=$SHAPES_ALL bash tests/cuda/qstaged_ab.sh "$S_CARRY"
fi
if has graphs; then
    . tests/cuda/device_lib.sh
    LOGS=$OUT
    device_unpack "$S_CARRY" /tmp/scr-qpass-bin
    mkdir -p /tmp/scr-qpass-t && tar -C /tmp/scr-qpass-t -xJf "$T_CARRY/bin.tar.xz" || { echo "cannot unpack $T_CARRY/bin.tar.xz"; exit 1; }
    export SCR_REQUIRE_GPU=1
    T=/tmp/scr-qpass-t/scr_cuda_tests
    step graphs 120 $T --gtest_filter='CudaGraphs.*:CudaBatch.DecodeStepKeepsTheBitsBf16'
    grep -E "^\[ +(OK|FAILED|PASSED) +\]|Failure|differ|not" "$OUT/graphs.txt" | head -12
    step graphs_memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaGraphs.*'
    grep -E "ERROR SUMMARY|^\[ +(OK|FAILED|PASSED) +\]" "$OUT/graphs_memcheck.txt" | head -6
    printf '%s\n' "${summary[@]}"
fi
if has e2e; then
    OUT=$OUT CHECKS=${LOGITS:-0} QGEMV=0 UPTO=$([ "${LOGITS:-0}" = 1 ] && echo 256) KBENCH=0 MEMCHECK=0 MODELS="${MODELS-1b 8b}" ROUNDS=${ROUNDS:-1} BATCHES=${BATCHES:-24,32,48,64} \
        VARIANTS="${VARIANTS:-default SCR_CUDA_QUANT_STAGED_PASS_KIB=0 SCR_CUDA_QUANT_STAGED_PASS_KIB=8193}" \
        bash tests/cuda/qstaged_ab.sh "$S_CARRY"
fi
