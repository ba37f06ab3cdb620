#!/usr/bin/env python3
"""Write a random-weight model (config.json + model.safetensors, bf16) for any checked-in config.

usage: make_random_model.py CONFIG_JSON OUT_DIR [--dtype bf16|f32] [--seed N]

For benchmarks of real model shapes without a download. Uses transformers to build the model
class the config names (its own initializer: normal(0, initializer_range), norms = 1), on the GPU
when there is one, and saves it with safetensors. `scr make-random` does the same in C++ for
configs compiled into a binary; this one needs only Python (e.g. on the GPU machine).
"""
import json, shutil, sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

args = sys.argv[1:]
def opt(name, default):
    if name in args:
        i = args.index(name); v = args[i + 1]; del args[i:i + 2]; return type(default)(v)
    return default
dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[opt("--dtype", "bf16")]
seed = opt("--seed", 1)
config_path, out = Path(args[0]), Path(args[1])
torch.manual_seed(seed)
config = AutoConfig.from_pretrained(config_path)
device = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(device):
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
out.mkdir(parents=True, exist_ok=True)
model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
cfg = json.loads(config_path.read_text())
cfg["torch_dtype"] = "bfloat16" if dtype == torch.bfloat16 else "float32"
cfg.pop("dtype", None)
(out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters, {dtype}")
