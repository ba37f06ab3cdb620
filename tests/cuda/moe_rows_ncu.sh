#!/bin/bash
# Nsight Compute on the grouped expert GEMMs' rows kernel (moe_gemm_rows_kernel: the wide steps) at
# Qwen3-30B-A3B's expert shapes, bf16 and int8 (row scales), in one or more builds of scr_cuda_moe
# (issue #9; docs/CUDA.md "Session 51": session 48's int8 loss after its mend, not found at this tree):
#   OUT=$OUT [LAUNCHES=12] [BENCH=1] [NCU=0] bash tests/cuda/moe_rows_ncu.sh CARRY_A [CARRY_B ...]
# Each CARRY/bin.tar.xz holds scr_cuda_moe (tests/cuda/pack_carry.sh). Per carry, ncu's full set on the
# first LAUNCHES launches of the rows kernel at the 30B shapes (gate / up: <2048, 768, 4, true, 8, 0, 1,
# *>, down: <768, 2048, 4, false, 1, 2, 1, *>; the last argument: int8's row scales) while
# `scr_cuda_moe --no-bench` runs its checks (260 rows: bf16, then int8). Then one table, a column per
# profiled launch, of its duration, issue rate, occupancy and the stall reasons per issued
# instruction ($OUT/table.txt), and per carry the SASS stall samples of its first int8 gate / up and
# down launches ($OUT/sass_*.csv, digested on stdout). BENCH=1: first, per carry, the whole
# `scr_cuda_moe` (checks and bench) and its int8 tables (us per call of every form at 1-4,096 rows);
# a carry named twice is run twice, in the order given (rounds). NCU=0: the bench only.
set -u
[ $# -ge 1 ] && [ -f "$1/bin.tar.xz" ] || { echo "usage: [OUT=DIR] [LAUNCHES=N] [BENCH=1] [NCU=0] bash $0 CARRY_A [CARRY_B ...] (each a folder holding bin.tar.xz)" >&2; exit 2; }
. tests/cuda/device_lib.sh
device_begin /tmp/scr-moe-rows-ncu
export SCR_REQUIRE_GPU=1
ROWS='moe_gemm_rows_kernelILi(2048ELi768ELi4ELb1ELi8ELi0ELi1|768ELi2048ELi4ELb0ELi1ELi2ELi1)ELb[01]E'
# Each carry unpacked once: run r's binary in bins[r], its key (carry name and run) in keys[r].
bins=()
keys=()
for carry in "$@"; do
    keys+=("$(basename "$carry" | tr -c 'A-Za-z0-9' _)_$((${#keys[@]} + 1))")
    device_unpack "$carry" "/tmp/scr-moe-rows-${keys[-1]}"
    bins+=("$C/scr_cuda_moe")
done
if [ "${BENCH:-0}" = 1 ]; then
    for i in "${!bins[@]}"; do
        key=${keys[$i]}
        step "bench_$key" 280 "${bins[$i]}"
        echo "== $key: ${summary[-1]}; $(grep -E 'all MoE expert checks passed|FAILED' "$LOGS/bench_$key.txt" | head -1)"
        grep -A16 -E '^H2048 F768 E128 top8 int8.*uniform routing' "$LOGS/bench_$key.txt"
    done
fi
[ "${NCU:-1}" = 0 ] && { tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .; exit 0; }
reps=()
for i in "${!bins[@]}"; do
    key=${keys[$i]}
    # --kill on: the checks after the last profiled launch are not run (without it if ncu refuses it)
    for kill in "--kill on" ""; do
        t0=$SECONDS
        timeout 250 ncu --kernel-name-base mangled --kernel-name "regex:$ROWS" --launch-count "${LAUNCHES:-12}" $kill \
            --clock-control none --set full --import-source no -o "/tmp/scr-ncu-rows-$key" -f \
            "${bins[$i]}" --no-bench > "$LOGS/ncu_run_$key.txt" 2>&1
        echo "==== $key (ncu $kill): rc=$? ($((SECONDS - t0)) s)" \
            "$(grep -E 'all MoE expert checks passed|FAILED' "$LOGS/ncu_run_$key.txt" | head -1)"
        grep -q '^==PROF== Profiling' "$LOGS/ncu_run_$key.txt" && break
        grep -E '^==ERROR==|unrecognised|unknown option' "$LOGS/ncu_run_$key.txt" | head -3
    done
    [ -f "/tmp/scr-ncu-rows-$key.ncu-rep" ] || continue
    reps+=("$key")
    ncu -i "/tmp/scr-ncu-rows-$key.ncu-rep" --page raw --csv > "$OUT/raw_$key.csv" 2> "$LOGS/raw_$key.err"
    echo "$key: $(($(wc -l < "$OUT/raw_$key.csv") - 2)) launches in the report"  # a header and a units row
    for part in 'ILi2048ELi768E.*ELb1EEEv' 'ILi768ELi2048E.*ELb1EEEv'; do  # int8 gate / up, int8 down (the last argument)
        n=$([ "${part:3:4}" = 2048 ] && echo gateup || echo down)
        ncu -i "/tmp/scr-ncu-rows-$key.ncu-rep" --kernel-name-base mangled --kernel-name "regex:$part" --launch-count 1 \
            --page source --print-source sass --csv > "$OUT/sass_${key}_int8_$n.csv" 2> "$LOGS/sass_${key}_$n.err"
    done
done
# The table: a column per profiled launch (carry, int8 or bf16, gate/up or down), a row per metric.
python3 - "$OUT" "${reps[@]}" <<'PY' | tee "$OUT/table.txt"
import csv, re, sys
out, keys = sys.argv[1], sys.argv[2:]
cols, names = [], []
for key in keys:
    rows = list(csv.reader(open(f"{out}/raw_{key}.csv")))
    if len(rows) < 3:
        print(f"{key}: no raw rows"); continue
    hdr = rows[0]
    for r in rows[2:]:
        d = dict(zip(hdr, r))
        k = d.get("Kernel Name", "")
        # "moe_gemm_rows_kernel<2048, 768, 4, 1, 8, 0, 1, 1>(...)" (or "(bool)1" / "true"): the last template argument
        targs = [a.strip().split(")")[-1] for a in k[k.find("<") + 1:k.find(">")].split(",")] if "<" in k else []
        fmt = "int8" if targs and targs[-1] in ("1", "true") else "bf16"
        part = "gate/up" if targs and targs[0] == "2048" else "down"
        cols.append(d); names.append(f"{key}:{fmt}:{part}")
if not cols:
    sys.exit(0)
fixed = ["gpu__time_duration.sum", "launch__registers_per_thread", "launch__grid_size", "launch__occupancy_limit_registers",
         "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
         "smsp__inst_executed.sum", "smsp__average_warp_latency_per_inst_issued.ratio",
         "dram__bytes_read.sum", "dram__bytes_read.sum.per_second", "lts__t_sector_hit_rate.pct",
         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"]
stall = sorted({m for c in cols for m in c if re.fullmatch(r"smsp__average_warps_issue_stalled_\w+_per_issue_active\.ratio", m)})
print("metric | " + " | ".join(names))
for m in fixed + stall:
    vals = [c.get(m, "") for c in cols]
    if not any(vals):
        continue
    if m in stall:
        try:
            if max(float(v.replace(",", "") or 0) for v in vals) < 0.05:
                continue
        except ValueError:
            pass
    short = m.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    print(f"{short} | " + " | ".join(vals))
PY
for f in "$OUT"/sass_*.csv; do
    [ -s "$f" ] || continue
    echo "== $(basename "$f")"
    python3 - "$f" <<'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
starts = [i for i, r in enumerate(rows) if r and r[0] == "Address"]  # one section per launch: the first
name = next((r[1] for r in rows if r and r[0] == "Kernel Name"), "?")
hdr = rows[starts[0]]
end = next((i for i in range(starts[0] + 1, len(rows)) if rows[i] and rows[i][0] == "Kernel Name"), len(rows))
data = [r for r in rows[starts[0] + 1:end] if len(r) == len(hdr)]
c, s = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Source")
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
total = sum(num(r[c]) for r in data)
print(f"{name[:110]}\nstall samples {total:.0f}, SASS instructions {len(data)}; the 10 with the most:")
for r in sorted(data, key=lambda r: -num(r[c]))[:10]:
    print(f"  {100.0 * num(r[c]) / max(total, 1):5.1f} %  {r[s].strip()[:90]}")
PY
done
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
