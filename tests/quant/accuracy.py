#!/usr/bin/env python3
"""Accuracy of the quantized presets against the dense model (numbers for docs/QUANT.md).

  fixtures SCR WORK FIXTURE_DIR... [--presets P...] [--min-top1 X]
      For each fixture (config.json + model.safetensors + the index.json inputs of its folder), each
      preset: `scr quantize`, then `scr logits --all` on every input; against the dense f32 logits:
      top-1 agreement over all positions, max |logit error| and mean |error| / std(dense logits).
      With --min-top1, exits 1 when a preset's agreement is below it.
  perplexity SCR WORK MODEL_DIR HELDOUT.jsonl[.gz] [--presets P...] [--n 30]
      Perplexity of the first N held-out conversations ("user assistant" text, tokenized by the
      model's tokenizer with its special tokens) under the dense (bf16) model and each preset.
"""
import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit("FAIL (exit %d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr.strip()))
    return p.stdout


def quantize(scr, src, work, preset):
    out = os.path.join(work, os.path.basename(src.rstrip("/")) + "-" + preset)
    shutil.rmtree(out, ignore_errors=True)
    run([scr, "quantize", src, out, "--preset", preset])
    return out


def all_logits(scr, model, quant, ids):
    return json.loads(run([scr, "logits", model, "--quant", quant, "--ids", ",".join(map(str, ids)), "--all"]))["logits"]


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def fixtures(a):
    worst = 1.0
    for fx in a.dirs:
        index = os.path.join(os.path.dirname(fx.rstrip("/")), "index.json")
        inputs = json.load(open(index))["inputs"]
        dense = [all_logits(a.scr, fx, "f32", ids) for ids in inputs]
        for preset in a.presets:
            q = quantize(a.scr, fx, a.work, preset)
            agree = total = 0
            max_err = err_sum = std_sum = 0.0
            for ids, d_rows in zip(inputs, dense):
                for d, g in zip(d_rows, all_logits(a.scr, q, preset, ids)):
                    agree += argmax(d) == argmax(g)
                    total += 1
                    mean = sum(d) / len(d)
                    std_sum += math.sqrt(sum((v - mean) ** 2 for v in d) / len(d))
                    errs = [abs(x - y) for x, y in zip(d, g)]
                    max_err = max(max_err, max(errs))
                    err_sum += sum(errs) / len(errs)
            top1 = agree / total
            worst = min(worst, top1)
            print("%-40s %-14s top-1 agreement %5.1f%% (%d/%d)  max |err| %.4f  mean |err| / std %.4f"
                  % (os.path.relpath(fx), preset, 100 * top1, agree, total, max_err, err_sum / std_sum))
    if a.min_top1 is not None and worst < a.min_top1:
        print("FAIL: top-1 agreement %.3f below %.3f" % (worst, a.min_top1))
        return 1
    return 0


def perplexity(a):
    opener = gzip.open if a.heldout.endswith(".gz") else open
    texts = []
    with opener(a.heldout, "rt", encoding="utf-8") as f:
        for line in f:
            msgs = json.loads(line)["messages"]
            texts.append(" ".join(m["content"] for m in msgs))
            if len(texts) == a.n:
                break
    token_lists = [json.loads(run([a.scr, "tokenize", a.model, t, "--json", "--add-special"]))["ids"] for t in texts]
    models = [("dense bf16", a.model, "bf16")] + [(p, quantize(a.scr, a.model, a.work, p), p) for p in a.presets]
    for label, model, quant in models:
        nll = count = 0
        for ids in token_lists:
            rows = all_logits(a.scr, model, quant, ids)
            for t in range(len(ids) - 1):
                row = rows[t]
                m = max(row)
                lse = m + math.log(sum(math.exp(v - m) for v in row))
                nll += lse - row[ids[t + 1]]
                count += 1
        print("%-14s perplexity %.4f over %d tokens of %d held-out conversations" % (label, math.exp(nll / count), count, len(token_lists)))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("scr")
    f.add_argument("work")
    f.add_argument("dirs", nargs="+")
    f.add_argument("--presets", nargs="+", default=["mlx-int4-g32", "int8", "fp8", "fp8-tensor"])
    f.add_argument("--min-top1", type=float)
    p = sub.add_parser("perplexity")
    p.add_argument("scr")
    p.add_argument("work")
    p.add_argument("model")
    p.add_argument("heldout")
    p.add_argument("--presets", nargs="+", default=["mlx-int4-g32", "mlx-int4-g64", "mlx-int4-g128", "int8", "fp8"])
    p.add_argument("--n", type=int, default=30)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    return fixtures(a) if a.what == "fixtures" else perplexity(a)


if __name__ == "__main__":
    sys.exit(main())
