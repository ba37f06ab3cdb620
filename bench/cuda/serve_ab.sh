#!/bin/bash
# `scr serve` under load with two or more settings, interleaved, on the GPU machine:
#   OUT=$OUT [MODELS="8b 1b"] [VARIANTS="default SCR_CUDA_LINEAR=gemv-to-8"] [LEVELS=1,4,8,16]
#       [ROUNDS=2] [QUANT=PRESET] bash bench/cuda/serve_ab.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz: scr of a CUDA build with the MODELS x bf16 (tests/cuda/pack_carry.sh), and
# x PRESET with QUANT (the checkpoint then `scr quantize`d to it and served). A variant A=1+B=2 sets both.
# Per model a random bf16 checkpoint (make_model of tests/cuda/device_lib.sh) and a synthetic
# tokenizer; per round and variant (`default`, or VAR=VALUE set for the server): scr serve, then
# bench/cuda/serve_load.py at LEVELS concurrent clients (128-token prompts, 128 tokens out, two
# requests per client); its Markdown table is printed per run.
set -u
export OUT=${OUT:-/tmp/scr-serve-ab}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
device_unpack "$1" /tmp/scr-serve-bin
S=$C
port=8123
for m in ${MODELS:-8b 1b}; do
    make_model $m
    if [ -n "${QUANT:-}" ]; then
        step quant_$m 300 $S/scr quantize "$M" "$M-q" --preset "$QUANT"
        rm -rf "$M"
        M=$M-q
    fi
    python3 bench/cuda/serve_load.py tokenizer "$M" > /dev/null || { echo "cannot write a tokenizer for $M"; rm -rf "$M"; continue; }
    vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$M/config.json")
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for v in ${VARIANTS:-default SCR_CUDA_LINEAR=gemv-to-8}; do
            k=${m}_$(printf %s "${v//SCR_CUDA_/}" | tr -c 'A-Za-z0-9' _)_r$r  # every name (less SCR_CUDA_) and value
            e=; [ "$v" = default ] || e=${v//+/ }
            env $e $S/scr serve "$M" --port $port --max-model-len 4096 --kv-cache-memory 8GiB --max-num-seqs 64 \
                > "$OUT/server_$k.txt" 2>&1 &
            pid=$!
            step load_$k 240 python3 bench/cuda/serve_load.py load --url http://127.0.0.1:$port --server-pid $pid \
                --levels ${LEVELS:-1,4,8,16} --max-tokens 128 --prompt-tokens 128 --requests-per-client 2 --min-requests 4 \
                --seconds 20 --vocab "$vocab" --label "$k"
            kill -TERM $pid 2>/dev/null  # drains, then exits
            for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
            kill -KILL $pid 2>/dev/null
            wait $pid 2>/dev/null
            echo "== $k"
            grep -E "^\|" "$OUT/load_$k.txt"
            grep -q "^| " "$OUT/load_$k.txt" && rm -f "$OUT/server_$k.txt"  # kept when the load failed
        done
    done
    rm -rf "$M"
done
printf '%s\n' "${summary[@]}"
