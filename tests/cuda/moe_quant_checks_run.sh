#!/bin/bash
# The quantized MoE experts on the GPU machine, one call of the run tool, most important first:
#   OUT=$OUT bash tests/cuda/moe_quant_checks_run.sh   (carry [".moeq-carry"])
# .moeq-carry: bin.tar.xz (tests/cuda/pack_carry.sh of a CUDA build with -DSCR_MODELS=tiny-qwen3-moe
# -DSCR_QUANT="bf16;int8;fp8;fp8-tensor;mlx-int4-g32" -DSCR_TESTS=ON) and expected.json / expected.f32.xz
# (tests/cuda/quant_e2e.py expect on the CPU build): docs/CUDA.md "Session 38" / "Session 39".
set -u
OUT=${OUT:-/tmp/outA}; mkdir -p $OUT
t0=$SECONDS
C=/tmp/scr-cudaq2-bin
rm -rf $C; mkdir -p $C && tar -C $C -xJf .moeq-carry/bin.tar.xz
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 $C/scr_cuda_moe > $OUT/moe.txt 2>&1; echo "moe rc=$? $((SECONDS-t0)) s"
OUT=$OUT timeout 120 bash tests/cuda/quant_e2e_run.sh .moeq-carry > $OUT/e2e_all.txt 2>&1
echo "e2e done $((SECONDS-t0)) s"
timeout 90 $C/scr_cuda_quant_gemv --no-bench > $OUT/qgemv.txt 2>&1; echo "qgemv rc=$? $((SECONDS-t0)) s"
timeout 60 $C/scr_cuda_attention --no-bench > $OUT/attn.txt 2>&1; echo "attn rc=$? $((SECONDS-t0)) s"
F=tests/fixtures/Qwen3MoeForCausalLM
IDS=$(seq -s, 1 40)
for p in mlx-int4-g32; do
  $C/scr quantize $F /tmp/qm-$p --preset $p > /dev/null 2>&1
  for g in 1 0; do
    SCR_CUDA_MOE_GEMM=$g timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr complete /tmp/qm-$p --quant $p --ids $IDS --max-tokens 4 > $OUT/memcheck_${p}_$g.txt 2>&1
    echo "memcheck $p gemm=$g rc=$? $(grep -h 'ERROR SUMMARY' $OUT/memcheck_${p}_$g.txt) $((SECONDS-t0)) s"
  done
done
