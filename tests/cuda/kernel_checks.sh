#!/bin/bash
# The CUDA kernel and engine checks that need no `scr` binary, in one call on the GPU machine (the
# run tool carries at most 64 MiB with the working tree, so this carry leaves `scr` out):
#   tests/cuda/kernel_checks.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr_cuda_tests, scr_cuda_linear, scr_cuda_sample, scr_cuda_quant_gemv + lib/
# (tests/cuda/pack_carry.sh packs them with scr; drop scr from the archive when it is too large).
# Each step under its own timeout, logs appended to $OUT/kernel_checks.log, a summary at the end.
set -u
CARRY=${1:-.cuda-carry}
OUT=${OUT:-/tmp/scr-cuda-out}
mkdir -p "$OUT"
C=/tmp/scr-cuda-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SCR_REQUIRE_GPU=1
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
step() {  # step NAME TIMEOUT CMD... (skipped when the carry lacks the binary it runs)
    local name=$1 limit=$2; shift 2
    local bin
    for bin in "$@"; do case $bin in $C/*) [ -x "$bin" ] || { summary+=("$name: skipped (no $(basename "$bin") in the carry)"); return; } ;; esac; done
    local t0=$SECONDS
    timeout "$limit" "$@" > /tmp/step.txt 2>&1
    local rc=$?
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
    { echo "==== $name: $* -> rc=$rc"; cat /tmp/step.txt; } >> "$OUT/kernel_checks.log"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step gtest 180 $C/scr_cuda_tests
step linear 150 $C/scr_cuda_linear
step sample 180 $C/scr_cuda_sample
step quant_gemv 180 $C/scr_cuda_quant_gemv
step memcheck_engine 200 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_tests --gtest_filter='CudaBatch.*:CudaEngine.*:CudaSampling.*:CudaErrors.*'
step racecheck_sample 150 compute-sanitizer --tool racecheck --error-exitcode 9 $C/scr_cuda_sample --quick --no-bench
step memcheck_quant 150 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_quant_gemv --no-bench
echo "==== summary"; printf '%s\n' "${summary[@]}"
grep -h "PASSED\|FAILED\|ERROR SUMMARY\|passed\|NOT BATCH" "$OUT/kernel_checks.log" | sort | uniq -c | head -30
