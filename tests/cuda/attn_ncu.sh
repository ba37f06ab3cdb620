#!/bin/bash
# Nsight Compute's full set for one batch-1 decode attention launch (rope_attention_kernel) of the
# Llama-3.2-1B / Llama-3.1-8B MLX int4 g64 engines, on the GPU machine:
#   OUT=$OUT [MODELS="1b 8b"] [KERNEL=regex:rope_attention] [SKIP=600] bash tests/cuda/attn_ncu.sh CARRY_DIR
# CARRY_DIR/bin.tar.xz holds scr of a CUDA build with those models (tests/cuda/pack_carry.sh).
# Per model: a random checkpoint (transformers), `scr quantize`, then `scr cuda-bench` under ncu,
# profiling the launch after SKIP matching ones (a graph-replayed decode step; clocks as found).
# Text report in $OUT/ncu_KEY.txt, stall samples per SASS instruction in $OUT/sass_KEY.csv, and a
# digest of the headline metrics and the 14 hottest instructions on stdout.
set -u
CARRY=${1:-.x8-carry}
export OUT=${OUT:-/tmp/scr-attn-ncu}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
device_unpack "$CARRY" /tmp/scr-attn-ncu-bin
for m in ${MODELS:-1b 8b}; do
    make_model_any "$m"
    q=$M-int4
    step quant_$m 400 $C/scr quantize "$M" "$q" --preset mlx-int4-g64
    rm -rf "$M"
    timeout 300 ncu --kernel-name "${KERNEL:-regex:rope_attention}" --launch-skip "${SKIP:-600}" --launch-count 1 \
        --clock-control none --set full --import-source no -o "/tmp/scr-attn-ncu-$m" -f \
        $C/scr cuda-bench "$q" --prompt 128 --decode 128 --prefill 0 --batches 1 > "$OUT/ncu_run_$m.txt" 2>&1
    echo "==== $m rc=$?"
    ncu -i "/tmp/scr-attn-ncu-$m.ncu-rep" --print-details all > "$OUT/ncu_$m.txt" 2>&1
    ncu -i "/tmp/scr-attn-ncu-$m.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_$m.csv" 2>&1
    grep -E "Duration|Elapsed Cycles|SM Frequency|Registers Per|Block Size|Grid Size|Warp Cycles Per Issued|Issued Warp Per|Active Warps Per|Executed Instructions  |Stall [A-Z]" "$OUT/ncu_$m.txt" | head -40
    python3 - "$OUT/sass_$m.csv" <<'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(r for r in rows if "Address" in r and "Source" in r)
data = rows[rows.index(hdr) + 1:]
col = {k: hdr.index(k) for k in ("Address", "Source", "Warp Stall Sampling (All Samples)")}
num = lambda v: int(v or 0)
total = sum(num(r[col["Warp Stall Sampling (All Samples)"]]) for r in data)
print(f"stall samples: {total}; SASS instructions: {len(data)}; the 14 with the most:")
for r in sorted(data, key=lambda r: -num(r[col["Warp Stall Sampling (All Samples)"]]))[:14]:
    n = num(r[col["Warp Stall Sampling (All Samples)"]])
    print(f"  {100.0 * n / max(total, 1):5.1f} %  {r[col['Address']]}  {r[col['Source']].strip()[:90]}")
PY
    rm -rf "$q"
done
printf '%s\n' "${summary[@]}"
