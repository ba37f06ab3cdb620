#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS each (default 30) on the parsers of untrusted input:
# config.json, safetensors headers, tokenizer/template files, HTTP request bodies. A crash, a
# sanitizer report, a leak, a timeout (10 s per input) or an escaping exception fails the run and
# leaves the reproducer in build-fuzz/crashes/. Usage: tools/fuzz.sh [SECONDS]
# Needs clang (libFuzzer); tools/test.sh calls it when clang++ is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSCR_TESTS=ON \
  -DSCR_FUZZ=ON -DSCR_MODELS="tiny-llama" -DSCR_QUANT="f32" >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_config fuzz_safetensors fuzz_tokenizer fuzz_request
mkdir -p build-fuzz/crashes
run() {  # run NAME BINARY SEED_FILES...
    local name=$1 bin=$2; shift 2
    local corpus=build-fuzz/corpus/$name
    mkdir -p "$corpus"
    for f in "$@"; do [ -f "$f" ] && cp "$f" "$corpus/" ; done
    echo "-- fuzz $name for ${seconds}s"
    local log=build-fuzz/$name.log
    if ! "$bin" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
         -artifact_prefix=build-fuzz/crashes/"$name"- >"$log" 2>&1; then
        tail -40 "$log"; echo "fuzz $name: FAILED (reproducer in build-fuzz/crashes/)"; return 1
    fi
    grep -E "DONE|stat::number_of_executed_units" "$log" || true
}
# Seed for the safetensors target: 8 bytes of data size, then a real header's JSON text.
python3 - tests/fixtures/LlamaForCausalLM/model.safetensors build-fuzz/seed-safetensors <<'PY'
import struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(data) - 8 - n) + data[8:8 + n])
PY
run config build-fuzz/tests/model/fuzz_config models/configs/*/*.json
run safetensors build-fuzz/tests/weights/fuzz_safetensors build-fuzz/seed-safetensors
run tokenizer build-fuzz/tests/text/fuzz_tokenizer
run request build-fuzz/tests/server/fuzz_request
echo "== fuzz: no crash in 4 targets x ${seconds}s"
