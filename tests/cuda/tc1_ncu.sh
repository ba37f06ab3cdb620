#!/bin/bash
# Nsight Compute's full set for the one-row int4 tensor-core GEMV (quant_mma1_kernel, issue #9) at
# given shapes, on the GPU machine:
#   OUT=$OUT [FORMAT=mlx-int4-g64] [KERNEL=regex:...] bash tests/cuda/tc1_ncu.sh CARRY_DIR [SHAPES]
# CARRY_DIR/bin.tar.xz holds scr_cuda_quant_gemv (tests/cuda/pack_carry.sh). The first one-row
# launch at each shape (its 1-row check, weights cold: ncu flushes the caches) is profiled with
# --set full; the text report goes to $OUT/ncu_SHAPE.txt, the stall samples per SASS instruction
# (ncu's source page as CSV) to $OUT/sass_SHAPE.csv, and a digest of the headline metrics and the
# ten SASS instructions with the most samples to stdout.
set -u
CARRY=${1:-.tc-carry}
SHAPES=${2:-14336x4096 4096x14336}
export OUT=${OUT:-/tmp/scr-tc1-ncu}
mkdir -p "$OUT"
LOGS=$OUT
. tests/cuda/device_lib.sh
device_unpack "$CARRY" /tmp/scr-tc1-ncu-bin
export SCR_REQUIRE_GPU=1
for s in $SHAPES; do
    timeout 200 ncu --kernel-name "${KERNEL:-regex:quant_mma1_kernel}" --launch-count 1 --clock-control none \
        --set full --import-source no -o "/tmp/scr-tc1-ncu-$s" -f \
        $C/scr_cuda_quant_gemv --no-bench --formats "${FORMAT:-mlx-int4-g64}" --shapes "$s" > "$OUT/ncu_run_$s.txt" 2>&1
    echo "==== $s rc=$?"
    ncu -i "/tmp/scr-tc1-ncu-$s.ncu-rep" --print-details all > "$OUT/ncu_$s.txt" 2>&1
    ncu -i "/tmp/scr-tc1-ncu-$s.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_$s.csv" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Executed Ipc A|Grid Size|Stall [A-Z]|Mem Busy|Max Bandwidth|Executed Instructions  " "$OUT/ncu_$s.txt" | head -60
    python3 - "$OUT/sass_$s.csv" <<'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(r for r in rows if "Address" in r and "Source" in r)
data = rows[rows.index(hdr) + 1:]
col = {k: hdr.index(k) for k in ("Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb")}
num = lambda v: int(v or 0)
total = sum(num(r[col["Warp Stall Sampling (All Samples)"]]) for r in data)
print(f"stall samples: {total}; the ten SASS instructions with the most (share, long-scoreboard samples):")
for r in sorted(data, key=lambda r: -num(r[col["Warp Stall Sampling (All Samples)"]]))[:10]:
    n = num(r[col["Warp Stall Sampling (All Samples)"]])
    print(f"  {100.0 * n / max(total, 1):5.1f} %  lsb {num(r[col['stall_long_sb']]):5d}  {r[col['Source']].strip()[:80]}")
PY
done
