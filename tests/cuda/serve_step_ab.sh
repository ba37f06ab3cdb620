#!/bin/bash
# scr serve with the compiled 2,048-token step against --max-num-batched-tokens 512, same binary,
# alternating, in one call on the GPU machine (issue #6, session 11):
#   OUT=$OUT bash tests/cuda/serve_step_ab.sh   (carry .gc-carry: scr of a CUDA build with llama-3.1-8b, bf16)
# serve_load.py at 1 and 16 clients, 1,024-token prompts, 128 tokens out.
source tests/cuda/device_lib.sh; LOGS=$OUT; device_unpack .gc-carry /tmp/gc; make_model 8b
python3 bench/cuda/serve_load.py tokenizer $M > /dev/null
V=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" $M/config.json)
for r in 1 2; do for b in default 512; do
  extra=(); [ $b = 512 ] && extra=(--max-num-batched-tokens 512)
  $C/scr serve $M --port 8123 --max-model-len 4096 --kv-cache-memory 8GiB --max-num-seqs 64 "${extra[@]}" > $OUT/srv_${b}_$r.txt 2>&1 &
  pid=$!
  timeout 100 python3 bench/cuda/serve_load.py load --url http://127.0.0.1:8123 --server-pid $pid --levels 1,16 --max-tokens 128 \
    --prompt-tokens 1024 --requests-per-client 2 --min-requests 4 --seconds 10 --vocab $V --label "8b step $b round $r" > $OUT/load_${b}_$r.txt 2>&1
  echo "== step $b round $r rc=$?"; tail -n 6 $OUT/load_${b}_$r.txt
  kill -TERM $pid; for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 $pid 2>/dev/null || break; sleep 0.5; done; kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
done; done
