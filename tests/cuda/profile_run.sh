#!/bin/bash
# Where a decode step's time goes on the GPU, in one call of the run tool (docs/CUDA.md):
#   tests/cuda/profile_run.sh CARRY_DIR [MODELS="1b 8b"]
# For each random-weight model: scr_cuda_bench (batch 1, B = 16 / 64), then an Nsight Systems
# trace of batch-1 decode and one of B = 64 decode (graph kernels traced as nodes), each reduced
# to a per-kernel table (total time, count, average) in $OUT/kern_<model>_<phase>.csv.
# Falls back to Nsight Compute (kernel replay: isolated times) when nsys is missing.
set -u
CARRY=${1:-.prof-carry}
MODELS=${2:-"1b 8b"}
OUT=${OUT:-/tmp/scr-prof-out}
mkdir -p "$OUT"
C=/tmp/scr-prof-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin SCR_HUGE_PAGES=0 SCR_REQUIRE_GPU=1
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
declare -A CFG=([1b]=models/configs/llama/llama-3.2-1b.json [8b]=models/configs/llama/llama-3.1-8b.json)
for m in $MODELS; do
    D=/dev/shm/l$m
    timeout 200 $C/scr make-random "${CFG[$m]}" $D --dtype bf16 > "$OUT/make_$m.txt" 2>&1 || { echo "make-random $m failed"; continue; }
    timeout 150 $C/scr_cuda_bench $D --prompt 128 --decode 64 --prefill 0 --batches 16,64 --batch-steps 16 2>&1 | tee "$OUT/bench_$m.txt" | grep -E "start-up|batch-1|^decode|batch"
    for phase in bs1 b64; do
        if [ $phase = bs1 ]; then args="--prompt 128 --decode 64 --prefill 0 --batches 16 --batch-steps 1"
        else args="--prompt 128 --decode 1 --prefill 0 --batches 64 --batch-steps 32"; fi
        if [ -n "$NSYS" ]; then
            rm -f /tmp/p_$m_$phase.*
            timeout 200 $NSYS profile -q --trace=cuda --cuda-graph-trace=node -o /tmp/p_${m}_$phase -f true $C/scr_cuda_bench $D $args > /dev/null 2>&1
            timeout 120 $NSYS stats -q --report cuda_gpu_kern_sum --format csv -o /tmp/k_${m}_$phase /tmp/p_${m}_$phase.nsys-rep > /dev/null 2>&1
            cp /tmp/k_${m}_${phase}_cuda_gpu_kern_sum.csv "$OUT/kern_${m}_$phase.csv" 2>/dev/null
            echo "== $m $phase (top kernels by total time)"
            head -14 "$OUT/kern_${m}_$phase.csv" 2>/dev/null | cut -c1-220
        else
            timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 400 --launch-count 300 \
                $C/scr_cuda_bench $D $args > "$OUT/kern_${m}_$phase.csv" 2>&1
            echo "== $m $phase (ncu)"; tail -3 "$OUT/kern_${m}_$phase.csv" | cut -c1-200
        fi
    done
    rm -rf $D
done
