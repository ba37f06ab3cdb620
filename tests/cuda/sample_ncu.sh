#!/bin/bash
# Nsight Compute's full set for the GPU sampler (kernels/cuda/sample.cuh) on one row of V = 128,256
# random logits, on the GPU machine:
#   OUT=$OUT [CASES="2 3"] [ENVS="SCR_CUDA_SAMPLE_SELECT= SCR_CUDA_SAMPLE_SELECT=radix"] bash tests/cuda/sample_ncu.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz holds scr_cuda_sample (tests/cuda/pack_carry.sh). For each case K of its
# bench table (scr_cuda_sample --profile K: 0 greedy, 1 T=1, 2 top_k 50, 3 top_p 0.95, 4 k + p +
# min_p, 5 top_p 0.9 on a peaked row) and each environment, the second of two launches is profiled; a digest of the headline
# metrics and the SASS instructions with the most stall samples goes to stdout (ncu_digest,
# tests/cuda/device_lib.sh), the reports to $OUT.
set -u
CARRY=${1:-.q-carry}
export OUT=${OUT:-/tmp/scr-sample-ncu}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
device_unpack "$CARRY" /tmp/scr-sample-ncu-bin
export SCR_REQUIRE_GPU=1
read -r -a ENV_LIST <<< "${ENVS:-SCR_CUDA_SAMPLE_SELECT=}"
for k in ${CASES:-3}; do
    for e in "${ENV_LIST[@]}"; do
        (export "$e"; ncu_profile "case${k}_${e//[^A-Za-z0-9]/_}" regex:sample_rows_kernel 1 200 $C/scr_cuda_sample --profile "$k")
    done
done
