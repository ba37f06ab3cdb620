#!/usr/bin/env python3
"""The fused quantized launches (folded RMSNorm, grouped Q/K/V, SwiGLU in one pass) against the
unfused plan of the same binary (SCR_CUDA_QUANT_FUSED=0, the plan tests/cuda/quant_e2e.py checked
against the CPU build), on the GPU machine (docs/CUDA.md, "Quantized presets end to end").

  quant_fused_ab.py SCR_CUDA CASE... [--rtol R] [--ref-env NAME=VALUE] [--test-env NAME=VALUE]     CASE is NAME=DIR:PRESET[:ready]

--ref-env: the reference run sets NAME=VALUE instead of SCR_CUDA_QUANT_FUSED=0; --test-env: the
other run sets NAME=VALUE (default: nothing). E.g. --test-env SCR_CUDA_QUANT_GEMV=smem --ref-env
SCR_CUDA_QUANT_GEMV=mma: the shared-memory 1-8-row kernel against the tensor-core one (the 8-token
prompt and the 16-token continuations run on each).

Per case: DIR quantized with the carried binary (or, with ":ready", DIR already is a checkpoint of
PRESET), then quant_e2e.py's measurements (`scr logits --all` on DIR's reference.json prompts, or
8 and 41 made-up tokens, and a 200-token one; `scr complete --max-tokens 16` from the first two)
once per plan. The tiny fixtures' K = 96 layers run the SIMT kernel, which has no fused variant, so
the fused kernels are exercised end to end by the Llama-3.2-1B checkpoints (random weights). The two differ only by where the RMSNorm is rounded (the fused kernel
scales the dot products by 1/rms at the end instead of normalizing x first) and by K/V bf16
roundings that moves: a case passes when every kept position has ||fused - unfused|| / ||unfused||
<= rtol and the greedy continuations are identical. Exit 0 only if all cases pass.
"""
import json, math, os, sys, tempfile


def load_e2e():
    """quant_e2e.py's helpers (checkpoint, measure, PROMPT_LONG) without running its main()."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_e2e.py")
    src = open(path).read().replace('if __name__ == "__main__":', "if False:").replace("\nmain()\n", "\npass\n")
    module = {"__name__": "quant_e2e", "__file__": path}
    exec(compile(src, path, "exec"), module)
    return type("E2E", (), {k: staticmethod(v) if callable(v) else v for k, v in module.items() if not k.startswith("__")})


e2e = load_e2e()


def measure_with(scr, ckpt, quant, prompts, fused, ref_env=("SCR_CUDA_QUANT_FUSED", "0"), test_env=None):
    name, value = ref_env if not fused else (test_env or (None, None))
    if name:
        os.environ[name] = value
    try:
        return e2e.measure(scr, ckpt, quant, prompts)
    finally:
        if name:
            os.environ.pop(name, None)


def main(argv):
    rtol = 2e-3
    if "--rtol" in argv:
        i = argv.index("--rtol")
        rtol = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    ref_env = ("SCR_CUDA_QUANT_FUSED", "0")
    if "--ref-env" in argv:
        i = argv.index("--ref-env")
        ref_env = tuple(argv[i + 1].split("=", 1))
        argv = argv[:i] + argv[i + 2:]
    test_env = None
    if "--test-env" in argv:
        i = argv.index("--test-env")
        test_env = tuple(argv[i + 1].split("=", 1))
        argv = argv[:i] + argv[i + 2:]
    if len(argv) < 2:
        print(__doc__)
        return 2
    scr, cases = argv[0], argv[1:]
    ok_cases = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            name, spec = case.split("=", 1)
            parts = spec.split(":")
            fixture, preset, ready = parts[0], parts[1], len(parts) > 2 and parts[2] == "ready"
            try:
                if ready:
                    ckpt, quant = fixture, ["--quant", preset]
                else:
                    ckpt, quant, _ = e2e.checkpoint(scr, fixture, preset, tmp, name)
                ref_json = os.path.join(fixture, "reference.json")
                if os.path.exists(ref_json):
                    prompts = [list(p) for p in json.load(open(ref_json))["inputs"][:2]]
                else:
                    prompts = [[(i * 7 + 3) % 500 + 1 for i in range(8)], [(i * 13 + 5) % 900 + 1 for i in range(41)]]
                prompts.append(e2e.PROMPT_LONG)
                ref_rows, ref_greedy = measure_with(scr, ckpt, quant, prompts, fused=False, ref_env=ref_env)
                rows, greedy = measure_with(scr, ckpt, quant, prompts, fused=True, test_env=test_env)
            except Exception as e:  # noqa: BLE001  (report the case, go on with the others)
                print(f"{name}: ERROR {e}")
                continue
            worst = 0.0
            for a, b in zip(rows, ref_rows):
                num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
                den = math.sqrt(sum(y * y for y in b)) or 1.0
                worst = max(worst, num / den)
            same = greedy == ref_greedy and len(rows) == len(ref_rows)
            ok = same and worst <= rtol
            ok_cases += ok
            print(f"{name}: {len(rows)} positions, worst ||{'='.join(test_env) if test_env else 'default'} - {'='.join(ref_env)}|| / ||{'='.join(ref_env)}|| {worst:.3e} (rtol {rtol}), "
                  f"greedy {'same' if greedy == ref_greedy else 'DIFFERENT'} -> {'ok' if ok else 'FAILED'}")
    print(f"{ok_cases}/{len(cases)} cases match")
    return 0 if ok_cases == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
