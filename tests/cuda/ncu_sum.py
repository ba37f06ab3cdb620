#!/usr/bin/env python3
"""Time per kernel name over every launch of an `ncu --csv --metrics gpu__time_duration.sum` log
(ncu_step_table.py cuts one decode step; this sums a whole run, e.g. a chunked prefill):
usage `ncu_sum.py NCU_LOG [TOP=20]`."""
import csv
import sys
from collections import defaultdict

from ncu_step_table import TIME, short


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header found")
    us, count, grids = defaultdict(float), defaultdict(int), {}
    for row in csv.DictReader(lines[start:]):
        if not row.get("Metric Name", "").startswith("gpu__time_duration"):
            continue
        name = short(row["Kernel Name"])
        us[name] += float(row["Metric Value"].replace(",", "") or 0) * TIME.get(row["Metric Unit"], 1.0)
        count[name] += 1
        grids.setdefault(name, row.get("Grid Size", ""))
    total = sum(us.values())
    print(f"{sum(count.values())} launches, {total:.0f} us of kernel time")
    print("| kernel | launches | us | share | us per launch | first grid |\n|---|---:|---:|---:|---:|---|")
    for name in sorted(us, key=us.get, reverse=True)[:top]:
        print(f"| {name} | {count[name]} | {us[name]:.0f} | {100 * us[name] / total:.1f} % | {us[name] / count[name]:.1f} | {grids[name]} |")


if __name__ == "__main__":
    main()
