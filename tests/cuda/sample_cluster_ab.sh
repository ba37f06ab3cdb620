#!/bin/bash
# Two variants of the GPU sampler (kernels/cuda/sample.cuh; by default one block per row against clusters of 2-8) on the GPU machine,
# in one call:
#   OUT=$OUT [MODELS="1b"] [FORMATS="int4 bf16"] [ROUNDS=2] [TEST_FILTER=...] [SAMPLE_ONLY=1]
#       [A_ENV=SCR_CUDA_SAMPLE_CLUSTER=1] [B_ENV=SCR_CUDA_SAMPLE_CLUSTER=0] [SAMPLED="--temperature 0.8 ..."]
#       bash tests/cuda/sample_cluster_ab.sh SCR_CARRY|- [TEST_CARRY]
# A_ENV / B_ENV: the two variants of the engine runs (default: one block per row against the
# launcher's clusters; e.g. A_ENV=SCR_CUDA_SAMPLE_SELECT=radix B_ENV=SCR_CUDA_SAMPLE_SELECT= for the
# radix descent alone against the value bins). SAMPLE_ONLY=1: of TEST_CARRY only scr_cuda_sample.
# TEST_CARRY/bin.tar.xz (optional): scr_cuda_sample (every check, then its timing: one block per row
#   against the launcher's cluster size, alternating in one process), compute-sanitizer memcheck of
#   its quick checks (and racecheck with RACECHECK=1), and scr_cuda_tests (every test, or TEST_FILTER) with
#   SCR_REQUIRE_GPU=1, plus memcheck of the sampling tests; scr (of the same build) checks the
#   fixtures against transformers (tests/cuda/fixture_check.py).
# SCR_CARRY/bin.tar.xz: scr of a CUDA build with llama-3.2-1b (1b) and/or llama-3.1-8b (8b) x bf16 and
#   mlx-int4-g64. Per model and format: 64 ids through the engine (`scr complete`, greedy and seeded
#   T 0.8 / top-k 50 / top-p 0.9) with one block per row (SCR_CUDA_SAMPLE_CLUSTER=1) and the default,
#   compared byte for byte; then ROUNDS rounds, the two interleaved, of `scr bench --mode latency`
#   (one request at a time, 256 tokens) greedy and with T 0.8 / top-k 50 / top-p 0.9, and of
#   `scr cuda-bench --batches 1` (greedy).
# Both carries are packed by tests/cuda/pack_carry.sh. Summary in $OUT/summary.txt.
set -u
. tests/cuda/device_lib.sh
device_begin /tmp/scr-sc-out /tmp/scr-sc-logs  # tarred into $OUT at the end (the run tool brings back few files)
ROUNDS=${ROUNDS:-2}
if [ -n "${2:-}" ]; then
    device_unpack "$2" /tmp/scr-sc-tests
    T=$C
    export SCR_REQUIRE_GPU=1
    step sample 300 $T/scr_cuda_sample
    echo "sample: $(grep -E '^(PASSED|FAILED)' "$LOGS/sample.txt")"
    grep -E '^FAIL' "$LOGS/sample.txt" | head -10
    grep -E '^timing' "$LOGS/sample.txt"
    step memcheck_sample 300 compute-sanitizer --tool memcheck --error-exitcode 9 $T/scr_cuda_sample --quick --no-bench
    echo "memcheck sample: $(grep -E 'ERROR SUMMARY|^PASSED|^FAILED' "$LOGS/memcheck_sample.txt" | tr '\n' ' ')"
    if [ "${RACECHECK:-0}" = 1 ]; then  # slow: over 300 s for the quick checks
        step racecheck_sample 600 compute-sanitizer --tool racecheck $T/scr_cuda_sample --quick --no-bench
        echo "racecheck sample: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|^PASSED|^FAILED' "$LOGS/racecheck_sample.txt" | tr '\n' ' ')"
    fi
    if [ -z "${SAMPLE_ONLY:-}" ]; then
        step cuda_tests 400 $T/scr_cuda_tests ${TEST_FILTER:+--gtest_filter="$TEST_FILTER"}
        echo "cuda_tests: $(grep -E '^\[  (PASSED|FAILED) |tests? ran' "$LOGS/cuda_tests.txt" | tr '\n' ' ')"
        grep -E '^\[  FAILED|Failure' "$LOGS/cuda_tests.txt" | head -20
        step memcheck_sampling 300 compute-sanitizer --tool memcheck --error-exitcode 9 $T/scr_cuda_tests --gtest_filter='CudaSampling*:CudaRunAhead*'
        echo "memcheck sampling: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$LOGS/memcheck_sampling.txt" | tr '\n' ' ')"
        F=tests/fixtures
        step fixtures 200 python3 tests/cuda/fixture_check.py $T/scr $F/LlamaForCausalLM $F/Qwen3ForCausalLM $F/Qwen3MoeForCausalLM \
            $F/long/LlamaForCausalLM $F/long/Qwen3ForCausalLM $F/long/Qwen3MoeForCausalLM $F/long/MistralForCausalLM
        echo "fixtures: $(tail -3 "$LOGS/fixtures.txt" | tr '\n' ' ')"
    fi
    unset SCR_REQUIRE_GPU
