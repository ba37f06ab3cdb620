#!/bin/bash
# The tensor-core prefill attention (kernels/cuda/attention_prefill.cuh) on the GPU machine, one call:
#   OUT=$OUT [MODELS="1b 8b"] bash tests/cuda/attn_prefill_run.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz (tests/cuda/pack_carry.sh): scr built with -DSCR_MODELS="llama-3.2-1b;llama-3.1-8b;
# tiny-llama;tiny-llama-h64;tiny-qwen3-h64;tiny-qwen3-moe;tiny-qwen3-moe-h64" -DSCR_QUANT=bf16, and
# scr_cuda_attention. Steps, most important first:
#   1. scr_cuda_attention: both prefill kernels against float64, then their times; racecheck of the checks;
#   2. the fixtures against transformers in bf16 (long prompts: the prefill kernel), with the
#      tensor-core kernel and with SCR_CUDA_ATTN_PREFILL=keys; memcheck of a 100-token bf16 prompt;
#   3. Llama-3.2-1B (random bf16) against transformers (compare_transformers.py, 300-token prompt);
#   4. `scr bench --mode forward --input-len 2048` prefill for MODELS, default and =keys, alternating.
set -u
CARRY=${1:-.ap-carry}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-ap-out /tmp/scr-ap-logs  # tarred into $OUT at the end (the run tool brings back few files)
device_unpack "$CARRY" /tmp/scr-ap-bin
F=tests/fixtures
FIX="$F/LlamaForCausalLM $F/Qwen3ForCausalLM $F/Qwen3MoeForCausalLM $F/long/LlamaForCausalLM $F/long/Qwen3ForCausalLM $F/long/Qwen3MoeForCausalLM"

step attention_checks 240 $C/scr_cuda_attention
grep -E "^(ok|FAIL)|passed|FAILED|^\||^  " "$LOGS/attention_checks.txt"
step fixtures_bf16 120 python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 $FIX
step fixtures_bf16_keys 120 env SCR_CUDA_ATTN_PREFILL=keys python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 $FIX
for f in fixtures_bf16 fixtures_bf16_keys; do echo "-- $f"; grep -h "rel_err\|fixtures match" "$LOGS/$f.txt"; done
step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr complete $F/long/LlamaForCausalLM --quant bf16 --ids $(seq -s, 1 100) --max-tokens 2
grep -h "ERROR SUMMARY" "$LOGS/memcheck.txt"
step racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 9 $C/scr_cuda_attention --no-bench
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|hazard" "$LOGS/racecheck.txt" | head -5
for m in ${MODELS:-1b 8b}; do
    make_model $m
    [ $m = 1b ] && { step compare_1b 200 python3 tests/cuda/compare_transformers.py $C/scr $M --tokens 300; tail -n 4 "$LOGS/compare_1b.txt"; }
    for r in 1 2; do
        for v in default keys; do
            env=(); [ $v = keys ] && env=(SCR_CUDA_ATTN_PREFILL=keys)
            step "bench_${m}_${v}_$r" 120 env "${env[@]}" $C/scr bench $M --mode forward --batch 1 --input-len 2048 --context 16 --iters 3
            echo "== $m $v round $r: $(grep -h '^prefill' "$LOGS/bench_${m}_${v}_$r.txt")"
        done
    done
    rm -rf $M
done
printf '%s\n' "${summary[@]}"
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
