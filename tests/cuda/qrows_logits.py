#!/usr/bin/env python3
"""MLX int4 steps of 2 token rows on quant_mma1_kernel against the earlier path, end to end, on the
GPU machine (tests/cuda/qrows_ab.sh):

  qrows_logits.py SCR CKPT [--factor F]

`scr logits CKPT --quant mlx-int4-g64 --all --ids ...` of prompts of 1-4 random token ids (a prompt
of n tokens is one step of n rows through every linear) with the defaults (1-2 rows on
quant_mma1_kernel, 2 rows of SwiGLU as a grouped launch + silu*mul) and with
SCR_CUDA_QUANT_TC1_ROWS=1 (2+ rows on quant_mma_kernel, x as bf16 hi + lo):
  * 1, 3 and 4 tokens run the same kernels either way: the logits must be the same bits;
  * 2 tokens: both kernels are within ~2e-5 of float64 per linear (scr_cuda_quant_gemv's bounds),
    and through the layers of a random checkpoint their logits drift apart by some 1e-3 relative.
    The yardstick is the drift the engine's two existing kernels already show at one row
    (quant_mma1_kernel against SCR_CUDA_QUANT_GEMV=mma, the 1-token prompt): the 2-token drift
    must stay within F (default 3) times it, per position, and the top token must agree unless the
    old top two are that close.
With --mode staged (tests/cuda/qstaged_ab.sh): steps of 3-16 rows on quant_staged_kernel against
SCR_CUDA_QUANT_STAGED=0 (quant_mma_kernel): prompts of 1, 2, 3, 8, 16 and 17 tokens; 3, 8, 16 and
17 (passes of 16 since session 30) must be within the tolerance, 1 and 2 the same bits.
With --mode passes (the default rule, or SCR_CUDA_QUANT_STAGED_UPTO=64+): steps of 17-64 rows as passes of
16 rows on quant_staged_kernel against SCR_CUDA_QUANT_STAGED=0: prompts of 1, 2, 16, 17, 32 and 64
tokens; 16-64 must be within the tolerance, 1 and 2 the same bits.
With --mode cublas (any format: --quant Q, default mlx-int4-g64; --min-rows R, the format's
quant_prefill_min_rows: by default 65 for MLX int4, 33 for the others): steps of 1, 32, 33, 64 and 65 rows with the defaults against
SCR_CUDA_QUANT_PREFILL_MIN_ROWS=0 (the quantized kernels for every row count): steps of R+ rows run on
cuBLASLt on expanded weights and must be within the tolerance, shorter ones the same bits. For a
format without the one-row tensor-core kernel the yardstick is the 1-token drift between its default
GEMV and SCR_CUDA_QUANT_GEMV=simt.
With --mode wide (MLX int4 g32 / g64, or int8 / fp8 with --quant; sessions 32-33): steps of 33-256
rows on quant_wide_kernel (SCR_CUDA_QUANT_WIDE=256 and SCR_CUDA_QUANT_WIDE_CODES=256) against the
kernel switched off (=0 both: MLX int4 33+ rows in staged passes or on cuBLASLt, int8 / fp8 on
cuBLASLt): prompts of 1, 2, 32, 33, 64, 65, 100 and 128 tokens (100: two token tiles); 33+ must be
within the tolerance, shorter ones the same bits.
With --mode global (session 37): steps of 33-128 rows on quant_wide_kernel with the rule's K split
through global memory wherever one wave holds it (SCR_CUDA_QUANT_WIDE_GLOBAL=2) against the same
split as clusters (=3): the same additions in the same order, so every prompt must give the same bits.
Exit 0 only if every prompt passes.
"""
import json, math, os, random, subprocess, sys


QUANT = "mlx-int4-g64"


def logits(scr, ckpt, ids, env):
    e = dict(os.environ)
    e.update(env)
    out = subprocess.run([scr, "logits", ckpt, "--quant", QUANT, "--all", "--ids", ",".join(map(str, ids))], env=e, capture_output=True,
                         text=True, timeout=240)
    if out.returncode != 0:
        sys.exit(f"scr logits failed (rc {out.returncode}, env {env}): {out.stderr[-2000:]}")
    return json.loads(out.stdout)["logits"]


try:  # numpy where present (the GPU machine): long prompts carry 10^7 logits per side
    import numpy as np
except ImportError:
    np = None


def rel(a, b):
    if np is not None:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        return float(np.linalg.norm(a - b) / (np.linalg.norm(b) or 1.0))
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    return num / (math.sqrt(sum(y * y for y in b)) or 1.0)


def argmax(a):
    return int(np.argmax(a)) if np is not None else max(range(len(a)), key=a.__getitem__)


