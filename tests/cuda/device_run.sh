#!/bin/bash
# Everything the CUDA target checks and measures on the GPU machine, in one call (docs/CUDA.md):
#   tests/cuda/device_run.sh CARRY_DIR [quick]
# CARRY_DIR/bin.tar.xz holds scr (with `scr cuda-bench`) and scr_cuda_tests built here (-DSCR_TARGET=cuda)
# and lib/ with the shared libraries the GPU machine lacks (tests/cuda/pack_carry.sh makes it).
# Logs go to $OUT; the summary is printed last.
set -u
CARRY=${1:-.cuda-carry}
OUT=${OUT:-/tmp/scr-cuda-out}
LOGS=/tmp/scr-cuda-logs  # one file per step; all of them are appended to $OUT/device_run.log
mkdir -p "$OUT" "$LOGS"
C=/tmp/scr-cuda-bin  # unpacked binaries (tests/cuda/pack_carry.sh made the archive)
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
export SCR_REQUIRE_GPU=1  # the gtests fail, not skip, when the GPU cannot be opened
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
SCR=$C/scr
summary=()
note() { summary+=("$1"); echo "== $1"; }
step() {  # step NAME TIMEOUT CMD...: run, log to $OUT/NAME.txt, record pass/fail and seconds
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    tail -n 12 "$LOGS/$name.txt"
    note "$name: rc=$rc ($((SECONDS - t0)) s)"
    { echo "==== $name: $* -> rc=$rc"; cat "$LOGS/$name.txt"; } >> "$OUT/device_run.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
F=tests/fixtures
FIX="$F/LlamaForCausalLM $F/Qwen3ForCausalLM $F/Qwen3MoeForCausalLM $F/long/LlamaForCausalLM $F/long/Qwen3ForCausalLM $F/long/Qwen3MoeForCausalLM $F/long/MistralForCausalLM $F/seed5/LlamaForCausalLM $F/seed5/Qwen3ForCausalLM $F/seed5/Qwen3MoeForCausalLM"
IDS=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20
# Most important first: a run cut short still returns what it did.
step fixtures_f32 100 python3 tests/cuda/fixture_check.py $SCR $FIX
if [ "${2:-}" != quick ]; then
    step make_random_1b 60 $SCR make-random models/configs/llama/llama-3.2-1b.json /tmp/l1b --dtype bf16
    [ -f /tmp/l1b/model.safetensors ] || step make_random_1b_py 120 python3 tools/make_random_model.py models/configs/llama/llama-3.2-1b.json /tmp/l1b
    step bench_1b 100 $C/scr cuda-bench /tmp/l1b --prompt 128 --decode 128 --prefill 2048 --batches 16,64,256
fi
step gtest 120 $C/scr_cuda_tests
[ -x $C/scr_cuda_linear ] && step linear 120 $C/scr_cuda_linear
[ -x $C/scr_cuda_sample ] && step sample 150 $C/scr_cuda_sample
[ -x $C/scr_cuda_quant_gemv ] && step quant_gemv 150 $C/scr_cuda_quant_gemv
[ -x $C/scr_cuda_attention ] && step attention 200 $C/scr_cuda_attention --no-bench
[ -x $C/scr_cuda_moe ] && step moe 240 $C/scr_cuda_moe --no-bench
[ "${2:-}" != quick ] && step compare_transformers_1b 100 python3 tests/cuda/compare_transformers.py $SCR /tmp/l1b
# The engine's run-ahead and batching paths under memcheck: a prefill beside running decodes, then
# fed graph steps whose padding rows read token ids no step packed (docs/CUDA.md, "Session 25").
step memcheck_engine 300 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_tests --gtest_filter='CudaRunAhead.*:CudaEngine.*:CudaBatch.*:CudaSampling.*'
step memcheck_moe 60 compute-sanitizer --tool memcheck --error-exitcode 9 $SCR complete $F/Qwen3MoeForCausalLM --quant bf16 --ids $IDS --max-tokens 4
step memcheck_llama 60 compute-sanitizer --tool memcheck --error-exitcode 9 $SCR complete $F/long/LlamaForCausalLM --ids $IDS --max-tokens 4
# 40 prompt tokens: the prefill goes through cuBLASLt (33+ rows), the decode through the GEMV.
IDS40=$(seq -s, 1 40)
step memcheck_llama_cublas 90 compute-sanitizer --tool memcheck --error-exitcode 9 $SCR complete $F/LlamaForCausalLM --quant bf16 --ids $IDS40 --max-tokens 4
step fixtures_bf16 50 python3 tests/cuda/fixture_check.py $SCR --quant bf16 --rtol 3e-2 $F/LlamaForCausalLM $F/Qwen3ForCausalLM $F/Qwen3MoeForCausalLM
# racecheck is slow: 120 s was too short on an H100 (docs/CUDA.md "Session 48")
[ -x $C/scr_cuda_sample ] && step racecheck_sample 300 compute-sanitizer --tool racecheck --error-exitcode 9 $C/scr_cuda_sample --quick --no-bench
step initcheck_qwen3 60 compute-sanitizer --tool initcheck --error-exitcode 9 $SCR complete $F/Qwen3ForCausalLM --quant bf16 --ids $IDS --max-tokens 3
echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
grep -h "fixtures match\|rel_err=.*->\|PASSED\|FAILED\|ERROR SUMMARY\|all .* passed\|checks passed" "$LOGS"/*.txt | sort | uniq -c | head -30
grep -h "^model\|^ceilings\|^start-up\|^batch-1\|^decode batch\|^prefill\|^graphs\|^JSON" "$LOGS/bench_1b.txt" 2>/dev/null
