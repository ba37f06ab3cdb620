#!/bin/bash
# The shared-memory SIMT quantized GEMV (quant_smem_kernel, issue #9; docs/CUDA.md "Quantized GEMV")
# on the GPU machine in one call:   OUT=$OUT bash tests/cuda/qsmem_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: tests/cuda/pack_carry.sh of a CUDA build holding scr_cuda_quant_gemv.
# Steps, most important first, each under its own timeout: the GEMV checks of every format (smem,
# mma and simt paths: float64 reference, batch invariance, the fused variants); the timing table
# (smem vs mma vs simt, same process) at the 1B shapes, then the 8B shapes; compute-sanitizer
# memcheck of the checks. Logs in $OUT.
set -u
CARRY=${1:-.q5-carry}
export OUT=${OUT:-/tmp/scr-qsmem-out}
mkdir -p "$OUT"
C=/tmp/scr-qsmem-bin
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
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step checks 60 $G --no-bench --shapes 2048x2048,8192x2048,2048x8192,1001x384
echo "==== checks: $(grep -c -- '-> ok' $OUT/checks.txt) ok, $(grep -c -- '-> FAILED' $OUT/checks.txt) failed"
grep -h "FAILED\|error\|checks:" $OUT/checks.txt | head -20
step bench1b 50 $G --formats mlx-int4-g64,int8 --shapes 2048x2048,8192x2048,2048x8192,128256x2048
echo "==== 1B shapes: $(grep -h 'checks:' $OUT/bench1b.txt)"
sed -n '/^GB\/s:/,$p' "$OUT/bench1b.txt" | grep -E " (1|2|4|8) "
step bench8b 45 $G --formats mlx-int4-g64 --shapes 4096x4096,14336x4096,4096x14336,128256x4096
echo "==== 8B shapes: $(grep -h 'checks:' $OUT/bench8b.txt)"
sed -n '/^GB\/s:/,$p' "$OUT/bench8b.txt" | grep -E " (1|8) "
[ $SECONDS -lt 150 ] && step memcheck 40 compute-sanitizer --tool memcheck --error-exitcode 9 $G --no-bench \
    --formats mlx-int4-g64,int8 --shapes 1001x384,2048x2048
grep -h "ERROR SUMMARY\|checks:" $OUT/memcheck.txt 2>/dev/null
echo "==== summary"; printf '%s\n' "${summary[@]}"
