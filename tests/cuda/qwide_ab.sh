#!/bin/bash
# Decode of 33-256 token rows on quant_wide_kernel (issue #9; kernels/cuda/quant_wide.cuh; MLX int4:
# SCR_CUDA_QUANT_WIDE=N, int8 / fp8: SCR_CUDA_QUANT_WIDE_CODES=N) against other routings (MLX int4
# 33-64 rows in staged passes of 16, 65+ on cuBLASLt over expanded weights; int8 / fp8 33+ on
# cuBLASLt), on the GPU machine.
# One phase per call keeps a call inside the run tool's 600 s (each step prints its rc as it ends):
#   OUT=$OUT PHASE=checks|slices|global|racecheck|kbench|logits|e2e [MODELS="8b 1b"] [BATCHES=32,48,64,128,256]
#       [ROUNDS=2] [VARIANTS="SCR_CUDA_QUANT_WIDE=256 default"] [BF16=1] [LMODE=wide|global] [KROWS="32|48|64|96|128|256"]
#       [CFORMATS=mlx-int4-g64,mlx-int4-g32] [QPRESET=mlx-int4-g64|int8|...] [WIDE=NAME=VALUE]
#       bash tests/cuda/qwide_ab.sh S_CARRY
# S_CARRY/bin.tar.xz: scr and scr_cuda_quant_gemv of a CUDA build with llama-3.2-1b and llama-3.1-8b
# x bf16 and mlx-int4-g64 (and the QPRESET of the e2e / logits phases; tests/cuda/pack_carry.sh).
# WIDE: the switch the checks run with (default SCR_CUDA_QUANT_WIDE=256; int8 / fp8:
# SCR_CUDA_QUANT_WIDE_CODES=256 with CFORMATS=int8,fp8,fp8-tensor).
#   checks:    scr_cuda_quant_gemv --no-bench with SCR_CUDA_QUANT_WIDE=256 (values against float64 at
#              33, 64 and 256 rows; 256 rows against launches of 33, bit for bit; the PDL chain), then
#              the same under compute-sanitizer's memcheck on three shapes;
#   slices:    the checks with the K split forced to 1 and to 8 (SCR_CUDA_QUANT_WIDE_SLICES; g64, the
#              1B and 8B shapes): both epilogues on every shape;
#   global:    the checks with the rule's K split through global memory wherever one wave holds it
#              and as clusters (SCR_CUDA_QUANT_WIDE_GLOBAL=2 / 3): both pass, with the same check lines
#              (the same bits); memcheck of the global split on three shapes;
#   racecheck: compute-sanitizer --tool racecheck (shared-memory hazards in the ring) on two shapes;
#   kbench:    per-launch times at 32-256 rows of the 1B and 8B shapes (tc1 and bf16 rows of the table),
#              SCR_CUDA_QUANT_WIDE=256 and the default;
#   logits:    per model, qrows_logits.py --mode ${LMODE:-wide} (wide: steps of 33-128 rows against
#              the kernel off; global: the K split through global memory against the same split as
#              clusters, bit for bit);
#   e2e:       per model and round, `scr cuda-bench --prompt 128 --decode 64 --prefill 0` per variant,
#              and with BF16=1 the bf16 checkpoint's defaults (first round).
set -u
export OUT=${OUT:-/tmp/scr-qwide-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
export SCR_REQUIRE_GPU=1
device_unpack "$1" /tmp/scr-qwide-bin
S=$C
PHASE=${PHASE:-checks}
has() { case " $PHASE " in *" $1 "*) return 0 ;; esac; return 1; }
said() { echo "${summary[-1]}"; }  # the last step's rc, as soon as it ends
WIDE=${WIDE:-SCR_CUDA_QUANT_WIDE=256}
QP=${QPRESET:-mlx-int4-g64}
SMALL=4096x4096,2048x8192,1001x384
if has checks; then
    step qgemv 330 env $WIDE $S/scr_cuda_quant_gemv --no-bench --formats ${CFORMATS:-mlx-int4-g64,mlx-int4-g32}; said
    grep -E "FAILED|declined|checks passed|passed|failed|error" "$OUT/qgemv.txt" | tail -12
    grep -cE "tc1 +wide .* -> ok" "$OUT/qgemv.txt" | sed 's/^/wide checks ok: /'
    grep -cE "tc1 +wide .* -> FAILED" "$OUT/qgemv.txt" | sed 's/^/wide checks FAILED: /'
    grep -E "tc1 +wide .*rows +(33|64|256)" "$OUT/qgemv.txt" | head -6
    grep -E "tc1 +wide .*vs launches of 33" "$OUT/qgemv.txt" | head -4
    grep -E "wide chain with PDL" "$OUT/qgemv.txt"
    step memcheck 200 env $WIDE compute-sanitizer --tool memcheck --error-exitcode 9 $S/scr_cuda_quant_gemv --no-bench \
        --formats ${CFORMATS%%,*} --shapes $SMALL; said
    grep -h "ERROR SUMMARY\|checks passed\|FAILED" "$OUT/memcheck.txt" | tail -4
