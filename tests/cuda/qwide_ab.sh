#!/bin/bash
# MLX int4 decode of 33-256 token rows on quant_wide_kernel (issue #9; kernels/cuda/quant_wide.cuh;
# off by default until this has run: SCR_CUDA_QUANT_WIDE=256 turns it on) against the defaults
# (33-64 rows in staged passes of 16, 65-256 on cuBLASLt over expanded weights), on the GPU machine:
#   OUT=$OUT [PHASE="checks kbench logits e2e memcheck"] [MODELS="8b 1b"] [BATCHES=32,48,64,128,256]
#       [ROUNDS=2] [VARIANTS="SCR_CUDA_QUANT_WIDE=256 default"] [BF16=1] [KROWS="32|48|64|96|128|160"]
#       bash tests/cuda/qwide_ab.sh S_CARRY
# S_CARRY/bin.tar.xz: scr and scr_cuda_quant_gemv of a CUDA build with llama-3.2-1b and llama-3.1-8b
# x bf16 and mlx-int4-g64 (tests/cuda/pack_carry.sh).
#   checks:   scr_cuda_quant_gemv --no-bench with SCR_CUDA_QUANT_WIDE=256 on the MLX int4 formats
#             (CFORMATS; values against float64 at 33, 64 and 160 rows; 160 rows against launches of
#             33, bit for bit; g128 stays on the staged passes);
#   kbench:   per-launch times at 32-160 rows of the 1B and 8B shapes (tc1 and bf16 rows of the table),
#             SCR_CUDA_QUANT_WIDE=256 and the default;
#   logits:   per model, qrows_logits.py --mode wide (steps of 33-256 rows against the defaults);
#   e2e:      per model and round, `scr cuda-bench --prompt 128 --decode 64 --prefill 0` per variant,
#             and with BF16=1 the bf16 checkpoint's defaults;
#   memcheck: scr_cuda_quant_gemv --no-bench with SCR_CUDA_QUANT_WIDE=256 under compute-sanitizer's
#             memcheck (g64, three shapes).
set -u
export OUT=${OUT:-/tmp/scr-qwide-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
device_unpack "$1" /tmp/scr-qwide-bin
S=$C
PHASE=${PHASE:-checks kbench logits e2e memcheck}
has() { case " $PHASE " in *" $1 "*) return 0 ;; esac; return 1; }
if has checks; then
    step qgemv 600 env SCR_CUDA_QUANT_WIDE=256 $S/scr_cuda_quant_gemv --no-bench --formats ${CFORMATS:-mlx-int4-g32,mlx-int4-g64,mlx-int4-g128}
    grep -E "FAILED|declined|checks passed|passed|failed|error" "$OUT/qgemv.txt" | tail -12
    grep -cE "tc1 wide .* -> ok" "$OUT/qgemv.txt" | sed 's/^/wide checks ok: /'
    grep -cE "tc1 wide .* -> FAILED" "$OUT/qgemv.txt" | sed 's/^/wide checks FAILED: /'
    grep -E "tc1 wide .*rows (33|64|160)" "$OUT/qgemv.txt" | head -8
    grep -E "tc1 wide .*vs launches of 33" "$OUT/qgemv.txt" | head -4
fi
if has kbench; then
    for kv in SCR_CUDA_QUANT_WIDE=256 default; do
        kk=$(printf %s "${kv//SCR_CUDA_/}" | tr -c 'A-Za-z0-9' _)
        e=
        [ "$kv" = default ] || e=$kv
        step qbench_$kk 500 env $e $S/scr_cuda_quant_gemv --formats mlx-int4-g64 \
            --shapes ${SHAPES:-4096x4096,14336x4096,4096x14336,2048x2048,8192x2048,2048x8192}
        echo "== per launch, $kv"
        grep -E "^ *[0-9]+x[0-9]+ .*(tc1|bf16)" "$OUT/qbench_$kk.txt" | grep -E " (${KROWS:-32|48|64|96|128|160}) +[0-9.]+ " | head -80
    done
fi
for m in ${MODELS-8b 1b}; do
    has logits || has e2e || continue
    make_model $m
    step quant_$m 300 $S/scr quantize "$M" "$M-int4" --preset mlx-int4-g64
    Q=$M-int4
    if has logits; then
        step logits_$m 500 python3 tests/cuda/qrows_logits.py --mode wide $S/scr "$Q"
        tail -10 "$OUT/logits_$m.txt"
    fi
    if has e2e; then
        for r in $(seq 1 "${ROUNDS:-2}"); do
            bench_round $m "$Q" $r ${BATCHES:-32,48,64,128,256} ${VARIANTS:-SCR_CUDA_QUANT_WIDE=256 default}
            [ "${BF16:-1}" = 1 ] && [ "$r" = 1 ] && bench_round ${m}_bf16 "$M" $r ${BATCHES:-32,48,64,128,256} default
        done
    fi
    rm -rf "$Q" "$M"
done
if has memcheck; then
    step memcheck_qgemv 500 env SCR_CUDA_QUANT_WIDE=256 compute-sanitizer --tool memcheck --error-exitcode 9 $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g64 \
        --shapes 4096x4096,2048x8192,1001x384
    grep -h "ERROR SUMMARY\|checks passed\|FAILED" "$OUT/memcheck_qgemv.txt" | tail -4
fi
printf '%s\n' "${summary[@]}"