# mode: (the earlier path's environment, prompt lengths, lengths whose kernels differ)
MODES = {
    "rows2": ({"SCR_CUDA_QUANT_TC1_ROWS": "1"}, (1, 2, 3, 4), {2}),
    "staged": ({"SCR_CUDA_QUANT_STAGED": "0"}, (1, 2, 3, 8, 16, 17), {3, 8, 16, 17}),
    "passes": ({"SCR_CUDA_QUANT_STAGED": "0"}, (1, 2, 16, 17, 32, 64), {16, 17, 32, 64}),
    "cublas": ({"SCR_CUDA_QUANT_PREFILL_MIN_ROWS": "0"}, (1, 32, 33, 64, 65), None),  # changed: --min-rows
    "wide": ({"SCR_CUDA_QUANT_WIDE": "0", "SCR_CUDA_QUANT_WIDE_CODES": "0"}, (1, 2, 32, 33, 64, 65, 100, 128), {33, 64, 65, 100, 128}),
    "global": ({"SCR_CUDA_QUANT_WIDE": "256", "SCR_CUDA_QUANT_WIDE_CODES": "256", "SCR_CUDA_QUANT_WIDE_GLOBAL": "3"}, (1, 33, 64, 100, 128),
               set()),
}
# The new path's environment where it is not (or not for every row count) the default.
NEW_ENV = {"wide": {"SCR_CUDA_QUANT_WIDE": "256", "SCR_CUDA_QUANT_WIDE_CODES": "256"},
           "global": {"SCR_CUDA_QUANT_WIDE": "256", "SCR_CUDA_QUANT_WIDE_CODES": "256", "SCR_CUDA_QUANT_WIDE_GLOBAL": "2"}}


def main():
    args = sys.argv[1:]
    factor = 3.0
    if "--factor" in args:
        i = args.index("--factor")
        factor = float(args[i + 1])
        del args[i:i + 2]
    global QUANT
    min_rows = None
    if "--quant" in args:
        i = args.index("--quant")
        QUANT = args[i + 1]
        del args[i:i + 2]
    if "--min-rows" in args:
        i = args.index("--min-rows")
        min_rows = int(args[i + 1])
        del args[i:i + 2]
    mode = "rows2"
    if "--mode" in args:
        i = args.index("--mode")
        mode = args[i + 1]
        del args[i:i + 2]
    if mode not in MODES or len(args) != 2:
        sys.exit(__doc__)
    scr, ckpt = args
    vocab = json.load(open(os.path.join(ckpt, "config.json")))["vocab_size"]
    rng = random.Random(7)
    if min_rows is None:
        min_rows = 65 if QUANT.startswith("mlx-int4") else 33
    old_env, lengths, changed = MODES[mode]
    if changed is None:
        changed = {n for n in lengths if n >= min_rows}
    prompts = {n: [rng.randrange(vocab) for _ in range(n)] for n in lengths}
    int4 = QUANT.startswith("mlx-int4")
    other = {"SCR_CUDA_QUANT_GEMV": "mma" if int4 else "simt"}
    base = rel(logits(scr, ckpt, prompts[1], {})[0], logits(scr, ckpt, prompts[1], other)[0])
    tol = factor * base
    what = "quant_mma1_kernel against quant_mma_kernel" if int4 else "the default GEMV against SCR_CUDA_QUANT_GEMV=simt"
    print(f"yardstick: 1-token logits, {what}: {base:.2e} relative; tolerance {tol:.2e}")
    bad = 0
    for n, ids in prompts.items():
        new = logits(scr, ckpt, ids, NEW_ENV.get(mode, {}))
        old = logits(scr, ckpt, ids, old_env)
        if len(new) != n or len(old) != n:
            print(f"prompt of {n}: {len(new)} / {len(old)} positions, expected {n} -> FAILED")
            bad += 1
            continue
        worst, top_differs = 0.0, 0
        for a, b in zip(new, old):
            worst = max(worst, rel(a, b))
            ia, ib = argmax(a), argmax(b)
            if ia != ib and abs(b[ia] - b[ib]) > tol * (abs(b[ib]) + 1e-6):
                top_differs += 1
        same_bits = new == old
        ok = same_bits if n not in changed else (worst <= tol and top_differs == 0)
        bad += 0 if ok else 1
        want = "the same bits" if n not in changed else f"within {tol:.2e}"
        print(f"prompt of {n} token(s): max ||new - old|| / ||old|| over positions {worst:.2e}, top token differs at "
              f"{top_differs}, same bits: {same_bits} (want {want}) -> {'ok' if ok else 'FAILED'}")
    print("qrows logits: " + ("all passed" if bad == 0 else f"{bad} FAILED"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
