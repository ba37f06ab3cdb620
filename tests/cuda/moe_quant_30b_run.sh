#!/bin/bash
# A Qwen3-30B-A3B-shaped MoE on the GPU machine: random bf16 weights, their MLX int4 g64 quantization,
# `scr cuda-bench` of each (docs/CUDA.md and docs/PERF.md "Session 39"):
#   OUT=$OUT [SCR_CUDA_MOE_GEMM=0/1] bash tests/cuda/moe_quant_30b_run.sh "g64 bf16"   (carry [".moeq-carry"])
# .moeq-carry/m30.tar.xz: tests/cuda/pack_carry.sh of -DSCR_MODELS=qwen3-30b-a3b -DSCR_QUANT="bf16;mlx-int4-g64".
set -u
OUT=${OUT:-/tmp/outB}; mkdir -p $OUT
t0=$SECONDS
C=/tmp/m30bin; [ -x $C/scr ] || { mkdir -p $C && tar -C $C -xJf .moeq-carry/m30.tar.xz; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64
M=/dev/shm/m30b
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ ! -f $M/done ]; then timeout 200 $C/scr make-random models/configs/qwen3_moe/qwen3-30b-a3b.json $M --dtype bf16 > $OUT/make_random.txt 2>&1 && touch $M/done; echo "make-random rc=$? $((SECONDS-t0)) s"; fi
if [ ! -f $M-g64/done ]; then timeout 300 $C/scr quantize $M $M-g64 --preset mlx-int4-g64 > $OUT/quantize.txt 2>&1 && touch $M-g64/done; echo "quantize rc=$? $((SECONDS-t0)) s"; tail -c 300 $OUT/quantize.txt; fi
du -sh $M $M-g64
for v in ${1:-g64 bf16}; do
  m=$M; [ $v = g64 ] && m=$M-g64
  timeout 170 $C/scr cuda-bench $m --prompt 64 --decode 64 --prefill 2048 --batches 16,64 --batch-steps 16 > $OUT/bench_$v.txt 2>&1
  echo "== $v rc=$? $((SECONDS-t0)) s"; grep -h '^batch-1 decode\|^decode batch\|^prefill\|floor' $OUT/bench_$v.txt | cut -c1-200
done
