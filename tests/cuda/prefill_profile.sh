#!/bin/bash
# Where a dense model's prefill goes (issue #6), in one call of the run tool:
#   OUT=$OUT [MODELS="1b 8b"] [LEN=2048] [LAUNCHES=1500] bash tests/cuda/prefill_profile.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr of a CUDA build with the MODELS in bf16 (tests/cuda/pack_carry.sh). Per
# model: a random checkpoint in /dev/shm, `scr bench --mode forward --input-len LEN` (prefill in
# chunks of the compiled step size, best of 3), then Nsight Compute's duration of the first LAUNCHES
# kernels of that run (the warm-up prefill first), summed per kernel by tests/cuda/ncu_sum.py.
set -u
CARRY=${1:-.l1b-carry}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-pf-out /tmp/scr-pf-logs  # tarred into $OUT at the end (the run tool brings back few files)
device_unpack "$CARRY" /tmp/scr-pf-bin
L=${LEN:-2048}
for m in ${MODELS:-1b 8b}; do
    make_model $m
    for v in ${VARIANTS:-default}; do
        env=(); [ $v != default ] && env=($v)
        step "bench_${m}_$v" 120 env "${env[@]}" $C/scr bench $M --mode forward --batch 1 --input-len $L --context 16 --iters 3
        echo "== $m $v: $(grep -h '^prefill' "$LOGS/bench_${m}_$v.txt")"
    done
    if [ "${NCU:-1}" = 1 ]; then
        step "ncu_$m" 240 ncu --clock-control none --launch-count ${LAUNCHES:-1500} --metrics gpu__time_duration.sum --csv \
            $C/scr bench $M --mode forward --batch 1 --input-len $L --context 16 --iters 1
        python3 tests/cuda/ncu_sum.py "$LOGS/ncu_$m.txt" 16 | tee "$OUT/ncu_${m}_sum.md"
    fi
    rm -rf $M
done
printf '%s\n' "${summary[@]}"
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
