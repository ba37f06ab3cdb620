#!/bin/bash
# The quantized-GEMV checks and benchmark on the GPU machine, in one call (docs/CUDA.md, "Quantized GEMV"):
#   tests/cuda/quant_device_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr_cuda_quant_gemv (and optionally scr + lib/ from tests/cuda/pack_carry.sh of the same
# build, for a short bf16 fixture check of the unchanged dense path). Logs go to $OUT; the summary is printed last.
set -u
CARRY=${1:-.cudaq-carry}
OUT=${OUT:-/tmp/scr-cudaq-out}
mkdir -p "$OUT"
C=/tmp/scr-cudaq-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
step() {  # step NAME TIMEOUT CMD...: run, keep the whole log in $OUT/NAME.txt, record rc and seconds
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
# Most important first: a run cut short still returns what it did.
step quant_gemv 100 $C/scr_cuda_quant_gemv
step quant_memcheck 35 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_quant_gemv --no-bench --shapes 1001x384,2048x2048
F=tests/fixtures
[ -x $C/scr ] && step fixtures_bf16 30 python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 $F/LlamaForCausalLM $F/Qwen3MoeForCausalLM
grep -h "FAILED\|error" "$OUT"/quant_gemv.txt | head -20
grep -h "ERROR SUMMARY\|checks:" "$OUT"/quant_memcheck.txt
tail -n 4 "$OUT"/fixtures_bf16.txt 2>/dev/null
echo "==== checks (rows 1/3/8/13, all shapes): $(grep -c ' -> ok' "$OUT"/quant_gemv.txt) ok, $(grep -c ' -> FAILED' "$OUT"/quant_gemv.txt) failed; worst err/bound:"
grep -o "err/bound max [0-9.e+-]*" "$OUT"/quant_gemv.txt | sort -k3 -g | tail -1
echo "==== table"
sed -n '/^GB\/s:/,$p' "$OUT"/quant_gemv.txt
echo "==== summary"; printf '%s\n' "${summary[@]}"
