#!/usr/bin/env python3
"""Extra transformers fixtures for config knobs the standard ones leave at their defaults
(sliding windows on Mistral/Qwen2/Mixtral, longrope + partial rotary on Phi-3, YaRN on DeepSeek-V3,
linear scaling of Gemma 3's global rope, llama3 rope, GPT-OSS on long inputs).

Run where transformers and torch are installed (the GPU machine):
    python3 tests/models/make_variant_fixtures.py tests/models/fixtures
Writes OUTDIR/<Arch><suffix>/ exactly as tools/fixtures/make_fixtures.py does (it is imported and
reused: same sizes, weights init, long inputs of 40/100/230 tokens, seed 11) plus OUTDIR/index.json.
"""
import importlib.util
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("make_fixtures", os.path.join(HERE, "../../tools/fixtures/make_fixtures.py"))
mf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mf)

# suffix -> (arch, config overrides on top of make_fixtures' SPEC entry)
VARIANTS = {
    "-sw16": ("MistralForCausalLM", dict(sliding_window=16)),
    "-swlayer1": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=16, max_window_layers=1)),
    "-moe-sw16": ("MixtralForCausalLM", dict(sliding_window=16)),
    "-longrope": ("Phi3ForCausalLM", dict(
        original_max_position_embeddings=64,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
                             original_max_position_embeddings=64,
                             short_factor=[1.0, 1.1, 1.3, 1.7], long_factor=[1.2, 2.5, 4.0, 9.0]),
        partial_rotary_factor=0.5)),
    "-yarn": ("DeepseekV3ForCausalLM", dict(
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=64,
                             beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))),
    "-linear": ("Gemma3ForCausalLM", dict(
        rope_parameters={"full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    "-llama3": ("LlamaForCausalLM", dict(
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64))),
    "-long": ("GptOssForCausalLM", dict()),
}


def main():
    outdir = sys.argv[1]
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(VARIANTS)
    seed = 11
    mf.SEED = seed
    mf.INPUTS[:] = [[1, 17, 42, 99, 256, 7, 300, 12], [(7 * i * i + 3 * i + 5 + seed) % 512 for i in range(41)]]
    mf.INPUTS.extend(mf.long_inputs(seed, 512))
    mf.COMMON.update(intermediate_size=128)
    os.makedirs(outdir, exist_ok=True)
    results = []
    for suffix in only:
        arch, over = VARIANTS[suffix]
        cfg_name, base = mf.SPEC[arch]
        mf.SPEC[arch] = (cfg_name, {**base, **over})
        t = time.time()
        try:
            r = mf.one(arch, outdir, suffix)
        except Exception as e:  # noqa
            r = {"arch": arch, "ok": False, "error": repr(e)[:2000], "trace": traceback.format_exc()[-3000:]}
        mf.SPEC[arch] = (cfg_name, base)
        r.update(suffix=suffix, overrides=over, secs=round(time.time() - t, 1))
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "trace"}), flush=True)
        if not r["ok"]:
            print(r["trace"], flush=True)
    with open(os.path.join(outdir, "index.json"), "w") as f:
        json.dump({"transformers": mf.transformers.__version__, "torch": mf.torch.__version__, "seed": seed,
                   "inputs": mf.INPUTS, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
