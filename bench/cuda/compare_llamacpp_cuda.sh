#!/bin/bash
# Scratchy and llama.cpp side by side in ONE call on the GPU machine, on the same random weights:
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=2] [BATCHED=1] [PRESETS="mlx-int4-g64 int8"] [TYPES="BF16 Q4_0 Q8_0"] bash bench/cuda/compare_llamacpp_cuda.sh SCR_CARRY LLAMA_CARRY
# SCR_CARRY/bin.tar.xz: scr of a CUDA build holding the models (llama-3.2-1b / llama-3.1-8b) x
#   bf16 and the PRESETS (tests/cuda/pack_carry.sh).
# LLAMA_CARRY/bin.tar.xz: llama-bench, llama-quantize, llama-batched-bench and their shared libraries
#   (bench/cuda/pack_llamacpp.sh; a CUDA build of llama.cpp made here, never committed).
# Per model: a random bf16 checkpoint (`scr make-random`), our PRESETS of it (`scr quantize`), the
# same bf16 bytes as a GGUF (bench/make_gguf.py --from; in GGUF_DIR, default /tmp) and llama.cpp's
# TYPES of that GGUF (llama-quantize). Then ROUNDS rounds, interleaved (the machine's speed drifts
# between calls, so only ratios within a call are compared):
#   scr cuda-bench DIR --prompt 128 --decode 128 --prefill 512 --batches 1   (bf16, then each preset)
#   llama-bench -m GGUF -ngl 99 -fa on -p 512 -n 128 -d 0,128 -r 3         (each type)
# Our decode runs at context 128-256 (a 128-token prompt first); llama-bench's tg128 at depth 128
# is the same condition, depth 0 is facts.md's (../shared/notes/facts.md).
# With BATCHED=1, bf16 batched decode once per model: `scr cuda-bench --batches 16,64,256` against
# llama-batched-bench -npp 128 -ntg 128 -npl 16,64,256 (facts.md's condition).
# Logs in $OUT/logs, the lines that matter in $OUT/summary.txt.
set -u
if [ $# -ne 2 ] || [ ! -f "$1/bin.tar.xz" ] || [ ! -f "$2/bin.tar.xz" ]; then
    echo "usage: [OUT=DIR] [MODELS=...] bash $0 SCR_CARRY LLAMA_CARRY (each a folder holding bin.tar.xz; see the header)" >&2
    exit 2
fi
. tests/cuda/device_lib.sh
device_begin /tmp/scr-lcpp-out
device_unpack "$2" /tmp/scr-lcpp
L=$C
device_unpack "$1" /tmp/scr-lcpp-scr
S=$C/scr
ROUNDS=${ROUNDS:-2}
PRESETS=${PRESETS:-mlx-int4-g64 int8}  # ours, beside bf16
TYPES=${TYPES:-BF16 Q4_0 Q8_0}         # llama.cpp's
GGUF_DIR=${GGUF_DIR:-/tmp}             # the disk: /dev/shm holds our checkpoints
# llama-bench's markdown rows: "| model | size | params | backend | ngl | fa | test | t/s |".
lb_rows() { grep -E '^\| .*(pp|tg)[0-9]+' "$LOGS/$1.txt" | awk -F'|' '{gsub(/ +/," "); print $(NF-2) ":" $(NF-1)}' | tr '\n' ';'; }
for m in ${MODELS:-1b 8b}; do
    cfg=$(model_config "$m") || exit 2
    make_model_any "$m"
    G=$GGUF_DIR/g$m
    step gguf_$m 400 python3 bench/make_gguf.py "$cfg" "$G-bf16.gguf" --from "$M"
    if [ "$ROUNDS" -gt 0 ]; then
        for p in $PRESETS; do step quant_${m}_$p 400 $S quantize "$M" "$M-$p" --preset "$p"; done
        for t in $TYPES; do [ $t = BF16 ] || step gguf_${m}_$t 400 $L/llama-quantize "$G-bf16.gguf" "$G-$t.gguf" $t 16; done
        ls -la "$M"*/*.safetensors "$G"-*.gguf | awk '{print $5, $9}'
    fi
    for r in $(seq 1 "$ROUNDS"); do
        for p in bf16 $PRESETS; do
            d=$M; [ $p = bf16 ] || d=$M-$p
            step cb_${m}_${p}_$r 200 $S cuda-bench "$d" --prompt 128 --decode 128 --prefill 512 --batches 1
            echo "$m scr $p round $r: $(grep -h -o '"decode_device_ms": [0-9.]*\|"batch_tps": {[^}]*}\|"batch_ahead_tps": {[^}]*}\|"prefill_tps": [0-9.]*' "$LOGS/cb_${m}_${p}_$r.txt" | tr '\n' ' ')"
        done
        for t in $TYPES; do
            g=$G-$t.gguf; [ $t = BF16 ] && g=$G-bf16.gguf
            step lb_${m}_${t}_$r 300 $L/llama-bench -m "$g" -ngl 99 -fa on -p 512 -n 128 -d 0,128 -r 3
            echo "$m llama.cpp $t round $r: $(lb_rows lb_${m}_${t}_$r)"
        done
    done
    if [ "${BATCHED:-1}" = 1 ]; then
        step cbB_$m 300 $S cuda-bench "$M" --prompt 128 --decode 128 --prefill 0 --batches 16,64,256
        echo "$m scr bf16 batched: $(grep -h -o '"batch_tps": {[^}]*}' "$LOGS/cbB_$m.txt")"
        step lbb_$m 400 $L/llama-batched-bench -m "$G-bf16.gguf" -ngl 99 -fa on -c 66560 -b 2048 -ub 512 \
            -npp 128 -ntg 128 -npl 16,64,256
        echo "$m llama.cpp BF16 batched (PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, T s, S t/s):"
        grep -E '^\| +[0-9]+ \|' "$LOGS/lbb_$m.txt"
    fi
    rm -rf "$M" "$M"-* "$G"-*.gguf
done
printf '%s\n' "${summary[@]}"
