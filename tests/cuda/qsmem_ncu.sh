#!/bin/bash
# Nsight Compute sections of the shared-memory quantized GEMV at one token row (issue #9):
#   OUT=$OUT bash tests/cuda/qsmem_ncu.sh CARRY_DIR [SHAPES]
# CARRY_DIR/bin.tar.xz holds scr_cuda_quant_gemv (tests/cuda/pack_carry.sh). Profiles the first
# launches of quant_smem_kernel (the 1-row checks) at each shape: speed of light, occupancy, warp
# stall reasons, scheduler and memory sections; the text report goes to $OUT/ncu_SHAPE.txt.
set -u
CARRY=${1:-.q5-carry}
SHAPES=${2:-14336x4096 4096x14336 128256x4096}
export OUT=${OUT:-/tmp/scr-qsmem-ncu}
mkdir -p "$OUT"
C=/tmp/scr-qsmem-ncu-bin
rm -rf $C; mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SCR_REQUIRE_GPU=1
command -v ncu >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
KN=${KERNEL:-regex:quant_smem_kernel}
for s in $SHAPES; do
    timeout 120 ncu --kernel-name "$KN" --launch-count ${COUNT:-1} --clock-control none \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
        $C/scr_cuda_quant_gemv --no-bench --formats ${FORMAT:-mlx-int4-g64} --shapes $s > "$OUT/ncu_$s.txt" 2>&1
    echo "==== $s rc=$?"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Block Limit|Stall|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Executed Ipc|Grid Size|Dynamic Shared" "$OUT/ncu_$s.txt" | head -40
done
