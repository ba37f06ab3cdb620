#!/usr/bin/env python3
"""One decode step's kernels from an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum`
log, summed per kernel name: usage `ncu_step_table.py NCU_LOG [STEP_FROM_END]`.

Steps are split where the kernel that opened the log (the first step's first launch: the embedding
gather) is launched again; the table is for the last complete step (or STEP_FROM_END-th from the end).
"""
import csv
import re
import sys
from collections import OrderedDict

TIME = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
BYTES = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "KB": 1e-6, "MB": 1e-3, "GB": 1.0, "B": 1e-9}


def short(name):
    name = re.sub(r"^void\s+", "", name)
    name = re.sub(r"scr::kernels::cuda::|<unnamed>::|kernels::|cuda_rt::|detail::", "", name)
    return re.split(r"[<(]", name, maxsplit=1)[0]


def main():
    path = sys.argv[1]
    back = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header found")
    kernels = OrderedDict()  # id -> [name, grid, us, GB]
    for row in csv.DictReader(lines[start:]):
        try:
            kid = int(row["ID"])
        except (KeyError, ValueError):
            continue
        k = kernels.setdefault(kid, [row["Kernel Name"], row.get("Grid Size", ""), 0.0, 0.0])
        value = float(row["Metric Value"].replace(",", "") or 0)
        if row["Metric Name"].startswith("gpu__time_duration"):
            k[2] = value * TIME.get(row["Metric Unit"], 1.0)
        elif row["Metric Name"].startswith("dram__bytes_read"):
            k[3] = value * BYTES.get(row["Metric Unit"], 1e-9)
    ks = list(kernels.values())
    if not ks:
        sys.exit("no kernels")
    opener = short(ks[0][0])
    starts = [i for i, k in enumerate(ks) if short(k[0]) == opener]
    steps = [ks[a:b] for a, b in zip(starts, starts[1:])]
    print(f"{len(ks)} kernels profiled, {len(steps)} complete steps (split at `{opener}`); "
          f"kernels per step: {[len(s) for s in steps][-8:]}")
    if len(steps) < back:
        sys.exit("not enough steps")
    step = steps[-back]
    print("\nthe step's first 40 launches in order (us, MB read, grid):")
    for name, grid, us, gb in step[:40]:
        print(f"  {us:8.1f} {gb * 1e3:9.1f}  {grid:>14}  {short(name)}")
    agg = OrderedDict()
    for name, grid, us, gb in step:
        a = agg.setdefault(short(name), [0, 0.0, 0.0, grid])
        a[0] += 1
        a[1] += us
        a[2] += gb
    total_us = sum(a[1] for a in agg.values())
    total_gb = sum(a[2] for a in agg.values())
    print(f"\nstep {-back} from the end: {len(step)} kernels, {total_us:.1f} us of kernel time, {total_gb:.2f} GB read\n")
    print("| kernel | launches | us (sum) | % | GB read | TB/s | grid (first) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for n, (c, us, gb, grid) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {n} | {c} | {us:.1f} | {100 * us / total_us:.1f} | {gb:.3f} | {gb / (us * 1e-6) / 1e3 if us else 0:.2f} | {grid} |")


if __name__ == "__main__":
    main()
