#!/usr/bin/env python3
"""Check `scr logits` / `scr complete` against transformers reference fixtures.

usage: fixture_check.py SCR FIXTURE_DIR [FIXTURE_DIR...] [--rtol 1e-4] [--quant PRESET]
(Copied from the team's shared tools for the CUDA device runs; --quant added: passed to scr.)
Each FIXTURE_DIR holds config.json, model.safetensors and reference.json (made by make_fixtures.py).
Prints one line per fixture and a last line 'N/M fixtures match'. Exit 0 only if all match.
"""
import json, math, subprocess, sys

def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")
    return p.stdout

def first_json(text):
    text = text.strip()
    start = min([i for i in (text.find("{"), text.find("[")) if i >= 0], default=-1)
    if start < 0:
        raise RuntimeError("no JSON in output: " + text[:200])
    return json.loads(text[start:])

def last_logits(obj):
    v = obj.get("logits") if isinstance(obj, dict) else obj
    while isinstance(v, list) and v and isinstance(v[0], list):
        v = v[-1]
    return v

def ids_of(obj):
    for k in ("ids", "tokens", "token_ids", "output_ids"):
        if isinstance(obj, dict) and k in obj:
            return obj[k]
    return obj

def main():
    args = [a for a in sys.argv[1:]]
    rtol = 1e-4
    if "--rtol" in args:
        i = args.index("--rtol"); rtol = float(args[i + 1]); del args[i:i + 2]
    quant = []
    if "--quant" in args:
        i = args.index("--quant"); quant = ["--quant", args[i + 1]]; del args[i:i + 2]
    scr, dirs = args[0], args[1:]
    ok = 0
    for d in dirs:
        name = d.rstrip("/").split("/")[-1]
        try:
            ref = json.load(open(f"{d}/reference.json"))
            worst = 0.0
            for seq, want in zip(ref["inputs"], ref["logits_last"]):
                got = last_logits(first_json(run([scr, "logits", d, *quant, "--ids", ",".join(map(str, seq))])))
                if len(got) != len(want):
                    raise RuntimeError(f"vocab {len(got)} != {len(want)}")
                num = math.sqrt(sum((g - w) ** 2 for g, w in zip(got, want)))
                den = math.sqrt(sum(w * w for w in want)) or 1.0
                worst = max(worst, num / den)
            gen = ids_of(first_json(run([scr, "complete", d, *quant, "--ids", ",".join(map(str, ref["inputs"][0])),
                                         "--max-tokens", "16", "--json"])))
            gen = [int(x) for x in gen][-16:]
            good = worst <= rtol and gen == ref["greedy_16"]
            print(f"{name}: rel_err={worst:.2e} greedy={'same' if gen == ref['greedy_16'] else 'DIFFERENT'} -> {'ok' if good else 'FAIL'}")
            ok += good
        except Exception as e:  # a crash or a missing feature is a failure of that fixture
            print(f"{name}: FAIL ({str(e)[:200]})")
    print(f"{ok}/{len(dirs)} fixtures match")
    sys.exit(0 if ok == len(dirs) else 1)

main()
