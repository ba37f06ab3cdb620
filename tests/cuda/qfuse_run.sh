#!/bin/bash
# The fused quantized launches on the GPU machine in one call (docs/CUDA.md, "Quantized presets end
# to end"):   tests/cuda/qfuse_run.sh CARRY_DIR [model|kernels|all]
# CARRY_DIR/bin.tar.xz: tests/cuda/pack_carry.sh of a CUDA build with scr (llama-3.2-1b in bf16 / int8 /
# mlx-int4-g64) for "model", scr_cuda_quant_gemv for "kernels" (the two together exceed what the
# run tool carries beside the working tree, ~2.8 MB, hence two calls). Steps, most important first
# (each under its own timeout, logs in $OUT): the quantized GEMV checks (float64 reference, batch invariance; the fused variants
# included) for int4 g32/g64/g128 and int8; a random Llama-3.2-1B quantized on the machine; batch-1
# decode of bf16, int8 and int4-g64 with the fused plan and with SCR_CUDA_QUANT_FUSED=0 (the unfused
# one), side by side; fused vs unfused logits on the 1B checkpoints; ncu of int4 decode steps (per
# kernel: time, DRAM bytes and throughput) and of a few int4 GEMV launches (warp stalls, occupancy);
# compute-sanitizer memcheck of the GEMV checks, the GEMV bench at the 1B shapes, ncu of one cold int4
# launch per shape. $OUT returns at most 8 files: the step logs go to $LOGS, the ones read later are
# copied to $OUT at the end.
set -u
CARRY=${1:-.qfuse-carry}
PART=${2:-all}
export OUT=${OUT:-/tmp/scr-qfuse-out}
mkdir -p "$OUT"
C=/tmp/scr-qfuse-bin
rm -rf $C /tmp/l1b*; mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 SCR_REQUIRE_GPU=1
command -v ncu >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
LOGS=/tmp/scr-qfuse-logs
rm -rf $LOGS; mkdir -p $LOGS
step() {  # step NAME TIMEOUT CMD...: run, keep the log in $LOGS/NAME.txt (appended to $OUT/all.log), record rc and seconds
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    summary+=("$name: rc=$? ($((SECONDS - t0)) s)")
    { echo "==== $name: $*"; cat "$LOGS/$name.txt"; } >> "$OUT/all.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
FORMATS=mlx-int4-g32,mlx-int4-g64,mlx-int4-g128,int8
if [ $PART != model ]; then
step quant_gemv 45 $C/scr_cuda_quant_gemv --no-bench --formats $FORMATS --shapes 2048x2048,8192x2048,2048x8192,1001x384
echo "==== gemv checks: $(grep -c -- '-> ok' "$LOGS"/quant_gemv.txt) ok, $(grep -c -- '-> FAILED' "$LOGS"/quant_gemv.txt) failed"
grep -h "FAILED\|error\|checks:" "$LOGS"/quant_gemv.txt | head -20
fi
if [ $PART != kernels ]; then
step make_random_1b 30 $C/scr make-random models/configs/llama/llama-3.2-1b.json /tmp/l1b --dtype bf16
for p in int8 mlx-int4-g64; do step "quantize_$p" 25 $C/scr quantize /tmp/l1b "/tmp/l1b-$p" --preset "$p"; done
BENCH="--mode forward --batch 1 --context 128 --input-len 128 --iters 25"
for m in l1b l1b-int8 l1b-mlx-int4-g64; do
    step "bench_$m" 20 $C/scr bench /tmp/$m $BENCH
    echo "== $m (fused)"; grep -h "^forward:\|^prefill\|^decode" "$LOGS/bench_$m.txt"
    [ $m = l1b ] && continue
    step "bench_${m}_unfused" 20 env SCR_CUDA_QUANT_FUSED=0 $C/scr bench /tmp/$m $BENCH
    echo "== $m (SCR_CUDA_QUANT_FUSED=0)"; grep -h "^forward:\|^prefill\|^decode" "$LOGS/bench_${m}_unfused.txt"
done
step fused_ab 40 python3 tests/cuda/quant_fused_ab.py $C/scr \
    l1b-int4-g64=/tmp/l1b-mlx-int4-g64:mlx-int4-g64:ready l1b-int8=/tmp/l1b-int8:int8:ready
cat "$LOGS/fused_ab.txt"
# Per-kernel GPU time and DRAM traffic of int4 decode steps (kernel replay, clocks as found).
step ncu_decode 45 ncu --clock-control none --csv --metrics \
    gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread \
    --launch-skip 200 --launch-count 90 $C/scr complete /tmp/l1b-mlx-int4-g64 --ids 1,2,3,4,5,6,7,8 --max-tokens 6 --temperature 0
# Why the int4 GEMV sits below the copy bandwidth: stall reasons and occupancy of a few launches.
step ncu_stalls 25 ncu --clock-control none --csv --page details --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis -k regex:quant_mma --launch-skip 120 --launch-count 4 \
    $C/scr complete /tmp/l1b-mlx-int4-g64 --ids 1,2,3,4,5,6,7,8 --max-tokens 4 --temperature 0
fi
if [ $PART != model ]; then
step memcheck 30 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_quant_gemv --no-bench \
    --formats mlx-int4-g64,int8 --shapes 1001x384
grep -h "ERROR SUMMARY\|checks:" "$LOGS"/memcheck.txt
# The GEMV alone at the 1B shapes (scr_cuda_quant_gemv's bench: µs, GB/s, % of copy, x bf16).
step gemv_bench 40 $C/scr_cuda_quant_gemv --formats mlx-int4-g64,int8 --shapes 2048x2048,8192x2048,2048x8192,128256x2048
sed -n '/^GB\/s:/,$p' "$LOGS/gemv_bench.txt" | grep -E "GB/s| 1 | 8 " | grep -v simt
# Why the int4 GEMV sits below the copy bandwidth: one cold batch-1 launch per shape under ncu.
for sh in 8192x2048 2048x8192; do
    step "ncu_gemv_$sh" 25 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:quant_mma_kernel --launch-count 1 \
        $C/scr_cuda_quant_gemv --no-bench --formats mlx-int4-g64 --shapes $sh
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Block Limit|Waves Per SM|Grid Size" "$LOGS/ncu_gemv_$sh.txt" | head -30
done
fi
for f in ncu_decode ncu_stalls quant_gemv gemv_bench; do [ -f $LOGS/$f.txt ] && cp $LOGS/$f.txt "$OUT/"; done
echo "==== summary"; printf '%s\n' "${summary[@]}"
