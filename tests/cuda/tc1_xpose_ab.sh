#!/bin/bash
# The one-row int4 tensor-core GEMV (quant_mma1_kernel, issue #9) by default against AB_ENV, on the
# GPU machine, in one call. Session 12 ran it with AB_ENV=SCR_CUDA_QUANT_TC1_VARIANT=xpose (the lane
# transpose of sessions 7-11; AB_ENV's default) and AB_ENV=SCR_CUDA_QUANT_TC1_PARTS=fifths (the
# earlier parts rule):
#   OUT=$OUT [AB_ENV=...] [MODELS=1b] [ROUNDS=2] [SHAPES=NxK,...] bash tests/cuda/tc1_xpose_ab.sh [CARRY_DIR] [GEMV_CARRY_DIR]
# Since session 13 this is tests/cuda/tc1_variants_ab.sh with the two variants "default" and AB_ENV
# (the g64 and g32 GEMV bench, `cuda-bench` with a 2,048-token prefill, as session 12 ran it). Its
# GEMV checks cover the int4 formats of both variants; session 12's script also ran the other
# formats' checks and the int4 checks under SCR_CUDA_QUANT_TC1_VARIANT=narrow2.
AB_ENV=${AB_ENV:-SCR_CUDA_QUANT_TC1_VARIANT=xpose}
VARIANTS="default $AB_ENV" FORMATS=${FORMATS:-mlx-int4-g64,mlx-int4-g32} CB_PREFILL=${CB_PREFILL:-2048} MODELS=${MODELS:-1b} \
    exec bash tests/cuda/tc1_variants_ab.sh "${1:--}" "${2:-}"
