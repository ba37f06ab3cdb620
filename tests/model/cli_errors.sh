#!/usr/bin/env bash
# Bad inputs to `scr` exit non-zero with a message naming the problem (never a crash: exit codes
# >= 128 mean a signal). Usage: cli_errors.sh SCR SOURCE_DIR
set -u
scr=$1; src=$2
fx=$src/tests/fixtures/LlamaForCausalLM
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
expect() {  # expect NAME PATTERN -- command...
    local name=$1 pattern=$2; shift 3
    local out code
    out=$("$@" 2>&1); code=$?
    if [ $code -eq 0 ] || [ $code -ge 128 ] || ! tr '\n' ' ' <<<"$out" | grep -qE -- "$pattern"; then
        echo "FAIL $name: exit $code, output: ${out:0:400}"; fails=$((fails+1))
    else
        echo "ok   $name: $(head -c 160 <<<"$out" | tr '\n' ' ')"
    fi
}
# A config that is not compiled in.
mkdir -p $tmp/other && cp $fx/model.safetensors $tmp/other/ && sed 's/"hidden_size": 96/"hidden_size": 80/' $fx/config.json > $tmp/other/config.json
expect uncompiled "matches no specialization.*tiny-llama" -- $scr logits $tmp/other --ids 1,2
# A truncated safetensors file.
mkdir -p $tmp/trunc && cp $fx/config.json $tmp/trunc/ && head -c 100000 $fx/model.safetensors > $tmp/trunc/model.safetensors
expect truncated "model.safetensors.*truncated" -- $scr logits $tmp/trunc --ids 1,2
# A wrong-shaped tensor: swap the header's shape of q_proj.
mkdir -p $tmp/shape && cp $fx/config.json $tmp/shape/
python3 - "$fx/model.safetensors" "$tmp/shape/model.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
h = json.loads(data[8:8+n])
h['model.layers.1.mlp.up_proj.weight']['shape'] = [96, 192]
t = json.dumps(h, separators=(',', ':')).encode()
t += b' ' * (n - len(t)) if len(t) <= n else b''
assert len(t) == n
open(sys.argv[2], 'wb').write(data[:8] + t + data[8+n:])
PY
expect wrong_shape "model.layers.1.mlp.up_proj.weight.*shape \[96, 192\].*expects \[192, 96\]" -- $scr logits $tmp/shape --ids 1,2
# A missing tensor file, a missing folder, bad ids, a prompt over the context.
mkdir -p $tmp/empty && cp $fx/config.json $tmp/empty/
expect no_weights "no model.safetensors" -- $scr logits $tmp/empty --ids 1
expect no_folder "no such folder" -- $scr logits $tmp/nope --ids 1
expect bad_ids "not a non-negative integer" -- $scr logits $fx --ids 1,x
expect big_id "outside the vocabulary" -- $scr logits $fx --ids 1,640
ids=$(seq -s, 1 300)
expect too_long "longer than the context" -- $scr complete $fx --ids $ids --max-tokens 4
printf '{"architectures": [' > $tmp/other/config.json
expect bad_config "malformed JSON" -- $scr logits $tmp/other --ids 1
echo "$fails failed"
[ $fails -eq 0 ]
