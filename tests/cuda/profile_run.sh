#!/bin/bash
# Where a decode step's time goes on the GPU, and whether a change helps, in one call of the run
# tool (docs/CUDA.md):
#   tests/cuda/profile_run.sh CARRY_DIR [MODELS="1b 8b"] [AB_ENV="SCR_CUDA_CUBLAS_DECODE=single"]
# First the checks the carry has binaries for (scr_cuda_linear: bf16 linears vs float64 and batch
# invariance; the bf16 fixtures through scr). Then for each random-weight model: scr cuda-bench
# (start-up, batch 1, B = 16 / 64 / 256) with the defaults and again with AB_ENV set (the
# previous behaviour of a change, so the two figures come from one run), and Nsight Systems traces
# of batch-1, B = 64 and B = 256 decode (PHASES="bs1 b64 b256"; graph kernels traced as nodes), each reduced to a
# per-kernel table (total time, count, average) in $OUT/kern_<model>_<phase>.csv.
set -u
CARRY=${1:-.prof-carry}
MODELS=${2:-"1b 8b"}
AB_ENV=${3:-SCR_CUDA_CUBLAS_DECODE=single}
OUT=${OUT:-/tmp/scr-prof-out}
mkdir -p "$OUT"
C=/tmp/scr-prof-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin SCR_HUGE_PAGES=0 SCR_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -x $C/scr_cuda_linear ]; then
    timeout 240 $C/scr_cuda_linear --no-bench > "$OUT/linear.txt" 2>&1; echo "== linear rc=$?"
    grep -c " ok " "$OUT/linear.txt"; grep -E "FAILED|NOT BATCH|passed" "$OUT/linear.txt" | head -12
    env $AB_ENV timeout 240 $C/scr_cuda_linear --no-bench > "$OUT/linear_ab.txt" 2>&1; echo "== linear with $AB_ENV rc=$?"
    grep -E "FAILED|NOT BATCH|passed" "$OUT/linear_ab.txt" | head -5
fi
if [ -x $C/scr ]; then
    timeout 120 python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 tests/fixtures/LlamaForCausalLM \
        tests/fixtures/Qwen3ForCausalLM tests/fixtures/long/LlamaForCausalLM > "$OUT/fixtures.txt" 2>&1; echo "== fixtures rc=$?"
    tail -4 "$OUT/fixtures.txt"
fi
declare -A CFG=([1b]=models/configs/llama/llama-3.2-1b.json [8b]=models/configs/llama/llama-3.1-8b.json)
for m in $MODELS; do
    D=/dev/shm/l$m
    timeout 200 $C/scr make-random "${CFG[$m]}" $D --dtype bf16 > "$OUT/make_$m.txt" 2>&1 || { echo "make-random $m failed"; continue; }
    for v in default ab; do
        E=""; [ $v = ab ] && E=$AB_ENV
        echo "== bench $m $v $E"
        env $E timeout 150 $C/scr cuda-bench $D --prompt 128 --decode 64 --prefill 0 --batches 16,64,256 --batch-steps 16 2>&1 |
            tee "$OUT/bench_${m}_$v.txt" | grep -E "start-up|batch-1 decode|^decode|B = |batch" | head -12
    done
    [ -n "$NSYS" ] || continue
    for phase in ${PHASES:-bs1 b64 b256}; do
        case $phase in
            bs1) args="--prompt 128 --decode 64 --prefill 0 --batches 16 --batch-steps 1" ;;
            *) args="--prompt 128 --decode 1 --prefill 0 --batches ${phase#b} --batch-steps 16" ;;
        esac
        timeout 200 $NSYS profile -q --trace=cuda --cuda-graph-trace=node -o /tmp/p_${m}_$phase -f true $C/scr cuda-bench $D $args > /dev/null 2>&1
        timeout 120 $NSYS stats -q --report cuda_gpu_kern_sum --format csv -o /tmp/k_${m}_$phase /tmp/p_${m}_$phase.nsys-rep > /dev/null 2>&1
        cp /tmp/k_${m}_${phase}_cuda_gpu_kern_sum.csv "$OUT/kern_${m}_$phase.csv" 2>/dev/null
        echo "== $m $phase: top kernels by total GPU time (Time %, total ns, instances, avg ns, ..., name)"
        head -12 "$OUT/kern_${m}_$phase.csv" 2>/dev/null | cut -d, -f1-4,9 | cut -c1-180
    done
    rm -rf $D
done
