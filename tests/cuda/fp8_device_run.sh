#!/bin/bash
# fp8 (and the other quantized presets) on the GPU machine in one call (docs/CUDA.md, "Quantized presets
# end to end" and "Quantized GEMV"):
#   tests/cuda/fp8_device_run.sh CARRY_DIR
# CARRY_DIR: bin.tar.xz (tests/cuda/pack_carry.sh of a CUDA build with scr_cuda_quant_gemv and the tiny
# quantized presets; with llama-3.2-1b too when FP8_ONE_B names presets) and expected.json /
# expected.f32.xz (tests/cuda/quant_e2e.py expect).
# Steps, most important first (a run cut short still returns what it did): the quantized GEMV checks
# and bench for fp8, fp8-tensor and int8; compute-sanitizer memcheck of the fp8 GEMVs; the tiny
# end-to-end cases against the CPU build; with FP8_ONE_B="int8 fp8 fp8-tensor" (a build with
# llama-3.2-1b), batch-1 decode of a random Llama-3.2-1B in bf16 and those presets
# (tests/cuda/quant_e2e_run.sh). Logs go to $OUT.
set -u
CARRY=${1:-.fp8-carry}
export OUT=${OUT:-/tmp/scr-fp8-out}
mkdir -p "$OUT"
C=/tmp/scr-fp8-bin
rm -rf $C; mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
step() {  # step NAME TIMEOUT CMD...: run, keep the log in $OUT/NAME.txt, record rc and seconds
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    summary+=("$name: rc=$? ($((SECONDS - t0)) s)")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
SHAPES=${FP8_SHAPES:-2048x2048,8192x2048,2048x8192,4096x4096,14336x4096,4096x14336,1001x384}
# The carry may hold the GEMV test, scr, or both (the 64 MiB working-tree limit can force two calls).
if [ -x $C/scr_cuda_quant_gemv ]; then
    step quant_gemv "${FP8_GEMV_LIMIT:-70}" $C/scr_cuda_quant_gemv --formats fp8,fp8-tensor,int8 --shapes "$SHAPES"
    step quant_memcheck 40 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_quant_gemv --no-bench \
        --formats fp8,fp8-tensor --shapes 1001x384,2048x2048
    grep -h "host selftest\|FAILED\|error" "$OUT"/quant_gemv.txt | head -20
    echo "==== gemv checks: $(grep -c -- '-> ok' "$OUT"/quant_gemv.txt) ok, $(grep -c -- '-> FAILED' "$OUT"/quant_gemv.txt) failed"
    grep -h "ERROR SUMMARY\|checks:" "$OUT"/quant_memcheck.txt
    echo "==== table"
    sed -n '/^GB\/s:/,$p' "$OUT"/quant_gemv.txt | grep -v "^quant GEMV"
fi
[ -x $C/scr ] && bash tests/cuda/quant_e2e_run.sh "$CARRY" "${FP8_ONE_B:-}"
echo "==== summary"; printf '%s\n' "${summary[@]}"