fi
if [ -n "${1:-}" ] && [ "$1" != - ]; then
    device_unpack "$1" /tmp/scr-sc-bin
    S=$C/scr
    SAMPLED=${SAMPLED:-"--temperature 0.8 --top-k 50 --top-p 0.9"}
    A_ENV=${A_ENV:-SCR_CUDA_SAMPLE_CLUSTER=1}
    B_ENV=${B_ENV:-SCR_CUDA_SAMPLE_CLUSTER=0}
    echo "variant 1: $A_ENV; variant auto: $B_ENV; sampled: $SAMPLED"
    for m in ${MODELS:-1b}; do
        make_model_any "$m"
        declare -A dir=([bf16]=$M [int4]=$M-int4)
        if [[ " ${FORMATS:-int4 bf16} " == *" int4 "* ]]; then
            step quant_$m 400 $S quantize "$M" "$M-int4" --preset mlx-int4-g64
        fi
        IDS=$(seq -s, 11 130)
        for f in ${FORMATS:-int4 bf16}; do
            d=${dir[$f]}
            for how in greedy sampled; do
                args="--max-tokens 64 --json"
                [ $how = sampled ] && args="$args $SAMPLED --seed 7"
                for c in 1 auto; do
                    step ids_${m}_${f}_${how}_$c 200 env "$([ $c = 1 ] && echo "$A_ENV" || echo "$B_ENV")" \
                        $S complete "$d" --ids "$IDS" $args
                done
                if cmp -s "$LOGS/ids_${m}_${f}_${how}_1.txt" "$LOGS/ids_${m}_${f}_${how}_auto.txt"; then s=same; else s=DIFFERENT; fi
                echo "== $m $f $how ids, variant 1 vs auto: $s ($(wc -c < "$LOGS/ids_${m}_${f}_${how}_auto.txt") bytes)"
            done
            for r in $(seq 1 "$ROUNDS"); do
                for how in greedy sampled; do
                    for c in 1 auto; do
                        step lat_${m}_${f}_${how}_${c}_$r 300 env "$([ $c = 1 ] && echo "$A_ENV" || echo "$B_ENV")" \
                            $S bench "$d" --mode latency --concurrency 1 --num-prompts 3 --input-len 128 --output-len 256 \
                            --prefix-caching off $([ $how = sampled ] && echo "$SAMPLED" || echo "--temperature 0")
                        echo "$m $f $how variant $c round $r: $(grep -h -E 'output tokens/s|TPOT' "$LOGS/lat_${m}_${f}_${how}_${c}_$r.txt" | tr -s ' ' | tr '\n' ' ')"
                    done
                done
                for c in 1 auto; do
                    step cb_${m}_${f}_${c}_$r 300 env "$([ $c = 1 ] && echo "$A_ENV" || echo "$B_ENV")" \
                        $S cuda-bench "$d" --prompt 128 --decode 128 --prefill 0 --batches 1
                    echo "$m $f cuda-bench variant $c round $r: $(grep -h -E '^decode batch|step parts' "$LOGS/cb_${m}_${f}_${c}_$r.txt" | tr -s ' ' | tr '\n' ' ')"
                done
            done
        done
        rm -rf "$M" "$M-int4"
    done
fi
printf '%s\n' "${summary[@]}"
tar -C "$LOGS/.." -cJf "$OUT/logs.tar.xz" "$(basename "$LOGS")"
