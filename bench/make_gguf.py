#!/usr/bin/env python3
"""Write a llama.cpp GGUF file for a Llama-architecture config.json, for speed comparisons only.

    python3 bench/make_gguf.py CONFIG_OR_DIR OUT.gguf [--from DIR]

With --from DIR (the output of `scr make-random CONFIG DIR --dtype bf16`), the GGUF holds exactly the
same weight bytes as the safetensors our engine reads: BF16 matrices copied as they are, norm
vectors widened to F32 (as llama.cpp's converter stores them). Without --from, matrices are filled
with pseudo-random BF16 values (standard normal, a 4 MiB pool reused at shifting offsets:
values do not matter for speed, only shapes and bytes do).

Pure Python (no numpy). What llama.cpp needs, and what it is given:
- GGUF v3, 32-byte aligned tensor data; llama.cpp tensor names (token_embd, blk.N.attn_q, ...), dims
  in ggml order (innermost first, i.e. [in, out] for a HF [out, in] weight);
- llama.* hyper-parameters (context/embedding/feed-forward length, block count, head counts,
  rope base and dimension, RMS epsilon, vocab size);
- tokenizer.ggml.model = "none" plus llama.vocab_size: llama.cpp then creates that many dummy
  tokens, which is all `llama-bench` needs (it feeds random token ids); or, with --vocab words,
  the synthetic byte-level vocabulary `bench/cuda/serve_load.py tokenizer` gives `scr serve` (ids
  0-255 the bytes, every other id the word " w<id>", no merges) as a GPT-2 BPE vocabulary, so that
  `llama-server` streams the same text per token as `scr serve` does (each token visible).
Not done, since it does not change speed: the q/k row permutation llama.cpp's converter applies
for its rope layout, and the rope_freqs tensor of llama3 rope scaling (so logits are not those of
the safetensors model; timings are).
"""
import argparse
import json
import math
import os
import random
import struct
import sys

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32
# GGUF metadata value types
T_INT32, T_UINT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64 = 5, 4, 6, 7, 8, 9, 10
# ggml tensor types
GGML_F32, GGML_BF16 = 0, 30
LLAMA_FTYPE_MOSTLY_BF16 = 32


