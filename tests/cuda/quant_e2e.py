#!/usr/bin/env python3
"""Quantized presets end to end on the CUDA target, against the CPU target (docs/CUDA.md).

  quant_e2e.py expect SCR_CPU OUT_DIR CASE...     here, with a CPU build: writes OUT_DIR/expected.json
                                                  and OUT_DIR/expected.f32.xz
  quant_e2e.py check  SCR_CUDA DIR [--rtol R]     on the GPU machine, with the CUDA build

CASE is NAME=FIXTURE_DIR:PRESET. A quantized PRESET (int8, mlx-int4-g32, ...) is made with `scr
quantize` into a temporary folder on each side (the same deterministic code in both builds; check
compares the checkpoint's sha256 with the one the CPU side used, so the two read the same bytes and
nothing big has to be carried); a dense PRESET (bf16, f32) runs the fixture itself, as a control.

Per case: `scr logits --all` on three prompts (the fixture's 8 and 41 tokens: decode-sized and
prefill-sized rows; a 200-token one made here, of which the last 4 positions are kept) and `scr
complete --max-tokens 16` from the first two (engine steps: a prefill, then one-row decode steps,
CUDA graphs on the GPU).

The CPU and CUDA builds dequantize to the same f32 weights (scale * q is exact, fma(q, scale, bias)
singly rounded on both), keep f32 activations and a bf16 KV cache: they differ by f32 summation
order and by what that does to the bf16 rounding of K/V. A case passes when every kept position has
||cuda - cpu|| / ||cpu|| <= rtol and the greedy continuations are identical. Prints one line per case
and 'N/M cases match'; exit 0 only if all match.
"""
import array, hashlib, json, lzma, math, os, subprocess, sys, tempfile

PROMPT_LONG = [(i * 37 + 11) % 600 + 1 for i in range(200)]
KEEP_LONG = 4  # last positions of the long prompt kept


def run(cmd, timeout=120):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
    s = p.stdout.strip()
    start = min([i for i in (s.find("{"), s.find("[")) if i >= 0], default=-1)
    return json.loads(s[start:]) if start >= 0 else None


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def checkpoint(scr, fixture, preset, tmp, name):
    """(directory to run, --quant args, sha256 of its weights)."""
    if preset in ("bf16", "f32", "f16"):
        return fixture, ["--quant", preset], sha256(os.path.join(fixture, "model.safetensors"))
    out = os.path.join(tmp, name)
    run([scr, "quantize", fixture, out, "--preset", preset])
    return out, ["--quant", preset], sha256(os.path.join(out, "model.safetensors"))


def measure(scr, ckpt, quant, prompts):
    rows, greedy = [], []
    for i, p in enumerate(prompts):
        logits = run([scr, "logits", ckpt, *quant, "--all", "--ids", ",".join(map(str, p))])["logits"]
        rows += logits[-KEEP_LONG:] if i == 2 else logits
    for p in prompts[:2]:
        r = run([scr, "complete", ckpt, *quant, "--ids", ",".join(map(str, p)), "--max-tokens", "16", "--json"])
        ids = next((r[k] for k in ("ids", "tokens", "token_ids", "output_ids") if isinstance(r, dict) and k in r), r)
        greedy.append([int(x) for x in ids][-16:])
    return rows, greedy


def rel(a, b):
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    return num / (math.sqrt(sum(y * y for y in b)) or 1.0)


def main():
    mode, scr, out_dir, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    tmp = tempfile.mkdtemp(prefix="scr-quant-e2e-")
    if mode == "expect":
        cases, flat = {}, array.array("f")
        for spec in rest:
            name, where = spec.split("=", 1)
            fixture, _, preset = where.rpartition(":")
            ckpt, quant, digest = checkpoint(scr, fixture, preset, tmp, name)
            prompts = [list(p) for p in json.load(open(os.path.join(fixture, "reference.json")))["inputs"][:2]] + [PROMPT_LONG]
            rows, greedy = measure(scr, ckpt, quant, prompts)
            cases[name] = {"fixture": fixture, "preset": preset, "sha256": digest, "prompts": prompts, "greedy": greedy,
                           "rows": len(rows), "vocab": len(rows[0]), "offset": len(flat)}
            for r in rows:
                flat.extend(r)
            print(f"{name}: {len(rows)} positions, greedy {greedy}")
        json.dump(cases, open(os.path.join(out_dir, "expected.json"), "w"))
        open(os.path.join(out_dir, "expected.f32.xz"), "wb").write(lzma.compress(flat.tobytes(), preset=9))
        return
    rtol = float(rest[rest.index("--rtol") + 1]) if "--rtol" in rest else 2e-3
    expected = json.load(open(os.path.join(out_dir, "expected.json")))
    flat = array.array("f")
    flat.frombytes(lzma.decompress(open(os.path.join(out_dir, "expected.f32.xz"), "rb").read()))
    ok = 0
    for name, want in expected.items():
        try:
            ckpt, quant, digest = checkpoint(scr, want["fixture"], want["preset"], tmp, name)
            if digest != want["sha256"]:
                raise RuntimeError(f"checkpoint differs from the CPU side's (sha256 {digest[:12]} vs {want['sha256'][:12]})")
            rows, greedy = measure(scr, ckpt, quant, want["prompts"])
            if len(rows) != want["rows"] or len(rows[0]) != want["vocab"]:
                raise RuntimeError(f"{len(rows)} x {len(rows[0])} logits, expected {want['rows']} x {want['vocab']}")
            worst, same_top = 0.0, 0
            for i, g in enumerate(rows):
                at = want["offset"] + i * want["vocab"]
                w = flat[at:at + want["vocab"]]
                worst = max(worst, rel(g, w))
                same_top += max(range(len(g)), key=g.__getitem__) == max(range(len(w)), key=w.__getitem__)
            same = greedy == want["greedy"]
            good = worst <= rtol and same
            print(f"{name}: {len(rows)} positions, worst rel err {worst:.2e}, top-1 same {same_top}/{len(rows)}, "
                  f"greedy {'same' if same else 'DIFFERENT ' + str(greedy) + ' vs ' + str(want['greedy'])}"
                  f" -> {'ok' if good else 'FAIL'}")
            ok += good
        except Exception as e:  # a refusal or crash is a failure of that case
            print(f"{name}: FAIL ({str(e)[:300]})")
    print(f"{ok}/{len(expected)} cases match (rtol {rtol})")
    sys.exit(0 if ok == len(expected) else 1)


main()