fi
if has slices; then
    for sl in 1 8; do
        step slices_$sl 250 env $WIDE SCR_CUDA_QUANT_WIDE_SLICES=$sl $S/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g64 \
            --shapes 2048x2048,8192x2048,2048x8192,4096x4096,14336x4096,4096x14336; said
        grep -E "FAILED|checks passed" "$OUT/slices_$sl.txt" | tail -4
        grep -E "tc1 +wide .*rows +256" "$OUT/slices_$sl.txt" | head -3
    done
fi
if has global; then
    # The rule's K split through global memory wherever one wave holds it (SCR_CUDA_QUANT_WIDE_GLOBAL=2)
    # against the same split as clusters (=3): every check passes both ways, and every check line
    # (values, errors) is the same once the plan's tag (s8g16x / s8g16) is dropped: the same
    # additions in the same order.
    for g in 3 2; do
        step global_$g 330 env $WIDE SCR_CUDA_QUANT_WIDE_GLOBAL=$g $S/scr_cuda_quant_gemv --no-bench --formats ${CFORMATS:-mlx-int4-g64,mlx-int4-g32}; said
        grep -E "FAILED|checks passed" "$OUT/global_$g.txt" | tail -3
        grep -E "^check" "$OUT/global_$g.txt" | sed -E 's/ wide s[0-9]+g[0-9]+x?/ wide/' > "$OUT/global_$g.lines"
    done
    grep -cE "wide s[0-9]+g[0-9]+x .* -> ok" "$OUT/global_2.txt" | sed 's/^/global-split checks ok: /'
    if cmp -s "$OUT/global_3.lines" "$OUT/global_2.lines"; then echo "global vs cluster: the same check lines ($(wc -l < "$OUT/global_3.lines"))"
    else echo "global vs cluster: check lines DIFFER"; diff "$OUT/global_3.lines" "$OUT/global_2.lines" | head -8; fi
    step global_mem 200 env $WIDE SCR_CUDA_QUANT_WIDE_GLOBAL=2 compute-sanitizer --tool memcheck --error-exitcode 9 $S/scr_cuda_quant_gemv --no-bench \
        --formats ${CFORMATS%%,*} --shapes 4096x4096,4096x14336,1001x384; said
    grep -h "ERROR SUMMARY\|checks passed\|FAILED" "$OUT/global_mem.txt" | tail -4
fi
if has racecheck; then
    step racecheck 500 env $WIDE compute-sanitizer --tool racecheck --error-exitcode 9 $S/scr_cuda_quant_gemv --no-bench \
        --formats mlx-int4-g64 --shapes 2048x2048,1001x384; said
    grep -h "ERROR SUMMARY\|RACE\|hazard\|checks passed\|FAILED" "$OUT/racecheck.txt" | tail -6
fi
if has kbench; then
    for kv in $WIDE default; do
        kk=$(printf %s "${kv//SCR_CUDA_/}" | tr -c 'A-Za-z0-9' _)
        e=
        [ "$kv" = default ] || e=$kv
        step qbench_$kk 280 env $e $S/scr_cuda_quant_gemv --formats mlx-int4-g64 \
            --shapes ${SHAPES:-4096x4096,14336x4096,4096x14336,2048x2048,8192x2048,2048x8192}; said
        echo "== per launch, $kv"
        grep -E "^ *[0-9]+x[0-9]+ .*(tc1|bf16)" "$OUT/qbench_$kk.txt" | grep -E " (${KROWS:-32|48|64|96|128|256}) +[0-9.]+ " | head -80
    done
fi
for m in ${MODELS-8b 1b}; do
    has logits || has e2e || continue
    make_model $m; said
    step quant_$m 300 $S/scr quantize "$M" "$M-q" --preset $QP; said
    Q=$M-q
    if has logits; then
        step logits_$m 450 python3 tests/cuda/qrows_logits.py --mode ${LMODE:-wide} --quant $QP $S/scr "$Q"; said
        tail -10 "$OUT/logits_$m.txt"
    fi
    if has e2e; then
        for r in $(seq 1 "${ROUNDS:-2}"); do
            bench_round $m "$Q" $r ${BATCHES:-32,48,64,128,256} ${VARIANTS:-$WIDE default}
            [ "${BF16:-1}" = 1 ] && [ "$r" = 1 ] && bench_round ${m}_bf16 "$M" $r ${BATCHES:-32,48,64,128,256} default
        done
    fi
    rm -rf "$Q" "$M"
done
printf '%s\n' "${summary[@]}"