def s_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = s_str(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        out += struct.pack("<I", value)
    elif vtype == T_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == T_BOOL:
        out += struct.pack("<B", 1 if value else 0)
    elif vtype == T_STRING:
        out += s_str(value)
    else:
        raise ValueError(vtype)
    return out


class Source:
    """Tensors of a safetensors file (single file), read lazily."""

    def __init__(self, folder):
        path = os.path.join(folder, "model.safetensors")
        self.f = open(path, "rb")
        (n,) = struct.unpack("<Q", self.f.read(8))
        self.header = json.loads(self.f.read(n))
        self.base = 8 + n

    def info(self, name):
        if name not in self.header:
            sys.exit(f"make_gguf: tensor {name} is missing from the --from safetensors")
        return self.header[name]

    def chunks(self, name, chunk=64 << 20):
        e = self.info(name)
        b, end = e["data_offsets"]
        self.f.seek(self.base + b)
        left = end - b
        while left:
            data = self.f.read(min(chunk, left))
            if not data:
                sys.exit(f"make_gguf: safetensors truncated inside {name}")
            left -= len(data)
            yield data


def kv_array(key, etype, values):
    out = s_str(key) + struct.pack("<IIQ", T_ARRAY, etype, len(values))
    if etype == T_STRING:
        return out + b"".join(s_str(v) for v in values)
    if etype == T_INT32:
        return out + struct.pack(f"<{len(values)}i", *values)
    raise ValueError(etype)


def word_vocab(cfg, V):
    """serve_load.py's synthetic tokenizer as GGUF keys: a GPT-2 BPE vocabulary with no merges."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda"))
    from serve_load import synthetic_tokens  # the one definition of that vocabulary

    tokens = synthetic_tokens(V)
    bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    out = [
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, "default"),
        kv_array("tokenizer.ggml.tokens", T_STRING, tokens),
        kv_array("tokenizer.ggml.token_type", T_INT32, [1] * V),  # all normal: every id decodes to its text
        kv_array("tokenizer.ggml.merges", T_STRING, []),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, False),
    ]
    if isinstance(bos, int) and 0 <= bos < V:
        out.append(kv("tokenizer.ggml.bos_token_id", T_UINT32, bos))
    if isinstance(eos, int) and 0 <= eos < V:
        out.append(kv("tokenizer.ggml.eos_token_id", T_UINT32, eos))
    return out


def bf16_to_f32_bytes(raw):
    out = bytearray(len(raw) * 2)
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    return bytes(out)


def random_pool(nbytes, seed):
    rng = random.Random(seed)
    out = bytearray(nbytes)
    for i in range(0, nbytes, 2):
        bits = struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, 1.0)))[0] >> 16
        out[i] = bits & 0xFF
        out[i + 1] = bits >> 8
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="config.json, or a folder holding one")
    ap.add_argument("out", help="output .gguf")
    ap.add_argument("--from", dest="src", help="folder written by `scr make-random ... --dtype bf16`")
    ap.add_argument("--vocab", choices=["none", "words"], default="none",
                    help="none: dummy tokens (llama-bench); words: serve_load.py's synthetic vocabulary (llama-server)")
    a = ap.parse_args()
    cfg_path = os.path.join(a.config, "config.json") if os.path.isdir(a.config) else a.config
    cfg = json.load(open(cfg_path))
    if cfg.get("model_type") != "llama":
        sys.exit(f"make_gguf: {cfg_path}: only model_type llama is supported")
    H, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", H // nh)
    V = cfg["vocab_size"]
    tied = cfg.get("tie_word_embeddings", False)
    src = Source(a.src) if a.src else None

    # (gguf name, hf name, ggml dims, is_vector)
    tensors = [("token_embd.weight", "model.embed_tokens.weight", [H, V], False)]
    for i in range(L):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        tensors += [
            (p + "attn_norm.weight", q + "input_layernorm.weight", [H], True),
            (p + "attn_q.weight", q + "self_attn.q_proj.weight", [H, nh * hd], False),
            (p + "attn_k.weight", q + "self_attn.k_proj.weight", [H, nkv * hd], False),
            (p + "attn_v.weight", q + "self_attn.v_proj.weight", [H, nkv * hd], False),
            (p + "attn_output.weight", q + "self_attn.o_proj.weight", [nh * hd, H], False),
            (p + "ffn_norm.weight", q + "post_attention_layernorm.weight", [H], True),
            (p + "ffn_gate.weight", q + "mlp.gate_proj.weight", [H, F], False),
            (p + "ffn_up.weight", q + "mlp.up_proj.weight", [H, F], False),
            (p + "ffn_down.weight", q + "mlp.down_proj.weight", [F, H], False),
        ]
    tensors.append(("output_norm.weight", "model.norm.weight", [H], True))
    if not tied:
        tensors.append(("output.weight", "lm_head.weight", [H, V], False))

    if src:
        for _, hf, dims, vec in tensors:
            e = src.info(hf)
            if list(reversed(e["shape"])) != dims:
                sys.exit(f"make_gguf: {hf} has shape {e['shape']}, config says {list(reversed(dims))}")
            if e["dtype"] != "BF16":
                sys.exit(f"make_gguf: {hf} is {e['dtype']}; make the source with --dtype bf16")

    meta = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, "scratchy-random-" + os.path.basename(cfg_path).removesuffix(".json")),
        kv("general.file_type", T_UINT32, LLAMA_FTYPE_MOSTLY_BF16),
        kv("general.alignment", T_UINT32, ALIGN),
        kv("llama.context_length", T_UINT32, min(cfg.get("max_position_embeddings", 4096), 131072)),
        kv("llama.embedding_length", T_UINT32, H),
        kv("llama.block_count", T_UINT32, L),
        kv("llama.feed_forward_length", T_UINT32, F),
        kv("llama.attention.head_count", T_UINT32, nh),
        kv("llama.attention.head_count_kv", T_UINT32, nkv),
        kv("llama.attention.key_length", T_UINT32, hd),
        kv("llama.attention.value_length", T_UINT32, hd),
        kv("llama.rope.dimension_count", T_UINT32, hd),
        kv("llama.rope.freq_base", T_FLOAT32, float(cfg.get("rope_theta", 10000.0))),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg.get("rms_norm_eps", 1e-5))),
        kv("llama.vocab_size", T_UINT32, V),
    ] + (word_vocab(cfg, V) if a.vocab == "words" else [kv("tokenizer.ggml.model", T_STRING, "none")])

    infos, offset = [], 0
    for name, _, dims, vec in tensors:
        gtype = GGML_F32 if vec else GGML_BF16
        nbytes = math.prod(dims) * (4 if vec else 2)
        infos.append(s_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", gtype, offset))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN

    pool = None if src else random_pool(4 << 20, 1)
    with open(a.out, "wb") as f:
        f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for t in infos:
            f.write(t)
        f.write(b"\0" * (-f.tell() % ALIGN))
        data_start = f.tell()
        for k, (name, hf, dims, vec) in enumerate(tensors):
            f.write(b"\0" * (-(f.tell() - data_start) % ALIGN))
            n = math.prod(dims)
            if vec:
                if src:
                    f.write(bf16_to_f32_bytes(b"".join(src.chunks(hf))))
                else:
                    f.write(struct.pack(f"<{n}f", *([1.0] * n)))
            elif src:
                for c in src.chunks(hf):
                    f.write(c)
            else:
                left, shift = 2 * n, (k * 7919 * 2) % len(pool)
                while left:
                    piece = pool[shift:shift + left]
                    f.write(piece)
                    left -= len(piece)
                    shift = 0
            print(f"\rwriting tensors {k + 1}/{len(tensors)}", end="", file=sys.stderr)
        print(file=sys.stderr)
    print(f"wrote {a.out}: {len(tensors)} tensors, {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
