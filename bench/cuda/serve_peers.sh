#!/bin/bash
# `scr serve` and llama.cpp's `llama-server` side by side in ONE call on the GPU machine, on the same
# random weights, under the same load (issue #6: TTFT / ITL at 1 / 16 / 64 clients beside the peers):
#   OUT=$OUT [MODELS="1b 8b"] [ROUNDS=2] [LEVELS=1,16,64] [LLAMA_VARIANTS="plain"] bash bench/cuda/serve_peers.sh SCR_CARRY LLAMA_CARRY
# SCR_CARRY/bin.tar.xz: scr of a CUDA build holding the models in bf16 (tests/cuda/pack_carry.sh).
# LLAMA_CARRY/bin.tar.xz: llama-server and its shared libraries (bench/cuda/pack_llamacpp.sh; a CUDA
#   build of llama.cpp made here, never committed).
# Per model: a random bf16 checkpoint (make_model_any), serve_load.py's synthetic tokenizer for it, and
# the same bf16 bytes as a GGUF with the same vocabulary (bench/make_gguf.py --from --vocab words:
# every id decodes to the same text in both servers). Then ROUNDS rounds, the two servers alternating;
# each server is started, loaded by bench/cuda/serve_load.py (streaming /v1/completions, 128-token
# prompts as token ids, distinct per request, 128 tokens out with ignore_eos, greedy, two requests per
# client, one warm-up request first) and stopped.
#   scr serve DIR --max-model-len 4096 --kv-cache-memory 8GiB --max-num-seqs 64   (device_bench.sh's)
#   llama-server -m GGUF -ngl 99 -fa on -np 64 -c 32768 (512 tokens per slot) -b 2048 -ub 512
#   per LLAMA_VARIANTS (default "plain"); `gpu` adds --backend-sampling --kv-unified (its
#   experimental sampling on the GPU, one KV buffer for all slots): at d32676d77 that aborts at
#   start-up with 64 slots (GGML_ASSERT(obj_new) in ggml_new_object under build_sampling: the
#   graph's object pool is too small), 1B and 8B alike (docs/PERF.md "Session 50")
# Both batch continuously; ours samples on the GPU, llama.cpp's on the CPU unless `gpu`;
# both run their default prefix caching (every prompt differs from its first token, so neither hits).
# On random weights a few llama-server requests fail part-way ("The model produced output that
# does not match the expected Content-only format": its chat-output parser rejects a text that
# holds a broken UTF-8 sequence, which a drawn byte token 128-255 makes); serve_load.py counts them as
# errors and leaves them out of the figures.
# The tables in $OUT/summary.txt, the logs in $OUT/logs.tar.xz. Also recorded: whether `transformers serve`
# (the PyTorch peer's server) can run there (its Python dependencies), for a later comparison.
set -u
if [ $# -ne 2 ] || [ ! -f "$1/bin.tar.xz" ] || [ ! -f "$2/bin.tar.xz" ]; then
    echo "usage: [OUT=DIR] [MODELS=...] [ROUNDS=N] [LEVELS=...] [LLAMA_VARIANTS=...] bash $0 SCR_CARRY LLAMA_CARRY (each a folder holding bin.tar.xz)" >&2
    exit 2
fi
for v in ${LLAMA_VARIANTS:-plain}; do
    case $v in plain | gpu) ;; *) echo "LLAMA_VARIANTS: unknown variant '$v' (known: plain, gpu)" >&2; exit 2 ;; esac
done
. tests/cuda/device_lib.sh
device_begin /tmp/scr-serve-peers
device_unpack "$2" /tmp/scr-peers-lcpp
L=$C
device_unpack "$1" /tmp/scr-peers-scr
S=$C/scr
GGUF_DIR=${GGUF_DIR:-/tmp}
port=8123   # scr serve's; each llama-server start takes a fresh one (on the port scr serve had just
lport=9000  # closed it could not bind: likely the connections still in TIME_WAIT)

# load NAME PID VOCAB PORT: serve_load.py against the server PID on PORT, its table echoed.
load() {
    step "$1" 300 python3 bench/cuda/serve_load.py load --url http://127.0.0.1:$4 --server-pid "$2" \
        --levels "${LEVELS:-1,16,64}" --max-tokens 128 --prompt-tokens 128 --requests-per-client 2 --min-requests 4 \
        --seconds 30 --ready-timeout 180 --vocab "$3" --label "$1" --json --count-events
    echo "== $1 (${summary[-1]})"
    grep -E "^\||^first error" "$LOGS/$1.txt"
}
# stop PID: SIGTERM (both servers drain and exit), SIGKILL after 5 s.
stop() {
    kill -TERM "$1" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$1" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

for m in ${MODELS:-1b 8b}; do
    cfg=$(model_config "$m") || exit 2
    make_model_any "$m"
    python3 bench/cuda/serve_load.py tokenizer "$M" > /dev/null || { echo "$m: cannot write a tokenizer"; continue; }
    vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$M/config.json")
    G=$GGUF_DIR/g$m-words.gguf
    step gguf_$m 400 python3 bench/make_gguf.py "$cfg" "$G" --from "$M" --vocab words
    for r in $(seq 1 "${ROUNDS:-2}"); do
        k=${m}_scr_r$r
        $S serve "$M" --port $port --max-model-len 4096 --kv-cache-memory 8GiB --max-num-seqs 64 > "$LOGS/server_$k.txt" 2>&1 &
        pid=$!
        load "$k" $pid "$vocab" $port
        stop $pid
        for v in ${LLAMA_VARIANTS:-plain}; do
            extra=; [ $v = gpu ] && extra="--backend-sampling --kv-unified"
            k=${m}_llamacpp_${v}_r$r
            lport=$((lport + 1))
            $L/llama-server -m "$G" --host 127.0.0.1 --port $lport -ngl 99 -fa on -np 64 -c 32768 -b 2048 -ub 512 $extra \
                > "$LOGS/server_$k.txt" 2>&1 &
            pid=$!
            load "$k" $pid "$vocab" $lport
            stop $pid
            grep -E "^\|" "$LOGS/$k.txt" > /dev/null || tail -n 20 "$LOGS/server_$k.txt"  # why it failed
        done
    done
    rm -rf "$G"
done
echo "transformers serve's dependencies: $(python3 -c 'import fastapi, uvicorn; print("fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__)' 2>&1 | tail -n 1)"
printf '%s\n' "${summary[@]}"
# The run tool brings back a few files only: the logs as one archive beside summary.txt.
tar -C "$OUT" -cJf /tmp/scr-peers-logs.tar.xz logs && rm -rf "$LOGS" && mv /tmp/scr-peers-logs.tar.xz "$OUT/logs.tar.xz"
