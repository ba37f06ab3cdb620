#!/usr/bin/env python3
"""Checks a compiled `scr` against Hugging Face transformers reference fixtures (stdlib only).

usage: fixture_check.py SCR FIXTURE_DIR [FIXTURE_DIR...] [--rtol 1e-4] [--gap 1e-3] [--threads 1]
                        [--quant Q --lossy]

Each FIXTURE_DIR holds config.json, model.safetensors and reference.json (tools/fixtures/make_fixtures.py):
  inputs, logits_last (full vocab, last position, per input), logits_all_argmax (per position, per input),
  greedy_16 (16 greedy ids after inputs[0]).
Per fixture and input it checks:
  1. `scr logits DIR --ids ...`: relative error ||got - ref|| / ||ref|| of the last position <= rtol;
  2. `scr logits DIR --ids ... --all`: the argmax at every position equals transformers' unless our
     own top-2 gap there is below --gap (a near tie that float rounding may flip);
  3. `scr complete DIR --ids inputs[0] --max-tokens 16 --json`: identical to greedy_16.
--lossy (for a reduced-precision --quant such as bf16): only the last-position logits, and at least half of
the inputs within --rtol — a rounding flip of an MoE router's top-k moves one input far, a broken kernel
moves them all; greedy and per-position argmax are not compared (near ties flip).
--threads is passed to scr (1 by default: results do not depend on it, and one thread does not stall
on a loaded CI machine). Prints one line per fixture and 'N/M fixtures match'; exit 0 only if all match.
"""
import json
import math
import subprocess
import sys


def run(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
    return json.loads(p.stdout[p.stdout.index("{"):])


def rel_err(got, want):
    if len(got) != len(want):
        raise RuntimeError(f"vocab {len(got)} != reference {len(want)}")
    num = math.sqrt(sum((g - w) ** 2 for g, w in zip(got, want)))
    den = math.sqrt(sum(w * w for w in want)) or 1.0
    return num / den


def top2_gap(row):
    a = b = -math.inf
    for x in row:
        if x > a:
            a, b = x, a
        elif x > b:
            b = x
    return a - b


def check_lossy(scr, d, rtol, threads, quant):
    ref = json.load(open(f"{d}/reference.json"))
    errs = []
    for i, seq in enumerate(ref["inputs"]):
        last = run([scr, "logits", d, "--ids", ",".join(map(str, seq)), "--threads", threads, "--quant", quant])["logits"]
        errs.append(rel_err(last, ref["logits_last"][i]))
    within = sum(e <= rtol for e in errs)
    ok = 2 * within >= len(errs)
    print(f"{d.rstrip('/')} [{quant}]: rel_err per input {' '.join(f'{e:.1e}' for e in errs)}; {within}/{len(errs)} within {rtol:g}"
          f" -> {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def check(scr, d, rtol, gap, threads):
    ref = json.load(open(f"{d}/reference.json"))
    worst, bad_positions, near_ties = 0.0, [], 0
    for i, seq in enumerate(ref["inputs"]):
        ids = ",".join(map(str, seq))
        last = run([scr, "logits", d, "--ids", ids, "--threads", threads])["logits"]
        worst = max(worst, rel_err(last, ref["logits_last"][i]))
        if "logits_all_argmax" in ref:
            rows = run([scr, "logits", d, "--ids", ids, "--all", "--threads", threads])["logits"]
            for p, (row, want) in enumerate(zip(rows, ref["logits_all_argmax"][i])):
                got = max(range(len(row)), key=row.__getitem__)
                if got != want:
                    if top2_gap(row) < gap:
                        near_ties += 1
                    else:
                        bad_positions.append((i, p, got, want))
    gen = run([scr, "complete", d, "--ids", ",".join(map(str, ref["inputs"][0])), "--max-tokens", "16", "--json",
               "--threads", threads])["ids"]
    greedy_ok = [int(x) for x in gen] == ref["greedy_16"]
    ok = worst <= rtol and greedy_ok and not bad_positions
    note = f" argmax differs at (input, position, got, want) {bad_positions[:4]}" if bad_positions else ""
    note += f" ({near_ties} near-tie positions)" if near_ties else ""
    print(f"{d.rstrip('/')}: rel_err={worst:.2e} greedy={'same' if greedy_ok else 'DIFFERENT'}{note} -> {'ok' if ok else 'FAIL'}",
          flush=True)
    return ok


def main():
    args = sys.argv[1:]
    opts = {"--rtol": 1e-4, "--gap": 1e-3, "--threads": 1}
    for k in list(opts):
        if k in args:
            i = args.index(k)
            opts[k] = float(args[i + 1])
            del args[i:i + 2]
    quant, lossy = "", "--lossy" in args
    if lossy:
        args.remove("--lossy")
    if "--quant" in args:
        i = args.index("--quant")
        quant = args[i + 1]
        del args[i:i + 2]
    if lossy and not quant:
        sys.exit("--lossy needs --quant")
    if len(args) < 2:
        sys.exit(__doc__)
    scr, dirs = args[0], args[1:]
    good = 0
    for d in dirs:
        try:
            threads = str(int(opts["--threads"]))
            if lossy:
                good += check_lossy(scr, d, opts["--rtol"], threads, quant)
            else:
                good += check(scr, d, opts["--rtol"], opts["--gap"], threads)
        except Exception as e:  # a crash or a missing specialization fails that fixture
            print(f"{d}: FAIL ({str(e)[:400]})", flush=True)
    print(f"{good}/{len(dirs)} fixtures match")
    sys.exit(0 if good == len(dirs) else 1)


if __name__ == "__main__":
    main()
