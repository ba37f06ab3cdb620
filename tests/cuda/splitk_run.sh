#!/bin/bash
# Split-K of the tensor-core quantized GEMV (SCR_CUDA_QUANT_SPLITK, docs/CUDA.md "Quantized GEMV") on
# the GPU machine in one call:   tests/cuda/splitk_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: tests/cuda/pack_carry.sh of a CUDA build holding only scr_cuda_quant_gemv.
# Steps, most important first, each under its own timeout: the GEMV checks (float64 reference, batch
# invariance, fused variants) of every format with the split on; the timing table at the 1B shapes
# with the old split (SCR_CUDA_QUANT_SPLITK=0, the default) and the new one (=1), same binary;
# compute-sanitizer memcheck with the split on; then, while the time lasts, 8B shapes, int4-g32 and fp8.
# Logs in $OUT (at most 8 files come back).
set -u
CARRY=${1:-.q4speed-carry}
export OUT=${OUT:-/tmp/scr-splitk-out}
mkdir -p "$OUT"
C=/tmp/scr-splitk-bin
rm -rf $C; mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SCR_REQUIRE_GPU=1
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
step() {  # step NAME TIMEOUT CMD...: log to $OUT/NAME.txt, record rc and seconds
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    summary+=("$name: rc=$? ($((SECONDS - t0)) s)")
}
G=$C/scr_cuda_quant_gemv
SHAPES=2048x2048,8192x2048,2048x8192,128256x2048
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step checks_split 60 env SCR_CUDA_QUANT_SPLITK=1 $G --no-bench --shapes 2048x2048,8192x2048,2048x8192,1001x384
echo "==== checks (split on): $(grep -c -- '-> ok' $OUT/checks_split.txt) ok, $(grep -c -- '-> FAILED' $OUT/checks_split.txt) failed"
grep -h "FAILED\|error\|checks:\|selftest (split" $OUT/checks_split.txt | head -12
for mode in 0 1; do
    step "bench_mode$mode" 45 env SCR_CUDA_QUANT_SPLITK=$mode $G --formats mlx-int4-g64,int8 --shapes $SHAPES
    echo "==== SCR_CUDA_QUANT_SPLITK=$mode: $(grep -h 'checks:' $OUT/bench_mode$mode.txt)"
    sed -n '/^GB\/s:/,$p' "$OUT/bench_mode$mode.txt" | grep -E "mma" | grep -E " (1|8|64) "
done
step memcheck 45 env SCR_CUDA_QUANT_SPLITK=1 compute-sanitizer --tool memcheck --error-exitcode 9 $G --no-bench \
    --formats mlx-int4-g64,int8 --shapes 1001x384,2048x2048,8192x2048
grep -h "ERROR SUMMARY\|checks:" $OUT/memcheck.txt
# 8B shapes and the other formats (int4-g32: 172 registers, one block per SM), while the time lasts.
for mode in 0 1; do
    [ $SECONDS -gt 150 ] && break
    step "bench8b_mode$mode" 40 env SCR_CUDA_QUANT_SPLITK=$mode $G --formats mlx-int4-g32,fp8 --shapes 4096x4096,14336x4096,4096x14336,2048x8192
    echo "==== 8B shapes, SCR_CUDA_QUANT_SPLITK=$mode: $(grep -h 'checks:' $OUT/bench8b_mode$mode.txt)"
    sed -n '/^GB\/s:/,$p' "$OUT/bench8b_mode$mode.txt" | grep -E "mma" | grep -E " (1|8) "
done
echo "==== summary"; printf '%s\n' "${summary[@]}"
