#!/bin/bash
# Start-up A/B on the GPU machine: process start -> first token for two builds, rounds interleaved.
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=3] bash tests/cuda/startup_ab.sh NEW_CARRY OLD_CARRY
# Each carry is tests/cuda/pack_carry.sh's folder. Random bf16 checkpoints of the real shapes are
# written to /dev/shm (page cache, as a model a user has loaded before); one unmeasured process per
# model first. Prints cuda-bench's start-up lines per run and a one-line summary per run.
set -u
NEW=$1; OLD=${2:--}
OUT=${OUT:-/tmp/startup-out}; mkdir -p "$OUT"
MODELS=${MODELS:-"1b 8b"}; ROUNDS=${ROUNDS:-3}
export LD_LIBRARY_PATH=/tmp/su-new/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/su-new && tar -C /tmp/su-new -xJf "$NEW/bin.tar.xz" || exit 1
variants="new"
if [ "$OLD" != - ]; then mkdir -p /tmp/su-old && tar -C /tmp/su-old -xJf "$OLD/bin.tar.xz" || exit 1; variants="new old"; fi
declare -A cfg=([1b]=models/configs/llama/llama-3.2-1b.json [8b]=models/configs/llama/llama-3.1-8b.json)
for m in $MODELS; do
    [ -f /dev/shm/su-$m/model.safetensors ] || /tmp/su-new/scr make-random "${cfg[$m]}" /dev/shm/su-$m --dtype bf16 > /dev/null 2>&1 || exit 1
    /tmp/su-new/scr cuda-bench /dev/shm/su-$m --prompt 8 --decode 8 --prefill 0 --batches 1 > /dev/null 2>&1
done
# Same bits: 64 greedy ids through the engine (sampling on the GPU), the last position's logits of a
# 300-token prompt, and every position's logits of a 100-token prompt (more rows than the first host
# logits buffer holds, so it grows), new against old.
if [ "$OLD" != - ] && [ "${CHECK:-1}" = 1 ]; then
    for m in $MODELS; do
        for v in new old; do
            /tmp/su-$v/scr complete /dev/shm/su-$m --ids $(seq -s, 11 130) --max-tokens 64 --json > /tmp/su-greedy-$v.txt 2>&1
            /tmp/su-$v/scr logits /dev/shm/su-$m --ids $(seq -s, 11 310) > /tmp/su-logits-$v.txt 2>&1
            /tmp/su-$v/scr logits /dev/shm/su-$m --ids $(seq -s, 11 110) --all 2>&1 | md5sum > /tmp/su-all-$v.txt
        done
        for f in greedy logits all; do
            if cmp -s /tmp/su-$f-new.txt /tmp/su-$f-old.txt; then s=same; else s=DIFFERENT; fi
            echo "== $m $f: new vs old $s ($(wc -c < /tmp/su-$f-new.txt) bytes; $(head -c 120 /tmp/su-$f-new.txt | tr '\n' ' '))"
        done
    done
fi
for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
        for v in $variants; do
            log=$OUT/startup_${m}_${v}_$r.txt
            /tmp/su-$v/scr cuda-bench /dev/shm/su-$m --prompt 8 --decode 8 --prefill 0 --batches 1 > "$log" 2>&1
            echo "== $m $v round $r"; grep -E "start-up|start-up parts|device opening" "$log"
        done
    done
done
