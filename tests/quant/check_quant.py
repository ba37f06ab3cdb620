#!/usr/bin/env python3
"""End-to-end checks of the quantized formats against the pure-Python reference (quant_ref.py).

  quantize  SCR FIXTURE WORK PRESET...   `scr quantize` output == the reference quantization, bit for bit
                                         (tensor names, dtypes, shapes, bytes), config.json blocks ==
                                         models/quant/<preset>.json, tokenizer/generation files copied.
  logits    SCR FIXTURE WORK PRESET...   `scr logits` of the quantized checkpoint (test preset
                                         <preset>-kvf32: f32 KV cache) vs `scr logits --quant f32` of the
                                         checkpoint dequantized to f32 by the reference: max |diff| <=
                                         tolerance * max |logit| at every position (TOLERANCE below:
                                         fp32 rounding for int8/fp8, the int8 activation rounding for
                                         MLX int4) and the same top-1 wherever its margin is clear.
  mlx_layout SCR FIXTURE WORK PRESET     (MoE fixture, MLX preset) mlx-lm's layout of the same checkpoint:
                                         experts stacked as mlp.switch_mlp.{proj} [E, ...] and each
                                         router quantized at 8 bits (a per-module override, as mlx-lm's
                                         qwen3_moe writes) -> `scr logits` bit-identical to the
                                         per-expert checkpoint with each router replaced by its f32
                                         dequantization (the reference's); and bad stacked checkpoints
                                         (an expert short, an override of another module, 3-bit
                                         router) -> a message naming the tensor or override.
  errors    SCR FIXTURE WORK             bad checkpoints: wrong group size, truncated packed tensor,
                                         missing scales, dense checkpoint for a quantized preset ->
                                         non-zero exit and a message naming the problem.
Exit 0 when all pass.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_ref as ref  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IDS = "1,17,42,99,256,7,300,12"


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if expect_ok and p.returncode != 0:
        print("FAIL (exit %d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr.strip()))
        sys.exit(1)
    return p


def fixture_tensors(fixture):
    out = {}
    for f in sorted(os.listdir(fixture)):
        if f.endswith(".safetensors"):
            out.update(ref.read_safetensors(os.path.join(fixture, f)))
    return out


def quantize(scr, fixture, work, preset):
    out = os.path.join(work, preset)
    shutil.rmtree(out, ignore_errors=True)
    run([scr, "quantize", fixture, out, "--preset", preset])
    return out


def reference_quantization(src, preset):
    spec = json.load(open(os.path.join(ROOT, "models", "quant", preset + ".json")))
    fmt = spec["format"]
    want = {}
    for name, (dtype, shape, raw) in src.items():
        w = [ref.bf(v) for v in ref.floats(dtype, raw)]
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        # A MoE router (a module named gate: Qwen-MoE's mlp.gate) stays dense under every preset.
        quant = module is not None and len(shape) == 2 and module.split(".")[-1] != "gate"
        if fmt == "mlx-affine":
            quant = quant and shape[1] % spec["group_size"] == 0
        else:
            quant = quant and not module.endswith("embed_tokens") and module != "lm_head"
        if not quant:
            want[name] = ("BF16", shape, ref.bf16_bytes(w))
            continue
        n, k = shape
        if fmt == "mlx-affine":
            g = spec["group_size"]
            words, scales, biases = ref.mlx_quantize(w, n, k, g)
            want[name] = ("U32", [n, k // 8], struct.pack("<%dI" % len(words), *words))
            want[module + ".scales"] = ("BF16", [n, k // g], ref.bf16_bytes(scales))
            want[module + ".biases"] = ("BF16", [n, k // g], ref.bf16_bytes(biases))
        elif spec["weight_type"] == "int":
            q, scales = ref.int8_quantize(w, n, k)
            want[name] = ("I8", [n, k], struct.pack("<%db" % len(q), *q))
            want[module + ".weight_scale"] = ("BF16", [n, 1], ref.bf16_bytes(scales))
        else:
            per_tensor = spec["strategy"] == "tensor"
            q, scales = ref.fp8_quantize(w, n, k, per_tensor)
            want[name] = ("F8_E4M3", [n, k], bytes(q))
            want[module + ".weight_scale"] = ("BF16", [1] if per_tensor else [n, 1], ref.bf16_bytes(scales))
    return spec, want


def cmd_quantize(scr, fixture, work, presets):
    src = fixture_tensors(fixture)
    failed = 0
    for preset in presets:
        out = quantize(scr, fixture, work, preset)
        spec, want = reference_quantization(src, preset)
        got = ref.read_safetensors(os.path.join(out, "model.safetensors"))
        bad = []
        if sorted(got) != sorted(want):
            bad.append("tensor names differ: only written %s, only expected %s"
                       % (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5]))
        for name in sorted(set(got) & set(want)):
            if got[name][:2] != want[name][:2]:
                bad.append("%s: %s %s, expected %s %s" % (name, got[name][0], got[name][1], want[name][0], want[name][1]))
            elif got[name][2] != want[name][2]:
                diff = sum(1 for a, b in zip(got[name][2], want[name][2]) if a != b)
                bad.append("%s: %d of %d bytes differ" % (name, diff, len(want[name][2])))
        cfg = json.load(open(os.path.join(out, "config.json")))
        if cfg.get("quantization_config") != spec["quantization_config"]:
            bad.append("config.json quantization_config %s != preset's %s" % (cfg.get("quantization_config"), spec["quantization_config"]))
        if spec["format"] == "mlx-affine" and cfg.get("quantization") != spec["quantization_config"]:
            bad.append("config.json has no MLX \"quantization\" block equal to the preset's")
        for f in os.listdir(fixture):
            if not f.endswith(".safetensors") and f != "config.json" and f != "reference.json" and not os.path.exists(os.path.join(out, f)):
                bad.append("%s was not copied" % f)
        nq = sum(1 for n in want if n.endswith((".scales", ".weight_scale")))
        print("%s quantize %-14s %d tensors, %d quantized%s" % ("FAIL" if bad else "ok  ", preset, len(want), nq,
                                                             "".join("\n     " + b for b in bad[:10])))
        failed += bool(bad)
    return failed


def logits(scr, model, quant):
    out = run([scr, "logits", model, "--quant", quant, "--ids", IDS, "--all"]).stdout
    return json.loads(out)["logits"]


def dequantized_copy(qdir, work, preset):
    dq = os.path.join(work, preset + "-dequantized")
    shutil.rmtree(dq, ignore_errors=True)
    os.makedirs(dq)
    ref.write_safetensors(os.path.join(dq, "model.safetensors"),
                          ref.dequantize_checkpoint(ref.read_safetensors(os.path.join(qdir, "model.safetensors"))))
    cfg = json.load(open(os.path.join(qdir, "config.json")))
    cfg.pop("quantization_config", None)
    cfg.pop("quantization", None)
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(os.path.join(dq, "config.json"), "w"), indent=2)
    return dq


# Tolerance on max |diff| / max |logit| against the f32 model on the reference-dequantized weights.
# int8 / fp8 kernels dequantize exactly and keep f32 activations: fp32 rounding of the same sums.
# MLX int4 quantizes each activation row to int8 per 32 elements (docs/QUANT.md): every element moves
# by up to half a step, 2^-8 of its block's largest magnitude, so a linear output moves by about
# (amax / rms) / (127 * sqrt(12)) ~ 0.6-0.9 % of its spread, and the fixture's 3 layers (7 linears
# each, in sequence through the residual stream) and the int4 head add up. Measured on this fixture
# (8 + 16 positions): max |diff| / max |logit| 1.2-2.7 %, rms diff / std(logits) 1.2-2.5 %. The bounds
# below leave ~2x room; a wrong nibble, scale or bias term moves the logits by tens of percent.
TOLERANCE = {"mlx": 6e-2, "other": 1e-5}
RMS_TOLERANCE = {"mlx": 5e-2, "other": 1e-5}


def cmd_logits(scr, fixture, work, presets):
    failed = 0
    for preset in presets:
        qdir = quantize(scr, fixture, work, preset)
        dq = dequantized_copy(qdir, work, preset)
        got, want = logits(scr, qdir, preset + "-kvf32"), logits(scr, dq, "f32")
        kind = "mlx" if preset.startswith("mlx-") else "other"
        tol, rms_tol = TOLERANCE[kind], RMS_TOLERANCE[kind]
        worst, worst_rms, agree, clear, clear_agree = 0.0, 0.0, 0, 0, 0
        for g_row, w_row in zip(got, want):
            scale = max(abs(v) for v in w_row)
            worst = max(worst, max(abs(a - b) for a, b in zip(g_row, w_row)) / scale)
            mean = sum(w_row) / len(w_row)
            spread = (sum((v - mean) ** 2 for v in w_row) / len(w_row)) ** 0.5
            worst_rms = max(worst_rms, (sum((a - b) ** 2 for a, b in zip(g_row, w_row)) / len(w_row)) ** 0.5 / spread)
            top = sorted(range(len(w_row)), key=lambda i: -w_row[i])[:2]
            same = max(range(len(g_row)), key=lambda i: g_row[i]) == top[0]
            agree += same
            # Where the f32 model's top-2 gap is wider than twice the tolerance, top-1 must agree.
            if w_row[top[0]] - w_row[top[1]] > 2 * tol * scale:
                clear += 1
                clear_agree += same
        # Batch invariance end to end: the first 3 positions prefilled alone (3-row linear calls) give
        # the same bits as inside the 8-token prefill (4-row tiles, the activations quantized in parallel).
        head = run([scr, "logits", qdir, "--quant", preset + "-kvf32", "--ids", ",".join(IDS.split(",")[:3]), "--all"]).stdout
        invariant = json.loads(head)["logits"] == got[:3]
        ok = len(got) == len(want) and worst <= tol and worst_rms <= rms_tol and clear_agree == clear and invariant
        print("%s logits %-14s vs f32 of the reference-dequantized weights: max |diff| / max |logit| = %.3g (tolerance %g), "
              "rms diff / std = %.3g (tolerance %g); top-1 agrees at %d of %d positions, %d of %d with a clear top-2 gap; "
              "first 3 positions alone %s"
              % ("ok  " if ok else "FAIL", preset, worst, tol, worst_rms, rms_tol, agree, len(want), clear_agree, clear,
                 "bit-identical" if invariant else "DIFFER from the batched run"))
        failed += not ok
    return failed


def refused(what, cmd, words):
    """True when cmd exits non-zero with every one of `words` in its message (and no crash)."""
    p = run(cmd, expect_ok=False)
    msg = p.stderr.strip()
    ok = p.returncode != 0 and all(x in msg for x in words) and "Segmentation" not in msg
    print("%s error: %-36s exit %d: %s" % ("ok  " if ok else "FAIL", what, p.returncode, msg.splitlines()[0] if msg else "(no message)"))
    if not ok:
        print("     expected the words %s in:\n%s" % (words, msg))
    return ok


def rewrite(qdir, work, name, edit_tensors=None, edit_config=None, tensors=None):
    bad = os.path.join(work, name)
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(qdir, bad)
    if edit_tensors or tensors is not None:
        t = tensors if tensors is not None else ref.read_safetensors(os.path.join(bad, "model.safetensors"))
        if edit_tensors:
            edit_tensors(t)
        ref.write_safetensors(os.path.join(bad, "model.safetensors"), t)
    if edit_config:
        cfg = json.load(open(os.path.join(bad, "config.json")))
        edit_config(cfg)
        json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
    return bad


ROUTER_BITS = 8


def mlx_lm_layout(qdir, work, name, group, drop_last_expert=False):
    """The mlx-lm layout of per-expert checkpoint qdir (mlx-lm's sanitize, then nn.quantize with
    qwen3_moe's quant_predicate): experts stacked, routers quantized at ROUTER_BITS (group `group`,
    recorded as overrides). Returns (folder, {router module: its f32 dequantized values})."""
    t = ref.read_safetensors(os.path.join(qdir, "model.safetensors"))
    stacks, routers = {}, {}
    for key in sorted(t):
        parts = key.split(".")
        if "experts" in parts:
            i = parts.index("experts")
            stacked = ".".join(parts[:i] + ["switch_mlp"] + parts[i + 2:])
            stacks.setdefault(stacked, {})[int(parts[i + 1])] = t.pop(key)
    for stacked, by_expert in stacks.items():
        experts = [by_expert[e] for e in sorted(by_expert)]
        if drop_last_expert:
            experts = experts[:-1]
        dtype, shape, _ = experts[0]
        t[stacked] = (dtype, [len(experts)] + shape, b"".join(raw for _, _, raw in experts))
    overrides = {}
    for key in sorted(k for k in t if k.endswith(".mlp.gate.weight")):
        module = key[:-len(".weight")]
        dtype, (n, k), raw = t[key]
        w = [ref.bf(v) for v in ref.floats(dtype, raw)]
        words, scales, biases = ref.mlx_quantize(w, n, k, group, ROUTER_BITS)
        t[key] = ("U32", [n, k * ROUTER_BITS // 32], struct.pack("<%dI" % len(words), *words))
        t[module + ".scales"] = ("BF16", [n, k // group], ref.bf16_bytes(scales))
        t[module + ".biases"] = ("BF16", [n, k // group], ref.bf16_bytes(biases))
        routers[module] = (n, k, ref.mlx_dequantize(words, scales, biases, n, k, group, ROUTER_BITS), w)
        overrides[module] = {"group_size": group, "bits": ROUTER_BITS}

    def edit(c):
        for block in ("quantization", "quantization_config"):
            c[block].update(overrides)
    return rewrite(qdir, work, name, edit_config=edit, tensors=t), routers


def cmd_mlx_layout(scr, fixture, work, presets):
    failed = 0
    for preset in presets:
        qdir = quantize(scr, fixture, work, preset)
        stacked, routers = mlx_lm_layout(qdir, work, preset + "-mlx-lm", 32)
        names = ref.read_safetensors(os.path.join(stacked, "model.safetensors"))
        n_stacked = sum(".switch_mlp." in k for k in names)
        moved = sum(sum(a != b for a, b in zip(dq, w)) for _, _, dq, w in routers.values())

        def dequantized_routers(t):
            for module, (n, k, dq, _) in routers.items():
                t[module + ".weight"] = ("F32", [n, k], ref.f32_bytes(dq))
        want_dir = rewrite(qdir, work, preset + "-routers-f32", edit_tensors=dequantized_routers)
        got, want = logits(scr, stacked, preset + "-kvf32"), logits(scr, want_dir, preset + "-kvf32")
        dense = logits(scr, qdir, preset + "-kvf32")
        ok = got == want and n_stacked > 0 and moved > 0 and got != dense
        print("%s mlx_layout %-12s %d stacked tensors, %d routers at %d bits (%d router weights moved by the rounding): "
              "logits %s the per-expert checkpoint's with the f32-dequantized routers (%s the dense routers')"
              % ("ok  " if ok else "FAIL", preset, n_stacked, len(routers), ROUTER_BITS, moved,
                 "bit-identical to" if got == want else "DIFFER from", "differ from" if got != dense else "SAME AS"))
        failed += not ok
        short, _ = mlx_lm_layout(qdir, work, preset + "-mlx-lm-short", 32, drop_last_expert=True)

        def other_override(c):
            c["quantization"]["model.layers.0.self_attn.q_proj"] = {"group_size": 32, "bits": 8}
            c["quantization_config"] = c["quantization"]

        def three_bits(c):
            c["quantization"]["model.layers.0.mlp.gate"] = {"group_size": 32, "bits": 3}
            c["quantization_config"] = c["quantization"]
        cases = [
            ("stacked experts one short", short, ["model.layers.0.mlp.switch_mlp.", "holds 3 experts", "expert 3"]),
            ("override of a non-router module", rewrite(stacked, work, "bad-override", edit_config=other_override),
             ["model.layers.0.self_attn.q_proj", "override"]),
            ("3-bit router", rewrite(stacked, work, "bad-router-bits", edit_config=three_bits), ["model.layers.0.mlp.gate", "bits 3"]),
        ]
        for what, model, words in cases:
            failed += not refused(what, [scr, "logits", model, "--ids", IDS, "--quant", preset + "-kvf32"], words)
    return failed


def cmd_errors(scr, fixture, work):
    qdir = quantize(scr, fixture, work, "mlx-int4-g32")
    w = "model.layers.0.self_attn.q_proj"

    def truncate(t):
        dtype, shape, raw = t[w + ".weight"]
        t[w + ".weight"] = (dtype, [shape[0], shape[1] - 1], b"".join(raw[r * shape[1] * 4:(r * shape[1] + shape[1] - 1) * 4] for r in range(shape[0])))

    def regroup(c):
        c["quantization"]["group_size"] = 64
        c["quantization_config"]["group_size"] = 64

    cases = [
        ("wrong group size", rewrite(qdir, work, "bad-group", edit_config=regroup), ["mlx-int4-g32"], ["group_size", "64", "32"]),
        ("truncated packed tensor", rewrite(qdir, work, "bad-truncated", edit_tensors=truncate), [],
         [w + ".weight", "[96, 11]", "[96, 12]"]),
        ("missing scales", rewrite(qdir, work, "bad-scales", edit_tensors=lambda t: t.pop(w + ".scales")), [],
         [w + ".scales", "missing"]),
        ("dense checkpoint, quantized preset", fixture, ["mlx-int4-g32"], ["scr quantize"]),
    ]
    failed = 0
    for what, model, quant, words in cases:
        failed += not refused(what, [scr, "logits", model, "--ids", IDS] + (["--quant", quant[0]] if quant else []), words)
    return failed


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    what, scr, fixture, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    presets = sys.argv[5:]
    if what == "quantize":
        failed = cmd_quantize(scr, fixture, work, presets)
    elif what == "logits":
        failed = cmd_logits(scr, fixture, work, presets)
    elif what == "errors":
        failed = cmd_errors(scr, fixture, work)
    elif what == "mlx_layout":
        failed = cmd_mlx_layout(scr, fixture, work, presets)
    else:
        print(__doc__)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
