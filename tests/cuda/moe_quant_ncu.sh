#!/bin/bash
# ncu of the quantized experts' per-pair kernels at 1 row (the 30B-A3B MLX int4 g64 checks of scr_cuda_moe), one
# call: OUT=$OUT bash tests/cuda/moe_quant_ncu.sh [CARRY_DIR], carry [".moeq-carry"] (bin.tar.xz as moe_quant_run.sh).
set -u
OUT=${OUT:-/tmp/scr-moeq-out}
mkdir -p "$OUT"
. tests/cuda/device_lib.sh
device_unpack "${1:-.moeq-carry}" /tmp/scr-moeq-bin
timeout 200 ncu --kernel-name-base mangled --kernel-name "regex:moe_quant_(up|down)_kernelILi2048ELi768E.*Li1EEEv" --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  $C/scr_cuda_moe --no-bench > $OUT/ncu.txt 2>&1
echo rc=$?
grep -E "moe_quant|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Compute \(SM\) Throughput|Waves Per SM|Block Limit Registers|One or More Eligible|Issued Warp|Bank Conflicts|Shared" $OUT/ncu.txt | cut -c1-160 | head -90
