#!/bin/bash
# Nsight Compute's full set for the one-row int4 tensor-core GEMV (quant_mma1_kernel, issue #9) at
# given shapes, on the GPU machine:
#   OUT=$OUT [FORMAT=mlx-int4-g64] [KERNEL=regex:...] bash tests/cuda/tc1_ncu.sh CARRY_DIR [SHAPES]
# CARRY_DIR/bin.tar.xz holds scr_cuda_quant_gemv (tests/cuda/pack_carry.sh). The first one-row
# launch at each shape (its 1-row check, weights cold: ncu flushes the caches) is profiled with
# --set full; the text report goes to $OUT/ncu_SHAPE.txt, the stall samples per SASS instruction
# (ncu's source page as CSV) to $OUT/sass_SHAPE.csv, and a digest of the headline metrics and the
# SASS instructions with the most samples to stdout (ncu_digest, tests/cuda/device_lib.sh).
set -u
CARRY=${1:-.tc-carry}
SHAPES=${2:-14336x4096 4096x14336}
export OUT=${OUT:-/tmp/scr-tc1-ncu}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
device_unpack "$CARRY" /tmp/scr-tc1-ncu-bin
export SCR_REQUIRE_GPU=1
for s in $SHAPES; do
    ncu_profile "$s" "${KERNEL:-regex:quant_mma1_kernel}" 0 200 \
        $C/scr_cuda_quant_gemv --no-bench --formats "${FORMAT:-mlx-int4-g64}" --shapes "$s"
done
