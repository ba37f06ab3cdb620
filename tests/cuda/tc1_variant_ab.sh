#!/bin/bash
# The one-row int4 tensor-core GEMV (quant_mma1_kernel, issue #9), its variants side by side in one
# call: each variant's checks, GEMV timing per variant over ROUNDS interleaved rounds, and the warp
# stall reasons of the default at two 8B shapes:
#   OUT=$OUT [VARIANTS="narrow2 wide2 wide3 wide4"] [SHAPES=NxK,...] bash tests/cuda/tc1_variant_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz holds scr_cuda_quant_gemv (tests/cuda/pack_carry.sh). SCR_CUDA_QUANT_TC1_VARIANT
# selects the variant (kernels/cuda/quant_mma1.cuh). Summary in $OUT/summary.txt.
set -u
source "$(dirname "$0")/device_lib.sh"
CARRY=${1:-.qpf-carry}
OUT=${OUT:-/tmp/scr-tc1v}; LOGS=$OUT/logs; mkdir -p "$LOGS"
device_unpack "$CARRY" /tmp/scr-tc1v-bin
export SCR_REQUIRE_GPU=1
G=$C/scr_cuda_quant_gemv
VARIANTS=${VARIANTS:-narrow2 wide2 wide3 wide4}
SHAPES=${SHAPES:-14336x4096,4096x14336,4096x4096,6144x4096,128256x4096,2048x2048,8192x2048,2048x8192,128256x2048}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$OUT/summary.txt"
for v in $VARIANTS; do
    step check_$v 240 env SCR_CUDA_QUANT_TC1_VARIANT=$v $G --no-bench --formats ${FORMATS:-mlx-int4-g32,mlx-int4-g64,mlx-int4-g128}
    echo "check $v: $(grep -c ' -> ok' "$LOGS/check_$v.txt") ok, $(grep -c 'FAILED' "$LOGS/check_$v.txt") FAILED; $(tail -1 "$LOGS/check_$v.txt")" | tee -a "$OUT/summary.txt"
done
for r in $(seq 1 ${ROUNDS:-2}); do
    for v in $VARIANTS; do
        step bench_${v}_$r 120 env SCR_CUDA_QUANT_TC1_VARIANT=$v $G --formats mlx-int4-g64 --shapes $SHAPES
        echo "== $v round $r" >> "$OUT/summary.txt"
        grep -E " tc1 " "$LOGS/bench_${v}_$r.txt" | grep -E "  1 " >> "$OUT/summary.txt"
    done
done
for s in ${NCU_SHAPES:-14336x4096 4096x14336}; do
    for v in ${NCU_VARIANTS:-wide2}; do
        step ncu_${v}_$s 150 env SCR_CUDA_QUANT_TC1_VARIANT=$v ncu --kernel-name regex:quant_mma1_kernel --launch-count 1 --clock-control none \
            --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
            $G --no-bench --formats mlx-int4-g64 --shapes $s
        { echo "== ncu $v $s"; grep -E "ratio|inst_executed|duration|elapsed|dram" "$LOGS/ncu_${v}_$s.txt" | awk '$NF+0 > 0.1 || /inst_ex|dura|elapsed|dram/' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'; } >> "$OUT/summary.txt"
    done
done
printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$LOGS"
