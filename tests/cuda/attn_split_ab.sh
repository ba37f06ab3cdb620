#!/bin/bash
# Batch-1 decode with and without a switch, same binary, alternating, in one call on the GPU machine
# (issue #6; written for the decode attention's head split, SCR_CUDA_ATTN_SPLIT=0 turns it off):
#   OUT=$OUT [AB_ENV=SCR_CUDA_ATTN_SPLIT=0] [AB_ENVS="A=1;A=2 B=3"] [GREEDY=1] [MODELS="1b 8b"] [ROUNDS=2] [BATCHES=4] [NCU=1] [NCU_MODEL=8b] [NCU_VARIANTS="default ab"] [NCU_LAUNCHES=1300] bash tests/cuda/attn_split_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr of a CUDA build holding the MODELS (bf16): 1b = llama-3.2-1b, 8b =
# llama-3.1-8b, 30b = qwen3-30b-a3b (61 GB in /dev/shm), packed by tests/cuda/pack_carry.sh. Per
# model: a random checkpoint in /dev/shm, then ROUNDS x (defaults, AB_ENV) of `scr cuda-bench
# --prompt 128 --decode 128 --prefill 0 --batches 4`; with NCU=1 the per-kernel table of NCU_MODEL's
# batch-1 decode steps (tests/cuda/ncu_step_table.py, caches warm) for both.
# AB_ENVS, a ';'-separated list of environments, runs several variants beside the defaults (AB_ENV
# is the one-variant form); GREEDY=1 first compares 64 greedy ids of every variant with the defaults'
# and the last position's logits of a 300-token prompt (prefill-sized linears), bit for bit.
set -u
CARRY=${1:-.ab-carry}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-ab-out /tmp/scr-ab-logs  # tarred into $OUT at the end (the run tool brings back few files)
device_unpack "$CARRY" /tmp/scr-ab-bin
AB_ENV=${AB_ENV:-SCR_CUDA_ATTN_SPLIT=0}
IFS=';' read -r -a variants <<< "${AB_ENVS:-$AB_ENV}"
for m in ${MODELS:-1b 8b}; do
    make_model $m
    if [ "${GREEDY:-0}" = 1 ]; then
        IDS=$(seq -s, 11 130)
        step "greedy_${m}_default" 120 $C/scr complete $M --ids $IDS --max-tokens 64 --json
        for i in "${!variants[@]}"; do
            step "greedy_${m}_v$i" 120 env ${variants[$i]} $C/scr complete $M --ids $IDS --max-tokens 64 --json
            if cmp -s "$LOGS/greedy_${m}_default.txt" "$LOGS/greedy_${m}_v$i.txt"; then s=same; else s=DIFFERENT; fi
            echo "== $m greedy 64 ids, ${variants[$i]} vs defaults: $s"
        done
        IDS300=$(seq -s, 11 310)
        step "logits_${m}_default" 120 $C/scr logits $M --ids $IDS300
        for i in "${!variants[@]}"; do
            step "logits_${m}_v$i" 120 env ${variants[$i]} $C/scr logits $M --ids $IDS300
            if cmp -s "$LOGS/logits_${m}_default.txt" "$LOGS/logits_${m}_v$i.txt"; then s=same; else s=DIFFERENT; fi
            echo "== $m logits after a 300-token prompt, ${variants[$i]} vs defaults: $s bits ($(wc -c < "$LOGS/logits_${m}_default.txt") bytes)"
        done
        rm -f "$LOGS"/logits_${m}_*.txt
    fi
    for r in $(seq ${ROUNDS:-2}); do
        for v in default "${!variants[@]}"; do
            env=(); [ $v != default ] && env=(${variants[$v]})
            step "bench_${m}_${v}_$r" 90 env "${env[@]}" $C/scr cuda-bench $M --prompt 128 --decode 128 --prefill 0 --batches ${BATCHES:-4}
            echo "== $m ${env[*]:-defaults} round $r: $(grep -h '^batch-1 decode\|^decode batch' "$LOGS/bench_${m}_${v}_$r.txt" | cut -c1-110 | tr '\n' ' ')"
        done
    done
    if [ $m = "${NCU_MODEL:-8b}" ] && [ "${NCU:-1}" = 1 ]; then
        for v in ${NCU_VARIANTS:-default ab}; do
            env=(); [ $v = ab ] && env=(${variants[0]})
            step ncu_$v 120 env "${env[@]}" ncu --clock-control none --cache-control none --launch-count ${NCU_LAUNCHES:-1300} \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $C/scr bench $M --mode forward --batch 1 --input-len 120 --context 192 --iters 1
            python3 tests/cuda/ncu_step_table.py "$LOGS/ncu_$v.txt" > "$OUT/ncu_${v}_table.md" 2>&1
            echo "-- ncu, $v:"; grep -E "^step|^\| [a-z_]+ \|" "$OUT/ncu_${v}_table.md" | head -8
        done
    fi
    rm -rf $M
done
printf '%s\n' "${summary[@]}"
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
