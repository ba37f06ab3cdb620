#!/bin/bash
# The engine's run-ahead (ModelRunner::launch_ahead, CompiledModel::launch_sample) on the GPU
# machine, in one call:
#   OUT=$OUT [MODELS="1b 8b"] [FORMATS="int4 bf16"] [ROUNDS=2] [TEST_FILTER=...] [ATTN=1] [BASE=CARRY]
#       [LATENCY=1] bash tests/cuda/run_ahead_ab.sh SCR_CARRY|- [TEST_CARRY]
# TEST_CARRY/bin.tar.xz (optional): scr_cuda_tests, scr_cuda_sample and scr_cuda_attention of a tiny-llama
#   f32;bf16 build: the run-ahead, sampling, engine, batch and decode1 tests, the sampler's and the attention's kernel checks, and
#   compute-sanitizer memcheck of the run-ahead tests.
# SCR_CARRY/bin.tar.xz: scr of a CUDA build with llama-3.2-1b (1b) and/or llama-3.1-8b (8b) x bf16 and
#   mlx-int4-g64. Per model: a random bf16 checkpoint (scr make-random), `scr quantize --preset
#   mlx-int4-g64` (int4); per format: 64 greedy ids through the engine (`scr complete`) with
#   run-ahead on and off (SCR_CUDA_RUN_AHEAD=0), compared byte for byte; then ROUNDS rounds, the
#   two interleaved, of `scr bench --mode latency` (the engine, one request at a time, 256 tokens
#   each) and one `scr cuda-bench --batches 1` (batch 1 sampling on the GPU, synchronous and run
#   ahead, in the same process, with each part of a sampled step's time by CUDA events).
# BASE/bin.tar.xz (optional): an earlier scr of the same models; its greedy ids are compared with
#   SCR_CARRY's and its cuda-bench runs interleave with SCR_CARRY's. LATENCY=0 skips `scr bench`.
# Both carries are packed by tests/cuda/pack_carry.sh. Summary in $OUT/summary.txt.
set -u
. tests/cuda/device_lib.sh
device_begin /tmp/scr-ra-out /tmp/scr-ra-logs  # tarred into $OUT at the end (the run tool brings back few files)
ROUNDS=${ROUNDS:-2}
if [ -n "${2:-}" ]; then
    device_unpack "$2" /tmp/scr-ra-tests
    export SCR_REQUIRE_GPU=1
    step cuda_tests 300 $C/scr_cuda_tests --gtest_filter="${TEST_FILTER:-CudaRunAhead*:CudaSampling*:CudaEngine*:CudaBatch*:CudaDecode1*:CudaErrors*}"
    echo "cuda_tests: $(grep -E '^\[  (PASSED|FAILED) ' "$LOGS/cuda_tests.txt" | tr '\n' ' ')"
    grep -E '^\[  FAILED|Failure' "$LOGS/cuda_tests.txt" | head -20
    if [ -x $C/scr_cuda_sample ]; then
        step sample 300 $C/scr_cuda_sample --no-bench
        echo "sample: $(tail -1 "$LOGS/sample.txt")"
    fi
    if [ "${ATTN:-1}" = 1 ]; then
        step attention 300 $C/scr_cuda_attention
        echo "attention: $(tail -2 "$LOGS/attention.txt" | tr '\n' ' ')"
        grep -iE 'fail|mismatch' "$LOGS/attention.txt" | head -10
    fi
    step memcheck_run_ahead 300 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_tests --gtest_filter='CudaRunAhead*'
    echo "memcheck run-ahead: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$LOGS/memcheck_run_ahead.txt" | tr '\n' ' ')"
    unset SCR_REQUIRE_GPU
fi
if [ -n "${1:-}" ] && [ "$1" != - ]; then
    if [ -n "${BASE:-}" ]; then
        device_unpack "$BASE" /tmp/scr-ra-base
        SB=$C/scr
    fi
    device_unpack "$1" /tmp/scr-ra-bin
    S=$C/scr
    for m in ${MODELS:-1b 8b}; do
        make_model "$m"
        declare -A dir=([bf16]=$M [int4]=$M-int4)
        if [[ " ${FORMATS:-int4 bf16} " == *" int4 "* ]]; then
            step quant_$m 400 $S quantize "$M" "$M-int4" --preset mlx-int4-g64
        fi
        IDS=$(seq -s, 11 130)
        for f in ${FORMATS:-int4 bf16}; do
            d=${dir[$f]}
            for v in on off; do
                step greedy_${m}_${f}_$v 200 env SCR_CUDA_RUN_AHEAD=$([ $v = on ] && echo 1 || echo 0) \
                    $S complete "$d" --ids "$IDS" --max-tokens 64 --json
            done
            if cmp -s "$LOGS/greedy_${m}_${f}_on.txt" "$LOGS/greedy_${m}_${f}_off.txt"; then s=same; else s=DIFFERENT; fi
            echo "== $m $f greedy ids, run-ahead on vs off: $s ($(wc -c < "$LOGS/greedy_${m}_${f}_on.txt") bytes)"
            if [ -n "${BASE:-}" ]; then
                step greedy_${m}_${f}_base 200 $SB complete "$d" --ids "$IDS" --max-tokens 64 --json
                if cmp -s "$LOGS/greedy_${m}_${f}_on.txt" "$LOGS/greedy_${m}_${f}_base.txt"; then s=same; else s=DIFFERENT; fi
                echo "== $m $f greedy ids, this scr vs the base: $s"
            fi
            for r in $(seq 1 "$ROUNDS"); do
                for v in $([ "${LATENCY:-1}" = 1 ] && echo on off); do
                    step lat_${m}_${f}_${v}_$r 300 env SCR_CUDA_RUN_AHEAD=$([ $v = on ] && echo 1 || echo 0) \
                        $S bench "$d" --mode latency --concurrency 1 --num-prompts 3 --input-len 128 --output-len 256 \
                        --prefix-caching off --temperature 0
                    echo "$m $f run-ahead $v round $r: $(grep -h -E 'output tokens/s|TPOT|run-ahead:|per step' "$LOGS/lat_${m}_${f}_${v}_$r.txt" | tr -s ' ' | tr '\n' ' ')"
                done
            done
            for r in $(seq 1 "$ROUNDS"); do
                for b in new $([ -n "${BASE:-}" ] && echo base); do
                    step cb_${m}_${f}_${b}_$r 300 $([ $b = new ] && echo $S || echo $SB) cuda-bench "$d" --prompt 128 --decode 128 \
                        --prefill 0 --batches 1
                    echo "$m $f cuda-bench $b round $r: $(grep -h -E '^decode batch' "$LOGS/cb_${m}_${f}_${b}_$r.txt" | tr -s ' ' | tr '\n' ' ')"
                    echo "$m $f JSON $b round $r: $(grep -h -o '"decode_device_ms": [0-9.]*\|"batch_tps": {[^}]*}\|"batch_ahead_tps": {[^}]*}' "$LOGS/cb_${m}_${f}_${b}_$r.txt" | tr '\n' ' ')"
                done
            done
        done
        rm -rf "$M" "$M-int4"
    done
fi
printf '%s\n' "${summary[@]}"
tar -C "$LOGS/.." -cJf "$OUT/logs.tar.xz" "$(basename "$LOGS")"
